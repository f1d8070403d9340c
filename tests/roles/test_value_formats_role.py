"""A value without its format stops site.yml in its first checks, naming the variable, in --check too.

site.yml itself on localhost, one inventory per play that checks values: the nodes' play 1 (the
shared role's checks), the gateways' play 0 and the monitors' play. Each bad value is one the
issue reproduced: an nft command after the table name, Prometheus flags after the retention, a
PromQL clause after an alert's window. `--tags` keeps everything but the checks (tagged always, or
the monitoring tag for the monitors' play) from running on this machine, whatever the outcome.
"""

import sys

import pytest
import yaml
from ansible_run import run_playbook

CHECK_TASK = "Refuse every role variable whose value does not have its declared format"
NOT_A_TAG = "value_formats_test_selects_only_the_always_tagged_checks"

BAD_NODES = {
    "node-nft-injection": {
        "sglang_firewall_table": "sglang_canon; insert rule inet sglang_canon input tcp dport 30000 accept; table inet sglang_canon",
    },
    "node-several": {
        "sglang_monitoring_retention": "15d --web.enable-admin-api --web.enable-lifecycle",
        "sglang_deploy_lock": "/run/sglang-deploy.lock; rm -rf /",
        "sglang_service_after_units": ["network-online.target", "x.service ExecStartPre=+/bin/sh"],
        "sglang_install_packages": ["sglang==0.5.9", "--index-url=http://10.9.9.9/simple"],
    },
}
# host -> the variables its refusal must name (each with the index for a list element)
EXPECTED = {
    "node-nft-injection": ["sglang_firewall_table"],
    "node-several": ["sglang_monitoring_retention", "sglang_deploy_lock", "sglang_service_after_units[1]",
                     "sglang_install_packages[1]"],
    "gateway-bad": ["sglang_gateway_service_name"],
    "monitor-bad": ["sglang_monitoring_alert_watchdog_restart_window"],
}


def _run(tmp_path, name, groups, tag, check=False):
    inventory = tmp_path / f"{name}.yml"
    inventory.write_text(yaml.safe_dump({"all": {
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
        # Every group of site.yml, empty or not, as an operator's inventory has them.
        "children": {group: {"hosts": groups.get(group, {})} for group in ("sglang_nodes", "sglang_gateways", "sglang_monitors")},
    }}), encoding="utf-8")
    result = run_playbook("site.yml", inventory, check=check, tags=[tag], testnode_vars=False,
                          envvars={"ANSIBLE_CACHE_PLUGIN": "memory"})  # the project's fact cache is for real runs
    events, stdout = result.events, result.stdout
    failed = {e["event_data"]["host"]: (e["event_data"].get("task"), str(e["event_data"]["res"].get("msg", "")))
              for e in events if e.get("event") == "runner_on_failed"}
    changed = [e["event_data"].get("task") for e in events
               if e.get("event") == "runner_on_ok" and e["event_data"].get("res", {}).get("changed")]
    return failed, changed, stdout


@pytest.fixture(name="outcomes", scope="module")
def fixture_outcomes(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("value_formats")
    nodes = {**BAD_NODES, "node-defaults": {}}
    return {
        "nodes --check": _run(tmp_path, "nodes", {"sglang_nodes": nodes}, NOT_A_TAG, check=True),
        "nodes": _run(tmp_path, "nodes", {"sglang_nodes": nodes}, NOT_A_TAG),
        "gateway --check": _run(tmp_path, "gateway", {"sglang_gateways": {"gateway-bad": {
            "sglang_gateway_service_name": "sglang-gateway; systemctl stop sglang"}}}, NOT_A_TAG, check=True),
        "monitor --check": _run(tmp_path, "monitor", {"sglang_monitors": {"monitor-bad": {
            "sglang_monitoring_alert_watchdog_restart_window": "1h])) < 0 #"}}}, "sglang_monitoring", check=True),
    }


@pytest.mark.parametrize("run, host", [
    ("nodes --check", "node-nft-injection"), ("nodes --check", "node-several"),
    ("nodes", "node-nft-injection"), ("nodes", "node-several"),
    ("gateway --check", "gateway-bad"), ("monitor --check", "monitor-bad"),
])
def test_a_bad_value_stops_the_run_at_the_format_check_naming_each_variable(outcomes, run, host):
    failed, changed, stdout = outcomes[run]
    assert host in failed, stdout[-3000:]
    task, message = failed[host]
    assert task == CHECK_TASK, f"{task}: {message}"
    named = [line.split(": expected ")[0] for line in message.split("; ") if ": expected " in line]
    assert sorted(named) == sorted(EXPECTED[host]), message
    assert changed == [], f"changed before the refusal: {changed}"


@pytest.mark.parametrize("run", ["nodes --check", "nodes"])
def test_the_roles_defaults_pass_the_format_check(outcomes, run):
    failed, _, stdout = outcomes[run]
    assert "node-defaults" not in failed, failed.get("node-defaults") or stdout[-3000:]
    assert "node-defaults" in stdout  # it ran, and passed
