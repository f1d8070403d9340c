"""roles/sglang_monitoring's filters: scrape targets and unreachable servers from the inventory."""

import pytest
from ansible.errors import AnsibleFilterError


@pytest.fixture(scope="module")
def monitoring(project_module):
    return project_module("roles/sglang_monitoring/filter_plugins/sglang_monitoring.py")


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
    hostvars = {"g": {"sglang_gateway_prometheus_port": "metrics"}}
    with pytest.raises(AnsibleFilterError, match="g: sglang_gateway_prometheus_port is 'metrics'"):
        monitoring.sglang_monitoring_targets(["g"], hostvars, "sglang_gateway_prometheus_port", 29000)
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
