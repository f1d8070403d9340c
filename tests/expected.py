"""What the test node should run, derived from the same variables the roles use.

The roles' defaults and the test inventory are the single source of truth: tests render
them with the same filter (filter_plugins/sglang_argv.py) instead of restating values.
"""

from __future__ import annotations

import jinja2
import jinja2.nativetypes
import yaml
from project_modules import REPO, load


def _load(path):
    return yaml.safe_load((REPO / path).read_text()) or {}


def _filters():
    return load("filter_plugins/sglang_argv.py")


def testnode_vars(overrides=None):
    """Role defaults layered under the test inventory (and overrides), templates resolved."""
    merged = {}
    for role in sorted((REPO / "roles").iterdir()):
        defaults = role / "defaults" / "main.yml"
        if defaults.exists():
            merged.update(_load(defaults.relative_to(REPO)))
    merged.update(_load("inventory/testnode/group_vars/sglang_nodes.yml"))
    merged.update(overrides or {})
    # Native types, as Ansible renders: "{{ sglang_worker_port }}" stays an integer.
    env = jinja2.nativetypes.NativeEnvironment(undefined=jinja2.StrictUndefined)

    def render(value, depth=0):
        if isinstance(value, str) and "{{" in value and depth < 10:
            try:
                return render(env.from_string(value).render(**merged), depth + 1)
            except (jinja2.UndefinedError, jinja2.TemplateAssertionError):
                # depends on facts gathered on the node, or on Ansible's own filters (bool, ...): not needed here
                return value
        if isinstance(value, dict):
            return {k: render(v, depth) for k, v in value.items()}
        if isinstance(value, list):
            return [render(v, depth) for v in value]
        return value

    return {k: render(v) for k, v in merged.items()}


def server_argv(overrides=None):
    """argv after the launcher: sglang_server_args through the one argv filter."""
    return _filters().sglang_argv(testnode_vars(overrides)["sglang_server_args"])


def exec_argv(overrides=None):
    """The whole command line of the unit: launcher + server argv."""
    variables = testnode_vars(overrides)
    return [str(x) for x in variables["sglang_service_launcher"]] + server_argv(overrides)


def systemd_exec_line(argv):
    return _filters().systemd_exec_line(argv)
