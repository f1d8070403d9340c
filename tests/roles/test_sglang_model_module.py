"""The sglang_model module for real on this machine: synthetic models (tests/double/make_test_models.py,
written with the safetensors package of .cache/parser-venv) served by the HTTP mirror double
(tests/double/model_mirror.py) or read from a directory, placed into temporary folders.
The pure logic alone is tested in tests/unit/test_model_logic.py."""

import base64
import hashlib
import json
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest
from ansible.module_utils.testing import patch_module_args
from project_modules import REPO

sys.path.insert(0, str(REPO / "tests"))

from model_fixtures import MirrorProcess, make_models  # noqa: E402  pylint: disable=wrong-import-position


@pytest.fixture(scope="module")
def model_module(project_module):
    # The module imports its helpers as ansible.module_utils.* (ansible.cfg's module_utils path at run
    # time); make those names resolve to the repository's files here.
    for name in ("model_manifest", "model_checks", "model_sources", "model_hub"):
        project_module(f"module_utils/{name}.py", as_name="ansible.module_utils." + name)
    return project_module("library/sglang_model.py")


@pytest.fixture(scope="module")
def models(tmp_path_factory, parser_python):
    """(folder with target/ and draft/, their manifests), written once for the module."""
    root = tmp_path_factory.mktemp("models-src")
    return root, make_models(parser_python, root)


@pytest.fixture
def mirror(models, tmp_path):
    process = MirrorProcess(models[0], tmp_path / "mirror.log")
    yield process
    process.stop()


@pytest.fixture
def run_model(model_module, capsys):
    """Run the module with these arguments; its result, asserting it failed only when `fail`."""

    def run(check=False, fail=False, **args):
        args.setdefault("label", "sglang_models_target_source")
        with patch_module_args(dict(args, _ansible_check_mode=check)):
            with pytest.raises(SystemExit) as exit_info:
                model_module.main()
        result = json.loads(capsys.readouterr().out)
        assert (exit_info.value.code != 0) == fail, result
        return result

    return run


def _inodes(folder):
    return dict((p.name, p.stat().st_ino) for p in Path(folder).iterdir())


def _gets(mirror):
    return [(r["path"], r["range"]) for r in mirror.requests() if r["method"] == "GET"]


def test_fresh_placement_then_a_no_op_that_hashes_nothing(run_model, models, mirror, tmp_path):
    dest = tmp_path / "data" / "target"
    manifest = models[1]["target"]
    args = dict(path=str(dest), source={"type": "http", "url": mirror.url + "/target"}, manifest=manifest,
                revision="snapshot-1")

    first = run_model(**args)
    assert first["changed"] is True and first["state"] == "placed"
    assert [f["path"] for f in first["fetch"]] == sorted(e["path"] for e in manifest)
    assert first["config"]["architectures"] == ["LlamaForCausalLM"] and first["hashed"] == []
    for entry in manifest:
        placed = dest / entry["path"]
        assert placed.stat().st_size == entry["size"]
        assert stat.S_IMODE(placed.stat().st_mode) == 0o644 and placed.stat().st_uid == 0
    assert stat.S_IMODE(dest.stat().st_mode) == 0o755
    record = json.loads((dest / ".sglang-model.json").read_text())
    assert record["manifest_digest"] == first["manifest_digest"] and record["revision"] == "snapshot-1"
    assert not list((tmp_path / "data").glob(".target.*"))  # no staging or previous folder left

    before = len(mirror.requests())
    second = run_model(**args)
    assert second["changed"] is False and second["state"] == "verified"
    assert second["hashed"] == [] and second["fetch"] == []
    assert mirror.requests()[before:] == []  # nothing fetched, not even config.json

    full = run_model(verify="full", **args)
    assert full["changed"] is False and sorted(full["hashed"]) == sorted(e["path"] for e in manifest)


def test_a_corrupted_shard_is_refetched_alone_and_swapped_in(run_model, models, mirror, tmp_path):
    dest = tmp_path / "target"
    args = dict(path=str(dest), source={"type": "http", "url": mirror.url + "/target"}, manifest=models[1]["target"])
    run_model(**args)
    shard = dest / "model-00002-of-00002.safetensors"
    inodes = _inodes(dest)
    with open(shard, "r+b") as handle:  # same size, other bytes, mtime moves
        handle.seek(1000)
        handle.write(b"\x00" * 64)
    start = len(mirror.requests())

    repaired = run_model(**args)
    assert repaired["changed"] is True
    assert repaired["fetch"] == [{"path": shard.name, "reason": repaired["fetch"][0]["reason"]}]
    assert repaired["fetch"][0]["reason"].startswith("sha256 ")
    assert repaired["drifted"] == ["%s: %s" % (shard, repaired["fetch"][0]["reason"])]  # what drift.yml lists
    assert [r["path"] for r in mirror.requests()[start:]] == ["target/" + shard.name]
    after = _inodes(dest)
    assert after[shard.name] != inodes[shard.name]
    assert all(after[name] == inodes[name] for name in inodes if name not in (shard.name, ".sglang-model.json"))
    assert run_model(verify="full", **args)["changed"] is False


def test_a_corruption_hidden_from_size_and_mtime_is_found_by_full_verify(run_model, models, mirror, tmp_path):
    dest = tmp_path / "target"
    args = dict(path=str(dest), source={"type": "http", "url": mirror.url + "/target"}, manifest=models[1]["target"])
    run_model(**args)
    shard = dest / "model-00001-of-00002.safetensors"
    times = shard.stat()
    with open(shard, "r+b") as handle:
        handle.seek(500)
        handle.write(b"\x01" * 8)
    os.utime(shard, ns=(times.st_atime_ns, times.st_mtime_ns))

    assert run_model(check=True, **args)["changed"] is False
    scan = run_model(check=True, verify="full", **args)
    assert scan["changed"] is True and [f["path"] for f in scan["fetch"]] == [shard.name]
    assert scan["fetch"][0]["reason"].endswith("manifest says %s" % next(
        e["sha256"] for e in models[1]["target"] if e["path"] == shard.name))
    assert not (tmp_path / ".target.sglang-staging").exists()  # check mode fetched nothing


def test_a_source_that_does_not_match_the_manifest_is_refused_and_nothing_is_replaced(run_model, models, tmp_path):
    source = tmp_path / "source"
    shutil.copytree(models[0] / "target", source)
    dest = tmp_path / "target"
    manifest = models[1]["target"]
    run_model(path=str(dest), source={"type": "dir", "path": str(source)}, manifest=manifest)
    inodes, shard = _inodes(dest), "model-00002-of-00002.safetensors"
    (dest / shard).unlink()  # the node lost a shard ...
    data = bytearray((source / shard).read_bytes())  # ... and the source's copy went bad
    data[100] ^= 0xFF
    (source / shard).write_bytes(bytes(data))

    refused = run_model(fail=True, path=str(dest), source={"type": "dir", "path": str(source)}, manifest=manifest)
    expected = next(e for e in manifest if e["path"] == shard)
    assert "does not match the pinned manifest: %s has %d bytes with sha256 " % (shard, expected["size"]) in refused["msg"]
    assert "the manifest says %d bytes with sha256 %s" % (expected["size"], expected["sha256"]) in refused["msg"]
    remaining = _inodes(dest)
    assert all(remaining[name] == inodes[name] for name in remaining)  # the folder is as it was


def test_an_interrupted_fetch_is_resumed_from_its_partial_file(run_model, models, tmp_path):
    shard = "model-00001-of-00002.safetensors"
    cutting = MirrorProcess(models[0], tmp_path / "cut.log", cuts=[("target/" + shard, 300000)])
    dest = tmp_path / "target"
    args = dict(path=str(dest), manifest=models[1]["target"])
    try:
        interrupted = run_model(fail=True, source={"type": "http", "url": cutting.url + "/target"}, **args)
    finally:
        cutting.stop()
    assert "was interrupted after 300000 of" in interrupted["msg"] or "ended %s after 300000" % shard in interrupted["msg"]
    assert not dest.exists()
    part = tmp_path / ".target.sglang-staging" / (shard + ".part")
    assert part.stat().st_size == 300000

    resuming = MirrorProcess(models[0], tmp_path / "resume.log")
    try:
        done = run_model(source={"type": "http", "url": resuming.url + "/target"}, **args)
        gets = _gets(resuming)
    finally:
        resuming.stop()
    assert done["changed"] is True
    assert ("target/" + shard, "bytes=300000-") in gets
    assert (dest / shard).read_bytes() == (models[0] / "target" / shard).read_bytes()


def test_not_enough_disk_is_refused_before_anything_is_fetched(model_module, run_model, models, mirror, tmp_path, monkeypatch):
    monkeypatch.setattr(model_module, "_available", lambda path: 1000)
    dest = tmp_path / "target"
    refused = run_model(fail=True, path=str(dest), source={"type": "http", "url": mirror.url + "/target"},
                        manifest=models[1]["target"])
    needed = sum(e["size"] for e in models[1]["target"])
    assert refused["msg"] == ("not enough free space for sglang_models_target_source: the files still to fetch need "
                              "%d bytes (0.00 GiB) on the filesystem of %s, 1000 bytes (0.00 GiB) are available"
                              % (needed, tmp_path))
    assert mirror.requests() == [] and not dest.exists()


def test_check_mode_reads_config_and_mapping_tensors_from_the_source(run_model, models, mirror, tmp_path):
    dest = tmp_path / "draft"
    scan = run_model(check=True, path=str(dest), source={"type": "http", "url": mirror.url + "/draft"},
                     manifest=models[1]["draft"], inspect_tensors=["d2t", "t2d"])
    assert scan["changed"] is True and not dest.exists()
    assert scan["config"]["architectures"] == ["LlamaForCausalLMEagle3"]
    assert scan["tensors"] == {"d2t": [512], "t2d": [1024]}
    assert all(r["range"] for r in mirror.requests())  # only byte ranges: config.json and headers


def test_ownership_drift_and_a_swap_stopped_halfway_are_repaired(run_model, models, mirror, tmp_path):
    dest = tmp_path / "target"
    args = dict(path=str(dest), source={"type": "http", "url": mirror.url + "/target"}, manifest=models[1]["target"])
    run_model(**args)
    (dest / "config.json").chmod(0o666)
    fixed = run_model(**args)
    assert fixed["changed"] is True and fixed["ownership"] == [str(dest / "config.json")]
    assert stat.S_IMODE((dest / "config.json").stat().st_mode) == 0o644

    dest.rename(tmp_path / ".target.sglang-previous")  # stopped between the two renames
    start = len(mirror.requests())
    back = run_model(**args)
    assert back["changed"] is True and dest.is_dir() and not (tmp_path / ".target.sglang-previous").exists()
    assert mirror.requests()[start:] == []  # every file was hard-linked back, none fetched


def test_an_unmanaged_folder_is_only_read(run_model, models):
    result = run_model(path=str(models[0] / "draft"), inspect_tensors=["d2t"])
    assert result["state"] == "unmanaged" and result["changed"] is False
    assert result["tensors"] == {"d2t": [512]}
    assert sorted(f["path"] for f in result["files"]) == ["config.json", "model.safetensors"]


# --------------------------------------------------------------------------- Hugging Face Hub source

COMMIT = "4f2a9c0e1b3d5f7a9c0e1b3d5f7a9c0e1b3d5f7a"
TOKEN = "hf_test_token_not_a_secret"


@pytest.fixture
def hub(models, tmp_path):
    process = MirrorProcess.hub(models[0] / "target", tmp_path / "hub.log", "example/target", COMMIT, TOKEN)
    yield process
    process.stop()


def test_a_hub_source_at_a_pinned_commit_records_its_manifest_on_first_fetch(run_model, models, hub, tmp_path,
                                                                              parser_python):
    dest = tmp_path / "target"
    args = dict(path=str(dest), hf_python=str(parser_python), hf_token=TOKEN,
                source={"type": "hf", "repo": "example/target", "revision": COMMIT, "endpoint": hub.url})
    first = run_model(**args)
    assert first["changed"] is True and first["state"] == "placed"
    expected = sorted(models[1]["target"], key=lambda e: e["path"])
    record = json.loads((dest / ".sglang-model.json").read_text())
    assert record["manifest"] == expected  # LFS sha256 from the Hub, the git files hashed after their blob id
    assert record["source"] == {"type": "hf", "repo": "example/target", "revision": COMMIT, "endpoint": hub.url}
    for entry in expected:
        assert (dest / entry["path"]).stat().st_size == entry["size"]
    assert not (tmp_path / ".target.sglang-staging").exists() and not (dest / ".hub").exists()
    requests = hub.requests()
    assert requests and all(r["token"] is True for r in requests)  # HF_TOKEN reached huggingface_hub
    assert any(r["path"].startswith("/example/target/resolve/%s/" % COMMIT) and r["method"] == "HEAD"
               for r in requests)  # hf_hub_download's metadata request, then its download
    assert TOKEN not in json.dumps(first)

    before = len(hub.requests())
    second = run_model(**args)
    assert second["changed"] is False and second["hashed"] == []
    assert hub.requests()[before:] == []  # the recorded manifest of a pinned commit: the Hub is not asked


def test_a_hub_branch_instead_of_a_commit_is_refused(run_model, tmp_path, parser_python):
    refused = run_model(fail=True, path=str(tmp_path / "t"), hf_python=str(parser_python),
                        source={"type": "hf", "repo": "example/target", "revision": "main"})
    assert refused["msg"] == ("sglang_models_target_source.revision must be the commit hash of the files "
                              "(40 hex digits), not a branch or tag that can move: 'main'")


def test_a_hub_without_the_token_is_refused_naming_the_repository(run_model, hub, tmp_path, parser_python):
    refused = run_model(fail=True, path=str(tmp_path / "t"), hf_python=str(parser_python),
                        source={"type": "hf", "repo": "example/target", "revision": COMMIT, "endpoint": hub.url})
    assert refused["msg"].startswith("huggingface_hub (%s) failed on example/target at %s: " % (parser_python, COMMIT))
    assert not (tmp_path / "t").exists()


def test_a_newly_pinned_sha256_is_not_vouched_for_by_the_old_mtime(run_model, models, mirror, tmp_path):
    dest = tmp_path / "target"
    manifest = models[1]["target"]
    args = dict(path=str(dest), source={"type": "http", "url": mirror.url + "/target"})
    run_model(manifest=manifest, **args)
    pinned = [dict(e, sha256="0" * 64) if e["path"] == "config.json" else e for e in manifest]
    inodes = _inodes(dest)
    refused = run_model(fail=True, manifest=pinned, **args)  # the mirror still serves the old bytes
    assert "does not match the pinned manifest: config.json" in refused["msg"]
    assert _inodes(dest) == inodes
    back = run_model(manifest=manifest, **args)  # the old pin again: verified by stat, leftovers removed
    assert back["hashed"] == [] and back["leftovers"] == [str(tmp_path / ".target.sglang-staging")]


def test_a_missing_unmanaged_folder_names_the_server_argument(run_model, tmp_path):
    refused = run_model(fail=True, path=str(tmp_path / "absent"), path_var="sglang_server_args.model_path")
    assert refused["msg"] == ("sglang_server_args.model_path: %s has no config.json: the model folder is missing or "
                              "incomplete, and sglang_models_target_source gives no source to fetch it from"
                              % (tmp_path / "absent"))


# --------------------------------------------------------------------------- what a source may not give or hold

SHARD = "model-00002-of-00002.safetensors"


@pytest.mark.parametrize("link", ["absolute", "relative"])
def test_a_link_out_of_a_dir_source_is_refused_before_anything_is_fetched(run_model, models, tmp_path, link):
    # A root-only file the manifest pins (as a manifest made from the source's links would):
    # today's module copied it into the model folder readable by everyone.
    secret = tmp_path / "shadow"
    secret.write_bytes(b"root:$6$not-a-real-hash:19000:0:99999:7:::\n")
    secret.chmod(0o600)
    source = tmp_path / "source"
    shutil.copytree(models[0] / "target", source)
    (source / "tokenizer.json").unlink()
    (source / "tokenizer.json").symlink_to(secret if link == "absolute" else "../shadow")
    manifest = [dict(e, size=len(secret.read_bytes()), sha256=hashlib.sha256(secret.read_bytes()).hexdigest())
                if e["path"] == "tokenizer.json" else e for e in models[1]["target"]]
    dest = tmp_path / "target"
    args = dict(path=str(dest), source={"type": "dir", "path": str(source)}, manifest=manifest)
    expected = ("sglang_models_target_source: %s/tokenizer.json in the dir source %s is a symbolic link to %s, which "
                "leads to %s outside the source folder" % (source, source, os.readlink(source / "tokenizer.json"), secret))
    for check in (True, False):
        refused = run_model(fail=True, check=check, **args)
        assert refused["msg"].startswith(expected), refused["msg"]
    assert not dest.exists() and not (tmp_path / ".target.sglang-staging").exists()  # nothing fetched


def test_links_that_stay_inside_a_dir_source_are_followed(run_model, models, tmp_path):
    # A link to a deduplicated blob inside the source gives nothing the source could not give as a file.
    source = tmp_path / "source"
    shutil.copytree(models[0] / "target", source)
    (source / "blobs").mkdir()
    (source / SHARD).rename(source / "blobs" / "abc")
    (source / SHARD).symlink_to("blobs/abc")
    placed = run_model(path=str(tmp_path / "target"), source={"type": "dir", "path": str(source)},
                       manifest=models[1]["target"])
    assert placed["state"] == "placed"
    assert (tmp_path / "target" / SHARD).read_bytes() == (models[0] / "target" / SHARD).read_bytes()
    assert not (tmp_path / "target" / SHARD).is_symlink()


def test_files_not_in_the_manifest_are_reported_on_every_run_and_removed_by_the_swap(run_model, models, mirror,
                                                                                      tmp_path):
    dest = tmp_path / "target"
    args = dict(path=str(dest), source={"type": "http", "url": mirror.url + "/target"}, manifest=models[1]["target"])
    run_model(**args)
    inodes = _inodes(dest)
    (dest / "model-00003-of-00002.safetensors").write_bytes(b"\x00" * 64)  # SGLang would load it as weights
    (dest / "stray" / "deeper").mkdir(parents=True)
    (dest / "stray" / "deeper" / "notes.txt").write_text("x")
    extra = ["model-00003-of-00002.safetensors", "stray"]
    start = len(mirror.requests())
    for verify in ("quick", "full"):
        scan = run_model(check=True, verify=verify, **args)
        assert scan["changed"] is True and scan["unexpected"] == extra and scan["fetch"] == []
        assert scan["drifted"] == ["%s: not in the manifest" % (dest / path) for path in extra]
    assert (dest / "stray").exists()  # check mode removed nothing

    repaired = run_model(**args)
    assert repaired["changed"] is True and repaired["state"] == "placed"
    assert sorted(os.listdir(dest)) == sorted([".sglang-model.json"] + [e["path"] for e in models[1]["target"]])
    after = _inodes(dest)
    assert all(after[name] == inodes[name] for name in after if name != ".sglang-model.json")  # hard links: swapped, not fetched
    assert mirror.requests()[start:] == []
    assert not list(tmp_path.glob(".target.*"))
    assert run_model(verify="full", **args)["changed"] is False

    # Without a source too: nothing is fetched, the good files are linked into the new folder.
    (dest / "extra.bin").write_bytes(b"x")
    unmanaged_source = run_model(path=str(dest), manifest=models[1]["target"])
    assert unmanaged_source["changed"] is True and not (dest / "extra.bin").exists()


# A URL holding the credential never reaches this module: the role refuses it on the controller
# (test_sglang_models_role.py, filter model_source_problems, the rule's one place).
def test_the_credential_travels_in_headers_and_is_never_recorded(run_model, models, tmp_path):
    token = "mirror-token-not-a-secret"
    guarded = MirrorProcess(models[0], tmp_path / "guarded.log", options=("--basic-auth", "reader:" + token))
    try:
        dest = tmp_path / "target"
        args = dict(path=str(dest), source={"type": "http", "url": guarded.url + "/target"},
                    manifest=models[1]["target"])
        assert "HTTP Error 401" in run_model(fail=True, **args)["msg"]
        header = {"Authorization": "Basic " + base64.b64encode(("reader:" + token).encode()).decode()}
        placed = run_model(http_headers=header, **args)
        assert placed["state"] == "placed" and all(r["auth"] for r in guarded.requests() if r["status"] != 401)
    finally:
        guarded.stop()
    assert token not in json.dumps(placed) and header["Authorization"] not in json.dumps(placed)
    recorded = (dest / ".sglang-model.json").read_text()
    assert json.loads(recorded)["source"] == {"type": "http", "url": guarded.url + "/target"}
    assert token not in recorded and header["Authorization"].split()[1] not in recorded


def test_the_credential_headers_do_not_follow_a_redirect_to_another_host(run_model, models, tmp_path):
    token = "mirror-token-not-a-secret"
    store = MirrorProcess(models[0], tmp_path / "store.log")  # another port: another origin
    front = MirrorProcess(models[0], tmp_path / "front.log",
                          options=("--basic-auth", "reader:" + token, "--redirect", store.url))
    try:
        header = {"Authorization": "Basic " + base64.b64encode(("reader:" + token).encode()).decode()}
        placed = run_model(path=str(tmp_path / "target"), source={"type": "http", "url": front.url + "/target"},
                           manifest=models[1]["target"], http_headers=header)
        fronted, stored = front.requests(), store.requests()
    finally:
        front.stop()
        store.stop()
    assert placed["state"] == "placed"
    assert fronted and all(r["auth"] and r["status"] == 302 for r in fronted)
    assert stored and not any(r["authorization"] for r in stored)  # urllib alone sent it along
