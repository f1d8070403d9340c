"""Where the project is, and its files (filters, modules, scripts) loaded as Python modules by
their path: the one REPO and the one loader of the tests.

Plugins and role scripts are not packages, so tests load them by path: through the session
fixture project_module (tests/conftest.py), or, for module-level constants and the parametrize
lists built while pytest collects (before any fixture exists), through load() directly.
tests/lint/test_test_helpers.py keeps test files from defining their own.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = REPO / ".venv" / "bin"
_LOADED = {}


def load(relative_path, as_name=None):
    """The file at relative_path (from the repository root) as a module, loaded once per session
    and name. A source loader also takes scripts without a .py suffix (scripts/build-wheelhouse).
    `as_name` also registers it in sys.modules under that name, e.g. the ansible.module_utils name
    a module imports it by at run time."""
    key = (str(relative_path), as_name)
    if key not in _LOADED:
        path = REPO / relative_path
        loader = importlib.machinery.SourceFileLoader(as_name or path.stem.replace("-", "_"), str(path))
        module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
        if as_name:
            sys.modules[as_name] = module
        loader.exec_module(module)
        _LOADED[key] = module
    return _LOADED[key]


load_at_collection = load  # the name the collection-time callers read best with
