"""Code and files shared by several parts live in one place, and each reaches it the ordinary way.

- A filter or lookup plugin does not load a module_util by its file path (importlib on a path,
  sys.path edits): the controller cannot import module_utils/ as Ansible packages it for modules,
  so such a plugin would depend on the repository's layout. Logic both sides need lives in the
  plugin, and the module gets (or returns) what the plugin computes.
- A role does not reach into another role's folder (role_path/../other_role/...): a helper
  several roles use lives in the shared role sglang (its files/ and a task file the roles import).
"""

import ast
import re

import pytest
from project_modules import REPO

PLUGINS = sorted([*REPO.glob("filter_plugins/*.py"), *REPO.glob("lookup_plugins/*.py"),
                  *REPO.glob("roles/*/filter_plugins/*.py")])
# Loading a file by path, or making module_utils/ importable by editing the search path.
PATH_LOADERS = {"spec_from_file_location", "SourceFileLoader", "load_source", "run_path", "exec_module"}


def _path_imports(source):
    """What in the plugin's source loads code by path: the calls and sys.path edits found."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and (node.attr in PATH_LOADERS or (
                node.attr == "path" and isinstance(node.value, ast.Name) and node.value.id == "sys")):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.Name) and node.id in PATH_LOADERS:
            found.append(f"line {node.lineno}: {node.id}")
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            found += [f"line {node.lineno}: import {name}" for name in names
                      if name in ("importlib.util", "imp", "runpy") or "module_utils" in name]
    return found


def test_the_check_finds_a_module_util_loaded_by_path():
    loaded = ('import importlib.util\nfrom pathlib import Path\n'
              'spec = importlib.util.spec_from_file_location("x", Path(__file__).parents[1] / "module_utils" / "x.py")\n')
    assert _path_imports(loaded)
    assert _path_imports("import sys\nsys.path.insert(0, 'module_utils')\nimport x\n")
    assert _path_imports("from ansible.module_utils.model_sources import url_problems\n")
    assert not _path_imports("import hashlib\nfrom urllib.parse import urlsplit\n")


@pytest.mark.parametrize("plugin", PLUGINS, ids=lambda p: str(p.relative_to(REPO)))
def test_no_filter_or_lookup_plugin_loads_a_module_util_by_path(plugin):
    assert not _path_imports(plugin.read_text()), f"{plugin.relative_to(REPO)} loads code by path"


# role_path followed by /.. (in {{ role_path }}/../x, role_path ~ '/../x' or role_path + '/../x').
REACH = re.compile(r"role_path\s*(?:}}\s*|[~+]\s*['\"])/\.\.")


def test_the_check_finds_a_reach_into_another_role():
    assert REACH.search('src: "{{ role_path }}/../sglang_service/files/systemd-unit-verify"')
    assert REACH.search("lookup('ansible.builtin.file', role_path ~ '/../sglang_gateway/defaults/main.yml')")
    assert not REACH.search('src: "{{ role_path }}/files/sglang-watchdog"')


def test_no_role_reaches_into_another_roles_folder():
    reaches = [f"{path.relative_to(REPO)}:{number}: {line.strip()}"
               for path in sorted((REPO / "roles").rglob("*")) if path.is_file() and path.suffix in (".yml", ".j2")
               for number, line in enumerate(path.read_text().splitlines(), 1) if REACH.search(line)]
    assert not reaches, "a role reaches into another role's folder (move what they share into roles/sglang):\n" + \
        "\n".join(reaches)


def test_another_roles_defaults_are_found_by_its_name_in_roles_path(project_module, tmp_path):
    """What production_doc and sglang_upgrade read of other roles' defaults (lookup sglang_role_defaults)."""
    lookup = project_module("lookup_plugins/sglang_role_defaults.py")
    defaults_file = lookup.defaults_file
    assert defaults_file("sglang_gateway", [str(tmp_path), str(REPO / "roles")]) == str(
        REPO / "roles" / "sglang_gateway" / "defaults" / "main.yml")
    with pytest.raises(Exception, match="role 'sglang_nothing': no defaults/main.yml in roles_path"):
        defaults_file("sglang_nothing", [str(REPO / "roles")])
    # a default made of the role's other variables stays text: the caller's play need not have them
    monitoring = lookup.read_defaults(defaults_file("sglang_monitoring", [str(REPO / "roles")]))
    assert monitoring["sglang_monitoring_node_exporter_listen_address"] == ":{{ sglang_monitoring_node_exporter_port }}"
