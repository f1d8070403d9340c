"""The sglang_files_in_place module: what differs between a path and the state a play writes."""

import hashlib
import os

import pytest


@pytest.fixture(scope="module")
def files(project_module):
    return project_module("library/sglang_files_in_place.py")


def sha1(data):
    return hashlib.sha1(data).hexdigest()


def me():
    """Names of this process's user and group, as the module's lookups give them."""
    return {"owner": str(os.getuid()), "group": str(os.getgid())}


def test_a_file_as_wanted_differs_in_nothing(files, tmp_path):
    path = tmp_path / "unit"
    path.write_bytes(b"[Unit]\n")
    path.chmod(0o644)
    entry = {"path": str(path), "checksum": sha1(b"[Unit]\n"), "mode": "0644", **me()}
    assert files.compare(entry) == []


def test_a_folder_as_wanted_differs_in_nothing(files, tmp_path):
    tmp_path.chmod(0o755)
    assert files.compare({"path": str(tmp_path), "state": "directory", "mode": "0755", **me()}) == []


def test_content_owner_group_and_mode_are_each_named(files, tmp_path):
    path = tmp_path / "probe"
    path.write_bytes(b"#!/bin/sh\nexit 0\n")
    path.chmod(0o700)
    entry = {"path": str(path), "checksum": sha1(b"#!/bin/sh\n"), "owner": "root", "group": "root", "mode": "0755"}

    reasons = files.compare(entry, user_name=lambda uid: "sglang", group_name=lambda gid: "sglang")

    assert reasons == ["content", "owner", "group", "mode"]


def test_an_absent_path_and_a_link_in_place_of_a_file_are_named(files, tmp_path):
    (tmp_path / "target").write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    wanted = {"checksum": sha1(b"x"), "mode": "0644"}
    assert files.compare({"path": str(tmp_path / "absent"), **wanted}) == ["absent"]
    # a masked unit is a link to /dev/null: never "in place", whatever it points at
    assert files.compare({"path": str(tmp_path / "link"), **wanted}) == ["type"]
    assert files.compare({"path": str(tmp_path / "target"), "state": "directory"}) == ["type"]


def test_numeric_ids_and_ids_without_a_name_compare_as_numbers(files, tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"")

    def nameless(number):
        raise KeyError(number)

    entry = {"path": str(path), "checksum": sha1(b""), "owner": str(os.getuid()), "group": "root"}
    assert files.compare(entry, user_name=nameless, group_name=nameless) == ["group"]


def test_an_uppercase_checksum_matches(files, tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"data")
    assert files.compare({"path": str(path), "checksum": sha1(b"data").upper()}) == []


@pytest.mark.parametrize(("entry", "message"), [
    ({"path": "/etc/x"}, "/etc/x: a checksum is required for a file"),
    ({"path": "/etc/x", "checksum": "00", "mode": "u=rw"}, "/etc/x: mode 'u=rw' is not an octal string such as '0644'"),
])
def test_an_entry_it_cannot_compare_is_refused_naming_the_path(files, entry, message):
    with pytest.raises(files.BadEntry, match="^" + message.replace("(", r"\(") + "$"):
        files.compare(entry)
