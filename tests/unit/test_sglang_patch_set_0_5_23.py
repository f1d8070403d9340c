"""The patch set ported to SGLang 0.5.23 (roles/sglang_patches/files/sglang-0.5.23), on the REAL wheel.

Both wheels come from the wheelhouse (.cache/wheelhouse; scripts/build-wheelhouse fetches sglang
0.5.23 from tests/wheelhouse/parser-requirements-0.5.23.txt). The set ports patch 0002 and
declares 0001 obsolete: 0.5.23 no longer reads SGLANG_ENABLE_SPEC_V2. Tested here without a GPU:
every shipped set applies to its own wheel (strict applier and GNU patch, no offset or fuzz), the
set accounts for every patch of the 0.5.9 set, its obsolete rule holds on 0.5.23 and not on 0.5.9,
and the ported threshold code decides as the 0.5.9 version does.
"""

import ast
import hashlib
import logging
import os
import shutil
import subprocess
import types
import zipfile

import pytest
import yaml
from parser_venv import WHEELHOUSE, ensure_wheelhouse
from patch_set_fixtures import pp, ud
from project_modules import REPO

SETS = REPO / "roles" / "sglang_patches" / "files"
SET_DIR = SETS / "sglang-0.5.23"
ORIGIN_DIR = SETS / "sglang-0.5.9"
WORKER = "sglang/srt/speculative/eagle_worker_v2.py"
SPEC_ENV = "SGLANG_SPEC_DISABLE_AT_RUNNING_REQUESTS"
SHIPPED_SETS = sorted(p.parent.name for p in SETS.glob("*/set.yml"))


def _meta(set_dir):
    return yaml.safe_load((set_dir / "set.yml").read_text())


def _wheel(version):
    """The wheelhouse's pristine sglang wheel of that version; an AssertionError naming the fix when absent."""
    ensure_wheelhouse()
    found = sorted(WHEELHOUSE.glob(f"sglang-{version}-*.whl"))
    assert len(found) == 1, (
        f"the wheelhouse holds {[p.name for p in found]} for sglang {version}: run scripts/build-wheelhouse --force"
    )
    return found[0]


def _patches(set_dir):
    return [ud.parse_patch(name, (set_dir / name).read_bytes()) for name in _meta(set_dir)["patches"]]


def _pristine(wheel, paths):
    with zipfile.ZipFile(wheel) as zf:
        return {path: zf.read(path) for path in paths}


@pytest.fixture(scope="module")
def wheel():
    return _wheel("0.5.23")


@pytest.fixture(scope="module")
def patched(wheel):
    patches = _patches(SET_DIR)
    return {path: ud.apply_patches(data, path, patches) for path, data in _pristine(wheel, ud.target_paths(patches)).items()}


# ----------------------------------------------------------------------------------------
# Every shipped set on its own real wheel
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("set_name", SHIPPED_SETS)
def test_each_shipped_set_applies_to_its_real_wheel_and_reverses(set_name):
    set_dir = SETS / set_name
    meta = _meta(set_dir)
    assert set_name == f"{meta['package']}-{meta['version']}"
    wheel = _wheel(meta["version"])
    patches = _patches(set_dir)
    with zipfile.ZipFile(wheel) as zf:
        record_text = zf.read(f"sglang-{meta['version']}.dist-info/RECORD").decode()
    record = {}
    for line in record_text.splitlines():
        path, digest, _ = line.rsplit(",", 2)
        record[path] = digest
    for path, data in _pristine(wheel, ud.target_paths(patches)).items():
        assert hashlib.sha256(data).hexdigest() == pp.record_hash_to_hex(record[path]), path
        result = ud.apply_patches(data, path, patches)
        assert result != data
        compile(result, path, "exec", dont_inherit=True)
        assert ud.apply_patches(result, path, patches, reverse=True) == data


@pytest.mark.parametrize("set_name", SHIPPED_SETS)
def test_each_shipped_set_applies_with_gnu_patch_without_offset_or_fuzz(set_name, tmp_path):
    assert shutil.which("patch"), "GNU patch is not installed: scripts/setup installs it (apt package patch)"
    set_dir = SETS / set_name
    meta = _meta(set_dir)
    for path, data in _pristine(_wheel(meta["version"]), ud.target_paths(_patches(set_dir))).items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(data)
    for name in meta["patches"]:
        done = subprocess.run(
            ["patch", "-p1", "--forward", "--fuzz=0", "--no-backup-if-mismatch", "-i", str(set_dir / name)],
            cwd=tmp_path, capture_output=True, text=True, check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "offset" not in done.stdout and "fuzz" not in done.stdout, done.stdout


# ----------------------------------------------------------------------------------------
# The 0.5.23 set: what it ports, what it declares obsolete
# ----------------------------------------------------------------------------------------


def test_set_yml_accounts_for_every_patch_of_the_0_5_9_set():
    meta, origin = _meta(SET_DIR), _meta(ORIGIN_DIR)
    assert (meta["package"], str(meta["version"])) == ("sglang", "0.5.23")
    assert meta["patches"] == sorted(p.name for p in SET_DIR.glob("*.patch"))
    assert meta["patches"] == ["0002-spec-v2-skip-drafting-at-running-requests.patch"]
    assert sorted(meta["obsolete"]) == ["0001-strict-sglang-enable-spec-v2.patch"]
    # Each 0.5.9 patch is ported under its own name or declared obsolete, never both.
    assert sorted(meta["patches"] + list(meta["obsolete"])) == origin["patches"]
    for rule in meta["obsolete"].values():
        assert {"file", "why"} < set(rule) <= {"file", "contains", "lacks", "why"}, rule
        assert all(isinstance(v, str) and v for v in rule.values())


def test_the_0_5_9_patches_do_not_apply_to_0_5_23(wheel):
    """Why the set had to be ported: both 0.5.9 patches conflict with the 0.5.23 wheel."""
    for patch in _patches(ORIGIN_DIR):
        paths = ud.target_paths([patch])
        with pytest.raises(ud.PatchError):
            for path, data in _pristine(wheel, paths).items():
                ud.apply_patches(data, path, [patch])


def _rule_holds(rule, data):
    """The upgrade report's reading of an obsolete rule: `file` holds `contains` and lacks `lacks`."""
    return (rule.get("contains", "").encode() in data) and not ("lacks" in rule and rule["lacks"].encode() in data)


def test_obsolete_rule_holds_on_0_5_23_and_not_on_0_5_9(wheel):
    rule = _meta(SET_DIR)["obsolete"]["0001-strict-sglang-enable-spec-v2.patch"]
    assert _rule_holds(rule, _pristine(wheel, [rule["file"]])[rule["file"]])
    assert not _rule_holds(rule, _pristine(_wheel("0.5.9"), [rule["file"]])[rule["file"]])


def test_0_5_23_reads_sglang_enable_spec_v2_nowhere_and_always_runs_the_v2_worker(wheel):
    """What makes 0001 obsolete: no file of the 0.5.23 wheel names the variable 0001 makes strict,
    and EAGLE/EAGLE3 pick the V2 worker unconditionally; 0.5.9 read it and picked by it."""
    with zipfile.ZipFile(wheel) as zf:
        naming = [n for n in zf.namelist() if n.endswith(".py") and b"SGLANG_ENABLE_SPEC_V2" in zf.read(n)]
        spec_info = zf.read("sglang/srt/speculative/spec_info.py")
    assert naming == []
    assert b"# EAGLE / EAGLE3 / STANDALONE / MULTI_LAYER always use the V2 worker," in spec_info
    assert b"SGLANG_ENABLE_SPEC_V2 = EnvBool(False)" in _pristine(_wheel("0.5.9"), ["sglang/srt/environ.py"])[
        "sglang/srt/environ.py"
    ]


def test_ported_patch_keeps_its_subject_and_says_what_changed_against_0_5_9(project_module):
    """production_doc prints the header by its sections: the port's changes are one of them."""
    header = project_module("roles/production_doc/filter_plugins/patch_header.py").patch_header
    ported = header((SET_DIR / "0002-spec-v2-skip-drafting-at-running-requests.patch").read_text())
    origin = header((ORIGIN_DIR / "0002-spec-v2-skip-drafting-at-running-requests.patch").read_text())
    assert ported["subject"] == origin["subject"]
    sections = {section["label"]: section["text"] for section in ported["sections"]}
    assert list(sections) == ["What", "How far the skip goes", "Changed in the port", "Why", "Files"]
    assert sections["Changed in the port"].startswith("against the 0.5.9 version, the environment variable")
    assert sections["Files"].endswith("pristine sglang 0.5.23 wheel, ported from the 0.5.9 version. Local patch of sglang-canon.")


# ----------------------------------------------------------------------------------------
# Patch 0002 as ported: the same decisions as its 0.5.9 version
# ----------------------------------------------------------------------------------------

PURE = ("SPEC_DISABLE_AT_RUNNING_REQUESTS_ENV", "parse_spec_disable_threshold", "should_skip_speculation")


def _pure_nodes(tree):
    return [
        n
        for n in tree.body
        if (isinstance(n, ast.FunctionDef) and n.name in PURE)
        or (isinstance(n, ast.Assign) and any(getattr(t, "id", None) in PURE for t in n.targets))
    ]


@pytest.fixture(scope="module")
def worker_tree(patched):
    return ast.parse(patched[WORKER])


def test_pure_threshold_code_is_the_0_5_9_versions_unchanged(worker_tree):
    origin_patches = _patches(ORIGIN_DIR)
    origin = _pristine(_wheel("0.5.9"), [WORKER])[WORKER]
    origin_tree = ast.parse(ud.apply_patches(origin, WORKER, origin_patches))
    ported, before = _pure_nodes(worker_tree), _pure_nodes(origin_tree)
    assert len(ported) == 3
    assert [ast.dump(n) for n in ported] == [ast.dump(n) for n in before]


def _worker_class(worker_tree, adaptive=False):
    """EAGLEWorkerV2's skip bookkeeping, bound to a stand-in class (no torch, no SGLang runtime)."""
    namespace = {"Optional": __import__("typing").Optional}
    exec(compile(ast.Module(body=_pure_nodes(worker_tree), type_ignores=[]), WORKER, "exec"), namespace)  # noqa: S102
    worker = next(n for n in worker_tree.body if isinstance(n, ast.ClassDef) and n.name == "EAGLEWorkerV2")
    methods = [n for n in worker.body if isinstance(n, ast.FunctionDef) and n.name in ("_init_spec_skip", "_skip_speculation_for")]
    assert len(methods) == 2
    logger = logging.getLogger("eagle_worker_v2_0_5_23_test")
    namespace.update(
        os=os,
        logger=logger,
        get_spec=lambda: types.SimpleNamespace(speculative_adaptive=adaptive),
        log_info_on_rank0=lambda log, message: log.info(message),
        # SGLang's own reading of the attention-DP width (its adaptive speculation refuses DP the same way).
        resolved_view=lambda server_args: server_args,
        attn_dp_enabled_of=lambda view: view.attn_dp_size > 1,
    )
    exec(compile(ast.Module(body=methods, type_ignores=[]), WORKER, "exec"), namespace)  # noqa: S102
    return type(
        "Worker",
        (),
        {
            "spec_disable_threshold": None,
            "_spec_skipping": False,
            "topk": 1,
            "server_args": types.SimpleNamespace(attn_dp_size=1, enable_dp_attention=False),
            "_init_spec_skip": namespace["_init_spec_skip"],
            "_skip_speculation_for": namespace["_skip_speculation_for"],
        },
    )


def test_worker_skips_at_the_threshold_and_resumes_below(worker_tree, monkeypatch, caplog):
    monkeypatch.setenv(SPEC_ENV, "4")
    caplog.set_level(logging.INFO, logger="eagle_worker_v2_0_5_23_test")
    worker = _worker_class(worker_tree)()  # no __init__ call: read on first use (StandaloneWorkerV2)
    decisions = [worker._skip_speculation_for(n) for n in (1, 3, 4, 9, 4, 3, 0, 5)]
    assert decisions == [False, False, True, True, True, False, False, True]
    transitions = [r.getMessage() for r in caplog.records if "speculation:" in r.getMessage()]
    assert transitions == [
        "Skipping speculation: 4 running requests, threshold 4.",
        "Resuming speculation: 3 running requests, threshold 4.",
        "Skipping speculation: 5 running requests, threshold 4.",
    ]


def test_worker_refuses_bad_threshold_topk_attention_dp_and_adaptive_at_start_up(worker_tree, monkeypatch):
    monkeypatch.setenv(SPEC_ENV, "many")
    with pytest.raises(ValueError, match=SPEC_ENV):
        _worker_class(worker_tree)()._init_spec_skip()
    monkeypatch.setenv(SPEC_ENV, "8")
    worker = _worker_class(worker_tree)()
    worker.topk = 4
    with pytest.raises(ValueError, match="topk 1"):
        worker._init_spec_skip()
    worker = _worker_class(worker_tree)()
    # 0.5.23 leaves enable_dp_attention false and takes attention DP from --attn-dp-size.
    worker.server_args = types.SimpleNamespace(attn_dp_size=2, enable_dp_attention=False)
    with pytest.raises(ValueError, match="attention DP"):
        worker._init_spec_skip()
    with pytest.raises(ValueError, match="--speculative-adaptive"):
        _worker_class(worker_tree, adaptive=True)()._init_spec_skip()
    monkeypatch.setenv(SPEC_ENV, "0")
    worker = _worker_class(worker_tree, adaptive=True)()
    worker._init_spec_skip()  # never skipping: nothing to refuse, adaptive or not
    assert worker.spec_disable_threshold == 0


def test_init_decode_path_draft_and_draft_forward_use_the_switch(worker_tree):
    classes = {n.name: n for n in worker_tree.body if isinstance(n, ast.ClassDef)}

    def method(cls, name):
        return ast.unparse(next(n for n in classes[cls].body if isinstance(n, ast.FunctionDef) and n.name == name))

    assert "self._init_spec_skip()" in method("EAGLEWorkerV2", "__init__")
    assert "attn_dp_enabled_of(resolved_view(self.server_args))" in method("EAGLEWorkerV2", "_init_spec_skip")
    imported = {alias.name for n in worker_tree.body if isinstance(n, ast.ImportFrom) for alias in n.names}
    assert {"attn_dp_enabled_of", "resolved_view", "log_info_on_rank0", "get_spec"} <= imported
    forward = method("EAGLEWorkerV2", "forward_batch_generation")
    assert "skip_draft_steps = self._skip_speculation_for(batch.seq_lens.shape[0])" in forward
    assert "self.draft_worker.draft(batch, skip_draft_steps=skip_draft_steps)" in forward
    draft = method("EagleDraftWorker", "draft")
    assert "if can_run_decode_cuda_graph and (not skip_draft_steps):" in draft
    assert "self.draft_forward(forward_batch, skip_draft_steps=skip_draft_steps)" in draft
    assert "get_spec().speculative_use_rejection_sampling" in draft.split("n_inner =")[0]
    draft_forward = method("EagleDraftWorker", "draft_forward")
    assert "draft_tokens_topk1[:, i + 1:i + 2].copy_(topk_index)" in draft_forward


# ----------------------------------------------------------------------------------------
# scripts/build-wheelhouse: two versions of one package (0.5.9's and 0.5.23's transformers)
# ----------------------------------------------------------------------------------------


def test_build_wheelhouse_downloads_two_versions_of_a_package_in_separate_calls(project_module):
    build = project_module("scripts/build-wheelhouse")
    pins = [("sglang", "0.5.9"), ("transformers", "4.57.1"), ("sglang", "0.5.23"), ("transformers", "5.19.0"), ("msgspec", "0.23.0")]
    assert build.one_version_per_name(pins) == [
        [("sglang", "0.5.9"), ("transformers", "4.57.1"), ("msgspec", "0.23.0")],
        [("sglang", "0.5.23"), ("transformers", "5.19.0")],
    ]
    pinned = dict(build.read_pins(build.UPGRADE_PARSER_REQUIREMENTS))
    assert pinned["sglang"] == "0.5.23" and build.UPGRADE_PARSER_REQUIREMENTS in build.REQUIREMENT_FILES
