"""Shared fixtures: test nodes made by tests/testnode and converged with site.yml."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
sys.path.insert(0, str(TESTS))

from ansible_run import run_playbook  # noqa: E402  pylint: disable=wrong-import-position
from parser_venv import ensure_parser_venv  # noqa: E402  pylint: disable=wrong-import-position
from testnodes import NodeSet  # noqa: E402  pylint: disable=wrong-import-position

# Test nodes of the suite live apart from the quickstart's node (.testnodes/), one folder per
# pytest-xdist worker (each worker has its own session, so its own converged node).
STATE_ROOT = REPO / ".cache" / "pytest-testnodes" / os.environ.get("PYTEST_XDIST_WORKER", "main")


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
            spec = importlib.util.spec_from_file_location(as_name or path.stem, path)
            module = importlib.util.module_from_spec(spec)
            if as_name:
                sys.modules[as_name] = module
            spec.loader.exec_module(module)
            loaded[relative_path] = module
        return loaded[relative_path]

    return load


@pytest.fixture(scope="session")
def parser_python():
    """Python of .cache/parser-venv (SGLang 0.5.9 + CPU torch 2.13.0 from the wheelhouse), built once."""
    return ensure_parser_venv()


@pytest.fixture(scope="session")
def node_sets():
    """Make NodeSets on demand; every node made is removed at the end of the session."""
    made = []

    def make(name, count=1, gateway=False):
        node_set = NodeSet(STATE_ROOT / name)
        node_set.down()  # leftovers of an interrupted earlier session
        made.append(node_set)
        node_set.up(count, gateway=gateway)
        return node_set

    yield make
    for node_set in made:
        node_set.down()


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


@pytest.fixture(scope="session")
def converged_node(node_sets):
    """One fresh test node, converged once by site.yml (the quickstart's job)."""
    node = node_sets("converged").nodes()[0]
    first = run_playbook("site.yml", node.inventory)
    assert first.rc == 0, first.stdout[-6000:]
    return Converged(node, first)


@pytest.fixture(scope="session")
def host(converged_node):
    """testinfra host of the converged node, over SSH."""
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


@pytest.fixture(scope="session")
def gateway_fleet(node_sets):
    """Three serving nodes and one gateway in front of them, made and converged once per session."""
    node_set = node_sets("gateway-fleet", 3, gateway=True)
    first = run_playbook("site.yml", node_set.inventory)
    assert first.rc == 0, first.stdout[-6000:]
    return GatewayFleet(node_set, first)
