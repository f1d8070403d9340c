"""The tests share their helpers: the repository root (REPO) and the loader of project files come
from tests/project_modules.py, playbook runs from tests/ansible_run.py. A test file that computes
the root from its own path, loads a file by path or runs ansible-playbook by itself fails here."""

import ast

import pytest
from project_modules import REPO

TESTS = REPO / "tests"
# Not test code of this checkout: doubles and shims installed on the test nodes, and the GPU tier,
# which runs on a GPU machine with none of tests/'s helpers.
OUTSIDE = {"double", "wheelhouse", "gpu"}
# Where each shared helper lives.
HOMES = {
    "its own REPO": {"project_modules.py"},
    "a loader of files by path": {"project_modules.py"},
    "its own ansible-playbook run": {
        "ansible_run.py",
        # They kill ansible-playbook mid-run (a fault injected into a converge, an interrupted
        # benchmark sweep): that needs the process itself, which ansible-runner's run() keeps.
        "integration/test_faults.py",
        "integration/test_benchmark.py",
    },
}
LOADERS = {"spec_from_file_location", "SourceFileLoader", "module_from_spec", "exec_module", "load_source", "run_path"}


def _reaches_the_root(node):
    """Path(__file__)...parents[N >= 1], or .parent.parent of it, or os.path.dirname twice."""
    text = ast.unparse(node)
    if "__file__" not in text:
        return False
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "parents":
        return True
    if isinstance(node, ast.Attribute) and node.attr == "parent" and isinstance(node.value, ast.Attribute) \
            and node.value.attr == "parent":
        return True
    return isinstance(node, ast.Call) and text.count("dirname(") >= 2 and text.startswith("os.path.dirname(os.path.dirname(")


def _operands(node):
    """Where a program is named: an argv list's items, the right side of a path's `/`, the
    argument of with_name() or shutil.which()."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return node.elts
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        return [node.right]
    if isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)) \
            and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("with_name", "which"):
        return node.args
    return []


def _names_the_executable(node):
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.endswith("ansible-playbook")


def own_helpers(source):
    """{what the file defines of its own: [line]} for the helpers that have a home."""
    found = {}
    for node in ast.walk(ast.parse(source)):
        what = None
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "REPO" for t in node.targets):
            what = "its own REPO"
        elif isinstance(node, (ast.Subscript, ast.Attribute, ast.Call)) and _reaches_the_root(node):
            what = "its own REPO"
        elif isinstance(node, (ast.Attribute, ast.Name)) and (getattr(node, "attr", None) or getattr(node, "id", None)) in LOADERS:
            what = "a loader of files by path"
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                (alias.name if isinstance(node, ast.Import) else node.module or "").split(".")[0] == "ansible_runner"
                for alias in node.names):
            what = "its own ansible-playbook run"
        elif any(_names_the_executable(part) for part in _operands(node)):
            what = "its own ansible-playbook run"
        if what:
            found.setdefault(what, set()).add(node.lineno)
    return {what: sorted(lines) for what, lines in found.items()}


def _test_files():
    for path in sorted(TESTS.rglob("*.py")):
        relative = path.relative_to(TESTS)
        if relative.parts[0] not in OUTSIDE and relative.as_posix() != "lint/test_test_helpers.py":
            yield relative.as_posix()


@pytest.mark.parametrize("relative", list(_test_files()))
def test_a_test_file_takes_its_helpers_from_their_home(relative):
    found = own_helpers((TESTS / relative).read_text(encoding="utf-8"))
    wrong = {what: lines for what, lines in found.items() if relative not in HOMES[what]}
    assert not wrong, (f"tests/{relative} defines {wrong} (what: line numbers); take REPO and load() from "
                       "tests/project_modules.py and run playbooks through tests/ansible_run.py's run_playbook")


@pytest.mark.parametrize("source, what", [
    ("from pathlib import Path\nREPO = Path(__file__).resolve().parents[2]\n", "its own REPO"),
    ("from pathlib import Path\nROLE = Path(__file__).parents[2] / 'roles'\n", "its own REPO"),
    ("import os\nTOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))\n", "its own REPO"),
    ("import importlib.util\nspec = importlib.util.spec_from_file_location('x', 'x.py')\n", "a loader of files by path"),
    ("import ansible_runner\n", "its own ansible-playbook run"),
    ("import subprocess\nsubprocess.run(['ansible-playbook', 'site.yml'])\n", "its own ansible-playbook run"),
    ("import sys\nfrom pathlib import Path\nBIN = Path(sys.executable).with_name('ansible-playbook')\n",
     "its own ansible-playbook run"),
    ("ARGV = [str(VENV_BIN / 'ansible-playbook'), 'site.yml']\n", "its own ansible-playbook run"),
])
def test_the_check_finds_each_kind(source, what):
    assert what in own_helpers(source)


def test_the_check_leaves_a_file_next_to_the_test_and_prose_alone():
    source = ('"""Runs ansible-playbook on localhost."""\nfrom pathlib import Path\n'
              'CHECK = Path(__file__).resolve().parent / "check.py"\n'
              'DOCUMENTED = [line for line in README if "ansible-playbook" in line]\n')
    assert own_helpers(source) == {}
