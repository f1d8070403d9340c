"""nccl_tuning on a systemd test node: where the NCCL settings land, and that they leave.

The node's stand-in nvidia-smi replays the canonical 8-GPU PCIe box, so site.yml's defaults give
the PCIe set (NCCL_PROTO=LL, NCCL_ALGO=Ring) through the service's EnvironmentFile. The tests below
are steps of one story (file order), on a node of this file alone (conftest's converged_node).
"""

import shlex

import expected
import pytest

SERVICE = "sglang.service"
PCIE = {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL"}
MARK = "sglang-canon nccl_tuning"


def out(node, command):
    return node.ssh(command).stdout


def main_pid(node):
    return int(out(node, f"systemctl show --property=MainPID --value {SERVICE}").strip())


def server_environ(node):
    lines = out(node, f"tr '\\0' '\\n' < /proc/{main_pid(node)}/environ").splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def env_files_text(node):
    """Every EnvironmentFile of the unit, concatenated."""
    listed = out(node, f"systemctl show --property=EnvironmentFiles --value {SERVICE}")
    paths = [line.split()[0] for line in listed.splitlines() if line.strip()]
    assert paths, "the unit has no EnvironmentFile"
    return "".join(out(node, f"cat {shlex.quote(p)}") for p in paths)


PYTHON = expected.testnode_vars()["sglang_python"]


def seen_by_python(node, name):
    """What a fresh process of the server's interpreter sees, with an empty environment."""
    return out(node, f"env -i {PYTHON} -c " + shlex.quote(f"import os; print(os.environ.get({name!r}))")).strip()


def sitecustomize_text(node):
    code = "import sitecustomize; print(open(sitecustomize.__file__).read())"
    return out(node, f"env -i {PYTHON} -c {shlex.quote(code)} 2>/dev/null || true")


def converge(node, **extravars):
    result = node.converge(extravars=extravars)
    assert result.rc == 0, result.stdout[-6000:]
    return result


def nccl_changes(result):
    return [
        e["event_data"].get("task")
        for e in result.events
        if e.get("event") == "runner_on_ok"
        and e["event_data"].get("role") == "nccl_tuning"
        and e["event_data"].get("res", {}).get("changed")
    ]


@pytest.fixture(scope="module")
def node(converged_node):
    """This file's converged node (restored from the worker's converged snapshot, so it needs no
    converge back to the defaults for other files: each file gets its own restore)."""
    return converged_node


def test_service_delivery_reaches_the_server_only(node):
    environ = server_environ(node)
    assert {k: environ.get(k) for k in PCIE} == PCIE
    assert 'NCCL_PROTO="LL"' in env_files_text(node)
    assert seen_by_python(node, "NCCL_PROTO") == "None"  # not node-wide
    assert MARK not in out(node, "cat /etc/nccl.conf 2>/dev/null || true")


def test_sitecustomize_delivery_reaches_every_process_of_the_interpreter(node):
    before = main_pid(node)
    converge(node, nccl_tuning_delivery="sitecustomize")
    assert seen_by_python(node, "NCCL_PROTO") == "LL" and seen_by_python(node, "NCCL_ALGO") == "Ring"
    assert MARK in sitecustomize_text(node)
    assert "NCCL_" not in env_files_text(node)  # not through the EnvironmentFile any more
    assert "NCCL_PROTO" not in server_environ(node)  # invisible to systemd, as the seed's was
    assert main_pid(node) != before  # the change restarted the server


def test_sitecustomize_delivery_is_idempotent(node):
    assert nccl_changes(converge(node, nccl_tuning_delivery="sitecustomize")) == []


def test_nccl_conf_delivery_moves_the_block(node):
    converge(node, nccl_tuning_delivery="nccl_conf")
    conf = out(node, "cat /etc/nccl.conf")
    assert "NCCL_ALGO=Ring\nNCCL_PROTO=LL\n" in conf and MARK in conf
    assert MARK not in sitecustomize_text(node) and seen_by_python(node, "NCCL_PROTO") == "None"
    assert "NCCL_" not in env_files_text(node)


def test_switching_back_to_service_removes_the_blocks(node):
    converge(node)
    assert MARK not in out(node, "cat /etc/nccl.conf 2>/dev/null || true")
    assert MARK not in sitecustomize_text(node)
    assert {k: server_environ(node).get(k) for k in PCIE} == PCIE


def test_invalid_value_fails_naming_it_and_changes_nothing(node):
    pid, env_text = main_pid(node), env_files_text(node)
    result = node.converge(extravars={"nccl_tuning_settings": {"NCCL_PROTO": "LL129"}})
    assert result.rc != 0
    assert any("NCCL_PROTO='LL129'" in msg for msg in result.failure_messages()), result.failure_messages()
    assert main_pid(node) == pid and env_files_text(node) == env_text
