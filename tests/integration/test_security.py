"""Security of the deployed service on the shared converged node: a dedicated unprivileged
user, reachable only on its configured address, vaulted secrets that land only in 0600
files and the server's environment and never in Ansible's output, and a hardened unit that
still lets the server reach the GPUs.
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
import socket
import subprocess

import expected
import node_state
import pytest
from ansible_run import run_playbook
from project_modules import REPO

VENV_BIN = REPO / ".venv" / "bin"
PORT = expected.testnode_vars()["sglang_server_args"]["port"]
MAX_EXPOSURE = 3.0


def _status(host, pid):
    text = host.file(f"/proc/{pid}/status").content_string
    return {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in text.splitlines() if ":" in line)}


def test_server_runs_as_a_dedicated_unprivileged_user(converged_node, host):
    pid = node_state.main_pid(converged_node.node)
    uid = int(_status(host, pid)["Uid"].split()[0])
    account = host.user("sglang")
    assert account.exists and uid == account.uid
    assert 0 < uid < 1000, f"uid {uid} is not a system account"  # Debian: SYS_UID_MAX 999
    assert account.shell in ("/usr/sbin/nologin", "/bin/false"), account.shell
    home = host.file(account.home)
    assert not home.exists or home.user == "sglang", f"{account.home} belongs to {home.user}"
    # dedicated: nothing else on the node runs as that user
    owned = {process.pid for process in host.process.filter(user="sglang")}
    tree = {process.pid for process in host.process.filter(ppid=pid)} | {pid}
    assert owned <= tree, f"other processes run as sglang: {owned - tree}"


def test_server_is_reachable_only_on_its_configured_address(converged_node, host):
    node = converged_node.node
    listening = [address for address in host.socket.get_listening_sockets()
                 if address.startswith("tcp://") and address.endswith(f":{PORT}")]
    assert listening == [f"tcp://127.0.0.1:{PORT}"]
    # the node's own address answers (SSH) but refuses the server's port
    socket.create_connection((node.ip, 22), timeout=5).close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((node.ip, PORT), timeout=5).close()


def _vaulted(tmp_path, values):
    """A group_vars file with sglang_service_secret_environment encrypted by ansible-vault."""
    password = tmp_path / "vault-password"
    password.write_text(secrets.token_hex(16) + "\n")
    password.chmod(0o600)
    lines = ["---", "sglang_service_secret_environment:"]
    for name, value in values.items():
        done = subprocess.run(
            [
                str(VENV_BIN / "ansible-vault"),
                "encrypt_string",
                "--vault-password-file",
                str(password),
                "--name",
                name,
                value,
            ],
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO,
        )
        assert "$ANSIBLE_VAULT;" in done.stdout and value not in done.stdout
        lines += ["  " + line for line in done.stdout.strip().splitlines()]
    return password, "\n".join(lines) + "\n"


@pytest.fixture
def vaulted_inventory(converged_node, tmp_path):
    """The node's inventory plus group_vars holding two vaulted secrets; the node is put back
    to no secrets afterwards."""
    values = {"HF_TOKEN": f"hf_{secrets.token_hex(12)}", "OPENAI_API_KEY": "sk-" + secrets.token_hex(16)}
    password, group_vars = _vaulted(tmp_path, values)
    inventory = tmp_path / "inventory"
    (inventory / "group_vars").mkdir(parents=True)
    shutil.copy(converged_node.inventory, inventory / "hosts.yml")
    (inventory / "group_vars" / "sglang_nodes.yml").write_text(group_vars)
    yield inventory, password, values
    restore = converged_node.converge()
    assert restore.rc == 0, node_state.failure_messages(restore)
    leftover = converged_node.ssh(f"grep -rlF {values['HF_TOKEN']} /etc /var /root /usr/local || true").stdout
    assert not leftover.strip(), f"secret left on the node after removing it: {leftover}"


def test_vaulted_secrets_reach_the_server_through_0600_files_only_and_never_the_output(
    converged_node, vaulted_inventory, host
):
    inventory, password, values = vaulted_inventory
    node = converged_node.node

    run = run_playbook("site.yml", inventory, diff=True, envvars={"ANSIBLE_VAULT_PASSWORD_FILE": str(password)})

    assert run.rc == 0, node_state.failure_messages(run)
    assert run.changed > 0
    output = run.stdout + json.dumps(run.events, default=str)
    for name, value in values.items():
        assert value not in output, f"{name}'s value appears in Ansible's output"
    # the server has them
    environ = node_state.process_environ(node, node_state.main_pid(node))
    assert {name: environ.get(name) for name in values} == values
    # only 0600 root files hold them (the secrets file and its last-good copy)
    holders = set()
    for value in values.values():
        found = node.ssh(f"grep -rlF -- {value} /etc /var /root /usr/local /run /tmp /home 2>/dev/null").stdout
        holders |= set(found.split())
    assert holders == {node_state.SECRETS_FILE, f"{node_state.LAST_GOOD}/sglang.secrets.env"}, holders
    for path in holders:
        holder = host.file(path)
        assert (holder.user, holder.mode) == ("root", 0o600), path
    journal = node.ssh("journalctl --no-pager -o cat -u sglang.service").stdout
    assert not any(value in journal for value in values.values())


def test_unit_is_hardened_and_the_gpus_stay_reachable(converged_node, host):
    node = converged_node.node
    wanted = {
        "User": "sglang",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes",
        "ProtectControlGroups": "yes",
        "RestrictNamespaces": "yes",
        "RestrictSUIDSGID": "yes",
        "LockPersonality": "yes",
        "CapabilityBoundingSet": "",
        "AmbientCapabilities": "",
        "RestrictAddressFamilies": "AF_INET AF_INET6 AF_NETLINK AF_UNIX",
        "DevicePolicy": "closed",
        "PrivateDevices": "no",  # a private /dev would hide /dev/nvidia*
    }
    shown = node_state.ssh(node, "systemctl show sglang.service " + " ".join(f"--property={p}" for p in wanted))
    props = dict(line.split("=", 1) for line in shown.splitlines())
    assert props == wanted
    allowed = node_state.ssh(node, "systemctl show --property=DeviceAllow --value sglang.service")
    assert {"char-nvidia-frontend rw", "char-nvidia-uvm rw"} <= set(allowed.strip().splitlines())

    # the running server really is confined
    pid = node_state.main_pid(node)
    status = _status(host, pid)
    assert status["NoNewPrivs"] == "1" and status["Seccomp"] == "2"
    assert {status[c] for c in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")} == {"0000000000000000"}

    # NVIDIA's device nodes (made here, as the driver would) are visible inside the server's /dev
    made = []
    for dev, minor in (("/dev/nvidiactl", 255), ("/dev/nvidia0", 0)):
        if not host.file(dev).exists:
            node_state.ssh(node, f"mknod -m 0666 {dev} c 195 {minor}")
            made.append(dev)
    try:
        seen = node_state.ssh(node, f"nsenter --target {pid} --mount stat -c '%t:%T %a' /dev/nvidiactl /dev/nvidia0")
        assert seen.split("\n")[:2] == ["c3:ff 666", "c3:0 666"], seen
    finally:
        for dev in made:
            node.ssh(f"rm -f {dev}")

    report = node_state.ssh(node, "systemd-analyze security --no-pager sglang.service")
    score = float(re.search(r"Overall exposure level for sglang\.service: ([0-9.]+)", report).group(1))
    print(f"systemd-analyze security sglang.service: {score}")
    assert score <= MAX_EXPOSURE, report
