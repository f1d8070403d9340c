"""sglang_patches on a converged systemd test node of this file alone (conftest's converged_node,
restored from the worker's converged snapshot), against the SGLang that site.yml installed.

Each test starts and ends with the shipped set applied. Runs go through site.yml, mostly
limited to the sglang_patches tag; the module's result is read from ansible-runner's events.
"""

import json
import shlex
import shutil
import types
from pathlib import Path

import pytest
from project_modules import REPO

SET = REPO / "roles" / "sglang_patches" / "files" / "sglang-0.5.9"
ENVIRON = "sglang/srt/environ.py"
WORKER = "sglang/srt/speculative/eagle_worker_v2.py"
TAGS = ["sglang_patches"]

# Prints "<path> <sha256 hex> <RECORD sha256 hex>" for each path given; run on the node with -c.
RECORD_CHECK = (Path(__file__).resolve().parent / "sglang_record_check.py").read_text()


@pytest.fixture(scope="module")
def paths(converged_node):
    """sglang_python and the manifest as the role resolved them on the node (the module's args in
    the first converge, which made the snapshot this node stands on), and the shipped set's state
    as applied there (the manifest and the patched files' hashes)."""
    args = _patch_result(converged_node.first_run)["invocation"]["module_args"]
    paths = types.SimpleNamespace(python=args["python"], manifest=args["manifest"])
    paths.shipped = _state(converged_node, paths)
    return paths


def _ssh(node, command):
    done = node.ssh(command)
    assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"
    return done.stdout


def _manifest(node, paths):
    return json.loads(node.node.testinfra_host().file(paths.manifest).content_string)


def _file(node, paths, rel):
    return _manifest(node, paths)["site_packages"] + "/" + rel


def _hashes(node, paths):
    """path -> (sha256 on disk, sha256 in RECORD) for the files the set patches."""
    argv = [paths.python, "-c", RECORD_CHECK, ENVIRON, "sglang/srt/server_args.py", WORKER]
    out = _ssh(node, " ".join(shlex.quote(a) for a in argv))
    return {path: (disk, record) for path, disk, record in (line.split() for line in out.splitlines())}


def _patch_result(run):
    """The python_package_patch task's result in a run (ok or failed)."""
    for event in run.events:
        data = event.get("event_data", {})
        if event.get("event") in ("runner_on_ok", "runner_on_failed") and str(data.get("task", "")).startswith(
            "Apply the patch sets to the installed SGLang"
        ):
            return data["res"]
    raise AssertionError("python_package_patch did not run:\n" + run.stdout[-3000:])


def _main_pid(node):
    return int(_ssh(node, "systemctl show --property=MainPID --value sglang.service"))


def _assert_applied(node, paths):
    manifest = _manifest(node, paths)
    hashes = _hashes(node, paths)
    assert set(manifest["files"]) == set(hashes)
    for path, (disk, record) in hashes.items():
        assert disk == manifest["files"][path]["sha256"] != record


def _state(node, paths):
    """The manifest's text (absent: None) and the hashes of the files the set patches."""
    manifest = node.node.testinfra_host().file(paths.manifest)
    return (manifest.content_string if manifest.exists else None), _hashes(node, paths)


@pytest.fixture
def node(converged_node, paths):
    yield converged_node
    # Back to the shipped set, whatever a test did: a run only where the test left another state
    # (the tests that end on the shipped set ran their own converge and read its result).
    if _state(converged_node, paths) != paths.shipped:
        run = converged_node.converge(tags=TAGS)
        assert run.rc == 0, run.failure_messages()
    _assert_applied(converged_node, paths)
    assert _state(converged_node, paths) == paths.shipped


def test_converge_applied_the_set_and_a_rerun_changes_nothing(node, paths):
    manifest = _manifest(node, paths)
    assert manifest["package"] == "sglang" and manifest["version"] == "0.5.9"
    assert [p["name"] for p in manifest["patches"]] == [f"sglang-0.5.9/{p.name}" for p in sorted(SET.glob("*.patch"))]
    _assert_applied(node, paths)
    # The first tagged run on a node that full runs converged: it must render what they rendered
    # (it once restarted the server without NCCL's settings, which only nccl_tuning chose).
    again = node.converge(tags=TAGS)
    assert again.rc == 0 and again.changed == 0, again.changed_tasks()


def test_hand_edit_is_restored_and_the_service_restarted(node, paths):
    pid = _main_pid(node)
    _ssh(node, f"echo '# edited by hand' >> {shlex.quote(_file(node, paths, WORKER))}")
    run = node.converge()
    assert run.rc == 0, run.failure_messages()
    assert _patch_result(run)["drifted"] == [WORKER]
    _assert_applied(node, paths)
    assert _main_pid(node) != pid


def test_check_mode_reports_drift_and_changes_nothing(node, paths):
    _ssh(node, f"echo '# edited by hand' >> {shlex.quote(_file(node, paths, ENVIRON))}")
    edited = _hashes(node, paths)[ENVIRON][0]
    run = node.converge(tags=TAGS, check=True, diff=True)
    assert run.rc == 0, run.failure_messages()
    result = _patch_result(run)
    assert result["changed"] and result["drifted"] == [ENVIRON] and result["diff"]
    assert _hashes(node, paths)[ENVIRON][0] == edited


def test_updated_patch_replaces_the_old_result_never_stacks(node, paths, tmp_path):
    updated = tmp_path / "sglang-0.5.9"
    shutil.copytree(SET, updated)
    patch = updated / "0001-strict-sglang-enable-spec-v2.patch"
    text = patch.read_text()
    assert text.count("or unset it") == 1
    patch.write_text(text.replace("or unset it", "or leave it unset"))
    run = node.converge(tags=TAGS, extravars={"sglang_patches_sets": [str(updated)]})
    assert run.rc == 0, run.failure_messages()
    actions = {f["path"]: f["action"] for f in _patch_result(run)["files"]}
    assert actions[ENVIRON] == "update" and actions[WORKER] == "ok"
    source = node.node.testinfra_host().file(_file(node, paths, ENVIRON)).content_string
    assert "or leave it unset" in source and "or unset it" not in source
    assert source.count("class EnvStrictBool(EnvBool):") == 1


def test_reinstalled_package_is_patched_again(node, paths):
    wheel = "/srv/wheelhouse/sglang-0.5.9-py3-none-any.whl"
    reinstall = node.ssh(f"{shlex.quote(paths.python)} -m pip install --force-reinstall --no-deps --no-index {wheel}")
    if reinstall.returncode != 0:  # a venv without pip: put the pristine files back as a reinstall would
        kept = paths.manifest[: -len(".manifest.json")] + ".pristine"
        _ssh(node, f"cp -a {shlex.quote(kept)}/. {shlex.quote(_manifest(node, paths)['site_packages'])}/")
    assert all(disk == record for disk, record in _hashes(node, paths).values())
    run = node.converge(tags=TAGS)
    assert run.rc == 0, run.failure_messages()
    assert {f["action"] for f in _patch_result(run)["files"]} == {"apply"}
    _assert_applied(node, paths)


def test_set_for_another_version_is_refused_naming_both(node, paths):
    before = _hashes(node, paths)
    # The inventory says 0.5.8 while the interpreter the service runs holds 0.5.9 (that release's
    # venv: with releases side by side, sglang_version alone would name 0.5.8's, which is not there).
    run = node.converge(tags=TAGS, extravars={"sglang_version": "0.5.8", "sglang_python": paths.python})
    assert run.rc != 0
    assert any("0.5.9" in m and "0.5.8" in m for m in run.failure_messages()), run.failure_messages()
    assert _hashes(node, paths) == before


def test_state_absent_restores_record_bytes_and_removes_the_manifest(node, paths):
    run = node.converge(tags=TAGS, extravars={"sglang_patches_state": "absent"})
    assert run.rc == 0, run.failure_messages()
    assert all(disk == record for disk, record in _hashes(node, paths).values())
    assert not node.node.testinfra_host().file(paths.manifest).exists
