"""What the tests of playbooks/upgrade.yml's rollout share (test_upgrade_rollout.py on one node,
test_upgrade_gateway.py on the gateway fleet): the bench client the gate measures with, the
double's pace per release in the inventory, the run itself, and what a node says afterwards.

The gate runs SGLang 0.5.9's real bench_serving from a venv of its own that sees the serving
venv's packages (site.addsitedir): the serving venv stays as site.yml made it (its packages are
part of what production_v2.md records).
"""

from __future__ import annotations

import json

import expected
import node_state
from ansible_run import run_playbook, start_playbook
from model_fixtures import tiny_tokenizer
from parser_venv import upgrade_sources

VARS = expected.testnode_vars()
CURRENT = VARS["sglang_version"]
TARGET = "0.5.23"
VENVS = VARS["sglang_venvs_dir"]
RECORD = VARS["sglang_releases_record"]
HISTORY = VARS["sglang_upgrade_history"]
WAY_BACK = f"{HISTORY.rsplit('/', 1)[0]}/way-back"  # roles/sglang_upgrade/vars/main.yml
GATE_RUNS = f"{HISTORY.rsplit('/', 1)[0]}/gate"  # roles/sglang_upgrade/tasks/measure.yml, while it measures
CLIENT = "/opt/bench-client"
TOKENIZER = "/srv/bench-tokenizer"
# The double's pace per release (tests/double/double_generate.py), from the inventory's mapping.
PACE_ENVIRONMENT = {
    "SGLANG_DOUBLE_STEP_SECONDS_BY_VERSION": (
        "{% for release, seconds in sglang_test_double_step_seconds_by_version.items() %}"
        "{{ release }}={{ seconds }}{{ '' if loop.last else ',' }}{% endfor %}"),
}


def install_bench_client(node):
    """0.5.9's bench_serving in CLIENT, and a tokenizer for it, on a node converged on 0.5.9."""
    site_packages = f"{VENVS}/{CURRENT}/lib/python3.11/site-packages"
    for command in (
        f"python3 -m venv {CLIENT}",
        # addsitedir, not a bare path: the serving venv's own .pth files (the torchvision shim) must run too
        f"echo 'import site; site.addsitedir(\"{site_packages}\")' > {CLIENT}/lib/python3.11/site-packages/sglang-serving.pth",
        f"{CLIENT}/bin/pip install -q --no-deps --no-index --find-links /srv/wheelhouse -r /srv/wheelhouse/bench-requirements.txt",
        f"{CLIENT}/bin/python -c 'import sglang.bench_serving'",
        f"mkdir -p {TOKENIZER}",
    ):
        node_state.ssh(node, command)
    for name, content in tiny_tokenizer().items():
        node.ssh(f"cat > {TOKENIZER}/{name} <<'EOF'\n{content}\nEOF", check=True)


def upgrade_extravars(report_dir, **extravars):
    """playbooks/upgrade.yml to TARGET from the wheelhouse, its gate at concurrency 4, twice each side."""
    return {
        "sglang_version": TARGET,
        **upgrade_sources(TARGET),
        "sglang_upgrade_report_dir": str(report_dir),
        "sglang_upgrade_gate_concurrency_levels": [4],
        "sglang_upgrade_gate_repetitions": 2,
        "sglang_benchmark_command": [f"{CLIENT}/bin/python", "-m", "sglang.bench_serving"],
        "sglang_benchmark_tokenizer": TOKENIZER,
        "sglang_benchmark_random_input_len": 32,
        "sglang_benchmark_random_output_len": 32,
        "sglang_benchmark_num_prompts": 8,
        **extravars,
    }


def upgrade(inventory, report_dir, **extravars):
    return run_playbook("playbooks/upgrade.yml", inventory, extravars=upgrade_extravars(report_dir, **extravars))


def start_upgrade(inventory, report_dir, **extravars):
    """The same run in the background, to be killed partway (ansible_run.start_playbook, kill_playbook)."""
    return start_playbook("playbooks/upgrade.yml", inventory, upgrade_extravars(report_dir, **extravars))


def gate_record(report_dir):
    return json.loads((report_dir / f"sglang-{CURRENT}-to-{TARGET}-gate.json").read_text())


def running_release(node):
    """(the interpreter of the node's server, the SGLang release it imports)."""
    pid = node_state.main_pid(node)
    python = node_state.ssh(node, f"tr '\\0' '\\n' < /proc/{pid}/cmdline | head -n 1").strip()
    return python, node_state.ssh(node, f"{python} -c 'import importlib.metadata as m; print(m.version(\"sglang\"))'").strip()


def release_record(node):
    return json.loads(node_state.ssh(node, f"cat {RECORD}"))


def pip_ran(result, host=None):
    return [e for e in result.events
            if e.get("event") == "runner_on_ok" and e["event_data"].get("task") == "Run pip install"
            and host in (None, e["event_data"].get("host"))]


def history(node):
    result = node.ssh(f"cat {HISTORY}")
    return json.loads(result.stdout) if result.returncode == 0 else []
