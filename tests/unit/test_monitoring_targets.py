"""roles/sglang_monitoring's filters: scrape targets and unreachable servers and gateways from the inventory."""

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from project_modules import REPO

ROLE = REPO / "roles" / "sglang_monitoring"


@pytest.fixture(scope="module")
def monitoring(project_module):
    return project_module("roles/sglang_monitoring/filter_plugins/sglang_monitoring.py")


@pytest.fixture(scope="module")
def role_vars():
    return yaml.safe_load((ROLE / "vars" / "main.yml").read_text())


HOSTVARS = {
    "n1": {"ansible_host": "10.213.0.2", "sglang_server_args": {"host": "0.0.0.0", "port": 30001}},
    "n2": {"ansible_host": "fd00::5", "sglang_server_args": {"host": "127.0.0.1"}},
    "n3": {},
}


def test_targets_take_the_address_from_ansible_host_and_the_port_from_the_variable(monitoring):
    targets = monitoring.sglang_monitoring_targets(["n1", "n2", "n3"], HOSTVARS, "sglang_server_args.port", 30000)
    assert targets == [
        {"node": "n1", "address": "10.213.0.2:30001"},
        {"node": "n2", "address": "[fd00::5]:30000"},
        {"node": "n3", "address": "n3:30000"},
    ]


def test_targets_refuse_a_port_that_is_no_port_naming_host_and_variable(monitoring):
    hostvars = {"g": {"sglang_gateway_endpoint": {"prometheus": {"port": "metrics"}}}}
    with pytest.raises(AnsibleFilterError, match="g: sglang_gateway_endpoint.prometheus.port is 'metrics'"):
        monitoring.sglang_monitoring_targets(["g"], hostvars, "sglang_gateway_endpoint.prometheus.port", None)
    with pytest.raises(AnsibleFilterError, match="70000"):
        monitoring.sglang_monitoring_targets(["g"], {"g": {"p": 70000}}, "p", 1)


def test_no_hosts_no_targets(monitoring):
    assert monitoring.sglang_monitoring_targets([], {}, "p", 1) == []


def test_servers_on_loopback_are_named_and_unset_host_is_sglang_default(monitoring):
    found = monitoring.sglang_monitoring_unreachable_servers(["n1", "n2", "n3"], HOSTVARS)
    assert found == ["n2: sglang_server_args.host is 127.0.0.1", "n3: sglang_server_args.host is 127.0.0.1"]
    assert monitoring.sglang_monitoring_unreachable_servers(["x"], {"x": {"sglang_server_args": {"host": "::1"}}})
    assert monitoring.sglang_monitoring_unreachable_servers(["x"], {"x": {"sglang_server_args": {"host": "localhost"}}})
    assert not monitoring.sglang_monitoring_unreachable_servers(["x"], {"x": {"sglang_server_args": {"host": "10.0.0.1"}}})


HOST_PATH = "sglang_gateway_endpoint.prometheus.host"


def _gateway(ansible_host, host, port=29000):
    return {"ansible_host": ansible_host, "sglang_gateway_endpoint": {"prometheus": {"host": host, "port": port}}}


def test_gateway_targets_take_the_port_of_the_published_endpoint(monitoring, role_vars):
    # The port path of the role's gateway job: the fact roles/sglang_gateway publishes.
    path = role_vars["__sglang_monitoring_gateway_metrics_port_path"]
    assert role_vars["__sglang_monitoring_gateway_metrics_host_path"] == HOST_PATH
    hostvars = {"gw": _gateway("10.0.0.9", "0.0.0.0", 29100)}
    assert monitoring.sglang_monitoring_targets(["gw"], hostvars, path, None) == [
        {"node": "gw", "address": "10.0.0.9:29100"}]


def test_gateways_on_loopback_or_without_an_endpoint_are_named(monitoring):
    hostvars = {"gw1": _gateway("10.0.0.9", "127.0.0.1"), "gw2": _gateway("10.0.0.10", "10.0.0.10"),
                "gw3": {"ansible_host": "10.0.0.11"}, "gw4": _gateway("fd00::9", "::1"),
                "gw5": _gateway("10.0.0.12", "localhost")}
    found = monitoring.sglang_monitoring_unreachable_gateways(["gw1", "gw2", "gw3", "gw4", "gw5"], hostvars,
                                                              ["mon"], HOST_PATH)
    assert found[0] == "gw1: sglang_gateway_args.prometheus_host is 127.0.0.1"
    assert found[1].startswith(f"gw3: publishes no {HOST_PATH} ")
    assert found[2:] == ["gw4: sglang_gateway_args.prometheus_host is ::1",
                         "gw5: sglang_gateway_args.prometheus_host is localhost"]
    assert not monitoring.sglang_monitoring_unreachable_gateways([], {}, ["mon"], HOST_PATH)


def test_a_gateway_on_loopback_is_reachable_only_by_itself_at_a_loopback_address(monitoring):
    unreachable = monitoring.sglang_monitoring_unreachable_gateways
    # The monitor is the gateway and scrapes it at 127.0.0.1: reachable.
    assert not unreachable(["gw"], {"gw": _gateway("127.0.0.1", "127.0.0.1")}, ["gw"], HOST_PATH)
    # The monitor is the gateway, but scrapes its ansible_host, which is not loopback.
    assert unreachable(["gw"], {"gw": _gateway("10.0.0.9", "127.0.0.1")}, ["gw"], HOST_PATH)
    # A second monitor on another host.
    assert unreachable(["gw"], {"gw": _gateway("127.0.0.1", "127.0.0.1")}, ["gw", "mon"], HOST_PATH)
    with pytest.raises(AnsibleFilterError, match="host_path"):
        unreachable(["gw"], {"gw": {}}, ["mon"], "")


def test_a_server_host_comes_from_sglang_worker_host_when_the_args_do_not_set_it(monitoring):
    # The canonical sglang_server_args take host and port from sglang_worker_host/_port (role
    # defaults, which hostvars never hold): a gateway fleet sets only those in its inventory.
    hostvars = {"n1": {"ansible_host": "10.0.0.5", "sglang_worker_host": "10.0.0.5", "sglang_worker_port": 30001},
                "n2": {"sglang_worker_host": "127.0.0.1"},
                "n3": {"sglang_worker_host": "10.0.0.7", "sglang_server_args": {"host": "127.0.0.1", "port": 30002}}}
    assert monitoring.sglang_monitoring_unreachable_servers(["n1", "n2", "n3"], hostvars) == [
        "n2: sglang_server_args.host is 127.0.0.1", "n3: sglang_server_args.host is 127.0.0.1"]
    targets = monitoring.sglang_monitoring_targets(["n1", "n3"], hostvars, ["sglang_server_args.port", "sglang_worker_port"],
                                                   30000)
    assert targets == [{"node": "n1", "address": "10.0.0.5:30001"}, {"node": "n3", "address": "n3:30002"}]

