"""The nccl_measure role through playbooks/nccl_measure.yml on this machine, every path in a temp dir.

No GPU here: what is proven is everything around the probe (candidate validation before anything
is made, the message sizes derived from a model's config.json, the server arguments and the GPU
memory that tests/double/nvidia-smi replays for the canonical node, a clear failure without torch or
without a config.json, the fewer-than-2-GPUs report and the fetch). The probe itself runs end to end
on the CPU in test_nccl_bench_gloo.py and on GPUs in the real-GPU tier.
"""

import json
import os
import sys

import pytest
from parser_venv import nccl_bench_python
from ansible_run import run_playbook
from project_modules import REPO, VENV_BIN

KiB, MiB = 1 << 10, 1 << 20
HIDDEN = 5120


def measure(tmp_path, python, **extra):
    """playbooks/nccl_measure.yml on localhost: a model whose config.json says hidden 5120, and an
    nvidia-smi on PATH that replays the canonical node (8 x RTX PRO 6000, 97887 MiB each)."""
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": HIDDEN}))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if not (bin_dir / "nvidia-smi").exists():
        (bin_dir / "nvidia-smi").symlink_to(REPO / "tests" / "double" / "nvidia-smi")
    extravars = {
        "sglang_state_dir": str(tmp_path / "state"),
        "sglang_model_path": str(model),
        "nccl_measure_python": str(python),
        "nccl_measure_artifacts_dir": str(tmp_path / "artifacts"),
        **extra,
    }
    inventory = tmp_path / "hosts"
    inventory.write_text(f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    result = run_playbook("playbooks/nccl_measure.yml", inventory, extravars=extravars, testnode_vars=False, envvars={
        "ANSIBLE_NOCOLOR": "1",
        "PATH": os.pathsep.join([str(bin_dir), str(VENV_BIN), os.environ["PATH"]]),
        "NVIDIA_SMI_DOUBLE_CAPTURE": "rtx-pro-6000-8x",
    })
    # The YAML callback folds long messages over lines (and doubles quotes): read the output as one line.
    return result.rc, " ".join(result.stdout.split()).replace("''", "'")


def test_measure_refuses_a_candidate_that_turns_multicast_on(tmp_path):
    rc, out = measure(tmp_path, sys.executable, nccl_measure_candidates={"nvls": {"NCCL_NVLS_ENABLE": "1"}})
    assert rc != 0 and "nccl_measure_candidates.nvls: NCCL_NVLS_ENABLE must stay 0" in out
    assert not (tmp_path / "state").exists()


def test_measure_with_an_interpreter_without_torch_fails_clearly(tmp_path):
    rc, out = measure(tmp_path, sys.executable)
    assert rc != 0 and "cannot import torch" in out


def test_measure_without_a_config_json_names_the_variables_before_anything_is_made(tmp_path):
    rc, out = measure(tmp_path, sys.executable, nccl_measure_model_config=str(tmp_path / "nowhere.json"))
    assert rc != 0
    assert f"nccl_measure_model_config: cannot read {tmp_path / 'nowhere.json'} on the node" in out
    assert "or set nccl_measure_hidden_size" in out
    assert not (tmp_path / "state").exists()


def test_measure_refuses_phase_weights_that_leave_nothing(tmp_path):
    rc, out = measure(tmp_path, sys.executable, nccl_measure_decode_weight=0, nccl_measure_prefill_weight=0)
    assert rc != 0 and "nccl_measure_decode_weight and nccl_measure_prefill_weight must be >= 0 and not both 0" in out
    assert not (tmp_path / "state").exists()


def test_measure_on_a_node_without_two_gpus_reports_and_fetches(tmp_path, request):
    """The measuring playbook end to end where fewer than 2 GPUs are visible (the parser venv's CPU torch)."""
    rc, out = measure(tmp_path, nccl_bench_python(request))
    if "nothing was measured" not in out:
        # Only with $NCCL_BENCH_PYTHON naming a CUDA torch on a machine with 2+ GPUs; CI has no GPU,
        # so there the parser venv's CPU torch always takes the path below.
        pytest.skip("this machine has 2+ GPUs: the GPU tier's device run covers the measuring path")
    assert rc == 0, out[-3000:]
    # the sizes of the canonical server (EAGLE3, 4 draft tokens, SGLang's 48 requests and its 8192-token
    # chunk for 96 GB GPUs) at this model's hidden size, said before the measurement runs
    decode = [t * HIDDEN * 2 for t in (1, 2, 4, 8, 16, 32, 64, 128, 192)]
    prefill = [t * HIDDEN * 2 for t in (1024, 2048, 4096, 8192)]
    assert prefill == [10 * MiB, 20 * MiB, 40 * MiB, 80 * MiB]
    assert "decode 10 KiB .. 1.9 MiB (9 sizes): 1 .. 192 tokens = 48 requests" in out
    assert "prefill 10 MiB .. 80 MiB (4 sizes): 1024 .. 8192 tokens, chunk 8192 (SGLang 0.5.9's default for 97887 MiB GPUs)" in out
    assert "at 9 decode and 4 prefill sizes: NCCL's defaults and seed-pcie, proto-ll, in 3 round(s) (10 runs" in out
    fetched = tmp_path / "artifacts" / "localhost" / "nccl"
    choice = json.loads((fetched / "choice.json").read_text())
    assert choice["settings"] is None and choice["phases"] == {"decode": decode, "prefill": prefill}
    assert "nothing was measured" in (fetched / "allreduce.jsonl").read_text()
    assert (tmp_path / "state" / "nccl" / "allreduce.jsonl").exists()  # kept on the node too
