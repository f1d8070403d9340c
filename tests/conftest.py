"""Shared fixtures: test nodes made by tests/testnode and converged with site.yml."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
sys.path.insert(0, str(TESTS))

import node_state  # noqa: E402  pylint: disable=wrong-import-position
from ansible_run import run_playbook  # noqa: E402  pylint: disable=wrong-import-position
from parser_venv import ensure_parser_venv  # noqa: E402  pylint: disable=wrong-import-position
from testnodes import NodeSet  # noqa: E402  pylint: disable=wrong-import-position

# Test nodes of the suite live apart from the quickstart's node (.testnodes/), one folder per
# pytest-xdist worker (each worker has its own session, so its own converged node).
STATE_ROOT = REPO / ".cache" / "pytest-testnodes" / os.environ.get("PYTEST_XDIST_WORKER", "main")
SNAPSHOTS = STATE_ROOT / "snapshots"

# The costliest files, costliest first (minutes each on the 2-core CI machine). Under pytest-xdist
# (pytest.ini: --dist=loadfile --no-loadscope-reorder) files are handed to the workers in
# collection order, one more whenever a worker runs low: the long files start first and the
# many quick ones even out the end. (xdist's default order, most tests first, handed out the
# four-test fleet and faults files last, so one worker ran them alone at the end.) A file not
# listed runs after these, integration files before the quick tiers.
COSTLIEST_FIRST = (
    "integration/test_rolling_gateway.py",
    "integration/test_monitoring.py",
    "integration/test_gateway.py",
    "integration/test_watchdog.py",
    "integration/test_firewall.py",
    "integration/test_faults.py",
    "integration/test_benchmark.py",
    "integration/test_models.py",
    "integration/test_unit_integrity.py",
    "integration/test_drift.py",
    "integration/test_sglang_patches.py",
    "integration/test_bad_input.py",
)


def pytest_collection_modifyitems(items):
    """Under xdist only, order the files costliest first (see COSTLIEST_FIRST); a stable sort, so
    each file's tests keep their order. A run without xdist keeps the tiers' order."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return

    def rank(item):
        relative = item.path.resolve().relative_to(TESTS).as_posix()
        if relative in COSTLIEST_FIRST:
            return (0, COSTLIEST_FIRST.index(relative))
        return (1 if relative.startswith("integration/") else 2, 0)

    items.sort(key=rank)


@pytest.fixture(scope="session")
def project_module():
    """Load a Python file of the project (a filter, module or script) by its path from the repository root.

    Plugins and role scripts are not packages, so tests load them by path; each file is loaded
    once per session. `as_name` also registers it in sys.modules under that name, e.g. the
    ansible.module_utils name a module imports it by at run time.
    """
    loaded = {}

    def load(relative_path, as_name=None):
        if relative_path not in loaded:
            path = REPO / relative_path
            # A source loader also takes scripts without a .py suffix (scripts/build-wheelhouse).
            loader = importlib.machinery.SourceFileLoader(as_name or path.stem.replace("-", "_"), str(path))
            spec = importlib.util.spec_from_loader(loader.name, loader)
            module = importlib.util.module_from_spec(spec)
            if as_name:
                sys.modules[as_name] = module
            loader.exec_module(module)
            loaded[relative_path] = module
        return loaded[relative_path]

    return load


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

    def __init__(self, node, first_run):
        self.node = node
        self.first_run = first_run
        self.inventory = node.inventory
        self.name = node.name

    def ssh(self, command, check=False):
        return self.node.ssh(command, check=check)

    def converge(self, **kwargs):
        return run_playbook("site.yml", self.inventory, **kwargs)


class ConvergedSnapshot:
    """This worker's converged node and the snapshot of it, proven converged (see converged_snapshot)."""

    def __init__(self, node_set, first_run, directory):
        self.node_set = node_set
        self.first_run = first_run
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
    proof = run_playbook("site.yml", node.inventory)
    assert proof.rc == 0, node_state.failure_messages(proof) or proof.stdout[-6000:]
    assert proof.changed == 0, proof.changed_tasks()  # the snapshot, as booted, is converged
    return ConvergedSnapshot(node_set, first, directory)


@pytest.fixture(scope="module")
def converged_node(converged_snapshot):
    """A converged node for this test file alone: this worker's node, restored from its converged snapshot.

    Every file gets the snapshot's state, whatever an earlier file did to the node, so a file
    needs no clean-up for others and reads no other file's side effects. `first_run` is the
    fresh node's first converge, which made the snapshot. Use it in a new file's module fixture
    instead of `node_sets(...)` plus a first site.yml run whenever the file needs "a converged
    node" (with the default inventory) rather than the first converge itself; `.node` is the
    tests/testnode Node (ssh, reboot, reset, testinfra_host).
    """
    return Converged(converged_snapshot.take(), converged_snapshot.first_run)


@pytest.fixture(scope="module")
def host(converged_node):
    """testinfra host of this file's converged node, over SSH."""
    return converged_node.node.testinfra_host()


class GatewayFleet:
    """Serving nodes plus one gateway host (tests/testnode up N --gateway), converged once by site.yml.

    nodes: the serving nodes (group sglang_nodes); gateway: the gateway host (sglang_gateways);
    url, api_key, ca_file: what a client of the gateway uses (host variables the harness wrote).
    """

    def __init__(self, node_set, first_run):
        import yaml  # pylint: disable=import-outside-toplevel

        self.node_set = node_set
        self.inventory = node_set.inventory
        self.first_run = first_run
        groups = yaml.safe_load(self.inventory.read_text())["all"]["children"]
        by_name = {n.name: n for n in node_set.nodes()}
        self.nodes = [by_name[name] for name in groups["sglang_nodes"]["hosts"]]
        (gateway_name, gateway_vars), = groups["sglang_gateways"]["hosts"].items()
        self.gateway = by_name[gateway_name]
        self.url = gateway_vars["sglang_gateway_url"]
        self.api_key = gateway_vars["sglang_gateway_api_keys"][0]
        self.ca_file = gateway_vars["sglang_gateway_tls_ca_file"]

    def converge(self, **kwargs):
        return run_playbook("site.yml", self.inventory, **kwargs)


@pytest.fixture(scope="module")
def gateway_fleet(node_sets, converged_snapshot):
    """Three serving nodes and one gateway in front of them, made and converged once per file.

    The serving nodes start from this worker's converged snapshot; this first run moves their
    servers onto their own addresses and sets up the gateway host, which starts from the base
    image (a gateway deployed in front of running servers).
    """
    node_set = node_sets("gateway-fleet", 3, gateway=True, from_snapshot=converged_snapshot.directory)
    first = run_playbook("site.yml", node_set.inventory)
    assert first.rc == 0, first.stdout[-6000:]
    return GatewayFleet(node_set, first)
