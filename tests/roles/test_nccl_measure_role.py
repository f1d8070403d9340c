"""The nccl_measure role through playbooks/nccl_measure.yml on this machine, every path in a temp dir.

No GPU here: what is proven is everything around the probe (candidate validation before anything
is made, a clear failure without torch, the fewer-than-2-GPUs report and the fetch). The probe itself
runs end to end on the CPU in test_nccl_bench_gloo.py and on GPUs in the real-GPU tier.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from parser_venv import nccl_bench_python

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK_BIN = Path(sys.executable).with_name("ansible-playbook")


@pytest.fixture(scope="module", autouse=True)
def ansible_playbook():
    """The tier runs ansible-playbook: a venv without it is broken, not a reason to skip."""
    assert PLAYBOOK_BIN.is_file(), f"{PLAYBOOK_BIN} is missing: pytest must run from .venv (scripts/setup makes it)"
    return PLAYBOOK_BIN


def measure(tmp_path, python, **extra):
    extravars = {
        "sglang_state_dir": str(tmp_path / "state"),
        "nccl_measure_python": str(python),
        "nccl_measure_artifacts_dir": str(tmp_path / "artifacts"),
        "ansible_python_interpreter": sys.executable,
        **extra,
    }
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    proc = subprocess.run(
        [
            str(PLAYBOOK_BIN),
            "-c",
            "local",
            "-i",
            "localhost,",
            "playbooks/nccl_measure.yml",
            "-e",
            json.dumps(extravars),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_measure_refuses_a_candidate_that_turns_multicast_on(tmp_path):
    rc, out = measure(tmp_path, sys.executable, nccl_measure_candidates={"nvls": {"NCCL_NVLS_ENABLE": "1"}})
    assert rc != 0 and "nccl_measure_candidates.nvls: NCCL_NVLS_ENABLE must stay 0" in out
    assert not (tmp_path / "state").exists()


def test_measure_with_an_interpreter_without_torch_fails_clearly(tmp_path):
    rc, out = measure(tmp_path, sys.executable)
    assert rc != 0 and "cannot import torch" in out


def test_measure_on_a_node_without_two_gpus_reports_and_fetches(tmp_path, request):
    """The measuring playbook end to end where fewer than 2 GPUs are visible (the parser venv's CPU torch)."""
    rc, out = measure(tmp_path, nccl_bench_python(request))
    if "nothing was measured" not in out:
        # Only with $NCCL_BENCH_PYTHON naming a CUDA torch on a machine with 2+ GPUs; CI has no GPU,
        # so there the parser venv's CPU torch always takes the path below.
        pytest.skip("this machine has 2+ GPUs: the GPU tier's device run covers the measuring path")
    assert rc == 0, out[-3000:]
    fetched = tmp_path / "artifacts" / "localhost" / "nccl"
    assert json.loads((fetched / "choice.json").read_text())["settings"] is None
    assert "nothing was measured" in (fetched / "allreduce.jsonl").read_text()
    assert (tmp_path / "state" / "nccl" / "allreduce.jsonl").exists()  # kept on the node too
