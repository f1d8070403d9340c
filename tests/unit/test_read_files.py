"""The sglang_read_files module: every record that exists in one round trip, no record versus an unreadable one."""

import pytest


@pytest.fixture(scope="module")
def read_files(project_module):
    return project_module("library/sglang_read_files.py")


def test_existing_files_are_read_by_name_and_missing_ones_named(read_files, tmp_path):
    (tmp_path / "applied.json").write_text('{"places": {}}\n', encoding="utf-8")
    (tmp_path / "empty").write_bytes(b"")
    contents, missing = read_files.read_files(
        {
            "applied": str(tmp_path / "applied.json"),
            "choice": str(tmp_path / "choice.json"),
            "empty": str(tmp_path / "empty"),
            "gone": str(tmp_path / "no-such-dir" / "x"),
        },
        1024,
    )
    assert contents == {"applied": '{"places": {}}\n', "empty": ""}
    assert missing == ["choice", "gone"]


def test_bytes_that_are_not_utf8_are_replaced_not_fatal(read_files, tmp_path):
    (tmp_path / "patch").write_bytes(b"caf\xe9\n")
    assert read_files.read_text(str(tmp_path / "patch"), 1024) == "caf\ufffd\n"


def test_a_directory_is_refused_naming_the_path(read_files, tmp_path):
    with pytest.raises(read_files.UnreadableFile, match=rf"^{tmp_path}: cannot be read \(a directory\)$"):
        read_files.read_text(str(tmp_path), 1024)


def test_a_file_larger_than_max_bytes_is_refused(read_files, tmp_path):
    (tmp_path / "big").write_bytes(b"x" * 11)
    assert read_files.read_text(str(tmp_path / "big"), 11) == "x" * 11
    with pytest.raises(read_files.UnreadableFile, match=r"big: larger than max_bytes \(10 bytes\)$"):
        read_files.read_text(str(tmp_path / "big"), 10)
