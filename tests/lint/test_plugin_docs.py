"""Every module, callback, lookup and filter plugin of the project has documentation that ansible-doc renders."""

import os
import subprocess
from project_modules import REPO

# The project's filters and the role-local ones (roles/NAME/filter_plugins), each with NAME.yml docs.
FILTER_DIRS = [REPO / "filter_plugins", *sorted(REPO.glob("roles/*/filter_plugins"))]
CALLBACK_DIR = REPO / "callback_plugins"
LOOKUP_DIR = REPO / "lookup_plugins"
MODULE_DIR = REPO / "library"


def _filter_names(project_module):
    """Every filter the project's filter plugins define, read from their FilterModule classes."""
    names = []
    for directory in FILTER_DIRS:
        for path in sorted(directory.glob("*.py")):
            names += list(project_module(str(path.relative_to(REPO))).FilterModule().filters())
    return names


def _assert_documented(plugin_type, names):
    # The text an operator reads: --json skips the rendering, which is where a bad description fails.
    done = subprocess.run(
        [str(REPO / ".venv" / "bin" / "ansible-doc"), "-t", plugin_type, *names],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={
            **os.environ,
            "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
            "ANSIBLE_NOCOLOR": "1",
            # ansible-doc loads role-local plugins only when pointed at them.
            "ANSIBLE_FILTER_PLUGINS": os.pathsep.join(str(directory) for directory in FILTER_DIRS),
        },
    )
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr
    for name in names:
        assert f"> {plugin_type.upper()} {name} (" in done.stdout, f"{plugin_type} {name}: no documentation rendered"


def test_every_filter_renders_its_documentation(project_module):
    names = _filter_names(project_module)
    assert "sglang_argv" in names  # the plugins were found at all
    _assert_documented("filter", names)


def test_every_filter_doc_file_belongs_to_a_filter(project_module):
    # A doc file left behind by a renamed or removed filter would document nothing.
    docs = {p.stem for directory in FILTER_DIRS for p in directory.glob("*.yml")}
    orphans = sorted(docs - set(_filter_names(project_module)))
    assert not orphans, f"filter_plugins/*.yml without a filter of that name: {orphans}"


def test_every_callback_renders_its_documentation():
    names = sorted(p.stem for p in CALLBACK_DIR.glob("*.py"))
    assert "sglang_drift" in names
    _assert_documented("callback", names)


def test_every_lookup_renders_its_documentation():
    names = sorted(p.stem for p in LOOKUP_DIR.glob("*.py"))
    assert "sglang_patch_sets" in names
    _assert_documented("lookup", names)


def test_every_module_renders_its_documentation():
    names = sorted(p.stem for p in MODULE_DIR.glob("*.py"))
    assert "python_package_patch" in names
    _assert_documented("module", names)
