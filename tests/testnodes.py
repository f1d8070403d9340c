"""Python side of tests/testnode: test nodes as objects for pytest fixtures."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TESTNODE = REPO / "tests" / "testnode"


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

    def ssh(self, command, check=False):
        """Run a shell command on the node as root; return the CompletedProcess."""
        return _testnode(self.state_dir, "ssh", self.name, "--", command, check=check)

    def reset(self):
        _testnode(self.state_dir, "reset", self.name)

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

    def up(self, count=1, gateway=False):
        """Make `count` nodes (with gateway=True: plus one gateway host, the last node)."""
        result = _testnode(self.state_dir, "up", str(count), *(["--gateway"] if gateway else []))
        self.inventory = Path(result.stdout.strip().splitlines()[-1])
        return self.nodes()

    def nodes(self):
        records = json.loads((self.state_dir / "nodes.json").read_text())
        if isinstance(records, dict):
            records = list(records.values())
        return [
            Node(name=r["name"], ip=r["ip"], host_ip=r["host_ip"], state_dir=self.state_dir, inventory=self.inventory)
            for r in records
        ]

    def down(self):
        _testnode(self.state_dir, "down", check=False)
