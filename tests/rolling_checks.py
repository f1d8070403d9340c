"""What the rolling tests on the gateway fleet share (test_rolling_gateway.py, test_upgrade_gateway.py):
the fleet's inventories, a client load through its gateway, and the checks of a rollout's
restart sequence read from ansible-runner's events (out of the gateways, drained, back in, in
turn) and of the load (no failed request).
"""

from __future__ import annotations

import sys

from gateway_client import DeployedGateway
from gateway_fleet import FLEET_SERVER_ENVIRONMENT as BASE_ENVIRONMENT
from gateway_fleet import fleet_inventory
from project_modules import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from gateway_load import LoadRun, Target  # noqa: E402  pylint: disable=wrong-import-position,wrong-import-order

CLIENTS = 16
# The server environment the rolling deploys change every node to (a new configuration for each):
# test_rolling_gateway.py leaves the fleet on it.
WARMUP_2 = {**BASE_ENVIRONMENT, "SGLANG_DOUBLE_WARMUP_SECONDS": "2"}
PORT = 30000
LEAVE = "Take this node out of every gateway (worker API), waiting until none lists it"
DRAIN = "Wait until the requests in flight on this node finished"
JOIN = "Add this node back to every gateway, waiting until each reports it healthy"


def worker_url(node):
    return f"http://{node.ip}:{PORT}"


class Fleet:
    """conftest's gateway_fleet as a rolling test drives it: an inventory per run, a load through the gateway."""

    def __init__(self, gateway_fleet, folder):
        self.gateway_fleet = gateway_fleet
        self.gateway = DeployedGateway(gateway_fleet.inventory)
        self.folder = folder
        self.nodes = gateway_fleet.nodes
        self.urls = [worker_url(node) for node in self.nodes]
        self.runs = 0

    def inventory(self, environment, node_vars=None):
        """The fleet's inventory with this server environment on every node (and node_vars:
        {name: {variable: value}} on top)."""
        self.runs += 1
        per_node = {node.name: {"sglang_service_environment": environment, **(node_vars or {}).get(node.name, {})}
                    for node in self.nodes}
        return fleet_inventory(self.gateway_fleet.harness_inventory, self.folder / f"inventory-{self.runs}.yml",
                               per_node)

    def load(self):
        target = Target(self.gateway.url, "/v1/completions", self.gateway.api_key, self.gateway.ca_file)
        return LoadRun(target, clients=CLIENTS).start()


def changes_on(result, host):
    return [
        e["event_data"]["task"] for e in result.events
        if e["event"] in ("runner_on_ok", "runner_item_on_ok") and e["event_data"].get("host") == host
        and e["event_data"].get("res", {}).get("changed")
    ]


def task_events(result, task, host=None):
    return [e for e in result.events if e["event"] in ("runner_on_ok", "runner_item_on_ok")
            and (e["event_data"].get("task") or "").startswith(task)  # a name may end in templated values
            and (host is None or e["event_data"].get("host") == host)]


def results_of(result, task, host):
    """Per-item results of a looped task, or the task's result."""
    events = task_events(result, task, host)
    items = [e["event_data"]["res"] for e in events if e["event"] == "runner_item_on_ok"]
    return items or [e["event_data"]["res"] for e in events]


def one_result(result, task, host):
    """The one result of `task` on `host`; failing, the tasks that did run there, to say why."""
    found = results_of(result, task, host)
    ran = [(e["event"], e["event_data"].get("task")) for e in result.events
           if e["event"].startswith("runner_on_") and e["event_data"].get("host") == host
           and e["event_data"].get("role") == "sglang_service"]
    assert len(found) == 1, (task, host, found, ran[-40:])
    return found[0]


def first_time(result, task, host):
    return min(e["created"] for e in task_events(result, task, host))


def last_time(result, task, host):
    return max(e["created"] for e in task_events(result, task, host))


def assert_each_node_left_drained_and_rejoined_in_turn(fleet, result):
    order = []
    for node in fleet.nodes:
        left = one_result(result, LEAVE, node.name)
        drained = one_result(result, DRAIN, node.name)
        joined = one_result(result, JOIN, node.name)
        assert left["action"] == "remove" and left["changed"], left
        assert joined["action"] == "add" and joined["changed"], joined
        # requests were in flight when it left, and it waited for them
        assert drained["action"] == "wait_drained" and drained["in_flight"] == 0 and drained["waited"] > 0, drained
        order.append((first_time(result, LEAVE, node.name), last_time(result, JOIN, node.name)))
    # batch by batch: a node leaves only once the one before it is back and healthy
    for (_, joined_before), (left_next, _) in zip(order, order[1:]):
        assert joined_before < left_next, order


def assert_no_request_failed(stats):
    assert stats["failed"] == 0, stats["failures"]
    assert stats["ok"] >= 100, stats  # a steady load, not a trickle
