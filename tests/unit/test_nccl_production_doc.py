"""production_v2.md's NCCL section says when a forced NCCL_PROTO was never measured at prefill sizes,
and how to measure it on the node (rendered by the production_doc role itself, as in
test_production_doc.py, from the recorded nccl_tuning_applied fact of a PCIe node)."""

from __future__ import annotations

import copy
import grp
import json
import os
import pwd
import sys
from pathlib import Path

import pytest
from project_modules import REPO

sys.path.insert(0, str(REPO / "tests"))

from ansible_run import run_playbook  # noqa: E402  pylint: disable=wrong-import-position

PLAYBOOK = """\
- name: Render production_v2.md on this machine
  hosts: docs
  gather_facts: false
  roles:
    - role: production_doc
"""
PCIE = json.loads((REPO / "tests" / "fixtures" / "doc" / "nccl.json").read_text())["nccl_tuning_applied"]
CAVEAT = "- Unmeasured at prefill sizes: `NCCL_PROTO=LL` was chosen for decode-sized all-reduces"


def nccl_section(tmp_path, applied):
    (tmp_path / "state").mkdir()
    (tmp_path / "playbook.yml").write_text(PLAYBOOK)
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(f"[docs]\ndoc-node ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    doc = tmp_path / "production_v2.md"
    variables = {
        "production_doc_path": str(doc),
        "production_doc_owner": pwd.getpwuid(os.getuid()).pw_name,
        "production_doc_group": grp.getgrgid(os.getgid()).gr_name,
        "sglang_state_dir": str(tmp_path / "state"),
        "production_doc_patches_manifest": str(tmp_path / "state" / "none.json"),
        "nccl_tuning_applied": applied,
    }
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    result = run_playbook(str(tmp_path / "playbook.yml"), inventory, extravars=variables, envvars={"PATH": path})
    assert result.rc == 0, result.stdout[-6000:]
    text = doc.read_text()
    start = text.index("\n## NCCL\n")
    return text[start : text.index("\n## ", start + 1)]


def test_pcie_default_says_it_is_unmeasured_at_prefill_sizes_and_how_to_measure(tmp_path):
    section = nccl_section(tmp_path, PCIE)
    assert CAVEAT in section
    assert "1.7-2.5x on an H200 NVLink pair and 3.0-3.4x with P2P off" in section
    assert (
        "`.venv/bin/ansible-playbook -i inventory/production playbooks/nccl_measure.yml -l doc-node`, "
        "then set `nccl_tuning_use_measurement: true`" in section
    )


@pytest.mark.parametrize(
    "measurement, caveat",
    [
        ({"chosen": "defaults", "rule": "r", "phases": {"decode": [16384], "prefill": [83886080]}}, False),
        ({"chosen": "seed-pcie", "rule": "r", "phases": {"decode": [16384], "prefill": []}}, True),  # decode only
        ({"chosen": "seed-pcie", "rule": "r"}, True),  # measured before phases existed
    ],
)
def test_a_measurement_at_prefill_sizes_removes_the_caveat(tmp_path, measurement, caveat):
    applied = copy.deepcopy(PCIE)
    applied["measurement"] = measurement
    section = nccl_section(tmp_path, applied)
    assert f"- Measured on this node: candidate `{measurement['chosen']}`" in section
    assert (CAVEAT in section) is caveat


def test_no_forced_protocol_no_caveat(tmp_path):
    applied = dict(PCIE, settings={}, setting_reasons={}, source="nvlink default", interconnect="nvlink")
    section = nccl_section(tmp_path, applied)
    assert "- Settings: none; NCCL's own defaults." in section and "Unmeasured" not in section
