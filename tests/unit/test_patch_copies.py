"""module_utils/patch_copies.py: the applied patches' text kept on the node, modes and owners put right."""

import os
import stat

import pytest

UID, GID = os.getuid(), os.getgid()


@pytest.fixture(scope="module")
def copies(project_module):
    return project_module("module_utils/patch_copies.py")


def _mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_copies_are_made_with_their_set_folders_then_left_alone(copies, tmp_path):
    root = tmp_path / "patches"
    wanted = [("sglang-0.5.9/0001-a.patch", b"--- a\n"), ("sglang-0.5.9/0002-b.patch", b"--- b\r\n")]

    made = copies.sync_copies(str(root), wanted, uid=UID, gid=GID)

    assert made == [str(root), str(root / "sglang-0.5.9"), str(root / "sglang-0.5.9" / "0001-a.patch"),
                    str(root / "sglang-0.5.9" / "0002-b.patch")]
    assert (root / "sglang-0.5.9" / "0002-b.patch").read_bytes() == b"--- b\r\n"
    assert _mode(root) == _mode(root / "sglang-0.5.9") == 0o755
    assert _mode(root / "sglang-0.5.9" / "0001-a.patch") == 0o644
    assert copies.sync_copies(str(root), wanted, uid=UID, gid=GID) == []


def test_a_changed_copy_and_a_loosened_folder_are_put_right_and_check_mode_only_reports_them(copies, tmp_path):
    root = tmp_path / "patches"
    wanted = [("set/0001-a.patch", b"new\n")]
    copies.sync_copies(str(root), [("set/0001-a.patch", b"old\n")], uid=UID, gid=GID)
    (root / "set").chmod(0o777)
    (root / "set" / "0001-a.patch").chmod(0o666)

    assert copies.sync_copies(str(root), wanted, check_mode=True, uid=UID, gid=GID) == [
        str(root / "set"), str(root / "set" / "0001-a.patch")]
    assert (root / "set" / "0001-a.patch").read_bytes() == b"old\n" and _mode(root / "set") == 0o777

    copies.sync_copies(str(root), wanted, uid=UID, gid=GID)
    assert (root / "set" / "0001-a.patch").read_bytes() == b"new\n"
    assert _mode(root / "set") == 0o755 and _mode(root / "set" / "0001-a.patch") == 0o644
    # only a mode drifted: put right without rewriting
    (root / "set" / "0001-a.patch").chmod(0o600)
    assert copies.sync_copies(str(root), wanted, uid=UID, gid=GID) == [str(root / "set" / "0001-a.patch")]
    assert _mode(root / "set" / "0001-a.patch") == 0o644
    assert sorted(os.listdir(root / "set")) == ["0001-a.patch"]  # no temporary file left


def test_check_mode_on_a_missing_folder_names_it_and_its_copies_without_making_them(copies, tmp_path):
    root = tmp_path / "patches"
    assert copies.sync_copies(str(root), [("set/a.patch", b"x")], check_mode=True, uid=UID, gid=GID) == [
        str(root), str(root / "set"), str(root / "set" / "a.patch")]
    assert not root.exists()


@pytest.mark.parametrize("name", ["/etc/passwd", "../escape.patch", "set/../../escape.patch", "set//a.patch", ""])
def test_a_name_outside_the_folder_is_refused(copies, tmp_path, name):
    with pytest.raises(ValueError, match="is not a relative path inside"):
        copies.sync_copies(str(tmp_path), [(name, b"x")], uid=UID, gid=GID)
    with pytest.raises(ValueError, match="is not a relative path inside"):
        copies.remove_copies(str(tmp_path), [name])


def test_removal_takes_each_named_set_folder_whole_and_a_flat_copy_alone(copies, tmp_path):
    root = tmp_path / "patches"
    copies.sync_copies(str(root), [("set/a.patch", b"a"), ("set/b.patch", b"b"), ("flat.patch", b"f")],
                       uid=UID, gid=GID)
    (root / "set" / "stale.patch").write_bytes(b"an older set's patch")
    (root / "sglang.manifest.json").write_text("{}")

    assert copies.remove_copies(str(root), ["set/a.patch", "set/b.patch", "flat.patch", "gone/c.patch"],
                                check_mode=True) == [str(root / "set"), str(root / "flat.patch")]
    assert (root / "set").is_dir()

    assert copies.remove_copies(str(root), ["set/a.patch", "set/b.patch", "flat.patch"]) == [
        str(root / "set"), str(root / "flat.patch")]
    assert sorted(os.listdir(root)) == ["sglang.manifest.json"]
