"""Shared fixtures: test nodes made by tests/testnode and converged with site.yml."""

from __future__ import annotations

import importlib.machinery
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


@pytest.fixture(scope="session")
def node_sets():
    """Make NodeSets on demand; every node made is removed at the end of the session."""
    made = []

    def make(name, count=1):
        node_set = NodeSet(STATE_ROOT / name)
        node_set.down()  # leftovers of an interrupted earlier session
        made.append(node_set)
        node_set.up(count)
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
