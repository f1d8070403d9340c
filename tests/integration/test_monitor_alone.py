"""One serving node and one monitor, no gateway (tests/testnode up 1 --monitor): site.yml converges it.

The monitor is another host, so it reaches the server at the node's own address; the harness once
left the server on loopback unless --gateway was given too, and site.yml refused the inventory
(roles/sglang_monitoring/tasks/check.yml: a monitor cannot scrape loopback). Issue 38 §8.
"""

import json

from alertmanager_checks import wait_for
from ansible_run import run_playbook
from node_state import failure_messages


def test_a_node_and_a_monitor_alone_converge_and_the_monitor_scrapes_the_server(node_sets):
    node_set = node_sets("monitor-alone", 1, monitor=True)
    server = next(node for node in node_set.nodes() if node.group == "sglang_nodes")
    monitor = next(node for node in node_set.nodes() if node.group == "sglang_monitors")

    result = run_playbook("site.yml", node_set.inventory)

    assert result.rc == 0, failure_messages(result) or result.stdout[-4000:]
    # Prometheus on the monitor scrapes the server where it now listens, and finds it up.
    def server_target():
        done = monitor.ssh("curl -sf http://127.0.0.1:9090/api/v1/targets")
        targets = json.loads(done.stdout)["data"]["activeTargets"] if done.returncode == 0 else []
        return [t["health"] for t in targets if t["scrapeUrl"] == f"http://{server.ip}:30000/metrics"]

    wait_for("the server's target up on the monitor", lambda: server_target() == ["up"], timeout=60,
             describe=server_target)
