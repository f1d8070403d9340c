"""The watchdog behind a gateway (issue 38 §5), on the gateway fleet (tests/gateway_fleet.py).

A restart by the watchdog leaves the gateway and drains like every other restart, and the node
comes back once its probe succeeds; a node whose restart budget is spent leaves the gateway's
rotation until it answers again; what the watchdog needs of the gateway (URL, API key, CA) is a
root-only systemd credential, never on a command line.

Only the first node gets a fast watchdog (probe every 5 s, 3 s to answer, restart after 2
failures, one restart an hour), through this file's inventory; the module fixture puts the fleet
back on its own inventory afterwards, so the rolling tests after this file find it as they expect.
The SIGUSR1 switch of the server double hangs the generation path while /health stays 200.
"""

from __future__ import annotations

import json
import time

import pytest
from ansible_run import run_playbook
from gateway_client import DeployedGateway
from gateway_fleet import fleet_inventory

INTERVAL, TIMEOUT, THRESHOLD = 5, 3, 2
WATCHDOG_VARS = {"sglang_watchdog_interval": INTERVAL, "sglang_watchdog_timeout": TIMEOUT,
                 "sglang_watchdog_failure_threshold": THRESHOLD, "sglang_watchdog_restart_budget": 1}
PORT = 30000
CREDENTIAL = "/etc/sglang-watchdog/gateways.json"
PROM = "/var/lib/prometheus/node-exporter/sglang_watchdog.prom"
# From the hang: THRESHOLD failing ticks (each up to TIMEOUT), one tick of slack, the restart and
# the server double's warm-up, a tick to see it answer, and the gateway's own health check.
BACK_WITHIN = INTERVAL * (THRESHOLD + 3) + TIMEOUT * THRESHOLD + 60


def _ssh(node, command):
    done = node.ssh(command)
    assert done.returncode == 0, f"{command}: {done.stderr}"
    return done.stdout


def _main_pid(node):
    return _ssh(node, "systemctl show --property=MainPID --value sglang.service").strip()


def _worker_url(node):
    return f"http://{node.ip}:{PORT}"


@pytest.fixture(scope="module")
def fleet(gateway_fleet, tmp_path_factory):
    victim = gateway_fleet.nodes[0]
    inventory = fleet_inventory(gateway_fleet.harness_inventory,
                                tmp_path_factory.mktemp("watchdog-gateway") / "inventory.yml",
                                {victim.name: WATCHDOG_VARS})
    # Only the victim's variables differ from the fleet's inventory: a run limited to it (and the
    # gateways, which publish the endpoint its watchdog reaches) applies them.
    run = run_playbook("site.yml", inventory, limit=f"{victim.name},sglang_gateways")
    assert run.rc == 0, run.failure_messages() or run.stdout[-5000:]
    gateway = DeployedGateway(inventory)
    urls = [_worker_url(node) for node in gateway_fleet.nodes]
    gateway.wait_workers(urls, timeout=180)
    yield type("Fleet", (), {"victim": victim, "gateway": gateway, "urls": urls, "nodes": gateway_fleet.nodes,
                             "api_key": gateway_fleet.api_key})
    victim.ssh("systemctl restart sglang.service")  # never leave a hung server behind
    restore = run_playbook("site.yml", gateway_fleet.inventory, limit=f"{victim.name},sglang_gateways")
    assert restore.rc == 0, restore.failure_messages() or restore.stdout[-5000:]
    gateway.wait_workers(urls, timeout=180)


def _journal(node, since):
    return _ssh(node, f"journalctl --no-pager -o cat -u sglang-watchdog.service --since '{since}'")


def _watch_gateway(fleet, until, timeout, interval=0.5):
    """Poll the gateway's workers until until(listing) holds; returns every listing seen."""
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            seen.append(fleet.gateway.workers())
        except OSError:
            pass
        if seen and until(seen[-1]):
            return seen
        time.sleep(interval)
    raise AssertionError(f"gateway listings within {timeout} s never matched; last: {seen[-1:]}")


def _wait_back_in_rotation_says_the_watchdog(node):
    """The watchdog's own word that the node is back: the tick after its POST /workers sees it
    listed (bounded: a few ticks)."""
    deadline = time.monotonic() + 3 * INTERVAL + 10
    while 'sglang_watchdog_out_of_rotation{unit="sglang.service"} 0' not in _ssh(node, f"cat {PROM}"):
        assert time.monotonic() < deadline, _ssh(node, f"cat {PROM}")
        time.sleep(1)


def test_the_gateways_reach_the_watchdog_in_a_root_only_credential(fleet):
    for node in fleet.nodes:
        assert _ssh(node, f"stat -c '%a %U %G' {CREDENTIAL} $(dirname {CREDENTIAL})").split("\n")[:2] == [
            "600 root root", "700 root root"], node.name
        credential = json.loads(_ssh(node, f"cat {CREDENTIAL}"))
        assert credential["worker_url"] == _worker_url(node)
        (gateway,) = credential["gateways"]
        assert gateway["url"] == fleet.gateway.url and gateway["api_key"] == fleet.api_key
        assert gateway["ca_pem"].startswith("-----BEGIN CERTIFICATE-----")
        unit = _ssh(node, "systemctl cat sglang-watchdog.service")
        assert f"LoadCredential=gateways:{CREDENTIAL}" in unit
        assert fleet.api_key not in unit
        assert fleet.api_key not in _ssh(node, "systemctl show --property=ExecStart sglang-watchdog.service")


def test_a_restart_by_the_watchdog_leaves_the_gateway_drains_and_rejoins(fleet):
    victim, url = fleet.victim, _worker_url(fleet.victim)
    pid = _main_pid(victim)
    since = _ssh(victim, "date '+%Y-%m-%d %H:%M:%S'").strip()
    _ssh(victim, f"kill -USR1 {pid}")

    seen = _watch_gateway(fleet, lambda workers: url not in workers, timeout=BACK_WITHIN)
    _watch_gateway(fleet, lambda workers: workers.get(url) is True, timeout=BACK_WITHIN)
    _wait_back_in_rotation_says_the_watchdog(victim)

    assert _main_pid(victim) != pid
    assert all(other in listing for listing in seen for other in fleet.urls[1:]), "another node left the gateway"
    # Out of the gateway, drained, only then restarted; back once its probe succeeded.
    journal = _journal(victim, since)
    steps = (f"{url} left its 1 gateway(s)", "drained", "restart queued", f"{url} is back in its 1 gateway(s)")
    assert all(step in journal for step in steps), journal[-3000:]
    order = [journal.index(step) for step in steps]
    assert order == sorted(order), journal[-3000:]


def test_a_node_whose_budget_is_spent_stays_out_of_rotation_until_it_answers(fleet):
    # The restart of the test before spent this node's budget of one restart an hour.
    victim, url = fleet.victim, _worker_url(fleet.victim)
    pid = _main_pid(victim)
    since = _ssh(victim, "date '+%Y-%m-%d %H:%M:%S'").strip()
    _ssh(victim, f"kill -USR1 {pid}")

    _watch_gateway(fleet, lambda workers: url not in workers, timeout=BACK_WITHIN)
    # It stays out while it hangs and nothing restarts it.
    time.sleep(3 * INTERVAL)
    assert url not in fleet.gateway.workers()
    assert _main_pid(victim) == pid
    prom = _ssh(victim, f"cat {PROM}")
    assert 'sglang_watchdog_budget_exhausted{unit="sglang.service"} 1' in prom, prom
    assert 'sglang_watchdog_out_of_rotation{unit="sglang.service"} 1' in prom, prom
    assert "the restart budget is spent" in _journal(victim, since)

    # A human restarts it; the watchdog's next good probe puts it back (no deploy runs).
    _ssh(victim, "systemctl restart sglang.service")
    _watch_gateway(fleet, lambda workers: workers.get(url) is True, timeout=BACK_WITHIN)
    _wait_back_in_rotation_says_the_watchdog(victim)
    assert f"{url} is back in its 1 gateway(s)" in _journal(victim, since)
