"""playbooks/benchmark.yml on a test node converged by site.yml: the sweep, the temporary
reconfiguration through sglang_service, and production ALWAYS coming back (failed runs, a
refused alternative, an interrupted run repaired by the next benchmark or by site.yml).

The server is the TEST DOUBLE (tests/double/sglang_server_double.py). Most tests point
sglang_benchmark_command at tests/double/bench_serving_double.py (a TEST DOUBLE of the client that
writes bench_serving's JSONL lines; stdlib only). test_real_bench_serving runs SGLang 0.5.9's own
`python -m sglang.bench_serving` instead; it needs, on the node, the packages of
tests/wheelhouse/bench-requirements.txt and the server double's POST /generate
(tests/double/double_generate.py hooked into the double).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import expected
import pytest
import yaml

from ansible_run import run_playbook
from project_modules import REPO
from model_fixtures import tiny_tokenizer

VENV_BIN = Path(sys.executable).parent
STATE = "/var/lib/sglang-canon/benchmark"
MARKER = f"{STATE}/temporary-configuration.json"
BENCH_DOUBLE = "/opt/sglang-test-double/bench_serving_double.py"
SERVER_INFO = "curl -sf http://127.0.0.1:30000/server_info"


# The interpreter sglang_install makes (roles/sglang defaults; the test inventory keeps them).
SGLANG_PYTHON = expected.testnode_vars()["sglang_python"]


@pytest.fixture(scope="module")
def node(converged_node):
    """A test node converged by site.yml (conftest's converged_node, restored from the worker's
    converged snapshot); .production_argv is what production runs."""
    node = converged_node.node
    node.production_argv = _server_info(node)["argv"]
    assert "--speculative-algorithm" in node.production_argv
    return node


def _vars(tmp, **extra):
    variables = {
        # the client double needs only the standard library
        "sglang_benchmark_command": ["/usr/bin/python3", BENCH_DOUBLE],
        "sglang_benchmark_concurrency_levels": [1, 2, 4],
        "sglang_benchmark_artifacts_dir": str(tmp / "artifacts"),
    }
    variables.update(extra)
    return variables


def _benchmark(node, tmp, **extra):
    return run_playbook("playbooks/benchmark.yml", node.inventory, extravars=_vars(tmp, **extra))


def _server_info(node):
    result = node.ssh(SERVER_INFO)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _assert_production_is_back(node):
    info = _server_info(node)
    assert info["argv"] == node.production_argv
    assert info["spec_v2"] is True
    assert node.ssh(f"test -e {MARKER}").returncode != 0, "the temporary-configuration marker is still there"
    assert node.ssh(f"test -e {STATE}/production-configuration").returncode != 0
    # rollback target is production again
    same = node.ssh("cmp /etc/systemd/system/sglang.service /etc/sglang/last-good/sglang.service"
                    " && cmp /etc/sglang/sglang.env /etc/sglang/last-good/sglang.env")
    assert same.returncode == 0, same.stdout + same.stderr


def _summary_on_node(node):
    return json.loads(node.ssh(f"cat {STATE}/summary.json", check=True).stdout)


def test_before_any_benchmark_the_doc_carries_the_seeds_reference(node):
    doc = node.ssh("cat /root/production_v2.md", check=True).stdout
    assert "None recorded on this node yet" in doc
    assert "Until then the reference is the seed's measured comparison below, which was not measured on this node." in doc
    assert "made 86.8 tok/s, `baseline` 92.7 tok/s (-6.4 %)" in doc
    # the patches explain themselves from the copies sglang_patches keeps on the node
    assert "### 1. Refuse a misspelt SGLANG_ENABLE_SPEC_V2 at start-up" in doc
    assert "- **Why:** the seed prepared this switch (left at 0, inactive)" in doc
    assert "| `SGLANG_SPEC_DISABLE_AT_RUNNING_REQUESTS` | `0` | sglang_patches | Patch 0002's switch:" in doc
    assert "no reason recorded" not in doc


def test_a_sweep_of_every_preset_the_seed_compared_runs_each_as_what_it_names(node, tmp_path):
    presets = list(yaml.safe_load((REPO / "roles" / "sglang_benchmark" / "defaults" / "main.yml").read_text())
                   ["sglang_benchmark_presets"])
    assert sorted(presets) == ["baseline", "topk1-spec-v1", "topk1-spec-v2", "topk4-spec-v1"]
    result = _benchmark(node, tmp_path, sglang_benchmark_concurrency_levels=[1, 32], sglang_benchmark_alternatives=presets)
    assert result.rc == 0, result.stdout[-6000:]
    summary = json.loads((tmp_path / "artifacts" / "summary.json").read_text())
    configurations = {c["name"]: c for c in summary["configurations"]}
    assert list(configurations) == ["production"] + presets
    assert [row["concurrency"] for row in summary["rows"]] == [1, 32]
    assert summary["failures"] == [] and summary["aborted"] is None
    production = configurations["production"]
    # the seed's production preset is exactly what the canonical inventory deploys
    assert configurations["topk1-spec-v2"]["argv"] == production["argv"]
    assert configurations["topk1-spec-v2"]["environment"] == production["environment"]
    # topk 1 on the v1 scheduler: the same flags, spec v2 off
    assert configurations["topk1-spec-v1"]["argv"] == production["argv"]
    assert "SGLANG_ENABLE_SPEC_V2" not in configurations["topk1-spec-v1"]["environment"]
    topk4 = configurations["topk4-spec-v1"]["argv"]
    assert topk4[topk4.index("--speculative-eagle-topk") + 1] == "4"
    assert topk4[topk4.index("--speculative-num-draft-tokens") + 1] == "16"
    baseline = configurations["baseline"]
    assert "--speculative-algorithm" not in baseline["argv"] and "SGLANG_ENABLE_SPEC_V2" not in baseline["environment"]
    # the client double measured each server as what it ran (its per-configuration model at C=1:
    # production 86.8 tok/s, the baseline 92.7, the seed's)
    first, crossover = summary["rows"]
    assert {name: round(r["output_throughput"], 1) for name, r in first["results"].items()} == {
        "production": 86.8, "baseline": 92.7, "topk4-spec-v1": 95.5, "topk1-spec-v1": 84.0, "topk1-spec-v2": 86.8}
    assert first["winner"] == "topk4-spec-v1"
    # above the seed's crossover (C=30) production beats the baseline; a tie goes to production
    assert crossover["concurrency"] == 32 and crossover["winner"] == "production"
    for name in ["production"] + presets:
        for level in (1, 32):
            raw = tmp_path / "artifacts" / "runs" / name / f"c{level}.jsonl"
            assert json.loads(raw.read_text().splitlines()[-1])["max_concurrency"] == level
            assert (tmp_path / "artifacts" / "runs" / name / f"c{level}.log").exists()
    assert (tmp_path / "artifacts" / "summary.md").read_text().startswith("Output throughput (tok/s)")
    assert _summary_on_node(node)["rows"] == summary["rows"]
    _assert_production_is_back(node)


def test_site_yml_puts_the_table_into_the_doc_and_is_idempotent(node):
    first = run_playbook("site.yml", node.inventory)
    assert first.rc == 0, first.stdout[-6000:]
    doc = node.ssh("cat /root/production_v2.md", check=True).stdout
    header = "| Concurrency | production | baseline | topk4-spec-v1 | topk1-spec-v1 | topk1-spec-v2 | Winner | Production vs winner |"
    assert header in doc
    assert "| 1 | 86.8 | 92.7 | **95.5** | 84.0 | 86.8 | topk4-spec-v1 | -9.1% |" in doc
    second = run_playbook("site.yml", node.inventory)
    assert second.rc == 0 and second.changed == 0, second.changed_tasks()


def test_failed_runs_are_reported_and_production_restored(node, tmp_path):
    result = _benchmark(node, tmp_path, sglang_benchmark_concurrency_levels=[1, 2], sglang_benchmark_alternatives=["baseline"],
                        sglang_benchmark_environment={"BENCH_SERVING_DOUBLE_FAIL_WITHOUT_SPECULATION": "1"})
    assert result.rc != 0
    message = " ".join(result.failure_messages())
    assert "2 run(s) without a result" in message
    assert "baseline at concurrency 1: bench_serving exited 1" in message
    summary = json.loads((tmp_path / "artifacts" / "summary.json").read_text())
    assert [row["winner"] for row in summary["rows"]] == ["production", "production"]
    _assert_production_is_back(node)


def test_a_run_past_its_timeout_is_killed_and_reported(node, tmp_path):
    result = _benchmark(node, tmp_path, sglang_benchmark_concurrency_levels=[1], sglang_benchmark_run_timeout=3,
                        sglang_benchmark_environment={"BENCH_SERVING_DOUBLE_SLEEP": "60"})
    assert result.rc != 0
    assert "production at concurrency 1: bench_serving timed out" in " ".join(result.failure_messages())
    _assert_production_is_back(node)


def test_a_refused_alternative_stops_the_sweep_and_production_comes_back(node, tmp_path):
    refused = {"name": "topk4-spec-v2", "server_args_overrides": {"speculative_eagle_topk": 4,
                                                                  "speculative_num_draft_tokens": 16}}
    result = _benchmark(node, tmp_path, sglang_benchmark_concurrency_levels=[1], sglang_benchmark_alternatives=[refused])
    assert result.rc != 0
    message = " ".join(result.failure_messages())
    assert "The sweep stopped" in message and "topk = 1" in message
    _assert_production_is_back(node)


def test_bad_alternatives_are_refused_before_anything_changes(node, tmp_path):
    before = _server_info(node)["pid"]
    result = _benchmark(node, tmp_path, sglang_benchmark_alternatives=["no-such-preset"])
    assert result.rc != 0
    assert "must be one of the presets" in result.stdout  # the failed loop item's message
    assert _server_info(node)["pid"] == before


def _interrupt_during_baseline(node, tmp_path):
    """Start a sweep whose baseline run hangs, kill ansible-playbook once the baseline serves."""
    extravars = _vars(tmp_path, sglang_benchmark_concurrency_levels=[1], sglang_benchmark_alternatives=["baseline"],
                      sglang_benchmark_environment={"BENCH_SERVING_DOUBLE_SLEEP_WITHOUT_SPECULATION": "600"})
    varfile = tmp_path / "vars.json"
    varfile.write_text(json.dumps(extravars))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
           "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(  # pylint: disable=consider-using-with
            [str(VENV_BIN / "ansible-playbook"), "-i", str(REPO / "inventory" / "testnode"), "-i", str(node.inventory),
             "playbooks/benchmark.yml", "-e", f"@{varfile}"],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                if process.poll() is not None:
                    log.seek(0)
                    pytest.fail("the benchmark ended before it could be interrupted:\n"
                                + log.read().decode(errors="replace")[-4000:])
                # [e]: the pattern must not match the shell that runs pgrep
                running = node.ssh("pgrep -f 'bench_serving_doubl[e].py.*runs/baseline/'").returncode == 0
                if running and node.ssh(f"test -e {MARKER}").returncode == 0:
                    break
                time.sleep(2)
            else:
                pytest.fail("the baseline run never started")
        finally:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            # ansible's worker processes call setsid(): kill the orphans of this run too (they
            # carry this test's unique vars file on their command line).
            orphans = subprocess.run(["pgrep", "-f", str(varfile)], capture_output=True, text=True).stdout.split()
            for pid in orphans:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
    info = _server_info(node)
    assert info["server_args"]["speculative_algorithm"] is None  # the baseline is what runs now


def test_an_interrupted_run_is_repaired_by_the_next_benchmark(node, tmp_path):
    _interrupt_during_baseline(node, tmp_path)
    result = _benchmark(node, tmp_path, sglang_benchmark_concurrency_levels=[])
    assert result.rc == 0, result.stdout[-6000:]
    # Read from the task's result: stdout is folded at 80 columns and colored line by line.
    assert any("restored (the temporary configuration was baseline)" in message for message in result.messages()), (
        result.messages()
    )
    _assert_production_is_back(node)
    # the client left running by the interrupted sweep is stopped too
    assert node.ssh("pgrep -f 'bench_serving_doubl[e].py'").returncode != 0


def test_an_interrupted_run_is_repaired_by_site_yml(node, tmp_path):
    _interrupt_during_baseline(node, tmp_path)
    result = run_playbook("site.yml", node.inventory)
    assert result.rc == 0, result.stdout[-6000:]
    _assert_production_is_back(node)
    assert "WARNING" not in node.ssh("cat /root/production_v2.md", check=True).stdout


# --------------------------------------------------------------------------- the real client

def test_real_bench_serving(node, tmp_path):
    python = SGLANG_PYTHON
    # bench_serving needs datasets & co. beyond the parser-only install; the wheelhouse has them.
    installed = node.ssh(f"{python} -m pip install -q --no-deps --no-index --find-links /srv/wheelhouse "
                         "-r /srv/wheelhouse/bench-requirements.txt")
    assert installed.returncode == 0, installed.stdout + installed.stderr
    imported = node.ssh(f"{python} -c 'import sglang.bench_serving'")
    assert imported.returncode == 0, imported.stderr[-2000:]
    probe = node.ssh("curl -s -o /dev/null -w '%{http_code}' -X POST -d '{}' http://127.0.0.1:30000/generate").stdout
    assert probe.strip() not in ("404", "501"), "the server double must answer POST /generate"
    for name, content in tiny_tokenizer().items():
        node.ssh(f"mkdir -p /srv/bench-tokenizer && cat > /srv/bench-tokenizer/{name} <<'EOF'\n{content}\nEOF", check=True)
    result = run_playbook("playbooks/benchmark.yml", node.inventory, extravars={
        "sglang_benchmark_concurrency_levels": [1, 4],
        "sglang_benchmark_random_input_len": 64,
        "sglang_benchmark_random_output_len": 32,
        "sglang_benchmark_tokenizer": "/srv/bench-tokenizer",
        "sglang_benchmark_artifacts_dir": str(tmp_path / "artifacts"),
    })
    assert result.rc == 0, result.stdout[-6000:]
    summary = json.loads((tmp_path / "artifacts" / "summary.json").read_text())
    assert summary["server_versions"] == ["0.5.9"]
    for row in summary["rows"]:
        production = row["results"]["production"]
        assert production["completed"] == 16 and production["output_throughput"] > 0
        assert production["accept_length"] == pytest.approx(2.7)  # the double's avg_spec_accept_length
    report = (tmp_path / "artifacts" / "runs" / "production" / "c4.log").read_text()
    assert "Serving Benchmark Result" in report and "TEST DOUBLE" not in report
    _assert_production_is_back(node)
