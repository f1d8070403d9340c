"""Drift: each kind of hand-made drift on a converged node is repaired by ONE run of site.yml,
after which the next run reports zero changes; playbooks/drift.yml finds drift without
changing anything; `site.yml --check --diff` says what a run would do on a fresh node, nothing
on a converged one, and each would-be change on a drifted one with its diff shown once.

A converged node of this file alone (conftest's converged_node, restored from the worker's
converged snapshot), converged again with nccl_tuning_delivery: sitecustomize (every run
here passes the same extra vars) so that the NCCL block in sitecustomize.py can drift too.
"Repaired" means the node's fingerprint (sha256, owner and mode of every file site.yml
manages, the unit's load/active/enabled state, the service user and who the server runs
as) equals the one taken right after the first converge, and /health answers 200.
"""

from __future__ import annotations

import collections
import json
import re
import shlex
import types

import expected
import node_state
import pytest
from ansible_run import run_playbook

EXTRA = {"nccl_tuning_delivery": "sitecustomize"}
# The venv sglang_install makes for the release (roles/sglang defaults; the test inventory keeps it).
SGLANG_VENV = expected.testnode_vars()["sglang_venv"]
NCCL_MARK = "sglang-canon nccl_tuning"
NODE_EXPORTER, NODE_EXPORTER_ARGS = "/usr/bin/prometheus-node-exporter", "/etc/default/prometheus-node-exporter"


def _site(drift, **kwargs):
    return run_playbook("site.yml", drift.node.inventory, extravars=EXTRA, **kwargs)


def _check_diff(node):
    return run_playbook("site.yml", node.inventory, extravars=EXTRA, check=True, diff=True)


# The lines Ansible prints for a failed task ("fatal: [host]: FAILED! =>", "failed: [host] (item=...)")
# and for an ignored one; matched as Ansible prints them, since a diff may show a file whose text
# holds the word "fatal" (the watchdog's "never fatal").
FAILURE_LINE = re.compile(r"^(?:\x1b\[[0-9;]*m)*(?:fatal|failed): \[|FAILED! =>|\.\.\.ignoring", re.MULTILINE)


def _printed_no_failure(result):
    """What an operator reads as a failure: a failed or ignored task, or its line in the output."""
    return (
        not [e for e in result.events if e.get("event") == "runner_on_failed"]
        and result.count("ignored") == 0
        and not FAILURE_LINE.search(result.stdout)
    )


def _scan(drift):
    return run_playbook("playbooks/drift.yml", drift.node.inventory, extravars=EXTRA)


@pytest.fixture(scope="module")
def drift(converged_node, node_sets):
    # The operator's dry run on fresh hosts, before anything was installed (test_check_mode_*):
    # bare nodes of their own (this file's converged node comes from the snapshot), a serving
    # node, a gateway and a monitor, so that every play of site.yml meets a host with nothing on it.
    fresh_hosts = {node.group: node for node in node_sets("drift-fresh", 1, gateway=True, monitor=True).nodes()}
    fresh = fresh_hosts["sglang_nodes"]
    fresh_check = _check_diff(fresh)
    # What a first converge makes, host by host and play by play (plays 1, 4 and 5 have a
    # check_mode keyword of their own): a dry run must leave every one of them absent.
    made_by_a_converge = {
        "sglang_nodes": [SGLANG_VENV, NODE_EXPORTER, NODE_EXPORTER_ARGS, node_state.STATE_DIR, node_state.UNIT,
                         node_state.ENV_FILE, node_state.DOC],
        "sglang_gateways": ["/opt/sglang-gateway", "/etc/sglang-gateway", "/etc/systemd/system/sglang-gateway.service",
                            NODE_EXPORTER],
        "sglang_monitors": ["/usr/bin/prometheus", "/etc/default/prometheus", NODE_EXPORTER],
    }
    fresh_check_left = [
        path
        for group, paths in made_by_a_converge.items()
        for path in node_state.ssh(fresh_hosts[group], " ".join(f"! test -e {p} || echo {p};" for p in paths)).split()
    ]
    node = converged_node.node
    first = run_playbook("site.yml", node.inventory, extravars=EXTRA)
    assert first.rc == 0, first.stdout[-6000:]
    paths = node_state.managed_paths(node)
    manifest = node_state.ssh(node, f"cat {node_state.MANIFEST}")
    sitecustomize = [p for p in paths if p.endswith("sitecustomize.py")]
    assert len(sitecustomize) == 1, paths  # the block lives in exactly one sitecustomize.py
    assert NCCL_MARK in node_state.ssh(node, f"cat {sitecustomize[0]}")
    baseline = node_state.fingerprint(node, paths)
    assert baseline["unit"]["ActiveState"] == "active" and baseline["enabled"] == "enabled"
    assert baseline["process_runs_as"] == ["sglang", "sglang"]
    return types.SimpleNamespace(
        node=node,
        fresh_check=fresh_check,
        first=first,
        fresh_converge=converged_node.first_run,  # the worker's first converge of a fresh node
        fresh_check_left=fresh_check_left,
        paths=paths,
        baseline=baseline,
        sitecustomize=sitecustomize[0],
        manifest=json.loads(manifest),
    )


def _patched_file(drift, rel="sglang/srt/environ.py"):
    return f"{drift.manifest['site_packages']}/{rel}", f"{drift.manifest['pristine_dir']}/{rel}"


# kind -> the shell command (given the drift fixture) that makes that drift on the node
DRIFTS = {
    "unit-edited": lambda d: (
        f"sed -i 's/^RestartSec=.*/RestartSec=1/' {node_state.UNIT} && grep -qx RestartSec=1 {node_state.UNIT}"
        " && systemctl daemon-reload"
    ),
    "env-file-edited": lambda d: (
        f"sed -i 's/^SGLANG_ENABLE_SPEC_V2=.*/SGLANG_ENABLE_SPEC_V2=\"0\"/' {node_state.ENV_FILE}"
        f" && grep -qx 'SGLANG_ENABLE_SPEC_V2=\"0\"' {node_state.ENV_FILE}"
    ),
    "env-file-deleted": lambda d: f"rm {node_state.ENV_FILE}",
    "service-stopped": lambda d: "systemctl stop sglang.service",
    "service-disabled": lambda d: "systemctl disable sglang.service",
    # `systemctl mask` refuses while the unit lives in /etc/systemd/system; an operator then
    # does by hand what mask does: the unit becomes a link to /dev/null (LoadState=masked).
    "service-masked": lambda d: (
        f"systemctl stop sglang.service && ln -sfn /dev/null {node_state.UNIT} && systemctl daemon-reload"
        ' && test "$(systemctl show --property=LoadState --value sglang.service)" = masked'
    ),
    # the pristine file SGLang shipped, copied back over the patched one
    "patched-file-reverted": lambda d: "cp {1} {0} && cmp -s {1} {0}".format(*map(shlex.quote, _patched_file(d))),
    "patch-manifest-deleted": lambda d: f"rm {node_state.MANIFEST}",
    "nccl-block-removed-from-sitecustomize": lambda d: (
        f"sed -i '/# BEGIN {NCCL_MARK}/,/# END {NCCL_MARK}/d' {shlex.quote(d.sitecustomize)}"
        f" && ! grep -q '{NCCL_MARK}' {shlex.quote(d.sitecustomize)}"
    ),
    # the server's user could then rewrite its own environment
    "env-file-owner-changed": lambda d: f"chown sglang:sglang {node_state.ENV_FILE}",
    "secrets-file-mode-changed": lambda d: f"chmod 0644 {node_state.SECRETS_FILE}",
    # -f: the server keeps running under the uid whose account is gone
    "service-user-deleted": lambda d: "userdel -f sglang && ! getent passwd sglang",
    # the readiness probe of ExecStartPost= and a folder of sglang-canon's, each as another
    # program or user left it (sglang_service compares them all in one read, then writes)
    "probe-edited": lambda d: f"echo 'exit 0' >> {node_state.PROBE} && tail -n1 {node_state.PROBE} | grep -qx 'exit 0'",
    "state-folder-loosened": lambda d: f"chmod 0777 {node_state.STATE_DIR}",
    # the watchdog's timer and program (sglang_watchdog compares them in one read, then writes)
    "watchdog-timer-edited": lambda d: (
        f"sed -i 's/^AccuracySec=.*/AccuracySec=1min/' {node_state.WATCHDOG_TIMER}"
        f" && grep -qx AccuracySec=1min {node_state.WATCHDOG_TIMER} && systemctl daemon-reload"
    ),
    "watchdog-program-mode-changed": lambda d: f"chmod 0700 {node_state.WATCHDOG_PROGRAM}",
    # a venv file others may write: the server would run code anyone on the node can change
    "venv-file-loosened": lambda d: "chmod o+w {0} && test -n \"$(find {0} -perm -o+w)\"".format(
        shlex.quote(_patched_file(d)[0])),
}


# The kinds in groups that one run repairs together (the CI machine has 2 cores: a run per kind
# cost minutes each). Each group is applied kind by kind, each seen to change the node, then ONE
# site.yml run must repair all of them and the next run change nothing. Kinds of one group do not
# undo each other (e.g. a deleted env file and one whose owner changed are in different groups;
# the owner is changed after the edit); every kind of DRIFTS is in exactly one group
# (test_every_drift_kind_is_tested).
DRIFT_GROUPS = (
    ("unit-edited", "env-file-edited", "env-file-owner-changed", "secrets-file-mode-changed", "patched-file-reverted",
     "nccl-block-removed-from-sitecustomize", "service-stopped", "probe-edited", "state-folder-loosened",
     "watchdog-timer-edited", "watchdog-program-mode-changed"),
    # disabled, then masked: it stops the server, whose user then goes, and its environment file
    ("service-disabled", "patch-manifest-deleted", "service-masked", "service-user-deleted", "env-file-deleted",
     "venv-file-loosened"),
)


def _apply(drift, kinds):
    before = node_state.fingerprint(drift.node, drift.paths)
    assert not node_state.differences(drift.baseline, before), "the node is not converged before the drift"
    for kind in kinds:
        node_state.ssh(drift.node, DRIFTS[kind](drift))
        drifted = node_state.fingerprint(drift.node, drift.paths)
        assert node_state.differences(before, drifted), f"{kind} changed nothing the test can see"
        before = drifted
    return before


def test_drift_scan_passes_on_a_converged_node(drift):
    scan = _scan(drift)
    assert scan.rc == 0, node_state.failure_messages(scan) or scan.stdout[-4000:]
    assert scan.changed == 0, scan.changed_tasks()
    assert not node_state.differences(drift.baseline, node_state.fingerprint(drift.node, drift.paths))


def test_check_mode_on_a_fresh_node_says_what_would_be_installed_without_failing(drift):
    check = drift.fresh_check
    assert check.rc == 0, check.failure_messages() or check.stdout[-4000:]
    assert _printed_no_failure(check), check.failure_messages() or check.stdout[-4000:]
    assert check.changed > 0  # a fresh node has everything to do
    said = "\n".join(check.messages())
    assert "check mode: pip would install sglang==" in said, said
    # the gateway and the monitor say what they would install, too
    assert "check mode: pip would install sglang-router==" in said, said
    assert "its parser checks sglang_gateway_args, sglang_gateway_host and sglang_gateway_port after the install" in said, said
    assert "check mode: apt-get would install prometheus from " in said, said
    assert "the stack is verified after that install" in said, said
    # the unit it would write is shown as a diff (a new file's diff names the rendered template), and
    # check mode wrote nothing
    unit_diffs = [diff for _, what, diff in check.diffs() if what.endswith("/sglang.service.j2")]
    assert len(unit_diffs) == 1 and "ExecStart=" in unit_diffs[0]["after"], [w for _, w, _ in check.diffs()]
    assert drift.fresh_check_left == [], f"--check made {drift.fresh_check_left} on a fresh node"


def test_a_fresh_converge_prints_no_failure(drift):
    """No fatal, FAILED or ...ignoring line in a successful first deploy (the scan plays included)."""
    assert _printed_no_failure(drift.fresh_converge), drift.fresh_converge.failure_messages()


def test_check_mode_on_a_converged_node_changes_nothing(drift):
    check = _check_diff(drift.node)
    assert check.rc == 0, check.failure_messages() or check.stdout[-4000:]
    assert check.changed == 0, check.changed_tasks()
    assert _printed_no_failure(check)
    assert not check.diffs(), [what for _, what, _ in check.diffs()]


# What test_check_mode_and_the_drift_scan_* make drift: one listed item per kind, each naming the
# task that would repair it.
SCANNED_DRIFT = {
    # a loop over files: each changed file is listed by its path
    "unit-edited": f"Write the server's unit and environment file ({node_state.UNIT})",
    "env-file-edited": f"Write the server's unit and environment file ({node_state.ENV_FILE})",
    "secrets-file-mode-changed": "Write the server's secrets file",
    "service-stopped": "Enable the service on boot and start it",
    "patched-file-reverted": "Apply the patch sets to the installed SGLang",
    "nccl-block-removed-from-sitecustomize": "Write the NCCL block into sitecustomize.py",
    "venv-file-loosened": "Give the venv back to root",
    "watchdog-timer-edited": "Write the watchdog's units",
}


def test_check_mode_and_the_drift_scan_on_a_drifted_node_report_each_change_once_and_change_nothing(drift):
    """The operator's two ways of asking "what drifted?", on one drifted node (each run of a 2-core
    CI machine costs a minute; one repair serves both)."""
    before = node_state.fingerprint(drift.node, drift.paths)
    assert not node_state.differences(drift.baseline, before)
    for kind in SCANNED_DRIFT:
        node_state.ssh(drift.node, DRIFTS[kind](drift))
    drifted = node_state.fingerprint(drift.node, drift.paths)

    # site.yml --check --diff: each would-be change once, with its diff shown once
    check = _check_diff(drift.node)
    assert check.rc == 0, check.failure_messages() or check.stdout[-4000:]
    assert _printed_no_failure(check)
    shown = collections.Counter(what for _, what, _ in check.diffs())
    assert shown[node_state.UNIT] == 1, shown
    assert shown[node_state.ENV_FILE] == 1, shown
    assert all(count == 1 for count in shown.values()), shown
    unit_diff = next(diff for _, what, diff in check.diffs() if what == node_state.UNIT)
    assert "RestartSec=1" in unit_diff["before"].splitlines() and "RestartSec=1" not in unit_diff["after"].splitlines()
    # no task shows changed twice for the same host and item
    changed = collections.Counter(check.changed_tasks())
    assert all(count == 1 for count in changed.values()), changed
    assert node_state.fingerprint(drift.node, drift.paths) == drifted  # check mode changed nothing

    # playbooks/drift.yml: fails, listing each drifted item by the task that would repair it
    scan = _scan(drift)
    assert scan.rc != 0, "drift.yml exited 0 on a drifted node"
    report = "\n".join(m for m in node_state.failure_messages(scan) if " drifted: " in m)
    for kind, expected_item in SCANNED_DRIFT.items():
        assert expected_item in report, f"{kind}: {expected_item!r} not in the drift report:\n{report}"
    # the scan changed nothing: the edited unit is still edited, the env file still edited, ...
    after = node_state.fingerprint(drift.node, drift.paths)
    assert after == drifted, node_state.differences(drifted, after)
    assert node_state.ssh(drift.node, f"grep -c '^RestartSec=1$' {node_state.UNIT}").strip() == "1"

    repair = _site(drift)
    assert repair.rc == 0, node_state.failure_messages(repair)
    assert not node_state.differences(drift.baseline, node_state.fingerprint(drift.node, drift.paths))


# The includes a run reaches only when a role's one-read comparison (sglang_files_in_place) found
# a file or folder that differs from what the role writes.
WRITES_WHEN_DIFFERENT = (
    "sglang_service : Write the folders, helper programs, unit, environment and secrets that differ",
    "sglang_watchdog : Write the folders and files that differ",
)


def test_every_drift_kind_is_tested():
    grouped = [kind for group in DRIFT_GROUPS for kind in group]
    assert sorted(grouped) == sorted(DRIFTS) and len(grouped) == len(set(grouped))


@pytest.mark.parametrize("kinds", DRIFT_GROUPS, ids="+".join)
def test_drift_is_repaired_by_one_run_and_the_next_run_changes_nothing(drift, kinds):
    _apply(drift, kinds)

    repair = _site(drift)
    assert repair.rc == 0, node_state.failure_messages(repair) or repair.stdout[-4000:]
    assert repair.changed > 0, "site.yml found nothing to repair"
    repaired = node_state.fingerprint(drift.node, drift.paths)
    assert not node_state.differences(drift.baseline, repaired), node_state.differences(drift.baseline, repaired)
    assert node_state.health_code(drift.node) == "200"

    again = _site(drift)
    assert again.rc == 0, node_state.failure_messages(again)
    assert again.changed == 0, again.changed_tasks()
    # ... and found every file as it writes it in one read: the writing tasks were not even visited
    assert set(WRITES_WHEN_DIFFERENT) <= set(again.skipped_tasks()), again.skipped_tasks()
