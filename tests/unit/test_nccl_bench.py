"""roles/nccl_measure/files/nccl_allreduce_bench.py without GPUs: arguments, environments, < 2 GPUs.

Nothing here imports torch. The launcher's end-to-end run on the CPU (--backend gloo, fresh
processes, exact environments) is tests/roles/test_nccl_bench_gloo.py.
"""

import io
import json
import sys

import pytest
from project_modules import REPO

FILES = REPO / "roles" / "nccl_measure" / "files"
BENCH = FILES / "nccl_allreduce_bench.py"


@pytest.fixture(scope="module")
def bench(project_module):
    return project_module("roles/nccl_measure/files/nccl_allreduce_bench.py")


KiB, MiB = 1 << 10, 1 << 20


def test_module_imports_without_torch():
    src = BENCH.read_text()
    assert "\nimport torch" not in src  # torch is imported inside the worker and visible_gpus only


@pytest.mark.parametrize(
    "text, size",
    [("16384", 16384), ("16K", 16 * KiB), ("16KiB", 16 * KiB), ("4M", 4 * MiB), ("4 MiB", 4 * MiB), ("1g", 1 << 30)],
)
def test_parse_size(bench, text, size):
    assert bench.parse_size(text) == size


def test_default_sizes_are_decode_sized(bench):
    sizes = bench.default_sizes(8192, bench.DEFAULT_BATCH_SIZES)
    assert sizes[0] == 16 * KiB and sizes[-1] == 4 * MiB and len(sizes) == 9


def test_sizes_are_sorted_unique_and_whole_bf16(bench):
    assert bench.parse_sizes("4M,16K,16384") == [16 * KiB, 4 * MiB]
    with pytest.raises(ValueError, match="bf16"):
        bench.parse_sizes("3")


def test_candidates_parse_and_refuse_multicast(bench):
    got = bench.parse_candidates(
        '{"seed-pcie": {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}, "b": {"NCCL_BUFFSIZE": 1024}}'
    )
    assert got == {"seed-pcie": {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}, "b": {"NCCL_BUFFSIZE": "1024"}}
    for text, needle in [
        ('{"nvls": {"NCCL_NVLS_ENABLE": "1"}}', "NVLink multicast stays off"),
        ('{"x": {"NCCL_CONF_FILE": "/etc/nccl.conf"}}', "set by the benchmark itself"),
        ('{"x": {"CUDA_VISIBLE_DEVICES": "0"}}', "not an NCCL_* variable"),
        ('{"x": {}}', "non-empty"),
        ('{"defaults": {"NCCL_PROTO": "LL"}}', "not 'defaults'"),
        ('{"x": {"NCCL_P2P_DISABLE": true}}', "string or an integer"),
        ('["NCCL_PROTO=LL"]', "JSON object"),
        ("{not json", "not JSON"),
    ]:
        with pytest.raises(ValueError, match=needle.replace("*", r"\*")):
            bench.parse_candidates(text)


def test_child_env_is_exact_and_keeps_multicast_off(bench):
    base = {
        "PATH": "/usr/bin",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "NCCL_PROTO": "LL",
        "NCCL_DEBUG": "INFO",
        "NCCL_NVLS_ENABLE": "1",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "0",
    }
    env = bench.child_env(base, {"NCCL_ALGO": "Ring"})
    assert env["PATH"] == "/usr/bin" and env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert {k: v for k, v in env.items() if k.startswith("NCCL_")} == {
        "NCCL_ALGO": "Ring",
        "NCCL_NVLS_ENABLE": "0",
        "NCCL_CONF_FILE": "/dev/null",
    }
    assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1" and env["NVSHMEM_DISABLE_NVLS"] == "1"
    assert bench.child_env(base, {})["NCCL_NVLS_ENABLE"] == "0"  # defaults run too


def run_main(bench, argv, gpus, runner=None):
    out, err = io.StringIO(), io.StringIO()
    old = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        rc = bench.main(argv, gpu_count=lambda: gpus, runner=runner or bench.run_candidate)
    finally:
        sys.stdout, sys.stderr = old
    return rc, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("gpus", [0, 1])
def test_fewer_than_two_gpus_measures_nothing_and_says_so(bench, gpus, tmp_path):
    def never(*_a, **_k):
        raise AssertionError("nothing may run on one GPU")

    choice = tmp_path / "choice.json"
    rc, out, err = run_main(bench, ["--choice-out", str(choice)], gpus, never)
    assert rc == bench.EXIT_NOTHING_TO_MEASURE == 3
    assert "so nothing was measured (needs at least 2 GPUs)" in err
    line = json.loads(out)
    assert line["world"] == gpus and "nothing was measured" in line["skipped"]
    assert json.loads(choice.read_text())["settings"] is None


def test_more_processes_than_gpus_is_a_usage_error(bench):
    rc, _, err = run_main(bench, ["--nproc", "4"], 2)
    assert rc == 2 and "only 2 CUDA device(s)" in err


def test_bad_arguments_exit_2(bench):
    assert run_main(bench, ["--sizes", "abc"], 2)[0] == 2
    assert run_main(bench, ["--candidates", '{"x": {"NCCL_NVLS_ENABLE": "1"}}'], 2)[0] == 2
    assert run_main(bench, ["--reps", "0"], 2)[0] == 2
    assert run_main(bench, ["--rounds", "0"], 2)[0] == 2


def test_run_plan_interleaves_the_defaults_with_every_round(bench):
    plan = bench.run_plan({"a": {"NCCL_PROTO": "LL"}, "b": {"NCCL_ALGO": "Ring"}}, 2)
    assert [(r, name) for r, name, _ in plan] == [
        (1, "defaults"),
        (1, "a"),
        (1, "b"),
        (2, "defaults"),
        (2, "a"),
        (2, "b"),
        (3, "defaults"),
    ]
    assert plan[0][2] == {} and plan[1][2] == {"NCCL_PROTO": "LL"}
    assert bench.build_parser().parse_args([]).rounds == bench.DEFAULT_ROUNDS == 3


def test_rounds_of_candidates_between_defaults_runs_and_a_choice_follows(bench, bench_choice_rule, tmp_path):
    calls, dirs = [], []
    table = {"defaults": 50.0, "seed-pcie": 40.0, "proto-ll": 60.0}

    def fake(name, candidate, sizes, world, args, tmpdir):
        calls.append((name, candidate, sizes, world))
        dirs.append(tmpdir)
        us = {str(s): table[name] for s in sizes}
        return {
            "candidate": name,
            "settings": candidate,
            "world": world,
            "us_per_allreduce": us,
            "spread_us": {str(s): 0.5 for s in sizes},
            "correct": True,
        }

    out = tmp_path / "t.jsonl"
    argv = ["--sizes", "16K,4M", "--rounds", "2", "--out", str(out), "--choice-out", str(tmp_path / "c.json")]
    rc, _, err = run_main(bench, argv, 8, fake)
    assert rc == 0, err
    order = ["defaults", "seed-pcie", "proto-ll", "defaults", "seed-pcie", "proto-ll", "defaults"]
    assert [c[0] for c in calls] == order
    assert calls[0][1:] == ({}, [16 * KiB, 4 * MiB], 8)
    assert len(set(dirs)) == len(dirs)  # every run in its own folder: no file of one run reused by the next
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line.get("candidate") for line in lines[:-1]] == order
    assert [(line["round"], line["seq"]) for line in lines[:-1]] == [
        (1, 1),
        (1, 2),
        (1, 3),
        (2, 4),
        (2, 5),
        (2, 6),
        (3, 7),
    ]
    choice = lines[-1]["choice"]
    assert choice["chosen"] == "seed-pcie" and choice["settings"] == {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}
    assert choice["defaults_rounds"] == 3 and choice["probe_rounds"] == 2 and choice["rule"] == bench_choice_rule
    assert "| seed-pcie | 40.0 | 40.0 |" in choice["table_md"]
    assert "| 7 | defaults | 3 | 50.0 | 50.0 | 50.0 |" in choice["rounds_md"]
    assert json.loads((tmp_path / "c.json").read_text())["chosen"] == "seed-pcie"


def test_decode_and_prefill_sizes_run_together_and_the_phases_reach_the_choice(bench, tmp_path):
    """Every run measures both phases; a candidate faster at decode but slower at prefill is refused."""
    sizes_seen = []

    def fake(name, candidate, sizes, world, args, tmpdir):
        sizes_seen.append(sizes)
        decode_us, prefill_us = {"defaults": (50.0, 250.0), "proto-ll": (35.0, 590.0)}[name]
        return {
            "candidate": name,
            "settings": candidate,
            "world": world,
            "us_per_allreduce": {str(s): decode_us if s <= MiB else prefill_us for s in sizes},
            "spread_us": {str(s): 0.5 for s in sizes},
            "correct": True,
        }

    argv = [
        "--decode-sizes", "16K,1M", "--prefill-sizes", "80M,40M", "--prefill-weight", "0.5",
        "--candidates", '{"proto-ll": {"NCCL_PROTO": "LL"}}', "--rounds", "2",
    ]
    rc, out, err = run_main(bench, argv, 2, fake)
    assert rc == 0, err
    assert "at decode sizes [16384, 1048576] and prefill sizes [41943040, 83886080] (bytes)" in err
    assert sizes_seen == [[16 * KiB, MiB, 40 * MiB, 80 * MiB]] * 5
    lines = [json.loads(line) for line in out.splitlines()]
    phases = {"decode": [16 * KiB, MiB], "prefill": [40 * MiB, 80 * MiB]}
    assert all(line["phases"] == phases for line in lines[:-1])
    choice = lines[-1]["choice"]
    assert choice["phases"] == phases and choice["weights"] == {"decode": 1.0, "prefill": 0.5}
    assert choice["chosen"] == "defaults"
    ll = choice["candidates"][1]
    assert not ll["eligible"] and "41943040 B (prefill): 590.0 us vs 250.0 us (+136%" in ll["why"]
    assert ll["vs_defaults_by_phase"]["decode"] == pytest.approx(0.7)
    assert "prefill sizes 0.5 in all" in choice["rule"]


def test_one_gpu_reports_the_sizes_it_would_have_measured(bench, tmp_path):
    choice = tmp_path / "choice.json"
    rc, out, _ = run_main(bench, ["--sizes", "16K", "--prefill-sizes", "80M", "--choice-out", str(choice)], 1)
    assert rc == 3
    expected = {"decode": [16 * KiB], "prefill": [80 * MiB]}
    assert json.loads(out)["phases"] == expected and json.loads(choice.read_text())["phases"] == expected


def test_bad_weights_exit_2(bench):
    rc, _, err = run_main(bench, ["--decode-weight", "-1"], 2)
    assert rc == 2 and "--decode-weight must be >= 0" in err
    rc, _, err = run_main(bench, ["--decode-weight", "0"], 2)  # no prefill sizes: nothing would count
    assert rc == 2 and "leaves nothing to weigh" in err
    assert run_main(bench, ["--prefill-sizes", "3M,5"], 2)[0] == 2  # 5 bytes: not whole bf16 elements


@pytest.fixture(scope="module")
def bench_choice_rule(project_module):
    return project_module("roles/nccl_measure/files/nccl_choice.py").RULE


def test_a_failed_defaults_run_stops_the_measurement(bench, tmp_path):
    def fail(name, candidate, sizes, world, args, tmpdir):
        return {"candidate": name, "settings": candidate, "world": world, "error": "rank 1 exited with 1"}

    rc, out, _ = run_main(bench, ["--sizes", "16K"], 2, fail)
    lines = [json.loads(line) for line in out.splitlines()]
    assert rc == 1
    assert len(lines) == 1 + 3 * 3 + 1  # every planned run is listed, then the choice
    assert all(line["error"] == "not run: the run under NCCL's defaults failed" for line in lines[1:-1])
    assert "no run under NCCL's defaults" in lines[-1]["choice"]["error"]


def test_a_usage_error_leaves_an_earlier_table_alone(bench, tmp_path):
    out = tmp_path / "t.jsonl"
    out.write_text("earlier table\n")

    def no_torch():
        raise ImportError("No module named 'torch'")

    old = sys.stderr
    sys.stderr = io.StringIO()
    try:
        rc = bench.main(["--out", str(out)], gpu_count=no_torch)
        err = sys.stderr.getvalue()
    finally:
        sys.stderr = old
    assert rc == 2 and "cannot import torch" in err
    assert out.read_text() == "earlier table\n"
    assert run_main(bench, ["--out", str(out), "--nproc", "3"], 2)[0] == 2
    assert out.read_text() == "earlier table\n"


def test_a_dying_rank_stops_the_others_at_once(bench, tmp_path):
    """Rank 1 exits; rank 0 would wait in NCCL for ever: the run must end now, not at the timeout."""
    fake_python = tmp_path / "python"
    fake_python.write_text('#!/bin/sh\nif [ "$SGLANG_CANON_RANK" = 1 ]; then echo boom; exit 7; fi\nexec sleep 60\n')
    fake_python.chmod(0o755)
    args = bench.build_parser().parse_args(["--timeout", "50"])
    record = bench.run_candidate(
        "seed-pcie", {"NCCL_PROTO": "LL"}, [16384], 2, args, str(tmp_path), python=str(fake_python)
    )
    assert record["error"] == "rank 1 exited with 7"
    assert "boom" in record["log_tail"]
    assert record["elapsed_s"] < 10
