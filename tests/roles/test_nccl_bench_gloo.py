"""roles/nccl_measure/files/nccl_allreduce_bench.py end to end on the CPU: --backend gloo, two ranks.

The launcher starts fresh processes per candidate, each with an exact environment (nothing
inherited from NCCL_* of the caller). torch comes from $NCCL_BENCH_PYTHON when set, else from the
parser venv (the session fixture `parser_python`: CPU torch 2.13.0 with gloo). The benchmark's
pure parts are tested in tests/unit/test_nccl_bench.py.
"""

import json
import os
import subprocess

from parser_venv import nccl_bench_python
from project_modules import REPO

BENCH = REPO / "roles" / "nccl_measure" / "files" / "nccl_allreduce_bench.py"


def test_gloo_self_test_runs_fresh_processes_with_exact_environments(tmp_path, request):
    python = nccl_bench_python(request)
    out = tmp_path / "t.jsonl"
    env = dict(os.environ, NCCL_PROTO="Simple", NCCL_DEBUG="INFO")  # inherited: must not reach the runs
    proc = subprocess.run(
        [
            python,
            str(BENCH),
            "--backend",
            "gloo",
            "--nproc",
            "2",
            "--sizes",
            "16K",
            "--reps",
            "2",
            "--iters",
            "2",
            "--warmup",
            "1",
            "--rounds",
            "1",
            "--candidates",
            '{"seed-pcie": {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}}',
            "--out",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    defaults, seed, defaults_again = lines[0], lines[1], lines[2]
    assert [(line["candidate"], line["round"], line["seq"]) for line in lines[:3]] == [
        ("defaults", 1, 1),
        ("seed-pcie", 1, 2),
        ("defaults", 2, 3),
    ]
    assert defaults_again["env"] == defaults["env"] and defaults_again["correct"]
    assert len(defaults["times_us"]["16384"]) == 2  # every repetition is kept
    assert defaults["env"] == {"NCCL_CONF_FILE": "/dev/null", "NCCL_NVLS_ENABLE": "0"}
    assert seed["env"] == {
        "NCCL_ALGO": "Ring",
        "NCCL_CONF_FILE": "/dev/null",
        "NCCL_NVLS_ENABLE": "0",
        "NCCL_PROTO": "LL",
    }
    assert defaults["correct"] and seed["correct"] and defaults["world"] == 2
    assert set(defaults["us_per_allreduce"]) == {"16384"} and defaults["injected_env"] == {}
    assert len(lines) == 4 and lines[-1]["choice"]["defaults_rounds"] == 2
