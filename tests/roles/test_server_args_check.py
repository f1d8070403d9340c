"""library/sglang_server_args_check.py: SGLang 0.5.9's own ServerArgs judges the unit's argv and environment.

No mocks of SGLang: the module's main() runs for real and its probe runs in a CPU-only venv made
from the project's wheelhouse (.cache/parser-venv: sglang 0.5.9 + torch 2.13.0+cpu + the parser
dependencies of tests/wheelhouse/parser-requirements.txt), the same set the test node installs.
The venv is the session fixture `parser_python` (tests/conftest.py, tests/parser_venv.py), built
once and reused while the wheelhouse is unchanged. Model folders: tests/fixtures/testnode-model/
{target,draft} (config.json only). The probe's pure helpers are tested in
tests/unit/test_sglang_args_probe.py.
"""

import json

import pytest
from ansible.module_utils.testing import patch_module_args
from project_modules import REPO

TARGET = REPO / "tests" / "fixtures" / "testnode-model" / "target"
DRAFT = REPO / "tests" / "fixtures" / "testnode-model" / "draft"


@pytest.fixture(scope="module")
def check_module(project_module):
    # The module imports its probe and helpers as ansible.module_utils.* (ansible.cfg's module_utils
    # path at run time); make those names resolve to the repository's files here.
    project_module("module_utils/sglang_args_probe.py", as_name="ansible.module_utils.sglang_args_probe")
    project_module("module_utils/sglang_args_variables.py", as_name="ansible.module_utils.sglang_args_variables")
    return project_module("library/sglang_server_args_check.py")


# --------------------------------------------------------------------------- running the module

CANONICAL = [
    "--model-path", str(TARGET),
    "--speculative-algorithm", "EAGLE3",
    "--speculative-draft-model-path", str(DRAFT),
    "--speculative-num-steps", "3",
    "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "4",
    "--tp-size", "8",
    "--mem-fraction-static", "0.88",
    "--host", "127.0.0.1",
    "--port", "30000",
]
SPEC_V2 = {"SGLANG_ENABLE_SPEC_V2": "1"}


def with_flag(argv, flag, value):
    """argv with flag's value replaced (or the flag appended)."""
    argv = list(argv)
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [flag, value]
    return argv


def run_check(check_module, capsys, python, argv, environment=None, check_mode=False, variables=None):
    args = {"python": python, "argv": argv, "environment": environment or {}, "_ansible_check_mode": check_mode}
    if variables is not None:
        args["variables"] = variables
    with patch_module_args(args):
        with pytest.raises(SystemExit) as exit_info:
            check_module.main()
    result = json.loads(capsys.readouterr().out)
    result["_rc"] = exit_info.value.code
    return result


def flags_of(result, stage=None):
    return [e["flag"] for e in result["errors"] if stage is None or e["stage"] == stage]


# --------------------------------------------------------------------------- accepted

def test_canonical_argv_with_spec_v2_is_accepted_in_check_mode(check_module, capsys, parser_python):
    result = run_check(check_module, capsys, parser_python, CANONICAL, SPEC_V2, check_mode=True)
    assert result["_rc"] == 0 and not result.get("failed"), result.get("msg")
    assert result["changed"] is False
    resolved = result["resolved"]
    assert result["spec_v2"] is True and resolved["spec_v2"] is True and resolved["spec_v2_env"] is True
    assert resolved["disable_overlap_schedule"] is False
    assert resolved["speculative_algorithm"] == "EAGLE3"
    assert resolved["speculative_eagle_topk"] == 1
    assert resolved["speculative_num_steps"] == 3
    assert resolved["speculative_num_draft_tokens"] == 4
    assert resolved["tp_size"] == 8
    assert resolved["mem_fraction_static"] == 0.88
    assert resolved["host"] == "127.0.0.1" and resolved["port"] == 30000
    assert resolved["speculative_draft_model_path"] == str(DRAFT)
    # SGLang's silent EAGLE default, reported rather than hidden.
    assert resolved["max_running_requests"] == 48
    assert result["adjusted"]["max_running_requests"] == {"parsed": None, "resolved": 48}
    assert any("reset to 48" in w for w in result["sglang_warnings"])
    # No --device in argv: the check adds --device cuda (else "No accelerator" without a GPU).
    assert result["device_added"] is True and result["argv_checked"][-2:] == ["--device", "cuda"]
    assert result["sglang_version"] == "0.5.9"
    assert result["errors"] == []


def test_spec_v2_off_accepts_topk_4_and_sglang_adjusts_draft_tokens(check_module, capsys, parser_python):
    """Without spec v2 SGLang takes topk 4; with topk 1 it resets num-draft-tokens to steps + 1."""
    argv = with_flag(with_flag(CANONICAL, "--speculative-eagle-topk", "4"), "--speculative-num-draft-tokens", "8")
    result = run_check(check_module, capsys, parser_python, argv, {"SGLANG_ENABLE_SPEC_V2": "false"})
    assert result["_rc"] == 0, result.get("msg")
    assert result["spec_v2"] is False and result["resolved"]["disable_overlap_schedule"] is True
    assert result["resolved"]["speculative_eagle_topk"] == 4
    assert result["resolved"]["speculative_num_draft_tokens"] == 8

    argv = with_flag(CANONICAL, "--speculative-num-draft-tokens", "8")
    result = run_check(check_module, capsys, parser_python, argv, SPEC_V2)
    assert result["_rc"] == 0, result.get("msg")
    assert result["adjusted"]["speculative_num_draft_tokens"] == {"parsed": 8, "resolved": 4}


# --------------------------------------------------------------------------- refused

def test_parse_errors_are_all_listed_each_naming_its_flag(check_module, capsys, parser_python):
    """argparse stops at the first bad value; the check lists unknown flags, bad types and choices together."""
    argv = with_flag(with_flag(CANONICAL, "--tp-size", "eight"), "--speculative-algorithm", "EAGLE9")
    argv += ["--speculative-eagle-top-k", "1"]
    result = run_check(check_module, capsys, parser_python, argv, SPEC_V2)
    assert result["_rc"] == 1 and result["failed"] is True
    assert sorted(flags_of(result, "parse")) == ["--speculative-algorithm EAGLE9", "--speculative-eagle-top-k 1",
                                                 "--tp-size eight"]
    message = result["msg"]
    assert "invalid int value: 'eight'" in message
    assert "invalid choice: 'EAGLE9'" in message
    assert "unrecognized arguments: --speculative-eagle-top-k 1" in message
    assert result["resolved"] is None


def test_topk_above_1_with_spec_v2_is_refused_with_sglangs_own_message(check_module, capsys, parser_python):
    argv = with_flag(CANONICAL, "--speculative-eagle-topk", "4")
    result = run_check(check_module, capsys, parser_python, argv, SPEC_V2)
    assert result["_rc"] == 1
    (error,) = result["errors"]
    assert error["stage"] == "post_init"
    assert "Spec v2 currently only supports topk = 1" in error["message"]  # SGLang's ValueError, verbatim
    assert "_handle_speculative_decoding" in error["message"]
    assert error["flag"] == "--speculative-eagle-topk 4, SGLANG_ENABLE_SPEC_V2=1"
    assert "--speculative-eagle-topk 4" in result["msg"]


def test_spec_v2_spelling_sglang_would_silently_ignore_is_refused(check_module, capsys, parser_python):
    result = run_check(check_module, capsys, parser_python, CANONICAL, {"SGLANG_ENABLE_SPEC_V2": "on"})
    assert result["_rc"] == 1
    (error,) = result["errors"]
    assert error["stage"] == "environment" and error["flag"] == "SGLANG_ENABLE_SPEC_V2=on"
    # The accepted spellings are read from SGLang's own EnvBool parser.
    assert "accepts only true, 1, yes, y, false, 0, no, n" in error["message"]
    assert "WITHOUT spec v2" in error["message"]
    # SGLang itself went on with spec v2 off: that is what the unit would have run.
    assert result["resolved"]["spec_v2_env"] is False and result["spec_v2"] is False
    assert any("Invalid value for SGLANG_ENABLE_SPEC_V2" in w for w in result["sglang_warnings"])


# Whether the parallel sizes fit the node's GPUs is judged on the controller, from the values
# SGLang resolved (sglang_service's tasks/check_parser.yml, filter gpu_layout_mismatches).
@pytest.fixture(scope="module")
def layout_mismatches(project_module):
    return project_module("filter_plugins/gpu_expectations.py").gpu_layout_mismatches


def test_tp_8_on_a_node_with_7_gpus_is_refused(check_module, capsys, parser_python, layout_mismatches):
    result = run_check(check_module, capsys, parser_python, CANONICAL, SPEC_V2)
    assert result["_rc"] == 0 and result["resolved"]["tp_size"] == 8  # SGLang itself resolved it fine
    assert layout_mismatches(result["resolved"], 7, False, ["model_path", "tp_size"]) == [
        "sglang_server_args.tp_size: tp_size 8 = 8 GPU(s) per node, but the node has 7 GPU(s)"]


def test_each_refusal_names_the_inventory_variable_behind_it(check_module, capsys, parser_python):
    """The module itself names sglang_server_args.FIELD / sglang_service_environment.NAME (no mapping in the role)."""
    argv = with_flag(with_flag(CANONICAL, "--tp-size", "eight"), "--speculative-eagle-topk", "4")
    variables = {"sglang_server_args": ["model_path", "tp_size", "speculative_eagle_topk", "port"],
                 "sglang_service_environment": ["SGLANG_ENABLE_SPEC_V2"]}
    result = run_check(check_module, capsys, parser_python, argv, {"SGLANG_ENABLE_SPEC_V2": "on", "NCCL_PROTO": "LL"},
                       variables=variables)
    assert result["_rc"] == 1
    named = {error["flag"]: error["variables"] for error in result["errors"]}
    assert named["--tp-size eight"] == ["sglang_server_args.tp_size"]
    assert named["SGLANG_ENABLE_SPEC_V2=on"] == ["sglang_service_environment.SGLANG_ENABLE_SPEC_V2"]
    assert {"sglang_server_args.tp_size", "sglang_service_environment.SGLANG_ENABLE_SPEC_V2"} <= set(result["variables"])
    assert len(result["variables"]) == len(set(result["variables"]))  # each once
    assert "NCCL_PROTO" not in result["variables"]  # accepted: not named


def test_tp_4_on_a_node_with_8_gpus_is_refused_naming_the_idle_gpus_unless_allowed(check_module, capsys, parser_python,
                                                                                    layout_mismatches):
    argv = with_flag(CANONICAL, "--tp-size", "4")
    resolved = run_check(check_module, capsys, parser_python, argv, SPEC_V2)["resolved"]
    assert layout_mismatches(resolved, 8, False, ["model_path", "tp_size"]) == [
        "sglang_server_args.tp_size: tp_size 4 = 4 GPU(s) per node, so 4 of the node's 8 GPU(s) would sit idle; "
        "set sglang_allow_idle_gpus: true to deploy it anyway"]
    assert layout_mismatches(resolved, 8, True, ["model_path", "tp_size"]) == []


def test_mem_fraction_static_outside_0_1_is_refused_by_our_own_check(check_module, capsys, parser_python):
    """SGLang 0.5.9 resolves --mem-fraction-static 1.5 without a word: only the extra check catches it."""
    argv = with_flag(CANONICAL, "--mem-fraction-static", "1.5")
    result = run_check(check_module, capsys, parser_python, argv, SPEC_V2)
    assert result["_rc"] == 1
    (error,) = result["errors"]
    assert error["stage"] == "value" and error["flag"] == "--mem-fraction-static 1.5"
    assert result["resolved"]["mem_fraction_static"] == 1.5


def test_missing_model_folder_is_refused_before_transformers_looks_online(check_module, capsys, parser_python, tmp_path):
    argv = with_flag(CANONICAL, "--speculative-draft-model-path", str(tmp_path / "no-such-draft"))
    result = run_check(check_module, capsys, parser_python, argv, SPEC_V2)
    assert result["_rc"] == 1
    (error,) = result["errors"]
    assert error["stage"] == "value"
    assert error["flag"] == "--speculative-draft-model-path %s" % (tmp_path / "no-such-draft")
    assert "no such file or directory" in error["message"]
