"""SGLang's gateway (sglang-router 0.3.2) in front of a fleet: 3 serving nodes, 1 gateway host.

The fleet is the session fixture `gateway_fleet` (tests/conftest.py: with a monitor too), made
and converged once and shared with test_monitoring.py and test_rolling_gateway.py, which run
after this file on the same worker: every test here reads or changes it, and puts back what it
changed.
"""

import base64
import errno
import json
import re
import socket
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
import yaml

from ansible_run import run_playbook
from project_modules import REPO

TEST_GATEWAY_ARGS = yaml.safe_load(
    (REPO / "inventory/testnode/group_vars/sglang_gateways.yml").read_text())["sglang_gateway_args"]
SERVICE = "sglang-gateway.service"
UNIT = f"/etc/systemd/system/{SERVICE}"
CREDENTIAL = "/etc/sglang-gateway/api_key"
LAST_GOOD = "/etc/sglang-gateway/last-good"


def _request(fleet, path, body=None, key=None, method=None):
    """(status, parsed JSON or text) of a request to the gateway, its certificate verified with the test CA."""
    context = ssl.create_default_context(cafile=fleet.ca_file)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(fleet.url + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            text = response.read().decode()
            status = response.status
    except urllib.error.HTTPError as error:
        text, status = error.read().decode(errors="replace"), error.code
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def _generate(fleet, key):
    return _request(fleet, "/generate", {"text": "hello", "sampling_params": {"max_new_tokens": 4}}, key=key)


def _workers(fleet):
    status, body = _request(fleet, "/workers", key=fleet.api_key)
    assert status == 200, body
    return body["workers"]


def _wait(predicate, timeout, what):
    """Poll predicate() until true (bounded); returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            assert value, f"{what} not within {timeout} s"
            return value
        time.sleep(0.5)


def _node_urls(fleet):
    return sorted(f"http://{node.ip}:30000" for node in fleet.nodes)


def _refused_before_any_change(result, variable):
    assert result.rc != 0
    assert result.changed == 0, result.changed_tasks()
    failures = " ".join(result.failure_messages())
    assert variable in failures, failures
    return failures


def test_first_run_converged_every_host(gateway_fleet):
    stats = gateway_fleet.first_run.stats
    assert {host.name for host in gateway_fleet.hosts} <= set(stats.get("ok", {})), stats
    assert not stats.get("failures") and not stats.get("dark"), stats


def _tcp_from_node(source, address, port):
    """'open', 'refused' or 'timeout': a TCP connection from a test node (bash's /dev/tcp)."""
    done = source.ssh(f"timeout 5 bash -c '</dev/tcp/{address}/{port}' 2>&1")
    if done.returncode == 0:
        return "open"
    return "timeout" if done.returncode == 124 else ("refused" if "refused" in done.stdout else done.stdout.strip())


def _tcp_from_host(address, port):
    try:
        socket.create_connection((address, port), timeout=5).close()
    except ConnectionRefusedError:
        return "refused"
    except TimeoutError:
        return "timeout"
    except OSError as error:
        return errno.errorcode.get(error.errno, str(error))
    return "open"


def test_the_worker_port_answers_only_the_gateway_and_the_monitor(gateway_fleet):
    """The nodes' firewall (roles/sglang_firewall, on because the servers listen beyond loopback):
    another serving node and the host get a TCP reset on the worker port; SSH stays open to all."""
    target, other = gateway_fleet.nodes[0], gateway_fleet.nodes[1]
    assert _tcp_from_node(other, target.ip, 22) == "open"  # the nodes reach each other
    assert _tcp_from_node(other, target.ip, 30000) == "refused"
    assert _tcp_from_host(target.ip, 22) == "open"
    assert _tcp_from_host(target.ip, 30000) == "refused"
    assert _tcp_from_node(gateway_fleet.gateway, target.ip, 30000) == "open"
    assert _tcp_from_node(gateway_fleet.monitor, target.ip, 30000) == "open"  # its /metrics


def test_nodes_listen_on_their_private_address_and_are_the_gateways_workers(gateway_fleet):
    for node in gateway_fleet.nodes:
        assert node.testinfra_host().socket(f"tcp://{node.ip}:30000").is_listening
    def healthy_urls():
        return sorted(w["url"] for w in _workers(gateway_fleet) if w.get("is_healthy"))

    _wait(lambda: healthy_urls() == _node_urls(gateway_fleet), 60, "every node a healthy worker")


def test_tls_with_the_key_answers_a_generate(gateway_fleet):
    status, body = _generate(gateway_fleet, gateway_fleet.api_key)
    assert status == 200, body
    assert body["text"] and body["meta_info"]["completion_tokens"] >= 1


@pytest.mark.parametrize("key", [None, "sk-wrong-key"])
def test_without_a_valid_key_the_gateway_answers_401(gateway_fleet, key):
    status, _ = _generate(gateway_fleet, key)
    assert status == 401


def test_plain_http_to_the_tls_port_gets_no_http_answer(gateway_fleet):
    host, port = urllib.parse.urlsplit(gateway_fleet.url).hostname, urllib.parse.urlsplit(gateway_fleet.url).port
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(b"GET /liveness HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n\r\n")
        sock.settimeout(5)
        received = b""
        try:
            while chunk := sock.recv(4096):
                received += chunk
        except (socket.timeout, ConnectionResetError):
            pass
    assert not received.startswith(b"HTTP/"), received[:200]
    assert b"200 OK" not in received and b"alive" not in received.lower()


def test_the_api_key_is_in_no_world_readable_place(gateway_fleet):
    gateway, key = gateway_fleet.gateway, gateway_fleet.api_key
    host = gateway.testinfra_host()
    unit = host.file(UNIT)
    assert unit.mode == 0o644 and key not in unit.content_string
    # The key reaches the router as a systemd credential, read by the launcher in its own process.
    assert "--api-key" not in unit.content_string and "SGLANG_GATEWAY_API_KEY" not in unit.content_string
    assert f"LoadCredential=api_key:{CREDENTIAL}" in unit.content_string
    credential = host.file(CREDENTIAL)
    assert (credential.user, credential.group, credential.mode) == ("root", "root", 0o600)
    assert not host.file("/etc/sglang-gateway/sglang-gateway.secrets.env").exists
    last_good = host.file(LAST_GOOD)
    assert (last_good.user, last_good.mode) == ("root", 0o700)
    tls_key = host.file("/etc/sglang-gateway/tls.key")
    assert (tls_key.user, tls_key.group, tls_key.mode) == ("sglang-gateway", "sglang-gateway", 0o600)
    # The journal of the whole host (the gateway's log, systemd's messages, Ansible's module runs).
    journal = gateway.ssh("journalctl --no-pager -o cat").stdout
    assert journal and key not in journal
    # Defence in depth (test_the_api_key_is_in_no_command_line_across_a_restart shows the key is in
    # no process's argv or environment): other users do not see the gateway's processes at all.
    pid = gateway.ssh(f"systemctl show -P MainPID {SERVICE}").stdout.strip()
    as_root = gateway.ssh("ps -eo user:32,args").stdout
    assert re.search(r"^sglang-gateway\s+sglang::router", as_root, re.M), as_root
    gateway.ssh("id probe >/dev/null 2>&1 || useradd --no-create-home --shell /bin/sh probe", check=True)
    as_user = gateway.ssh(f"su -s /bin/sh probe -c 'ps -eo user:32,args; cat /proc/{pid}/cmdline /proc/{pid}/environ; true'")
    assert "ps -eo" in as_user.stdout  # the user sees its own processes ...
    assert "sglang-gateway" not in as_user.stdout and "sglang::router" not in as_user.stdout  # ... not the gateway
    assert key not in as_user.stdout + as_user.stderr
    assert "hidepid=invisible" in gateway.ssh("findmnt -n -o OPTIONS /proc").stdout
    assert re.search(r"^proc\s+/proc\s+proc\s+\S*hidepid=invisible", host.file("/etc/fstab").content_string, re.M)


def test_the_unit_is_hardened(gateway_fleet):
    gateway = gateway_fleet.gateway
    report = gateway.ssh(f"systemd-analyze security --no-pager {SERVICE}").stdout
    score = float(re.search(rf"Overall exposure level for {re.escape(SERVICE)}: ([0-9.]+)", report).group(1))
    print(f"systemd-analyze security {SERVICE}: {score}")
    assert score <= 3.0, report
    host = gateway.testinfra_host()
    assert host.service("sglang-gateway").is_enabled
    pid = gateway.ssh(f"systemctl show -P MainPID {SERVICE}").stdout.strip()
    assert gateway.ssh(f"stat -c %U /proc/{pid}").stdout.strip() == "sglang-gateway"
    assert gateway.ssh(f"systemctl show -P CapabilityBoundingSet {SERVICE}").stdout.strip() == ""


def test_a_second_run_checks_every_host_and_changes_nothing(gateway_fleet):
    second = gateway_fleet.converge()
    assert second.rc == 0, second.stdout[-4000:]
    assert second.changed == 0, second.changed_tasks()
    assert {host.name for host in gateway_fleet.hosts} <= set(second.stats.get("ok", {})), second.stats
    # the nodes are checked all at once, then converged one batch after the other, each changing
    # nothing and restarting nothing (changed == 0 above)
    names = {node.name for node in gateway_fleet.nodes}
    (check, check_hosts), (config, config_hosts), *batches = second.plays_on(names)
    assert check.startswith("Check every node") and check_hosts == names
    assert config.startswith("Check the server's configuration on every node") and config_hosts == names
    assert [hosts for _, hosts in batches] == [{node.name} for node in gateway_fleet.nodes], batches
    assert all(name.startswith("Converge the nodes in batches") for name, _ in batches), batches
    assert "Could not match supplied host pattern" not in second.stdout


def test_drift_of_the_gateway_is_reported_and_repaired_by_one_run(gateway_fleet, tmp_path):
    gateway = gateway_fleet.gateway
    # By hand: an edited unit, and a node removed through the gateway's worker API.
    gateway.ssh(f"sed -i 's/^RestartSec=.*/RestartSec=30/' {UNIT} && systemctl daemon-reload", check=True)
    # /proc remounted without hidepid: other users could see the gateway's processes and argv
    gateway.ssh("mount -o remount,hidepid=0 /proc", check=True)
    assert "hidepid=invisible" not in gateway.ssh("findmnt -n -o OPTIONS /proc").stdout
    victim = next(w for w in _workers(gateway_fleet) if w["url"] == _node_urls(gateway_fleet)[0])
    status, body = _request(gateway_fleet, f"/workers/{victim['id']}", key=gateway_fleet.api_key, method="DELETE")
    assert status in (200, 202), body
    _wait(lambda: victim["url"] not in [w["url"] for w in _workers(gateway_fleet)], 30, "the worker removed")

    # The scans and the repair are limited to the gateway's role (--tags sglang_gateway, as an
    # operator scans and repairs one role): that the nodes, checked all at once, are scanned and
    # repaired too is test_drift.py's and test_rolling_gateway.py's; a full run of the fleet
    # (test_a_second_run_checks_every_host_and_changes_nothing) costs minutes of the CI's 2 cores.
    drift = run_playbook("playbooks/drift.yml", gateway_fleet.inventory, tags=["sglang_gateway"])
    assert drift.rc != 0
    report = " ".join(drift.failure_messages())
    assert f"{gateway.name} drifted" in report, report
    assert "Write the systemd unit" in report and "workers the gateway lacks" in report, report
    assert any(victim["url"] in m for m in drift.messages() if m.startswith("check mode: the gateway lacks"))
    assert "Report that /proc would be remounted" in report, report
    # Args changed in the inventory are drift too (the rendered unit differs).
    changed_args = run_playbook("playbooks/drift.yml", gateway_fleet.inventory, tags=["sglang_gateway"], extravars={
        "sglang_gateway_args": {**TEST_GATEWAY_ARGS, "retry_max_retries": 2}})
    assert changed_args.rc != 0 and f"{gateway.name} drifted" in " ".join(changed_args.failure_messages())

    repair = gateway_fleet.converge(tags=["sglang_gateway"])
    assert repair.rc == 0, repair.stdout[-4000:]
    assert any(gateway.name in t for t in repair.changed_tasks())
    assert gateway.ssh(f"grep -c '^RestartSec=2$' {UNIT}").stdout.strip() == "1"
    assert "hidepid=invisible" in gateway.ssh("findmnt -n -o OPTIONS /proc").stdout
    _wait(lambda: sorted(w["url"] for w in _workers(gateway_fleet)) == _node_urls(gateway_fleet), 30,
          "the removed worker back")
    clean = run_playbook("playbooks/drift.yml", gateway_fleet.inventory, tags=["sglang_gateway"])
    assert clean.rc == 0, clean.failure_messages()


def _other_key(tmp_path):
    import subprocess  # pylint: disable=import-outside-toplevel

    key = tmp_path / "other.key"
    subprocess.run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", str(key)],
                   check=True, capture_output=True)
    return key.read_text()


def test_bad_gateway_input_is_refused_before_any_change(gateway_fleet, tmp_path):
    cases = {
        "sglang_gateway_port": {"sglang_gateway_port": 30000},
        "sglang_gateway_tls_key": {"sglang_gateway_tls_key": _other_key(tmp_path)},
        "an empty key": {"sglang_gateway_api_keys": [""]},
        "no API key": {"sglang_gateway_api_keys": []},
        "no TLS": {"sglang_gateway_tls_cert": "", "sglang_gateway_tls_key": ""},
    }
    for expected, extravars in cases.items():
        result = run_playbook("site.yml", gateway_fleet.inventory, extravars=extravars)
        failures = _refused_before_any_change(result, expected)
        assert "BEGIN" not in failures and "PRIVATE" not in failures
    # No node behind the gateway: the inventory without its serving nodes.
    inventory = yaml.safe_load(gateway_fleet.inventory.read_text())
    inventory["all"]["children"]["sglang_nodes"]["hosts"] = {}
    lonely = tmp_path / "gateway-only.yml"
    lonely.write_text(yaml.safe_dump(inventory))
    _refused_before_any_change(run_playbook("site.yml", lonely), "groups['sglang_nodes'] is empty")


def test_allow_insecure_warns_on_every_run(gateway_fleet):
    result = run_playbook("site.yml", gateway_fleet.inventory, check=True, tags=["sglang_gateway"], extravars={
        "sglang_gateway_api_keys": [], "sglang_gateway_allow_insecure": True})
    assert result.rc == 0, result.stdout[-3000:]
    assert any(m.startswith("WARNING: sglang_gateway_allow_insecure is true") for m in result.messages())
    # --check wrote nothing: the gateway still starts with its API key (a play-level check_mode
    # of false once made this dry run rewrite the unit without it)
    assert f"LoadCredential=api_key:{CREDENTIAL}" in gateway_fleet.gateway.ssh(f"cat {UNIT}", check=True).stdout


def test_gateway_args_are_judged_by_sglang_routers_own_parser_before_any_change(gateway_fleet):
    """An option value sglang-router refuses stops the run in play 0, naming the variable, in the router's words."""
    bad = {**TEST_GATEWAY_ARGS, "policy": "fastest"}
    for check in (False, True):
        result = run_playbook("site.yml", gateway_fleet.inventory, check=check, extravars={"sglang_gateway_args": bad})
        failures = _refused_before_any_change(result, "sglang_gateway_args.policy")
        assert "invalid choice: 'fastest'" in failures and "round_robin" in failures, failures
    assert "--policy round_robin" in gateway_fleet.gateway.ssh(f"cat {UNIT}", check=True).stdout


def _wait_every_node_a_healthy_worker(fleet):
    """After a restart the gateway registers its workers in the background: wait until all are in and healthy."""
    def healthy_urls():
        return sorted(w["url"] for w in _workers(fleet) if w.get("is_healthy"))

    _wait(lambda: healthy_urls() == _node_urls(fleet), 60, "every node a healthy worker")


def _gateway_curl(gateway, port, path, key=None):
    """HTTP status of a request to the gateway from its own host (loopback: whatever the firewall admits)."""
    header = f"-H 'Authorization: Bearer {key}'" if key else ""
    done = gateway.ssh(f"curl -sk -o /dev/null -w '%{{http_code}}' {header} https://127.0.0.1:{port}{path}")
    return done.stdout.strip()


def test_a_port_below_1024_binds_with_that_capability_alone(gateway_fleet):
    gateway = gateway_fleet.gateway
    try:
        moved = gateway_fleet.converge(tags=["sglang_gateway"], extravars={"sglang_gateway_port": 443})
        assert moved.rc == 0, moved.failure_messages() or moved.stdout[-4000:]
        assert re.search(r"127\.0\.0\.1:443\b|0\.0\.0\.0:443\b", gateway.ssh("ss -ltnH 'sport = :443'").stdout)
        assert _gateway_curl(gateway, 443, "/workers", gateway_fleet.api_key) == "200"
        assert _gateway_curl(gateway, 443, "/workers") == "401"
        for setting in ("CapabilityBoundingSet", "AmbientCapabilities"):
            assert gateway.ssh(f"systemctl show -P {setting} {SERVICE}").stdout.strip() == "cap_net_bind_service"
        report = gateway.ssh(f"systemd-analyze security --no-pager {SERVICE}").stdout
        score = float(re.search(rf"Overall exposure level for {re.escape(SERVICE)}: ([0-9.]+)", report).group(1))
        print(f"systemd-analyze security {SERVICE} on port 443: {score}")
        assert score <= 3.0, report
    finally:
        back = gateway_fleet.converge(tags=["sglang_gateway"])
    assert back.rc == 0, back.failure_messages() or back.stdout[-4000:]
    assert gateway.ssh(f"systemctl show -P CapabilityBoundingSet {SERVICE}").stdout.strip() == ""
    _wait_every_node_a_healthy_worker(gateway_fleet)
    assert _generate(gateway_fleet, gateway_fleet.api_key)[0] == 200


def test_a_failed_start_rolls_back_to_the_last_good_configuration(gateway_fleet):
    """A port sshd holds: sglang-router cannot bind it, the old configuration comes back and serves,
    and the run fails naming the router's words."""
    gateway = gateway_fleet.gateway
    before = gateway.ssh(f"cat {UNIT}", check=True).stdout
    failed = gateway_fleet.converge(tags=["sglang_gateway"], extravars={"sglang_gateway_port": 22})
    assert failed.rc != 0
    report = " ".join(failed.failure_messages())
    assert "Rolled back to the last good configuration" in report and "Address already in use" in report, report
    assert gateway.ssh(f"cat {UNIT}", check=True).stdout == before
    assert gateway.ssh(f"systemctl is-active {SERVICE}").stdout.strip() == "active"
    _wait_every_node_a_healthy_worker(gateway_fleet)
    assert _generate(gateway_fleet, gateway_fleet.api_key)[0] == 200
    # What was restored is exactly what the inventory asks for.
    again = gateway_fleet.converge(tags=["sglang_gateway"])
    assert again.rc == 0 and again.changed == 0, again.changed_tasks() or again.failure_messages()


# What a local user, and root, can read of every process on the gateway host, polled in a loop:
# systemd's GetUnitProcesses (read by PID 1 as root: hidepid does not hide it), systemctl status,
# and /proc/*/cmdline and environ.
_POLL_PROCESSES = f"""
end=$((SECONDS+{{seconds}})); polls=0
while [ $SECONDS -lt $end ]; do
  busctl call org.freedesktop.systemd1 /org/freedesktop/systemd1 org.freedesktop.systemd1.Manager GetUnitProcesses s {SERVICE}
  systemctl status --no-pager --full --lines=0 {SERVICE}
  cat /proc/[0-9]*/cmdline /proc/[0-9]*/environ | tr '\\0' ' '
  polls=$((polls+1))
done 2>&1
echo "polls=$polls"
"""


def test_the_api_key_is_in_no_command_line_or_environment_across_a_restart(gateway_fleet):
    gateway, key = gateway_fleet.gateway, gateway_fleet.api_key
    gateway.ssh("id probe >/dev/null 2>&1 || useradd --no-create-home --shell /bin/sh probe", check=True)
    script = base64.b64encode(_POLL_PROCESSES.format(seconds=10).encode()).decode()
    gateway.ssh(f"echo {script} | base64 -d > /tmp/poll-processes.sh && chmod 0755 /tmp/poll-processes.sh", check=True)
    polled = gateway.ssh(
        "su -s /bin/bash probe -c 'bash /tmp/poll-processes.sh' > /tmp/as-user.out 2>&1 &"
        " bash /tmp/poll-processes.sh > /tmp/as-root.out 2>&1 &"
        f" sleep 2; systemctl restart {SERVICE}; wait; cat /tmp/as-user.out; echo '=== root'; cat /tmp/as-root.out",
        check=True).stdout
    as_user, as_root = polled.split("=== root", 1)
    for seen in (as_user, as_root):
        assert int(re.search(r"polls=(\d+)", seen).group(1)) > 20, seen[-2000:]
        # the polls saw the gateway starting: its launcher's command line, before setproctitle renamed it
        assert "sglang-gateway-launch --host" in seen, seen[-2000:]
        assert key not in seen
    _wait_every_node_a_healthy_worker(gateway_fleet)
    assert _generate(gateway_fleet, key)[0] == 200
    assert _generate(gateway_fleet, None)[0] == 401


def test_production_doc_names_the_gateway_and_its_certificate_never_a_key(gateway_fleet):
    import subprocess  # pylint: disable=import-outside-toplevel

    cert = gateway_fleet.ca_file.replace("ca.pem", "gateway.pem")
    fingerprint = subprocess.run(["openssl", "x509", "-noout", "-fingerprint", "-sha256", "-in", cert],
                                 check=True, capture_output=True, text=True).stdout.strip().split("=", 1)[1]
    doc = gateway_fleet.nodes[0].ssh("cat /root/production_v2.md", check=True).stdout
    section = doc.split("## Gateway", 1)[1].split("\n## ", 1)[0]
    assert gateway_fleet.url in section and "round_robin" in section and fingerprint in section, section
    assert all(f"http://{node.ip}:30000" in section for node in gateway_fleet.nodes), section
    assert gateway_fleet.api_key not in doc and "PRIVATE KEY" not in doc


def test_fleet_firewall_gateway_and_monitor_ports_answer_the_monitor_only(gateway_fleet):
    """Every host of the fleet has its table (roles/sglang_firewall, run in the gateways' and the
    monitors' plays too): the gateway's own port answers everyone; its metrics port and node
    exporter, and the monitor's node exporter, answer the monitor only (loopback aside)."""
    gateway, monitor, node = gateway_fleet.gateway, gateway_fleet.monitor, gateway_fleet.nodes[0]
    gateway_port = urllib.parse.urlsplit(gateway_fleet.url).port
    metrics_port, exporter_port = TEST_GATEWAY_ARGS["prometheus_port"], 9100
    assert _tcp_from_host(gateway.ip, gateway_port) == "open"
    assert _tcp_from_node(node, gateway.ip, gateway_port) == "open"
    for port in (metrics_port, exporter_port):
        assert _tcp_from_node(monitor, gateway.ip, port) == "open", port
        assert _tcp_from_node(node, gateway.ip, port) == "refused", port
        assert _tcp_from_host(gateway.ip, port) == "refused", port
    assert _tcp_from_node(monitor, monitor.ip, exporter_port) == "open"
    assert _tcp_from_node(node, monitor.ip, exporter_port) == "refused"
    assert _tcp_from_host(monitor.ip, exporter_port) == "refused"
    for host in (gateway, monitor):
        tables = host.ssh("nft list table inet sglang_canon", check=True).stdout
        assert 'comment "managed by sglang-canon"' in tables, host.name
