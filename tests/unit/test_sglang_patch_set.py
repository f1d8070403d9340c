"""The patch set shipped in roles/sglang_patches/files/sglang-0.5.9, on the REAL pristine wheel.

The wheel is looked for in .cache/wheelhouse/ (filled by scripts/setup), then .cache/wheels/,
and downloaded there with `pip download --no-deps sglang==0.5.9` when absent.

What runs without a GPU is tested: every patch applies (strict applier and GNU patch), the
patched files compile, the patched environ.py refuses a misspelt SGLANG_ENABLE_SPEC_V2, and
the threshold functions of patch 0002 decide as documented. The role itself then runs through
ansible-playbook against a throw-away venv holding the real sglang 0.5.9 files.
"""

import ast
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import types
import warnings
import zipfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SET_DIR = REPO / "roles" / "sglang_patches" / "files" / "sglang-0.5.9"
VERSION = "0.5.9"
WHEEL_NAME = f"sglang-{VERSION}-py3-none-any.whl"

import ansible.module_utils  # noqa: E402

if str(REPO / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(REPO / "module_utils"))

from ansible.module_utils import package_patch as pp  # noqa: E402

SPEC_ENV = "SGLANG_SPEC_DISABLE_AT_RUNNING_REQUESTS"
WORKER = "sglang/srt/speculative/eagle_worker_v2.py"


# ----------------------------------------------------------------------------------------
# Fixtures: the pristine wheel and the set
# ----------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def wheel():
    for folder in (REPO / ".cache" / "wheelhouse", REPO / ".cache" / "wheels"):
        if (folder / WHEEL_NAME).is_file():
            return folder / WHEEL_NAME
    dest = REPO / ".cache" / "wheels"
    dest.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", f"sglang=={VERSION}", "-d", str(dest)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0 or not (dest / WHEEL_NAME).is_file():
        pytest.skip(f"sglang {VERSION} wheel not available: {done.stderr[-500:]}")
    return dest / WHEEL_NAME


@pytest.fixture(scope="session")
def set_meta():
    return yaml.safe_load((SET_DIR / "set.yml").read_text())


@pytest.fixture(scope="session")
def patches(set_meta):
    return [pp.parse_patch(name, (SET_DIR / name).read_bytes()) for name in set_meta["patches"]]


@pytest.fixture(scope="session")
def record(wheel):
    """RECORD of the wheel: path -> sha256 hex."""
    with zipfile.ZipFile(wheel) as zf:
        text = zf.read(f"sglang-{VERSION}.dist-info/RECORD").decode()
    out = {}
    for line in text.splitlines():
        path, digest, _ = line.rsplit(",", 2)
        out[path] = pp.record_hash_to_hex(digest)
    return out


@pytest.fixture(scope="session")
def pristine(wheel, patches):
    """Pristine bytes of every file the set touches, straight from the wheel."""
    with zipfile.ZipFile(wheel) as zf:
        return {path: zf.read(path) for path in pp.target_paths(patches)}


@pytest.fixture(scope="session")
def patched(pristine, patches):
    return {path: pp.apply_patches(data, path, patches) for path, data in pristine.items()}


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
    for path in pp.target_paths(patches):
        assert record.get(path), path


def test_pristine_files_match_record(pristine, record):
    for path, data in pristine.items():
        assert hashlib.sha256(data).hexdigest() == record[path]


def test_each_patch_applies_in_order_to_the_pristine_wheel_and_reverses(pristine, patches, patched):
    for path, data in pristine.items():
        assert patched[path] != data
        assert pp.apply_patches(patched[path], path, patches, reverse=True) == data


def test_each_patch_applies_with_gnu_patch_too(tmp_path, pristine):
    if not shutil.which("patch"):
        pytest.skip("GNU patch not installed")
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


def _functions(source, names, cls=None):
    body = ast.parse(source).body
    if cls:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == cls).body
    return [n for n in body if isinstance(n, ast.FunctionDef) and n.name in names]


def test_skipped_draft_keeps_the_tree_shapes_without_any_draft_forward(wheel, patched):
    """EagleDraftWorker.draft_forward with a fake drafter, on CPU torch (skipped where torch is absent).

    Skipping must give the verify pass tensors of the same shapes and the same chain tree
    (so the TARGET_VERIFY CUDA graph still fits), with every draft slot holding the first token.
    """
    torch = pytest.importorskip("torch")
    with zipfile.ZipFile(wheel) as zf:
        common = zf.read("sglang/srt/utils/common.py")
        spec_utils = zf.read("sglang/srt/speculative/spec_utils.py")
    namespace = {"torch": torch, "List": list, "_is_npu": False, "detect_nan": lambda _: None, "ForwardBatch": object}
    nodes = _functions(common, {"fast_topk"}) + _functions(spec_utils, {"select_top_k_tokens"})
    nodes += _functions(patched[WORKER], {"draft_forward"}, cls="EagleDraftWorker")
    exec(compile(ast.Module(body=nodes, type_ignores=[]), WORKER, "exec"), namespace)  # noqa: S102
    batch, hidden, vocab, steps = 5, 8, 50, 3
    forwards = []

    def forward(forward_batch, skip_attn_backend_init):
        forwards.append(forward_batch.input_ids.clone())
        n = forward_batch.input_ids.shape[0]
        out = types.SimpleNamespace(next_token_logits=torch.randn(n, vocab), hidden_states=torch.randn(n, hidden))
        return types.SimpleNamespace(logits_output=out)

    def run(skip):
        forwards.clear()
        first = torch.randint(0, vocab, (batch, 1))
        spec = types.SimpleNamespace(
            topk_p=torch.rand(batch, 1), topk_index=first, hidden_states=torch.randn(batch, hidden)
        )
        forward_batch = types.SimpleNamespace(
            spec_info=spec,
            out_cache_loc=torch.arange(batch * steps),
            batch_size=batch,
            positions=torch.zeros(batch, dtype=torch.long),
        )
        worker = types.SimpleNamespace(
            hot_token_id=None,
            topk=1,
            speculative_num_steps=steps,
            speculative_num_draft_tokens=steps + 1,
            draft_attn_backend=types.SimpleNamespace(attn_backends=[None] * steps),
            draft_runner=types.SimpleNamespace(forward=forward),
            server_args=types.SimpleNamespace(enable_nan_detection=False),
        )
        out = namespace["draft_forward"](worker, forward_batch, skip_draft_steps=skip)
        return out, first, len(forwards)

    (parents, index, tokens), _, normal_forwards = run(False)
    (s_parents, s_index, s_tokens), first, skipped_forwards = run(True)
    assert (normal_forwards, skipped_forwards) == (steps - 1, 0)
    assert torch.equal(parents, s_parents) and torch.equal(index, s_index)
    assert s_tokens.shape == tokens.shape and s_tokens.dtype == tokens.dtype
    assert torch.equal(s_tokens, first.repeat(1, steps))


# ----------------------------------------------------------------------------------------
# The role, end to end, on a venv holding the real sglang 0.5.9 files
# ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def venv(tmp_path_factory, wheel):
    root = tmp_path_factory.mktemp("sglang-venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    python = root / "venv" / "bin" / "python"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--no-compile",
            str(wheel),
        ],
        check=True,
    )
    site = Path(
        subprocess.check_output(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    return types.SimpleNamespace(root=root, python=python, site=site, state=root / "state")


PLAYBOOK = """\
- name: Apply the SGLang patch sets to a local venv
  hosts: localhost
  connection: local
  gather_facts: false
  roles:
    - sglang_patches
  handlers:
    - name: Record the restart
      ansible.builtin.copy:
        content: "restarted\\n"
        dest: "{{ sglang_state_dir }}/restarted"
        mode: "0644"
      listen: Restart sglang service
"""


def run_role(venv, check=False, **extravars):
    playbook = venv.root / "play.yml"
    playbook.write_text(PLAYBOOK)
    variables = {
        "ansible_python_interpreter": sys.executable,
        "sglang_python": str(venv.python),
        "sglang_state_dir": str(venv.state),
        **extravars,
    }
    argv = [
        str(Path(sys.executable).parent / "ansible-playbook"),
        "-i",
        "localhost,",
        str(playbook),
        "-e",
        json.dumps(variables),
    ]
    if check:
        argv += ["--check", "--diff"]
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    recap = done.stdout[done.stdout.rfind("PLAY RECAP") :]
    changed = int(recap.split("changed=")[1].split()[0]) if "changed=" in recap else None
    restarted = (venv.state / "restarted").exists()
    if restarted:
        (venv.state / "restarted").unlink()
    return types.SimpleNamespace(
        rc=done.returncode, out=done.stdout + done.stderr, changed=changed, restarted=restarted
    )


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_role_on_real_sglang_files(venv, record, patched):
    files = {rel: venv.site / rel for rel in patched}
    pristine_hashes = {rel: _sha(p) for rel, p in files.items()}
    assert pristine_hashes == {rel: record[rel] for rel in files}
    manifest = venv.state / "patches" / "sglang.manifest.json"

    # A set for another version is refused before anything is copied or changed.
    wrong = run_role(venv, sglang_version="0.5.8")
    assert wrong.rc != 0 and "made for sglang 0.5.9 but this deployment runs sglang 0.5.8" in wrong.out
    assert not venv.state.exists()

    # Check mode on the fresh node: reports, changes nothing.
    checked = run_role(venv, check=True)
    assert checked.rc == 0, checked.out
    assert checked.changed and "(patched)" in checked.out
    assert {rel: _sha(p) for rel, p in files.items()} == pristine_hashes and not manifest.exists()

    # Fresh apply: the files are the set's result, the service is told to restart.
    first = run_role(venv)
    assert first.rc == 0, first.out
    assert first.restarted
    assert {rel: p.read_bytes() for rel, p in files.items()} == patched
    data = json.loads(manifest.read_text())
    assert [p["name"] for p in data["patches"]] == [
        "sglang-0.5.9/0001-strict-sglang-enable-spec-v2.patch",
        "sglang-0.5.9/0002-spec-v2-skip-drafting-at-running-requests.patch",
    ]
    assert (venv.state / "patches" / "sglang-0.5.9" / "0001-strict-sglang-enable-spec-v2.patch").is_file()
    pyc = files["sglang/srt/environ.py"].parent / "__pycache__" / f"environ.{sys.implementation.cache_tag}.pyc"
    assert pyc.is_file()

    # Second run: nothing changes, no restart.
    again = run_role(venv)
    assert again.rc == 0 and again.changed == 0 and not again.restarted, again.out

    # A hand edit is restored (and restarts the service).
    target = files[WORKER]
    target.write_bytes(target.read_bytes() + b"# edited by hand\n")
    repaired = run_role(venv)
    assert repaired.rc == 0 and repaired.restarted, repaired.out
    assert target.read_bytes() == patched[WORKER]

    # state absent: pristine bytes (RECORD), no manifest, no copied sets.
    removed = run_role(venv, sglang_patches_state="absent")
    assert removed.rc == 0 and removed.restarted, removed.out
    assert {rel: _sha(p) for rel, p in files.items()} == pristine_hashes
    assert not manifest.exists() and not (venv.state / "patches" / "sglang-0.5.9").exists()

    # An operator's own set, given as a controller directory named <package>-<version>
    # (no set.yml), here holding only patch 0002.
    own = venv.root / "operator" / "sglang-0.5.9"
    own.mkdir(parents=True)
    shutil.copy(SET_DIR / "0002-spec-v2-skip-drafting-at-running-requests.patch", own)
    mine = run_role(venv, sglang_patches_sets=[str(own)])
    assert mine.rc == 0 and mine.restarted, mine.out
    assert files[WORKER].read_bytes() == patched[WORKER]
    assert _sha(files["sglang/srt/environ.py"]) == pristine_hashes["sglang/srt/environ.py"]

    # No set left: every patch goes.
    none = run_role(venv, sglang_patches_sets=[])
    assert none.rc == 0 and none.restarted, none.out
    assert {rel: _sha(p) for rel, p in files.items()} == pristine_hashes and not manifest.exists()
