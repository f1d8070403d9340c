"""The sglang_model_access module: missing folders named, the service user's access tried only when it exists."""

import pytest


@pytest.fixture(scope="module")
def access(project_module):
    return project_module("library/sglang_model_access.py")


class Runner:
    """Stands in for runuser: answers each folder with a recorded (rc, stdout, stderr)."""

    def __init__(self, answers):
        self.answers, self.argvs = answers, []

    def __call__(self, argv):
        self.argvs.append(argv)
        return self.answers[argv[4]]


def test_a_missing_folder_a_file_and_a_relative_path_are_named_and_never_tried(access, tmp_path):
    (tmp_path / "target").mkdir()
    (tmp_path / "weights.bin").write_bytes(b"")
    folders = {"model_path": str(tmp_path / "target"), "tokenizer_path": str(tmp_path / "weights.bin"),
               "speculative_draft_model_path": str(tmp_path / "absent"), "other": "models/target"}
    run = Runner({str(tmp_path / "target"): (0, "", "")})

    missing, known, denied = access.check_folders(folders, "sglang", run, exists=lambda user: True)

    assert missing == [{"name": "tokenizer_path", "path": str(tmp_path / "weights.bin")},
                       {"name": "speculative_draft_model_path", "path": str(tmp_path / "absent")},
                       {"name": "other", "path": "models/target"}]
    assert known and denied == []
    assert run.argvs == [["runuser", "--user=sglang", "--", "find", str(tmp_path / "target"), "-maxdepth", "1",
                          "(", "!", "-readable", "-o", "-type", "d", "!", "-executable", ")", "-print"]]


def test_a_user_that_does_not_exist_yet_is_reported_and_nothing_is_tried(access, tmp_path):
    run = Runner({})
    missing, known, denied = access.check_folders({"model_path": str(tmp_path)}, "sglang", run,
                                                  exists=lambda user: False)
    assert (missing, known, denied) == ([], False, [])
    assert run.argvs == []


@pytest.mark.parametrize(("result", "reason"), [
    ((1, "", "find: '/srv/locked/target': Permission denied\n"), "find: '/srv/locked/target': Permission denied"),
    ((0, "/srv/m/target/model.safetensors\n/srv/m/target/sub\n", ""),
     "cannot read /srv/m/target/model.safetensors, /srv/m/target/sub"),
    ((1, "/srv/m/target/x\n", "\nfind: '/srv/m/target/x': Permission denied\n"), "find: '/srv/m/target/x': Permission denied"),
    ((125, "", ""), "runuser exited with 125"),
])
def test_each_denial_says_why(access, tmp_path, result, reason):
    run = Runner({str(tmp_path): result})
    _, _, denied = access.check_folders({"model_path": str(tmp_path)}, "sglang", run, exists=lambda user: True)
    assert denied == [{"name": "model_path", "path": str(tmp_path), "reason": reason}]


def test_a_readable_folder_is_not_denied(access):
    assert access.denial(0, "", "") is None


def test_the_passwd_lookup_knows_root_and_not_a_made_up_user(access):
    assert access.user_exists("root")
    assert not access.user_exists("sglang-canon-no-such-user")
