"""The patch set shipped in roles/sglang_patches/files/sglang-0.5.9, on the REAL pristine wheel.

The wheel is the wheelhouse's (.cache/wheelhouse, built by scripts/setup; tests/patch_set_fixtures.py).

What runs without a GPU, torch or ansible-playbook is tested here: every patch applies (strict
applier and GNU patch), the patched files compile, the patched environ.py refuses a misspelt
SGLANG_ENABLE_SPEC_V2, and the threshold functions of patch 0002 decide as documented.
tests/roles/test_sglang_patch_set_role.py runs the patched draft code on CPU torch and the role
itself through ansible-playbook against a throw-away venv holding the real sglang 0.5.9 files.
"""

import ast
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import types
import warnings

import pytest
import yaml
from patch_set_fixtures import (  # noqa: F401  pylint: disable=unused-import  (fixtures, used by name)
    SET_DIR,
    VERSION,
    patched,
    patches,
    pristine,
    record,
    set_meta,
    ud,
    wheel,
)
from project_modules import REPO

SPEC_ENV = "SGLANG_SPEC_DISABLE_AT_RUNNING_REQUESTS"


# ----------------------------------------------------------------------------------------
# The set itself
# ----------------------------------------------------------------------------------------


def test_set_yml_names_package_version_and_every_patch_in_order(set_meta):
    assert set_meta["package"] == "sglang"
    assert str(set_meta["version"]) == VERSION
    assert set_meta["patches"] == sorted(p.name for p in SET_DIR.glob("*.patch"))
    assert set_meta["patches"] == [
        "0001-strict-sglang-enable-spec-v2.patch",
        "0002-spec-v2-skip-drafting-at-running-requests.patch",
    ]


def test_the_set_is_made_for_the_shared_sglang_version(set_meta):
    shared = yaml.safe_load((REPO / "roles" / "sglang" / "defaults" / "main.yml").read_text())
    assert str(shared["sglang_version"]) == str(set_meta["version"])


def test_every_patch_has_a_header_saying_what_and_why(patches):
    for patch in patches:
        header = patch.header
        assert header.startswith("Subject: "), patch.name
        assert "\nWhat: " in header and "\nWhy: " in header, patch.name
        assert "pristine sglang 0.5.9 wheel" in header, patch.name


def test_patch_paths_are_files_of_the_wheel_with_a_record_hash(patches, record):
    for path in ud.target_paths(patches):
        assert record.get(path), path


def test_pristine_files_match_record(pristine, record):
    for path, data in pristine.items():
        assert hashlib.sha256(data).hexdigest() == record[path]


def test_each_patch_applies_in_order_to_the_pristine_wheel_and_reverses(pristine, patches, patched):
    for path, data in pristine.items():
        assert patched[path] != data
        assert ud.apply_patches(patched[path], path, patches, reverse=True) == data


def test_each_patch_applies_with_gnu_patch_too(tmp_path, pristine):
    assert shutil.which("patch"), "GNU patch is not installed: scripts/setup installs it (apt package patch)"
    for path, data in pristine.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(data)
    for patch_file in sorted(SET_DIR.glob("*.patch")):
        done = subprocess.run(
            ["patch", "-p1", "--forward", "--fuzz=0", "--no-backup-if-mismatch", "-i", str(patch_file)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "offset" not in done.stdout and "fuzz" not in done.stdout, done.stdout


def test_patched_files_compile(patched):
    for path, data in patched.items():
        compile(data, path, "exec", dont_inherit=True)


# ----------------------------------------------------------------------------------------
# Patch 0001: SGLANG_ENABLE_SPEC_V2 is strict
# ----------------------------------------------------------------------------------------


def _load_environ(source, monkeypatch):
    """Load sglang/srt/environ.py alone (its only sglang import is a best-effort side effect)."""
    for name in ("sglang", "sglang.srt", "sglang.srt.debug_utils"):
        stub = types.ModuleType(name)
        stub.__path__ = []
        monkeypatch.setitem(sys.modules, name, stub)
    monkeypatch.setitem(sys.modules, "sglang.srt.debug_utils.cuda_coredump", types.ModuleType("cuda_coredump"))
    module = types.ModuleType("sglang.srt.environ")
    module.__file__ = "sglang/srt/environ.py"
    monkeypatch.setitem(sys.modules, "sglang.srt.environ", module)
    exec(compile(source, "sglang/srt/environ.py", "exec"), module.__dict__)  # noqa: S102
    return module


@pytest.fixture
def environ(patched, monkeypatch):
    monkeypatch.delenv("SGLANG_ENABLE_SPEC_V2", raising=False)
    return _load_environ(patched["sglang/srt/environ.py"], monkeypatch)


@pytest.mark.parametrize("value", ["true", "1", "yes", "y", "TRUE", "True", "Yes"])
def test_spec_v2_true_spellings(environ, monkeypatch, value):
    monkeypatch.setenv("SGLANG_ENABLE_SPEC_V2", value)
    assert environ.envs.SGLANG_ENABLE_SPEC_V2.get() is True


@pytest.mark.parametrize("value", ["false", "0", "no", "n", "FALSE", "No"])
def test_spec_v2_false_spellings(environ, monkeypatch, value):
    monkeypatch.setenv("SGLANG_ENABLE_SPEC_V2", value)
    assert environ.envs.SGLANG_ENABLE_SPEC_V2.get() is False


def test_spec_v2_unset_is_the_default_false(environ):
    assert environ.envs.SGLANG_ENABLE_SPEC_V2.get() is False


@pytest.mark.parametrize("value", ["on", "off", "ture", "", " 1", "2", "enabled"])
def test_spec_v2_other_values_are_refused_naming_the_variable(environ, monkeypatch, value):
    monkeypatch.setenv("SGLANG_ENABLE_SPEC_V2", value)
    with pytest.raises(ValueError, match="SGLANG_ENABLE_SPEC_V2") as err:
        environ.envs.SGLANG_ENABLE_SPEC_V2.get()
    assert repr(value.lower()).strip("'") in str(err.value)


def test_spec_v2_set_by_sglang_itself_still_reads_back(environ):
    """server_args.py calls envs.SGLANG_ENABLE_SPEC_V2.set(True) for some models."""
    with environ.envs.SGLANG_ENABLE_SPEC_V2.override(True):
        assert environ.envs.SGLANG_ENABLE_SPEC_V2.get() is True
    with environ.envs.SGLANG_ENABLE_SPEC_V2.override(False):
        assert environ.envs.SGLANG_ENABLE_SPEC_V2.get() is False


def test_other_booleans_keep_sglang_lenient_behaviour(environ, monkeypatch):
    monkeypatch.setenv("SGLANG_USE_MODELSCOPE", "on")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert environ.envs.SGLANG_USE_MODELSCOPE.get() is False
    assert caught


def test_pristine_environ_silently_turned_spec_v2_off(pristine, monkeypatch):
    """The bug the patch fixes: 'on' only warns and spec v2 is off."""
    module = _load_environ(pristine["sglang/srt/environ.py"], monkeypatch)
    monkeypatch.setenv("SGLANG_ENABLE_SPEC_V2", "on")
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert module.envs.SGLANG_ENABLE_SPEC_V2.get() is False


def test_server_args_reads_spec_v2_first_thing_at_start_up(patched):
    tree = ast.parse(patched["sglang/srt/server_args.py"])
    server_args = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    post_init = next(n for n in server_args.body if isinstance(n, ast.FunctionDef) and n.name == "__post_init__")
    first = next(s for s in post_init.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)))
    assert ast.unparse(first) == "envs.SGLANG_ENABLE_SPEC_V2.get()"


# ----------------------------------------------------------------------------------------
# Patch 0002: the running-request threshold of spec v2
# ----------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def worker_tree(patched):
    return ast.parse(patched["sglang/srt/speculative/eagle_worker_v2.py"])


@pytest.fixture(scope="session")
def threshold_functions(worker_tree):
    """The pure functions and the env-var constant, exec'd alone (the module needs torch)."""
    wanted = {"SPEC_DISABLE_AT_RUNNING_REQUESTS_ENV", "parse_spec_disable_threshold", "should_skip_speculation"}
    nodes = [
        n
        for n in worker_tree.body
        if (isinstance(n, ast.FunctionDef) and n.name in wanted)
        or (isinstance(n, ast.Assign) and any(getattr(t, "id", None) in wanted for t in n.targets))
    ]
    assert len(nodes) == 3
    namespace = {"Optional": __import__("typing").Optional}
    exec(compile(ast.Module(body=nodes, type_ignores=[]), "eagle_worker_v2.py", "exec"), namespace)  # noqa: S102
    return types.SimpleNamespace(**{k: namespace[k] for k in wanted})


def test_env_var_name(threshold_functions):
    assert threshold_functions.SPEC_DISABLE_AT_RUNNING_REQUESTS_ENV == SPEC_ENV


@pytest.mark.parametrize(
    ("running", "threshold", "skip"),
    [
        (0, 0, False),
        (500, 0, False),  # 0 = never skip, the default
        (0, 32, False),
        (31, 32, False),
        (32, 32, True),  # at the threshold: skip
        (33, 32, True),
        (1, 1, True),
        (0, 1, False),  # idle batch
    ],
)
def test_skip_decision(threshold_functions, running, threshold, skip):
    assert threshold_functions.should_skip_speculation(running, threshold) is skip


@pytest.mark.parametrize(("value", "threshold"), [(None, 0), ("", 0), ("  ", 0), ("0", 0), ("32", 32), (" 8 ", 8)])
def test_threshold_parsing(threshold_functions, value, threshold):
    assert threshold_functions.parse_spec_disable_threshold(value) == threshold


@pytest.mark.parametrize("value", ["-1", "abc", "1.5", "32 requests", "true"])
def test_threshold_typos_are_refused_naming_the_variable(threshold_functions, value):
    with pytest.raises(ValueError, match=SPEC_ENV):
        threshold_functions.parse_spec_disable_threshold(value)


def _worker_methods(worker_tree, threshold_functions):
    """EAGLEWorkerV2's skip bookkeeping, bound to a stand-in class (no torch needed)."""
    worker = next(n for n in worker_tree.body if isinstance(n, ast.ClassDef) and n.name == "EAGLEWorkerV2")
    methods = [
        n
        for n in worker.body
        if isinstance(n, ast.FunctionDef) and n.name in ("_init_spec_skip", "_skip_speculation_for")
    ]
    assert len(methods) == 2
    namespace = {
        "os": os,
        "logger": logging.getLogger("eagle_worker_v2_test"),
        "parse_spec_disable_threshold": threshold_functions.parse_spec_disable_threshold,
        "should_skip_speculation": threshold_functions.should_skip_speculation,
        "SPEC_DISABLE_AT_RUNNING_REQUESTS_ENV": SPEC_ENV,
    }
    exec(compile(ast.Module(body=methods, type_ignores=[]), "eagle_worker_v2.py", "exec"), namespace)  # noqa: S102
    return type(
        "Worker",
        (),
        {
            "spec_disable_threshold": None,
            "_spec_skipping": False,
            "topk": 1,
            "tp_rank": 0,
            "server_args": types.SimpleNamespace(enable_dp_attention=False),
            "_init_spec_skip": namespace["_init_spec_skip"],
            "_skip_speculation_for": namespace["_skip_speculation_for"],
        },
    )


def test_worker_skips_at_the_threshold_and_resumes_below(worker_tree, threshold_functions, monkeypatch, caplog):
    monkeypatch.setenv(SPEC_ENV, "4")
    worker = _worker_methods(worker_tree, threshold_functions)()
    caplog.set_level(logging.INFO, logger="eagle_worker_v2_test")
    worker._init_spec_skip()
    decisions = [worker._skip_speculation_for(n) for n in (1, 3, 4, 9, 4, 3, 0, 5)]
    assert decisions == [False, False, True, True, True, False, False, True]
    transitions = [r.getMessage() for r in caplog.records if "speculation:" in r.getMessage()]
    assert transitions == [
        "Skipping speculation: 4 running requests, threshold 4.",
        "Resuming speculation: 3 running requests, threshold 4.",
        "Skipping speculation: 5 running requests, threshold 4.",
    ]


def test_worker_never_skips_by_default(worker_tree, threshold_functions, monkeypatch):
    monkeypatch.delenv(SPEC_ENV, raising=False)
    worker = _worker_methods(worker_tree, threshold_functions)()
    worker._init_spec_skip()
    assert worker.spec_disable_threshold == 0
    assert not any(worker._skip_speculation_for(n) for n in (0, 1, 48, 10_000))


def test_worker_refuses_a_bad_threshold_topk_above_1_or_dp_attention_at_start_up(
    worker_tree, threshold_functions, monkeypatch
):
    cls = _worker_methods(worker_tree, threshold_functions)
    monkeypatch.setenv(SPEC_ENV, "many")
    with pytest.raises(ValueError, match=SPEC_ENV):
        cls()._init_spec_skip()
    monkeypatch.setenv(SPEC_ENV, "8")
    worker = cls()
    worker.topk = 4
    with pytest.raises(ValueError, match="topk 1"):
        worker._init_spec_skip()
    worker = cls()
    worker.server_args = types.SimpleNamespace(enable_dp_attention=True)
    with pytest.raises(ValueError, match="dp-attention"):
        worker._init_spec_skip()
    monkeypatch.setenv(SPEC_ENV, "0")
    worker._init_spec_skip()  # never skipping: nothing to refuse
    assert worker.spec_disable_threshold == 0


def test_worker_subclass_without_init_reads_the_threshold_on_first_use(worker_tree, threshold_functions, monkeypatch):
    """StandaloneWorkerV2 does not call EAGLEWorkerV2.__init__ (nor set tp_rank)."""
    monkeypatch.setenv(SPEC_ENV, "2")
    cls = _worker_methods(worker_tree, threshold_functions)
    del cls.tp_rank
    worker = cls()
    assert worker._skip_speculation_for(2) is True
    assert worker.spec_disable_threshold == 2


def test_worker_init_and_decode_path_use_the_switch(worker_tree):
    """__init__ reads the threshold; the decode branch passes the decision to draft()."""
    worker = next(n for n in worker_tree.body if isinstance(n, ast.ClassDef) and n.name == "EAGLEWorkerV2")
    init = next(n for n in worker.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    assert "self._init_spec_skip()" in ast.unparse(init)
    forward = next(n for n in worker.body if isinstance(n, ast.FunctionDef) and n.name == "forward_batch_generation")
    source = ast.unparse(forward)
    assert "self._skip_speculation_for(len(model_worker_batch.seq_lens))" in source
    assert "self.draft_worker.draft(model_worker_batch, skip_draft_steps=skip_draft_steps)" in source
    draft_worker = next(n for n in worker_tree.body if isinstance(n, ast.ClassDef) and n.name == "EagleDraftWorker")
    draft = ast.unparse(next(n for n in draft_worker.body if isinstance(n, ast.FunctionDef) and n.name == "draft"))
    assert "if can_cuda_graph and (not skip_draft_steps):" in draft
