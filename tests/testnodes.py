"""Python side of tests/testnode: test nodes as objects for pytest fixtures."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path
from project_modules import REPO

TESTNODE = REPO / "tests" / "testnode"

from testnode_lib.util import SSH_COMMON_ARGS  # noqa: E402  pylint: disable=wrong-import-position


def _testnode(state_dir, *args, check=True):
    env = {**os.environ, "TESTNODE_STATE_DIR": str(state_dir)}
    return subprocess.run([str(TESTNODE), *args], env=env, check=check, capture_output=True, text=True)


@dataclasses.dataclass
class Node:
    """One test node: a systemd container reached over SSH."""

    name: str
    ip: str
    host_ip: str
    state_dir: Path
    inventory: Path
    group: str = "sglang_nodes"

    def ssh(self, command, check=False):
        """Run a shell command on the node as root; return the CompletedProcess.

        The same ssh command line as `tests/testnode ssh NAME -- command`, run directly: tests
        call this thousands of times, and each launch of tests/testnode's Python costs the
        2-core CI machine more CPU than the SSH session itself."""
        ssh = ["ssh", "-i", str(self.state_dir / "id_ed25519"), *SSH_COMMON_ARGS.split(),
               "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-o", "ServerAliveInterval=15", f"root@{self.ip}", "--"]
        return subprocess.run([*ssh, command], stdin=subprocess.DEVNULL, check=check, capture_output=True, text=True)

    def reset(self, to_snapshot=None):
        """Fresh rootfs from the base image, or from a snapshot directory (see snapshot())."""
        extra = ["--to-snapshot", str(to_snapshot)] if to_snapshot else []
        _testnode(self.state_dir, "reset", self.name, *extra)

    def snapshot(self, directory):
        """Clean poweroff, keep the filesystem as `directory`, boot again on top of it.

        `reset(to_snapshot=directory)` later brings this node back to exactly that state (same
        identity); `NodeSet.up(count, from_snapshot=directory)` starts other nodes from it.
        """
        _testnode(self.state_dir, "snapshot", self.name, str(directory))

    def reboot(self):
        _testnode(self.state_dir, "reboot", self.name)

    def testinfra_host(self):
        import testinfra  # pylint: disable=import-outside-toplevel

        key = self.state_dir / "id_ed25519"
        return testinfra.get_host(
            f"ssh://root@{self.ip}",
            ssh_identity_file=str(key),
            ssh_extra_args="-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR",
        )


class NodeSet:
    """Nodes made by `tests/testnode up` in one state directory, removed by down()."""

    def __init__(self, state_dir):
        self.state_dir = Path(state_dir)
        self.inventory = None

    def up(self, count=1, from_snapshot=None, monitor=False, gateway=False):
        """Make count serving nodes (from a snapshot, each with its own identity; with monitor,
        plus one host of group sglang_monitors; with gateway, plus one of sglang_gateways)."""
        extra = ["--from-snapshot", str(from_snapshot)] if from_snapshot else []
        extra += ["--monitor"] if monitor else []
        extra += ["--gateway"] if gateway else []
        result = _testnode(self.state_dir, "up", str(count), *extra)
        self.inventory = Path(result.stdout.strip().splitlines()[-1])
        return self.nodes()

    def nodes(self):
        records = json.loads((self.state_dir / "nodes.json").read_text())
        if isinstance(records, dict):
            records = list(records.values())
        return [
            Node(name=r["name"], ip=r["ip"], host_ip=r["host_ip"], state_dir=self.state_dir, inventory=self.inventory,
                 group=r.get("group") or "sglang_nodes")
            for r in records
        ]

    def down(self):
        _testnode(self.state_dir, "down", check=False)
