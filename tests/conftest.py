"""Shared fixtures: test nodes made by tests/testnode and converged with site.yml."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import node_state  # noqa: E402  pylint: disable=wrong-import-position
import project_modules  # noqa: E402  pylint: disable=wrong-import-position
from project_modules import REPO  # noqa: E402  pylint: disable=wrong-import-position
from ansible_run import run_playbook  # noqa: E402  pylint: disable=wrong-import-position
from parser_venv import ensure_parser_venv  # noqa: E402  pylint: disable=wrong-import-position
from testnodes import NodeSet  # noqa: E402  pylint: disable=wrong-import-position
from gateway_fleet import GatewayFleet, fleet_inventory  # noqa: E402  pylint: disable=wrong-import-position

# Test nodes of the suite live apart from the quickstart's node (.testnodes/), one folder per
# pytest-xdist worker (each worker has its own session, so its own converged node).
STATE_ROOT = REPO / ".cache" / "pytest-testnodes" / os.environ.get("PYTEST_XDIST_WORKER", "main")
SNAPSHOTS = STATE_ROOT / "snapshots"

# The files that share the gateway fleet (see gateway_fleet), in the order they run on it: the
# gateway's own checks, the monitors', the watchdog's behind the gateway, then the rolling
# deploys, which restart every node. Under pytest-xdist (pytest.ini: --dist=loadgroup) they form
# one xdist group, so one worker runs them one after the other on one fleet, made and converged once.
FLEET_GROUP = "gateway-fleet"
FLEET_FILES = (
    "integration/test_gateway.py",
    "integration/test_monitoring.py",
    "integration/test_watchdog_gateway.py",
    "integration/test_rolling_gateway.py",
    "integration/test_upgrade_gateway.py",
)
# The costliest files after them, costliest first (minutes each on the 2-core CI machine). Under
# xdist (--no-loadscope-reorder) groups are handed to the workers in collection order, one more
# whenever a worker runs low: the long ones start first and the many quick ones even out the end.
# Every other file is a group of its own, as --dist=loadfile would make it. A file not listed
# runs after these, integration files before the quick tiers.
COSTLIEST_FIRST = FLEET_FILES + (
    "integration/test_watchdog.py",
    "integration/test_faults.py",
    "integration/test_firewall.py",
    "integration/test_benchmark.py",
    "integration/test_models.py",
    "integration/test_upgrade_rollout.py",
    "integration/test_unit_integrity.py",
    "integration/test_drift.py",
    "integration/test_sglang_patches.py",
    "integration/test_bad_input.py",
)


_LAST_ON_THE_FLEET = pytest.StashKey[bool]()


def _relative(item):
    return item.path.resolve().relative_to(REPO / "tests").as_posix()


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the xdist_group marks
def pytest_collection_modifyitems(items):
    """Under xdist only: one xdist group per file, one for the fleet's files (FLEET_GROUP), and
    the costliest first (see COSTLIEST_FIRST, which also orders the fleet's files); a stable sort,
    so each file's tests keep their order. A run without xdist keeps the tiers' order. Either way
    the last test of the fleet's files, in the order they run, is marked: the fleet goes down
    after it (pytest_runtest_teardown)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):

        def rank(item):
            relative = _relative(item)
            if relative in COSTLIEST_FIRST:
                return (0, COSTLIEST_FIRST.index(relative))
            return (1 if relative.startswith("integration/") else 2, 0)

        for item in items:
            relative = _relative(item)
            item.add_marker(pytest.mark.xdist_group(FLEET_GROUP if relative in FLEET_FILES else relative))
        items.sort(key=rank)
    # After the sort: collection order is the files' names, and test_watchdog_gateway.py sorts
    # after test_rolling_gateway.py although it runs before it under xdist.
    fleet_items = [item for item in items if _relative(item) in FLEET_FILES]
    if fleet_items:
        fleet_items[-1].stash[_LAST_ON_THE_FLEET] = True


@pytest.fixture(scope="session")
def project_module():
    """Load a Python file of the project (a filter, module or script) by its path from the repository root.

    `project_module(path, as_name=None)` is tests/project_modules.py's load(): each file is loaded
    once per session and name; `as_name` also registers it in sys.modules under that name, e.g.
    the ansible.module_utils name a module imports it by at run time.
    """
    return project_modules.load


@pytest.fixture(scope="session")
def parser_python():
    """Python of .cache/parser-venv (SGLang 0.5.9 + CPU torch 2.13.0 from the wheelhouse), built once."""
    return ensure_parser_venv()


_FILE_NODE_SETS = []  # made by node_sets during the current test file (one file at a time per worker)


@pytest.fixture(scope="session")
def _all_node_sets():
    """Every NodeSet this worker made; all removed at the end of the session, snapshots last."""
    made = []

    def make(name, count=1, **up_options):
        node_set = NodeSet(STATE_ROOT / name)
        node_set.down()  # leftovers of an interrupted earlier session
        made.append(node_set)
        node_set.up(count, **up_options)  # e.g. monitor=True: tests/testnode up N --monitor
        return node_set

    yield make
    for node_set in made:
        node_set.down()
    # snapshots last: nodes of any set may stand on one
    shutil.rmtree(SNAPSHOTS, ignore_errors=True)


@pytest.fixture(scope="session")
def node_sets(_all_node_sets):
    """Make NodeSets on demand; the nodes are removed at the end of the test file that made them.

    `node_sets(name, count, from_snapshot=DIR)` starts the nodes from a snapshot (each with its
    own name, address and keys) instead of the bare base image, e.g. from
    `converged_snapshot.directory`; the file must then still converge them itself (site.yml,
    rc 0) before relying on them, since their identity differs from the snapshot's.
    """

    def make(name, count=1, **up_options):
        node_set = _all_node_sets(name, count, **up_options)
        _FILE_NODE_SETS.append(node_set)
        return node_set

    return make


@pytest.fixture(scope="module", autouse=True)
def _file_node_sets_down_at_its_end():
    """A file's own nodes go when the file is done: idle nodes cost the other files CPU and memory,
    and the host's inotify instances (each node's systemd holds several; fs.inotify.max_user_instances)."""
    yield
    while _FILE_NODE_SETS:
        _FILE_NODE_SETS.pop().down()


class Converged:
    """A node converged by site.yml, with the result of that first run."""

    def __init__(self, node, first_run, second_run):
        self.node = node
        self.first_run = first_run
        self.second_run = second_run
        self.inventory = node.inventory
        self.name = node.name

    def ssh(self, command, check=False):
        return self.node.ssh(command, check=check)

    def converge(self, **kwargs):
        return run_playbook("site.yml", self.inventory, **kwargs)


class ConvergedSnapshot:
    """This worker's converged node and the snapshot of it, proven converged (see converged_snapshot)."""

    def __init__(self, node_set, first_run, second_run, directory):
        self.node_set = node_set
        self.first_run = first_run
        self.second_run = second_run
        self.directory = directory
        self.handed_out = False

    def take(self):
        """The node as the snapshot has it: restored, unless nobody used it since it was proven."""
        node = self.node_set.nodes()[0]  # a new object: attributes set by one file stay there
        if self.handed_out:
            node.reset(to_snapshot=self.directory)
        self.handed_out = True
        node_state.wait_healthy(node, 120)
        return node


@pytest.fixture(scope="session")
def converged_snapshot(_all_node_sets):
    """One fresh node per xdist worker, converged once by site.yml, then snapshotted.

    The first converge runs on a fresh node (its result is `first_run`). The node is then powered
    off and its filesystem kept as a read-only snapshot under the node (tests/testnode snapshot:
    the overlay's upper dir is moved, not copied). The snapshot is proven converged once, on the
    node booted from it: a second site.yml run must change nothing. Restoring it (an empty upper
    dir over the snapshot, same name, address and keys) gives that proven state back in seconds,
    where a fresh node needs a full first converge (pip install from the wheelhouse, parser
    checks, ...).
    """
    node_set = _all_node_sets("converged")  # kept for the session, unlike node_sets' nodes
    node = node_set.nodes()[0]
    first = run_playbook("site.yml", node.inventory)
    assert first.rc == 0, first.stdout[-6000:]
    directory = SNAPSHOTS / "converged"
    shutil.rmtree(directory, ignore_errors=True)  # an interrupted session's (its nodes are down)
    node.snapshot(directory)
    # The snapshot, as booted, must be converged: test_spine's test_second_converge_changes_nothing
    # reads this run's stats (changed=0); every file's restored node stands on it.
    proof = run_playbook("site.yml", node.inventory)
    assert proof.rc == 0, node_state.failure_messages(proof) or proof.stdout[-6000:]
    return ConvergedSnapshot(node_set, first, proof, directory)


@pytest.fixture(scope="module")
def converged_node(converged_snapshot):
    """A converged node for this test file alone: this worker's node, restored from its converged snapshot.

    Every file gets the snapshot's state, whatever an earlier file did to the node, so a file
    needs no clean-up for others and reads no other file's side effects. `first_run` is the
    fresh node's first converge, which made the snapshot. Use it in a new file's module fixture
    instead of `node_sets(...)` plus a first site.yml run whenever the file needs "a converged
    node" (with the default inventory) rather than the first converge itself; `second_run` is
    the run on the node booted from the snapshot, which proved it converged; `.node` is the
    tests/testnode Node (ssh, reboot, reset, testinfra_host).
    """
    return Converged(converged_snapshot.take(), converged_snapshot.first_run, converged_snapshot.second_run)


@pytest.fixture(scope="module")
def host(converged_node):
    """testinfra host of this file's converged node, over SSH."""
    return converged_node.node.testinfra_host()


_FLEETS = []  # this worker's gateway fleet, once made


@pytest.fixture(scope="session")
def gateway_fleet(_all_node_sets, converged_snapshot, tmp_path_factory):
    """Three serving nodes behind one gateway, watched by one monitor, made and converged once per
    worker and shared by the files of FLEET_FILES (one xdist group: one worker, one after the other).

    The serving nodes start from this worker's converged snapshot; this first run moves their
    servers onto their own addresses (all at once: the rollout order is the rolling
    tests' subject, not this set-up's), sets up the gateway host in front of running servers and
    the monitor, both from the base image. Each file leaves the fleet converged on this inventory
    (the rolling deploys, which change it, run last, then the upgrades, which leave it on another
    release). The fleet goes down after the last test of
    those files (pytest_runtest_teardown below), not at the end of the session: idle, its four
    hosts and their probes would cost the other files CPU.
    """
    # Three serving nodes (issue 14 §5): a rollout has a batch before and a batch after the one
    # restarting, and two keep serving while one restarts; each node costs every fleet run a
    # host's worth of the 2-core CI machine's CPU.
    node_set = _all_node_sets("gateway-fleet", 3, gateway=True, monitor=True,
                              from_snapshot=converged_snapshot.directory)
    inventory = fleet_inventory(node_set.inventory, tmp_path_factory.mktemp("gateway-fleet") / "inventory.yml")
    fleet = GatewayFleet(node_set, inventory)
    fleet.first_run = fleet.converge(extravars={"sglang_rollout_batch_size": len(fleet.nodes)})
    assert fleet.first_run.rc == 0, fleet.first_run.failure_messages() or fleet.first_run.stdout[-6000:]
    _FLEETS.append(node_set)
    return fleet


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):  # pylint: disable=unused-argument
    """The gateway fleet goes after the last test of the fleet's files (marked at collection)."""
    if _FLEETS and item.stash.get(_LAST_ON_THE_FLEET, False):
        _FLEETS.pop().down()
