"""The SGLang 0.5.9 patch set for real: patched draft code on CPU torch, and the sglang_patches role.

Patch 0002's draft_forward runs in the parser venv (the session fixture `parser_python`: CPU torch
2.13.0), cut out of the patched file with the helpers it calls from the pristine wheel. The role
then runs through ansible-playbook against a throw-away venv holding the real sglang 0.5.9 files.
The set on the wheel's bytes alone (applies, reverses, compiles, decides) is tested in
tests/unit/test_sglang_patch_set.py; the wheel comes from the wheelhouse (tests/patch_set_fixtures.py).
"""

import hashlib
import json
import shutil
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import pytest
from patch_set_fixtures import (  # noqa: F401  pylint: disable=unused-import  (fixtures, used by name)
    SET_DIR,
    WORKER,
    patched,
    patches,
    pristine,
    record,
    set_meta,
    wheel,
)
from ansible_run import run_playbook


# ----------------------------------------------------------------------------------------
# Patch 0002 on CPU torch: a skipped draft keeps the verify pass's shapes
# ----------------------------------------------------------------------------------------

DRAFT_FORWARD_CHECK = Path(__file__).resolve().parent / "draft_forward_check.py"


def test_skipped_draft_keeps_the_tree_shapes_without_any_draft_forward(wheel, patched, parser_python, tmp_path):
    """EagleDraftWorker.draft_forward with a fake drafter, on the parser venv's CPU torch.

    Skipping must give the verify pass tensors of the same shapes and the same chain tree
    (so the TARGET_VERIFY CUDA graph still fits), with every draft slot holding the first token.
    """
    with zipfile.ZipFile(wheel) as zf:
        (tmp_path / "common.py").write_bytes(zf.read("sglang/srt/utils/common.py"))
        (tmp_path / "spec_utils.py").write_bytes(zf.read("sglang/srt/speculative/spec_utils.py"))
    (tmp_path / "eagle_worker_v2.py").write_bytes(patched[WORKER])
    done = subprocess.run(
        [parser_python, str(DRAFT_FORWARD_CHECK), str(tmp_path / "common.py"), str(tmp_path / "spec_utils.py"),
         str(tmp_path / "eagle_worker_v2.py"), WORKER],
        cwd=tmp_path, capture_output=True, text=True, check=False, timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["torch"].startswith("2.13.0")
    assert result["forwards"] == [result["steps"] - 1, 0]  # skipping runs no draft forward at all
    assert result["same_parents"] and result["same_index"]
    assert result["same_shape"] and result["same_dtype"]
    assert result["every_slot_holds_the_first_token"]


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
    inventory = venv.root / "hosts"
    inventory.write_text(f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    variables = {"sglang_python": str(venv.python), "sglang_state_dir": str(venv.state), **extravars}
    result = run_playbook(playbook, inventory, extravars=variables, check=check, diff=check, testnode_vars=False,
                          envvars={"ANSIBLE_NOCOLOR": "1"})
    restarted = (venv.state / "restarted").exists()
    if restarted:
        (venv.state / "restarted").unlink()
    return types.SimpleNamespace(
        rc=result.rc, out=result.stdout, changed=result.count("changed") if result.stats else None, restarted=restarted
    )


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_role_on_real_sglang_files(venv, record, patched):
    files = {rel: venv.site / rel for rel in patched}
    pristine_hashes = {rel: _sha(p) for rel, p in files.items()}
    assert pristine_hashes == {rel: record[rel] for rel in files}
    patches = venv.state / "patches" / "0.5.9"  # sglang_patches_dir: a folder per release
    manifest = patches / "sglang.manifest.json"

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
    assert (patches / "sglang-0.5.9" / "0001-strict-sglang-enable-spec-v2.patch").is_file()
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
    assert not manifest.exists() and not (patches / "sglang-0.5.9").exists()

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
