"""The patch set ported to SGLang 0.5.23 for real: its draft code on CPU torch, and the sglang_patches role.

EagleDraftWorker.draft_forward of the patched 0.5.23 file runs in the parser venv (the session
fixture `parser_python`: CPU torch 2.13.0), cut out with the helpers it calls from the pristine
0.5.23 wheel of the wheelhouse (tests/roles/draft_forward_check_0_5_23.py). The role then applies
the set through ansible-playbook to a throw-away venv holding the real sglang 0.5.23 files. The
set on the wheel's bytes alone is tested in tests/unit/test_sglang_patch_set_0_5_23.py.
"""

import json
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import pytest
from ansible_run import run_playbook
from parser_venv import WHEELHOUSE, ensure_wheelhouse
from patch_set_fixtures import ud
from project_modules import REPO

SET_DIR = REPO / "roles" / "sglang_patches" / "files" / "sglang-0.5.23"
WORKER = "sglang/srt/speculative/eagle_worker_v2.py"
HELPERS = ("sglang/srt/utils/common.py", "sglang/srt/speculative/eagle_utils.py", "sglang/srt/speculative/spec_utils.py")
DRAFT_FORWARD_CHECK = Path(__file__).resolve().parent / "draft_forward_check_0_5_23.py"


def _wheel():
    ensure_wheelhouse()
    (wheel,) = WHEELHOUSE.glob("sglang-0.5.23-*.whl")
    return wheel


def _patches():
    return [ud.parse_patch(p.name, p.read_bytes()) for p in sorted(SET_DIR.glob("*.patch"))]


def test_skipped_draft_keeps_the_chain_shapes_on_both_topk1_paths(parser_python, tmp_path):
    """Skipping must give the verify pass the same shapes and chain tree, every draft slot the first token.

    Both of 0.5.23's topk-1 paths: the chain its CUDA kernel writes in place (the port fills the
    skipped columns itself) and the token list of other devices.
    """
    patches = _patches()
    with zipfile.ZipFile(_wheel()) as zf:
        for path in HELPERS:
            (tmp_path / Path(path).name).write_bytes(zf.read(path))
        (tmp_path / "eagle_worker_v2.py").write_bytes(ud.apply_patches(zf.read(WORKER), WORKER, patches))
    done = subprocess.run(
        [parser_python, str(DRAFT_FORWARD_CHECK), *(str(tmp_path / Path(p).name) for p in HELPERS),
         str(tmp_path / "eagle_worker_v2.py"), WORKER],
        cwd=tmp_path, capture_output=True, text=True, check=False, timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    results = [json.loads(line) for line in done.stdout.strip().splitlines()[-2:]]
    assert [r["path"] for r in results] == ["in-place chain (CUDA kernel path)", "token list (other devices)"]
    for result in results:
        assert result["torch"].startswith("2.13.0")
        assert result["forwards"] == [result["steps"] - 1, 0], result  # skipping runs no draft forward at all
        assert result["same_parents"] and result["same_index"], result
        assert result["same_shape"] and result["same_dtype"] and result["no_probs"], result
        assert result["every_slot_holds_the_first_token"] and result["drafted_slots_differ"], result


# ----------------------------------------------------------------------------------------
# The role, on a venv holding the real sglang 0.5.23 files
# ----------------------------------------------------------------------------------------

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


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    root = tmp_path_factory.mktemp("sglang-0.5.23-venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    python = root / "venv" / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps", "--no-index",
         "--no-compile", str(_wheel())],
        check=True,
    )
    site = Path(subprocess.check_output(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True).strip())
    return types.SimpleNamespace(root=root, python=python, site=site, state=root / "state")


def run_role(venv, **extravars):
    playbook = venv.root / "play.yml"
    playbook.write_text(PLAYBOOK)
    inventory = venv.root / "hosts"
    inventory.write_text(f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    variables = {"sglang_python": str(venv.python), "sglang_state_dir": str(venv.state), "sglang_version": "0.5.23",
                 "sglang_patches_sets": ["sglang-0.5.23"], **extravars}
    result = run_playbook(playbook, inventory, extravars=variables, testnode_vars=False, envvars={"ANSIBLE_NOCOLOR": "1"})
    restarted = (venv.state / "restarted").exists()
    if restarted:
        (venv.state / "restarted").unlink()
    return types.SimpleNamespace(rc=result.rc, out=result.stdout,
                                 changed=result.count("changed") if result.stats else None, restarted=restarted)


def test_role_applies_the_0_5_23_set_to_real_sglang_0_5_23_files(venv):
    worker = venv.site / WORKER
    pristine = worker.read_bytes()
    manifest = venv.state / "patches" / "0.5.23" / "sglang.manifest.json"  # sglang_patches_dir: a folder per release

    # The 0.5.9 set on SGLang 0.5.23 is refused before anything changes.
    wrong = run_role(venv, sglang_patches_sets=["sglang-0.5.9"])
    assert wrong.rc != 0 and "made for sglang 0.5.9 but this deployment runs sglang 0.5.23" in wrong.out, wrong.out
    assert not venv.state.exists() and worker.read_bytes() == pristine

    # The ported set: patch 0002 applied, 0001 (obsolete there) not; the service is told to restart.
    first = run_role(venv)
    assert first.rc == 0 and first.restarted, first.out
    assert worker.read_bytes() == ud.apply_patches(pristine, WORKER, _patches())
    assert [p["name"] for p in json.loads(manifest.read_text())["patches"]] == [
        "sglang-0.5.23/0002-spec-v2-skip-drafting-at-running-requests.patch"
    ]

    # Second run: nothing changes, no restart (a hand edit, state absent and operators' sets are
    # the same code on any version: tests/roles/test_sglang_patch_set_role.py).
    again = run_role(venv)
    assert again.rc == 0 and again.changed == 0 and not again.restarted, again.out
