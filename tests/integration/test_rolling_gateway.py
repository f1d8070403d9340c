"""Rolling deploys of a fleet behind SGLang's gateway (sglang-router 0.3.2) drop no request (issue 14 §3).

Three serving nodes, their server on the node's own address, behind one gateway; 16
clients send requests through the gateway only, each request taking about half a second on
the server (SGLANG_DOUBLE_REQUEST_SECONDS in the fleet's inventory), so requests are in flight
whenever a node is taken out. Proven here:

- a site.yml run that restarts every node (a changed server environment) checks all nodes at
  once (the inventory, then the server's configuration), then converges batch by batch in the
  inventory's order, each node out of the gateway, drained, restarted, back and healthy before
  the next starts, and no client request fails;
- playbooks/rolling_restart.yml does the same, one node per play;
- kill -9 of a node's server under load: no client request fails (the gateway retries and
  ejects it), and it is back in rotation after systemd restarted it;
- a reboot of a node under load: the same, and it comes back into rotation by itself (its
  firewall and server start on boot);
- the first node's new configuration never gets healthy: it is rolled back, file for file, and
  added back to the gateway only once healthy on its last good configuration, which a drift
  scan then finds in order; the batches after it do not start (checked, in check mode, before
  the first batch, and left alone), and no client request fails;
- playbooks/rolling_restart.yml runs that same restart sequence: a node whose configuration on
  disk never gets healthy is rolled back, its deploy lock released (the watchdog is not locked
  out) and it is back in the gateway, healthy; the batches after it are not touched.

The fleet is conftest's gateway_fleet (with a monitor; converged once, shared with
test_gateway.py and test_monitoring.py, which run before this file; a converged fleet checked
and converged batch by batch without a change or a restart is test_gateway.py's second run): the gateway is the one
roles/sglang_gateway deploys, reached as clients reach it (TLS, API key; tests/gateway_client.py).
"""

import difflib
import threading
import time

import pytest

import node_state
from ansible_run import run_playbook
from gateway_fleet import FLEET_SERVER_ENVIRONMENT as BASE_ENVIRONMENT
from rolling_checks import (JOIN, LEAVE, WARMUP_2, Fleet, assert_each_node_left_drained_and_rejoined_in_turn,
                            assert_no_request_failed, changes_on, first_time, one_result, results_of, worker_url)

ROLLBACK_RESTART = "Restart the service on the last good configuration"
DEPLOY_LOCK = "/run/sglang-deploy.lock"


def _changed_lines(diff):
    """The lines a --diff result changed (unified diff of its before and after texts), else the result as text."""
    if isinstance(diff, dict) and isinstance(diff.get("before"), str) and isinstance(diff.get("after"), str):
        return "\n".join(difflib.unified_diff(diff["before"].splitlines(), diff["after"].splitlines(),
                                               "before", "after", lineterm=""))
    return str(diff)[:1500]


@pytest.fixture(scope="module")
def fleet(gateway_fleet, tmp_path_factory):
    fleet = Fleet(gateway_fleet, tmp_path_factory.mktemp("rolling"))
    # The files before this one leave the fleet converged, and this file's inventory is the same
    # (the fleet's server environment): a run finds nothing to do before any load runs. It once
    # found the gateway's unit without its API key and restarted the gateway, under load in a
    # rolling test: test_gateway.py's --check run had rewritten it, since site.yml's plays set
    # check_mode to false (not the command line's) outside drift scans.
    settle = run_playbook("site.yml", fleet.inventory(BASE_ENVIRONMENT), diff=True)
    assert settle.rc == 0, settle.failure_messages() or settle.stdout[-5000:]
    assert settle.changed == 0, (f"the gateway fleet had drifted before the rolling tests: {settle.changed_tasks()}; "
                                 f"diffs: {[(host, what, _changed_lines(diff)) for host, what, diff in settle.diffs()]}")
    fleet.gateway.wait_workers(fleet.urls, timeout=180)
    return fleet


def main_pid(node):
    return node.ssh("systemctl show --property=MainPID --value sglang.service").stdout.strip()


def server_environment(node):
    """The running server's environment, NAME=value each (/proc/PID/environ: NUL-terminated)."""
    return node.testinfra_host().file(f"/proc/{main_pid(node)}/environ").content_string.split("\0")[:-1]


def test_site_run_restarting_every_node_drops_no_request_and_goes_batch_by_batch(fleet):
    before = {node.name: main_pid(node) for node in fleet.nodes}
    inventory = fleet.inventory(WARMUP_2)
    load = fleet.load()
    started = time.monotonic()
    result = run_playbook("site.yml", inventory)
    stats = load.stop()
    print(f"site.yml rolling deploy of {len(fleet.nodes)} nodes under load: {time.monotonic() - started:.1f} s, {stats}")

    assert result.rc == 0, result.failure_messages()
    assert_no_request_failed(stats)
    assert all(main_pid(node) != before[node.name] for node in fleet.nodes)
    # the inventory and the server's configuration checked on every node at once, then one node
    # per batch in the inventory's order
    names = {node.name for node in fleet.nodes}
    (check, check_hosts), (config, config_hosts), *batches = result.plays_on(node.name for node in fleet.nodes)
    assert check.startswith("Check every node") and check_hosts == names
    assert config.startswith("Check the server's configuration on every node") and config_hosts == names
    assert [name for name, _ in batches] == [batches[0][0]] * len(fleet.nodes) and batches[0][0].startswith("Converge")
    assert [hosts for _, hosts in batches] == [{node.name} for node in fleet.nodes]
    assert_each_node_left_drained_and_rejoined_in_turn(fleet, result)
    assert fleet.gateway.wait_workers(fleet.urls, timeout=5)


def test_rolling_restart_playbook_drops_no_request(fleet):
    before = {node.name: main_pid(node) for node in fleet.nodes}
    inventory = fleet.inventory(WARMUP_2)
    load = fleet.load()
    result = run_playbook("playbooks/rolling_restart.yml", inventory)
    stats = load.stop()

    assert result.rc == 0, result.failure_messages()
    assert_no_request_failed(stats)
    assert all(main_pid(node) != before[node.name] for node in fleet.nodes)
    restart_plays = [e for e in result.events if e["event"] == "playbook_on_play_start"
                     and e["event_data"]["play"].startswith("Restart SGLang one batch at a time")]
    assert len(restart_plays) == len(fleet.nodes)  # one batch per node (after the gateways' endpoint play)
    assert_each_node_left_drained_and_rejoined_in_turn(fleet, result)


def requests_served_since(node, invocation):
    """Generation requests the server instance `invocation` answered (its journal lines)."""
    out = node.ssh(f"journalctl --no-pager -o cat _SYSTEMD_INVOCATION_ID={invocation} | grep -c 'POST /v1/completions'")
    return int(out.stdout.strip() or 0)


def wait_back_in_rotation(fleet, node, timeout):
    """Bounded waits until the gateway lists every node healthy again and node's running server
    instance answered requests through it (the gateway's circuit breaker may hold it back a while
    after it is listed healthy)."""
    fleet.gateway.wait_workers(fleet.urls, timeout=timeout)
    invocation = node.ssh("systemctl show --property=InvocationID --value sglang.service").stdout.strip()
    deadline = time.monotonic() + 180
    while requests_served_since(node, invocation) == 0:
        assert time.monotonic() < deadline, "the restarted server got no request through the gateway"
        time.sleep(1)


def test_a_node_killed_under_load_costs_no_request_and_comes_back_into_rotation(fleet):
    victim = fleet.nodes[0]
    pid = main_pid(victim)
    load = fleet.load()
    while load.completed() < 20:  # the load is flowing through the nodes
        time.sleep(0.1)
    victim.ssh(f"kill -9 {pid}", check=True)
    # systemd restarts it (RestartSec=1 here); the gateway's health checks take it back
    deadline = time.monotonic() + 120
    while not (main_pid(victim) not in ("0", pid) and _active(victim)):
        assert time.monotonic() < deadline, "systemd did not restart the killed server"
        time.sleep(0.5)
    wait_back_in_rotation(fleet, victim, timeout=120)
    stats = load.stop()

    assert_no_request_failed(stats)


def _active(node):
    return node.ssh("systemctl is-active sglang.service").stdout.strip() == "active"


def test_a_node_rebooted_under_load_costs_no_request_and_comes_back_into_rotation(fleet):
    victim = fleet.nodes[1]
    url = worker_url(victim)
    load = fleet.load()
    while load.completed() < 20:  # the load is flowing through every node
        time.sleep(0.1)
    rebooting = threading.Thread(target=victim.reboot)  # tests/testnode reboot: returns once SSH answers
    rebooting.start()
    # while it is down, the gateway's health checks eject it (no deploy told the gateway anything)
    ejected, deadline = False, time.monotonic() + 300
    while rebooting.is_alive():
        assert time.monotonic() < deadline, "the node did not come back from its reboot"
        try:
            ejected = ejected or fleet.gateway.workers().get(url) is False
        except OSError:
            pass  # the gateway itself is fine; a poll that timed out under load proves nothing
        time.sleep(0.5)
    rebooting.join()
    assert ejected, "the gateway never reported the rebooted node unhealthy"
    # back by itself: its firewall and server start on boot, the gateway's health checks take it back
    assert victim.ssh("nft list table inet sglang_canon").returncode == 0
    deadline = time.monotonic() + 180
    while not _active(victim):
        assert time.monotonic() < deadline, "the server did not start on boot"
        time.sleep(0.5)
    wait_back_in_rotation(fleet, victim, timeout=180)
    stats = load.stop()

    assert_no_request_failed(stats)


def test_a_node_that_fails_its_health_check_is_rolled_back_and_only_then_added_back(fleet):
    failing, *after = fleet.nodes
    # The earlier tests left every node on WARMUP 2 (this inventory); going back to the base
    # environment is a new configuration for each node, and the first one's never gets healthy.
    deployed = fleet.inventory(WARMUP_2)
    inventory = fleet.inventory(BASE_ENVIRONMENT, {failing.name: {
        "sglang_service_environment": {**BASE_ENVIRONMENT, "SGLANG_DOUBLE_NEVER_HEALTHY": "1"},
        "sglang_service_health_timeout": 20,
    }})
    paths = node_state.managed_paths(failing)
    good = node_state.fingerprint(failing, paths)
    after_pids = {node.name: main_pid(node) for node in after}
    after_env_shas = {node.name: node.testinfra_host().file(node_state.ENV_FILE).sha256sum for node in after}
    load = fleet.load()
    result = run_playbook("site.yml", inventory)
    stats = load.stop()

    assert result.rc != 0 and result.count("failures", failing.name) == 1
    said = [m for m in result.failure_messages() if "Rolled back to the last good configuration" in m]
    assert said, result.failure_messages()
    assert node_state.ENV_FILE in said[0] and "healthy again" in said[0], said[0]  # names what it restored
    assert_no_request_failed(stats)
    # the failing node: out, drained, rolled back to its last good configuration (file for
    # file), and only then back in, healthy
    left = one_result(result, LEAVE, failing.name)
    joined = one_result(result, JOIN, failing.name)
    assert left["action"] == "remove" and joined["action"] == "add"
    assert first_time(result, ROLLBACK_RESTART, failing.name) < first_time(result, JOIN, failing.name)
    back = node_state.fingerprint(failing, paths)
    assert not node_state.differences(good, back), node_state.differences(good, back)
    environment = server_environment(failing)
    assert "SGLANG_DOUBLE_NEVER_HEALTHY=1" not in environment and "SGLANG_DOUBLE_WARMUP_SECONDS=2" in environment
    fleet.gateway.wait_workers(fleet.urls, timeout=10)
    # the rollout stopped: the batches after the failure did not start (the failing node's is the
    # last batch), and their nodes were not taken out, nor changed, nor restarted
    batches = [hosts for name, hosts in result.plays_on(node.name for node in fleet.nodes) if name.startswith("Converge")]
    assert batches == [{failing.name}], batches
    for node in after:
        assert results_of(result, LEAVE, node.name) == [] and changes_on(result, node.name) == []
    assert {node.name: main_pid(node) for node in after} == after_pids
    assert {node.name: node.testinfra_host().file(node_state.ENV_FILE).sha256sum for node in after} == after_env_shas
    # the rolled-back configuration is the one deployed before (issue 19): a drift scan of the
    # fleet against that inventory finds nothing to change, and restarts nothing
    pids = {node.name: main_pid(node) for node in fleet.nodes}
    scan = run_playbook("playbooks/drift.yml", deployed)
    assert scan.rc == 0, scan.failure_messages() or scan.stdout[-4000:]
    assert {node.name: main_pid(node) for node in fleet.nodes} == pids


def test_a_rolling_restart_that_never_gets_healthy_rolls_back_releases_the_lock_and_rejoins(fleet):
    failing, *after = fleet.nodes
    # The fleet is on WARMUP 2 (the tests before); the failing node's environment file is edited by
    # hand, which its server reads at the next start only: the configuration on disk never gets
    # healthy, while its last good one (what site.yml last wrote and saw healthy) does.
    inventory = fleet.inventory(WARMUP_2, {failing.name: {"sglang_service_health_timeout": 20}})
    paths = node_state.managed_paths(failing)
    good = node_state.fingerprint(failing, paths)
    after_pids = {node.name: main_pid(node) for node in after}
    node_state.ssh(failing, f"echo 'SGLANG_DOUBLE_NEVER_HEALTHY=\"1\"' >> {node_state.ENV_FILE}")
    load = fleet.load()
    result = run_playbook("playbooks/rolling_restart.yml", inventory)
    stats = load.stop()

    assert result.rc != 0 and result.count("failures", failing.name) == 1, result.failure_messages()
    said = [m for m in result.failure_messages() if "Rolled back to the last good configuration" in m]
    assert said, result.failure_messages()
    assert node_state.ENV_FILE in said[0] and "healthy again" in said[0], said[0]
    assert_no_request_failed(stats)
    # the deploy lock is gone: sglang-watchdog watches the server again
    assert failing.ssh(f"test -e {DEPLOY_LOCK}").returncode == 1, f"{DEPLOY_LOCK} left behind"
    # out, drained, rolled back file for file, and only then back in the gateway, healthy
    left = one_result(result, LEAVE, failing.name)
    joined = one_result(result, JOIN, failing.name)
    assert left["action"] == "remove" and joined["action"] == "add"
    assert first_time(result, ROLLBACK_RESTART, failing.name) < first_time(result, JOIN, failing.name)
    assert fleet.gateway.wait_workers(fleet.urls, timeout=10)
    back = node_state.fingerprint(failing, paths)
    assert not node_state.differences(good, back), node_state.differences(good, back)
    assert "SGLANG_DOUBLE_NEVER_HEALTHY=1" not in server_environment(failing)
    # the rollout stopped at the failed node: the batches after it were not taken out nor restarted
    for node in after:
        assert results_of(result, LEAVE, node.name) == []
    assert {node.name: main_pid(node) for node in after} == after_pids
