"""library/sglang_server_args_check.py: SGLang 0.5.9's own ServerArgs judges the unit's argv and environment.

No mocks of SGLang: the module's main() runs for real and its probe runs in a CPU-only venv made
from the project's wheelhouse (.cache/parser-venv: sglang 0.5.9 + torch 2.13.0+cpu + the parser
dependencies of tests/wheelhouse/parser-requirements.txt), the same set the test node installs.
The venv is built once (about a minute) by ensure_parser_venv() and reused while the wheelhouse
is unchanged. Model folders: tests/fixtures/testnode-model/{target,draft} (config.json only).
"""

import fcntl
import hashlib
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ansible.module_utils.testing import patch_module_args

REPO = Path(__file__).resolve().parents[2]
WHEELHOUSE = REPO / ".cache" / "wheelhouse"
REQUIREMENTS = REPO / "tests" / "wheelhouse" / "parser-requirements.txt"
PARSER_VENV = REPO / ".cache" / "parser-venv"
MARKER = ".sglang-canon-parser-venv"
TARGET = REPO / "tests" / "fixtures" / "testnode-model" / "target"
DRAFT = REPO / "tests" / "fixtures" / "testnode-model" / "draft"


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The module imports its probe as ansible.module_utils.sglang_args_probe (ansible.cfg's module_utils
# path at run time); make that name resolve to the repository's file here.
probe = _load("ansible.module_utils.sglang_args_probe", REPO / "module_utils" / "sglang_args_probe.py")
sys.modules["ansible.module_utils.sglang_args_probe"] = probe
check_module = _load("sglang_server_args_check_under_test", REPO / "library" / "sglang_server_args_check.py")


# --------------------------------------------------------------------------- the parser venv

def _base_python():
    """A CPython 3.11 (the wheelhouse holds cp311 wheels, Debian 12's Python)."""
    for candidate in (shutil.which("python3.11"), sys.executable):
        if not candidate:
            continue
        version = subprocess.run([candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                 capture_output=True, text=True, check=False).stdout.strip()
        if version == "3.11":
            return candidate
    raise RuntimeError("the parser venv needs CPython 3.11 (the wheelhouse is cp311); none found")


def ensure_parser_venv():
    """Path of .cache/parser-venv/bin/python, (re)built from the wheelhouse when missing or stale.

    Builds the wheelhouse first with scripts/build-wheelhouse when it is not complete. A file lock
    keeps concurrent test sessions from building it twice; a marker holding the wheelhouse's hash
    is written last, so an interrupted build is redone.
    """
    python = PARSER_VENV / "bin" / "python"
    PARSER_VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(PARSER_VENV.parent / "parser-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (WHEELHOUSE / ".complete").is_file():
            subprocess.run([sys.executable, str(REPO / "scripts" / "build-wheelhouse")], check=True)
        wanted = hashlib.sha256((WHEELHOUSE / ".complete").read_bytes() + REQUIREMENTS.read_bytes()).hexdigest()
        marker = PARSER_VENV / MARKER
        if python.exists() and marker.is_file() and marker.read_text().strip() == wanted:
            return str(python)
        shutil.rmtree(PARSER_VENV, ignore_errors=True)
        subprocess.run([_base_python(), "-m", "venv", str(PARSER_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        "--no-index", "--no-deps", "--find-links", str(WHEELHOUSE), "-r", str(REQUIREMENTS)],
                       check=True)
        subprocess.run([str(python), "-c", "import sglang.srt.server_args"], check=True, capture_output=True)
        marker.write_text(wanted + "\n")
        return str(python)


@pytest.fixture(scope="session")
def sglang_python():
    return ensure_parser_venv()


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


def run_check(capsys, python, argv, environment=None, gpu_count=None, check_mode=False):
    args = {"python": python, "argv": argv, "environment": environment or {}, "_ansible_check_mode": check_mode}
    if gpu_count is not None:
        args["gpu_count"] = gpu_count
    with patch_module_args(args):
        with pytest.raises(SystemExit) as exit_info:
            check_module.main()
    result = json.loads(capsys.readouterr().out)
    result["_rc"] = exit_info.value.code
    return result


def flags_of(result, stage=None):
    return [e["flag"] for e in result["errors"] if stage is None or e["stage"] == stage]


# --------------------------------------------------------------------------- accepted

def test_canonical_argv_with_spec_v2_is_accepted_in_check_mode(capsys, sglang_python):
    result = run_check(capsys, sglang_python, CANONICAL, SPEC_V2, gpu_count=8, check_mode=True)
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


def test_spec_v2_off_accepts_topk_4_and_sglang_adjusts_draft_tokens(capsys, sglang_python):
    """Without spec v2 SGLang takes topk 4; with topk 1 it resets num-draft-tokens to steps + 1."""
    argv = with_flag(with_flag(CANONICAL, "--speculative-eagle-topk", "4"), "--speculative-num-draft-tokens", "8")
    result = run_check(capsys, sglang_python, argv, {"SGLANG_ENABLE_SPEC_V2": "false"}, gpu_count=8)
    assert result["_rc"] == 0, result.get("msg")
    assert result["spec_v2"] is False and result["resolved"]["disable_overlap_schedule"] is True
    assert result["resolved"]["speculative_eagle_topk"] == 4
    assert result["resolved"]["speculative_num_draft_tokens"] == 8

    argv = with_flag(CANONICAL, "--speculative-num-draft-tokens", "8")
    result = run_check(capsys, sglang_python, argv, SPEC_V2)
    assert result["_rc"] == 0, result.get("msg")
    assert result["adjusted"]["speculative_num_draft_tokens"] == {"parsed": 8, "resolved": 4}


# --------------------------------------------------------------------------- refused

def test_parse_errors_are_all_listed_each_naming_its_flag(capsys, sglang_python):
    """argparse stops at the first bad value; the check lists unknown flags, bad types and choices together."""
    argv = with_flag(with_flag(CANONICAL, "--tp-size", "eight"), "--speculative-algorithm", "EAGLE9")
    argv += ["--speculative-eagle-top-k", "1"]
    result = run_check(capsys, sglang_python, argv, SPEC_V2, gpu_count=8)
    assert result["_rc"] == 1 and result["failed"] is True
    assert sorted(flags_of(result, "parse")) == ["--speculative-algorithm EAGLE9", "--speculative-eagle-top-k 1",
                                                 "--tp-size eight"]
    message = result["msg"]
    assert "invalid int value: 'eight'" in message
    assert "invalid choice: 'EAGLE9'" in message
    assert "unrecognized arguments: --speculative-eagle-top-k 1" in message
    assert result["resolved"] is None


def test_topk_above_1_with_spec_v2_is_refused_with_sglangs_own_message(capsys, sglang_python):
    argv = with_flag(CANONICAL, "--speculative-eagle-topk", "4")
    result = run_check(capsys, sglang_python, argv, SPEC_V2, gpu_count=8)
    assert result["_rc"] == 1
    (error,) = result["errors"]
    assert error["stage"] == "post_init"
    assert "Spec v2 currently only supports topk = 1" in error["message"]  # SGLang's ValueError, verbatim
    assert "_handle_speculative_decoding" in error["message"]
    assert error["flag"] == "--speculative-eagle-topk 4, SGLANG_ENABLE_SPEC_V2=1"
    assert "--speculative-eagle-topk 4" in result["msg"]


def test_spec_v2_spelling_sglang_would_silently_ignore_is_refused(capsys, sglang_python):
    result = run_check(capsys, sglang_python, CANONICAL, {"SGLANG_ENABLE_SPEC_V2": "on"}, gpu_count=8)
    assert result["_rc"] == 1
    (error,) = result["errors"]
    assert error["stage"] == "environment" and error["flag"] == "SGLANG_ENABLE_SPEC_V2=on"
    # The accepted spellings are read from SGLang's own EnvBool parser.
    assert "accepts only true, 1, yes, y, false, 0, no, n" in error["message"]
    assert "WITHOUT spec v2" in error["message"]
    # SGLang itself went on with spec v2 off: that is what the unit would have run.
    assert result["resolved"]["spec_v2_env"] is False and result["spec_v2"] is False
    assert any("Invalid value for SGLANG_ENABLE_SPEC_V2" in w for w in result["sglang_warnings"])


def test_tp_8_on_a_node_with_7_gpus_is_refused(capsys, sglang_python):
    result = run_check(capsys, sglang_python, CANONICAL, SPEC_V2, gpu_count=7)
    assert result["_rc"] == 1
    (error,) = result["errors"]
    assert error == {"stage": "gpu_count", "flag": "--tp-size 8",
                     "message": "tp_size 8 = 8 GPU(s) per node, but the node has 7 GPU(s)"}
    assert result["resolved"]["tp_size"] == 8  # SGLang itself resolved it fine


def test_mem_fraction_static_outside_0_1_is_refused_by_our_own_check(capsys, sglang_python):
    """SGLang 0.5.9 resolves --mem-fraction-static 1.5 without a word: only the extra check catches it."""
    argv = with_flag(CANONICAL, "--mem-fraction-static", "1.5")
    result = run_check(capsys, sglang_python, argv, SPEC_V2, gpu_count=8)
    assert result["_rc"] == 1
    (error,) = result["errors"]
    assert error["stage"] == "value" and error["flag"] == "--mem-fraction-static 1.5"
    assert result["resolved"]["mem_fraction_static"] == 1.5


def test_missing_model_folder_is_refused_before_transformers_looks_online(capsys, sglang_python, tmp_path):
    argv = with_flag(CANONICAL, "--speculative-draft-model-path", str(tmp_path / "no-such-draft"))
    result = run_check(capsys, sglang_python, argv, SPEC_V2, gpu_count=8)
    assert result["_rc"] == 1
    (error,) = result["errors"]
    assert error["stage"] == "value"
    assert error["flag"] == "--speculative-draft-model-path %s" % (tmp_path / "no-such-draft")
    assert "no such file or directory" in error["message"]


def test_missing_python_fails_clearly(capsys, tmp_path):
    result = run_check(capsys, str(tmp_path / "venv" / "bin" / "python"), CANONICAL, SPEC_V2)
    assert result["_rc"] == 1
    assert "does not exist or is not executable" in result["msg"]


# --------------------------------------------------------------------------- pure helpers of the probe

def test_probe_environment_is_exactly_the_units_plus_path_home_lang(monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setenv("SGLANG_ENABLE_SPEC_V2", "1")  # the controller's own: must not leak
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    env = check_module.probe_environment({"NCCL_PROTO": "LL", "SGLANG_X": 3})
    assert env["PATH"] == "/usr/bin:/bin"
    assert env["NCCL_PROTO"] == "LL" and env["SGLANG_X"] == "3"
    assert "SGLANG_ENABLE_SPEC_V2" not in env and "CUDA_VISIBLE_DEVICES" not in env
    assert set(env) <= {"PATH", "HOME", "LANG", "TMPDIR", "NCCL_PROTO", "SGLANG_X"}


def test_probe_source_is_shipped_from_module_utils():
    source = check_module.probe_source()
    assert source == (REPO / "module_utils" / "sglang_args_probe.py").read_text()
    compile(source, "probe", "exec")


@pytest.mark.parametrize("resolved, gpus, explanation", [
    ({"tp_size": 8}, 8, "tp_size 8 = 8 GPU(s) per node"),
    ({"tp_size": 4, "pp_size": 2}, 8, "tp_size 4 x pp_size 2 = 8 GPU(s) per node"),
    ({"tp_size": 2, "dp_size": 4}, 8, "tp_size 2 x dp_size 4 = 8 GPU(s) per node"),
    ({"tp_size": 8, "dp_size": 8, "enable_dp_attention": True}, 8,
     "tp_size 8 x dp_size 8 (dp attention: inside tp) = 8 GPU(s) per node"),
    ({"tp_size": 16, "nnodes": 2}, 8, "tp_size 16 over 2 nodes = 8 GPU(s) per node"),
    ({"tp_size": 2, "base_gpu_id": 6}, 8, "tp_size 2, GPU ids from 6 step 1 = 2 GPU(s) per node"),
    ({"tp_size": 2, "base_gpu_id": 7}, 9, "tp_size 2, GPU ids from 7 step 1 = 2 GPU(s) per node"),
])
def test_gpus_needed(resolved, gpus, explanation):
    assert probe.gpus_needed(resolved) == (gpus, explanation)


@pytest.mark.parametrize("message, argv, flag, rest", [
    ("argument --tensor-parallel-size/--tp-size: invalid int value: 'eight'",
     ["--tp-size", "8", "--tp-size", "eight", "--port", "1"], "--tp-size eight", ["--tp-size", "8", "--port", "1"]),
    ("argument --mem-fraction-static: invalid float value: 'x'",
     ["--mem-fraction-static=x", "--port", "1"], "--mem-fraction-static x", ["--port", "1"]),
    ("argument --port: expected one argument", ["--host", "h", "--port"], "--port", ["--host", "h"]),
    ("unrecognized arguments: --foo 1", ["--foo", "1"], "--foo 1", None),
    ("the following arguments are required: --model-path/--model", [], "--model-path/--model", None),
])
def test_describe_parse_error(message, argv, flag, rest):
    error, remaining = probe.describe_parse_error(message, argv)
    assert error["stage"] == "parse" and error["flag"] == flag and message in error["message"]
    assert remaining == rest
