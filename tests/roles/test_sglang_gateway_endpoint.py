"""The fact sglang_gateway_endpoint for real: site.yml's play 0 on localhost gateways, through tests/ansible_run.py.

A node reads hostvars[GATEWAY].sglang_gateway_endpoint (roles/sglang_service/tasks/restart_sequence.yml,
where it leaves and rejoins its gateways): hostvars never hold the gateway role's defaults, the fact does. The gateways here
set no sglang_gateway_url: the URL comes from ansible_host and the default port. The API key is in
the fact but in no printed line, no event and no fact cache file. The nodes' worker URLs are checked
in play 0 too (loopback behind a gateway elsewhere, shared URLs); a node whose gateway published no
endpoint (a --limit without the gateways) stops with a message saying so.
"""

import json
import os
import sys

import pytest
import yaml
from ansible_run import REPO, VENV_BIN, run_playbook

API_KEY = "sk-roles-test-0123456789-endpoint-secret"
GATEWAYS = {
    # a key, no TLS, sglang_gateway_args without any prometheus option: the defaults apply
    "gw-key": {"ansible_host": "192.0.2.31", "sglang_gateway_api_keys": [API_KEY],
               "sglang_gateway_args": {"policy": "round_robin"}},
    # no key at all (allowed insecure), its own port and metrics address, a CA file
    "gw-nokey": {"ansible_host": "192.0.2.32", "sglang_gateway_port": 9443, "sglang_gateway_tls_ca_file": "/srv/ca.pem",
                 "sglang_gateway_args": {"prometheus_host": "0.0.0.0", "prometheus_port": 29100}},
}
NODES = {"n1": {"sglang_worker_host": "192.0.2.11"}, "n2": {"sglang_worker_host": "192.0.2.12"}}

SHOW = """\
- name: The gateway role's play 0
  ansible.builtin.import_playbook: {site}

- name: Show the published endpoints, the API key only as whether it is the inventory's
  hosts: sglang_gateways
  gather_facts: false
  tasks:
    - name: Show the endpoint
      ansible.builtin.debug:
        msg: >-
          {{{{ sglang_gateway_endpoint | combine({{'api_key':
               'the key' if sglang_gateway_endpoint.api_key == (sglang_gateway_api_keys | default([''], true) | first)
                         and sglang_gateway_endpoint.api_key | length > 0
               else sglang_gateway_endpoint.api_key}}) }}}}
      tags: [always]
"""

# The restart sequence on a serving node that owes a restart, as the role's vars would say; the
# controller has no systemd, so the sequence's read of the unit (a `systemctl show` whose answer
# __sglang_service_before stands for here) runs a stand-in that answers nothing.
LEAVE = """\
- name: A node whose gateways are limited out of the run
  hosts: sglang_nodes
  gather_facts: false
  tasks:
    - name: Restart through the one restart sequence
      ansible.builtin.include_tasks: {sequence}
      vars:
        sglang_service_gateways: "{{{{ groups['sglang_gateways'] }}}}"
        sglang_service_name: sglang
        sglang_check_mode: false
        sglang_deploy_lock: {lock}
        __sglang_service_restart_owed: true
        __sglang_service_before: {{ActiveState: active, LoadState: loaded, NeedDaemonReload: "no", InvocationID: ""}}
"""


def _inventory(tmp_path, gateways, nodes):
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump({"all": {"vars": local, "children": {
        "sglang_gateways": {"hosts": gateways, "vars": {"sglang_gateway_allow_insecure": True}},
        "sglang_nodes": {"hosts": nodes},
    }}}), encoding="utf-8")
    return path


def _playbook(tmp_path, text):
    path = tmp_path / "playbook.yml"
    path.write_text(text.format(site=REPO / "site.yml", sequence=REPO / "roles/sglang_service/tasks/restart_sequence.yml",
                                lock=tmp_path / "deploy.lock"),
                    encoding="utf-8")
    return path


@pytest.fixture(name="published", scope="module")
def fixture_published(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("endpoint")
    cache = tmp_path / "fact-cache"
    # Only play 0's tasks (tags always) on the gateways: the node plays are limited out.
    result = run_playbook(_playbook(tmp_path, SHOW), _inventory(tmp_path, GATEWAYS, NODES),
                          tags=["sglang_gateway_endpoint_test"], limit="sglang_gateways",
                          envvars={"ANSIBLE_CACHE_PLUGIN_CONNECTION": str(cache)})
    assert result.rc == 0, result.stdout[-4000:]
    shown = {e["event_data"]["host"]: e["event_data"]["res"]["msg"] for e in result.events
             if e.get("event") == "runner_on_ok" and e["event_data"].get("task") == "Show the endpoint"}
    cached = "".join(p.read_text() for p in cache.rglob("*") if p.is_file()) if cache.exists() else ""
    return result, shown, cached


def test_the_url_comes_from_ansible_host_and_the_default_port(published):
    _, shown, _ = published
    assert shown["gw-key"]["url"] == "https://192.0.2.31:8443"
    assert shown["gw-nokey"]["url"] == "https://192.0.2.32:9443"


def test_the_api_key_is_the_inventorys_or_empty(published):
    _, shown, _ = published
    assert shown["gw-key"]["api_key"] == "the key"
    assert shown["gw-nokey"]["api_key"] == ""


def test_ca_file_service_name_and_prometheus_with_the_defaults_applied(published):
    _, shown, _ = published
    assert shown["gw-key"]["ca_file"] is None and shown["gw-nokey"]["ca_file"] == "/srv/ca.pem"
    assert shown["gw-key"]["service_name"] == "sglang-gateway"
    assert shown["gw-key"]["prometheus"] == {"host": "127.0.0.1", "port": 29000}
    assert shown["gw-nokey"]["prometheus"] == {"host": "0.0.0.0", "port": 29100}


def test_the_api_key_is_never_printed_nor_cached(published):
    result, _, cached = published
    assert API_KEY not in result.stdout
    assert API_KEY not in json.dumps(result.events)
    assert API_KEY not in cached


def test_nodes_the_gateway_cannot_reach_or_tell_apart_are_refused_in_play_0(tmp_path):
    # n1 is the gateway's own machine (same ansible_host): its loopback is fine; n2 and n3 are not
    nodes = {"n1": {"ansible_host": "192.0.2.31"}, "n2": {"ansible_host": "192.0.2.12"}, "n3": {}}
    gateways = {"gw-key": GATEWAYS["gw-key"]}
    result = run_playbook(_playbook(tmp_path, SHOW), _inventory(tmp_path, gateways, nodes),
                          tags=["sglang_gateway_endpoint_test"], limit="sglang_gateways")
    assert result.rc != 0
    message = " ".join(result.failure_messages())
    assert "sglang_worker_host of n2: its worker URL http://127.0.0.1:30000 is on 127.0.0.1" in message
    assert "sglang_worker_host of n3:" in message and "sglang_worker_host of n1:" not in message
    assert "sglang_worker_host: n1, n2 and n3 have the same worker URL http://127.0.0.1:30000" in message
    assert API_KEY not in result.stdout


def test_a_node_whose_gateway_published_nothing_stops_naming_it_and_the_limit(tmp_path):
    stand_in = tmp_path / "bin" / "systemctl"
    stand_in.parent.mkdir()
    stand_in.write_text("#!/bin/sh\n", encoding="utf-8")
    stand_in.chmod(0o755)
    result = run_playbook(_playbook(tmp_path, LEAVE), _inventory(tmp_path, GATEWAYS, NODES), limit="n1",
                          envvars={"PATH": os.pathsep.join([str(stand_in.parent), str(VENV_BIN), os.environ["PATH"]])})
    assert result.rc != 0
    message = " ".join(result.failure_messages())
    assert "gateway gw-key: it did not publish its endpoint (the fact sglang_gateway_endpoint)" in message
    assert "expected the gateways (group sglang_gateways) in --limit too" in message
    assert result.count("changed") == 0
