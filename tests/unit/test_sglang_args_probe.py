"""library/sglang_server_args_check.py and module_utils/sglang_args_probe.py: the parts that need no SGLang.

The module's runs through SGLang 0.5.9's own ServerArgs (in the parser venv) are in
tests/roles/test_server_args_check.py; here are the probe's pure helpers and the module's
answer when the interpreter is missing.
"""

import json

import pytest
from ansible.module_utils.testing import patch_module_args
from project_modules import REPO


@pytest.fixture(scope="module")
def probe(project_module):
    # The module imports its probe as ansible.module_utils.sglang_args_probe (ansible.cfg's
    # module_utils path at run time); make that name resolve to the repository's file here.
    return project_module("module_utils/sglang_args_probe.py", as_name="ansible.module_utils.sglang_args_probe")


@pytest.fixture(scope="module")
def check_module(project_module, probe):  # pylint: disable=unused-argument  # probe: registered before the module imports it
    # Its other module utility too: without it this file passed only after another file had loaded it.
    project_module("module_utils/sglang_args_variables.py", as_name="ansible.module_utils.sglang_args_variables")
    return project_module("library/sglang_server_args_check.py")


def test_missing_python_fails_clearly(capsys, tmp_path, check_module):
    args = {"python": str(tmp_path / "venv" / "bin" / "python"), "argv": ["--model-path", str(tmp_path)],
            "environment": {"SGLANG_ENABLE_SPEC_V2": "1"}}
    with patch_module_args(args):
        with pytest.raises(SystemExit) as exit_info:
            check_module.main()
    result = json.loads(capsys.readouterr().out)
    assert exit_info.value.code == 1 and result["failed"] is True
    assert "does not exist or is not executable" in result["msg"]


# --------------------------------------------------------------------------- pure helpers of the probe

def test_probe_environment_is_exactly_the_units_plus_path_home_lang(monkeypatch, check_module):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setenv("SGLANG_ENABLE_SPEC_V2", "1")  # the controller's own: must not leak
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    env = check_module.probe_environment({"NCCL_PROTO": "LL", "SGLANG_X": 3})
    assert env["PATH"] == "/usr/bin:/bin"
    assert env["NCCL_PROTO"] == "LL" and env["SGLANG_X"] == "3"
    assert "SGLANG_ENABLE_SPEC_V2" not in env and "CUDA_VISIBLE_DEVICES" not in env
    assert set(env) <= {"PATH", "HOME", "LANG", "TMPDIR", "NCCL_PROTO", "SGLANG_X"}


def test_probe_source_is_shipped_from_module_utils(check_module):
    source = check_module.probe_source()
    assert source == (REPO / "module_utils" / "sglang_args_probe.py").read_text()
    compile(source, "probe", "exec")


@pytest.mark.parametrize("message, argv, flag, rest", [
    ("argument --tensor-parallel-size/--tp-size: invalid int value: 'eight'",
     ["--tp-size", "8", "--tp-size", "eight", "--port", "1"], "--tp-size eight", ["--tp-size", "8", "--port", "1"]),
    ("argument --mem-fraction-static: invalid float value: 'x'",
     ["--mem-fraction-static=x", "--port", "1"], "--mem-fraction-static x", ["--port", "1"]),
    ("argument --port: expected one argument", ["--host", "h", "--port"], "--port", ["--host", "h"]),
    ("unrecognized arguments: --foo 1", ["--foo", "1"], "--foo 1", None),
    ("the following arguments are required: --model-path/--model", [], "--model-path/--model", None),
])
def test_describe_parse_error(message, argv, flag, rest, probe):
    error, remaining = probe.describe_parse_error(message, argv)
    assert error["stage"] == "parse" and error["flag"] == flag and message in error["message"]
    assert remaining == rest
