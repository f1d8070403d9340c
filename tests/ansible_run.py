"""Run playbooks the way an operator does, and read the result from ansible-runner's stats: the one
playbook runner of the tests (tests/lint/test_test_helpers.py keeps others out)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import tempfile
import uuid
from pathlib import Path

import ansible_runner

from project_modules import REPO, VENV_BIN

TESTNODE_INVENTORY_VARS = REPO / "inventory" / "testnode"


@dataclasses.dataclass
class PlaybookResult:
    """What one ansible-playbook run did, from ansible-runner's stats and events."""

    rc: int
    status: str
    stats: dict
    stdout: str
    events: list

    def count(self, key, host=None):
        """Total of one stats key ('changed', 'ok', 'failures', ...), for one host or all."""
        per_host = self.stats.get(key, {}) or {}
        return per_host.get(host, 0) if host else sum(per_host.values())

    @property
    def changed(self):
        return self.count("changed")

    def changed_tasks(self):
        """Names of the tasks that reported changed, to explain a non-zero count."""
        return [
            f"{e['event_data'].get('host')}: {e['event_data'].get('task')}"
            for e in self.events
            if e.get("event") == "runner_on_ok" and e["event_data"].get("res", {}).get("changed")
        ]

    def skipped_tasks(self):
        """'role : task' (or the task's name) of each task a host skipped."""
        skipped = [e["event_data"] for e in self.events if e.get("event") == "runner_on_skipped"]
        return [f"{data['role']} : {data.get('task')}" if data.get("role") else data.get("task") for data in skipped]

    def messages(self):
        """The msg of every task that succeeded (debug output included), as the task returned it:
        stdout is colored line by line and folded by the YAML callback, so phrases are read here."""
        return [
            str(e["event_data"]["res"]["msg"])
            for e in self.events
            if e.get("event") == "runner_on_ok" and "msg" in e["event_data"].get("res", {})
        ]

    def diffs(self):
        """(host, what, diff) for each diff the run showed (--diff), one per changed task or loop item
        (Ansible prints a result's diff only when it changed): `what` is the file the diff names
        (before_header, the destination, or after_header), else the task's name and loop item."""
        shown = []
        for event in self.events:
            if event.get("event") != "runner_on_ok":
                continue
            data = event["event_data"]
            res = data.get("res", {})
            items = [r for r in res.get("results", []) or [] if isinstance(r, dict)]
            for result in items or [res]:
                if not result.get("changed"):
                    continue
                diff = result.get("diff")
                for part in diff if isinstance(diff, list) else [diff]:
                    if not part or not isinstance(part, dict) or not any(part.values()):
                        continue
                    item = result.get("_ansible_item_label", result.get("item")) if items else None
                    what = part.get("before_header") or part.get("after_header") or (
                        data.get("task") + (f" ({item})" if item is not None else ""))
                    shown.append((data.get("host"), str(what), part))
        return shown

    def plays_on(self, hosts):
        """(play name, those of `hosts` with a task result in it) for each play that ran on one of
        them, batches of a serial play each their own, in order. Plays that ran on none of them
        (e.g. a gateway's or a monitor's, for serving nodes) are left out."""
        names = set(hosts)
        plays = []
        for event in self.events:
            data = event.get("event_data", {})
            if event["event"] == "playbook_on_play_start":
                plays.append((data["play"], set()))
            elif event["event"].startswith("runner_on_") and data.get("host") in names:
                plays[-1][1].add(data["host"])
        return [(name, ran) for name, ran in plays if ran]

    def failure_messages(self):
        """The msg of every failed task, and of each failed item of a failed loop."""
        messages = []
        for event in self.events:
            if event.get("event") != "runner_on_failed":
                continue
            res = event["event_data"].get("res", {})
            messages.append(str(res.get("msg", "")))
            messages += [str(item.get("msg", "")) for item in res.get("results", []) or []
                         if isinstance(item, dict) and item.get("failed")]
        return messages


def run_playbook(playbook, inventory, extravars=None, check=False, diff=False, tags=None, limit=None, envvars=None,
                 testnode_vars=True):
    """Run a playbook (a path from the repository root, or an absolute one) against an inventory file
    with ansible-runner, under the project's ansible.cfg and venv.

    The test node's own variables (inventory/testnode/) are layered under the given inventory, as
    `ansible-playbook site.yml` does through ansible.cfg; a roles-tier test whose inventory is a
    world of its own on localhost passes testnode_vars=False.
    """
    cmdline = []
    if check:
        cmdline.append("--check")
    if diff:
        cmdline.append("--diff")
    with tempfile.TemporaryDirectory(prefix="sglang-canon-runner-") as private:
        runner = ansible_runner.run(
            private_data_dir=private,
            project_dir=str(REPO),
            playbook=str(REPO / playbook),
            inventory=[str(TESTNODE_INVENTORY_VARS), str(inventory)] if testnode_vars else [str(inventory)],
            extravars=extravars or {},
            tags=",".join(tags) if tags else None,
            limit=limit,
            cmdline=" ".join(cmdline) or None,
            envvars={
                "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
                # ansible-runner sets this variable, which hides ansible.cfg's callback_plugins; it
                # keeps a value given here, so the project's callbacks load for any playbook.
                "ANSIBLE_CALLBACK_PLUGINS": str(REPO / "callback_plugins"),
                # ansible-runner looks for ansible-playbook on PATH: use the project venv's.
                "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
                **(envvars or {}),
            },
            quiet=True,
        )
        # Stats and events live in the private data dir: read them before it is removed.
        return PlaybookResult(
            rc=runner.rc,
            status=runner.status,
            stats=runner.stats or {},
            stdout=runner.stdout.read(),
            events=list(runner.events),
        )


# In the environment of a run start_playbook starts, and so of every process it forks: what
# kill_playbook finds them by.
_RUN_MARKER = "SGLANG_CANON_TEST_RUN"


def start_playbook(playbook, inventory, extravars=None):
    """ansible-playbook started in the background, as run_playbook runs it (the test node's
    variables under the given inventory, the project's ansible.cfg and venv), for a test that
    kills it partway with kill_playbook. Its output is discarded (a killed run has no result to
    read)."""
    command = [str(VENV_BIN / "ansible-playbook"), "-i", str(TESTNODE_INVENTORY_VARS), "-i", str(inventory),
               "-e", json.dumps(extravars or {}), str(REPO / playbook)]
    environment = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
                   "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}", _RUN_MARKER: uuid.uuid4().hex}
    run = subprocess.Popen(  # pylint: disable=consider-using-with
        command, cwd=REPO, env=environment, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run.marker = f"{_RUN_MARKER}={environment[_RUN_MARKER]}".encode()
    return run


def kill_playbook(run):
    """SIGKILL to a run of start_playbook and to every process it forked. Its process group is not
    enough: ansible-playbook's workers leave it (WorkerProcess calls setsid), and a worker whose
    parent is gone blocks for ever writing its result to it. They are found by the run's marker
    in their environment."""
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if run.marker in environ.read_bytes().split(b"\0"):
                os.kill(int(environ.parent.name), signal.SIGKILL)
        except OSError:
            pass  # gone meanwhile, or not ours to read
