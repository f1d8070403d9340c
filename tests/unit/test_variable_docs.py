"""Every role variable is documented, and the production inventory's docs are current."""

import subprocess
import sys

import yaml
from project_modules import REPO

ROLES = sorted(p for p in (REPO / "roles").iterdir() if (p / "tasks").is_dir())


def test_every_role_has_an_argument_spec_covering_its_defaults():
    for role in ROLES:
        specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
        documented = {name for entry in specs.values() for name in entry.get("options", {})}
        defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {}
        assert set(defaults) <= documented, f"{role.name}: undocumented defaults {sorted(set(defaults) - documented)}"


def test_every_argument_spec_default_equals_the_role_default():
    # Ansible takes a role variable's value from defaults/main.yml; the spec's default is what
    # ansible-doc and the production inventory's comments show, so the two must not disagree.
    wrong = []
    for role in ROLES:
        specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
        defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {}
        for entry_point, entry in specs.items():
            for name, option in entry.get("options", {}).items():
                where = f"{role.name} {entry_point}.{name}"
                if name not in defaults:
                    if "default" in option:
                        wrong.append(f"{where}: spec default {option['default']!r} but no value in defaults/main.yml")
                elif "default" not in option:
                    wrong.append(f"{where}: no spec default (defaults/main.yml: {defaults[name]!r})")
                elif option["default"] != defaults[name]:
                    wrong.append(f"{where}: spec default {option['default']!r} != defaults/main.yml {defaults[name]!r}")
    assert not wrong, "\n".join(wrong)


def test_production_inventory_lists_every_variable_with_the_current_defaults():
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "document-variables"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def _document_role_readmes(repo, *options):
    return subprocess.run([sys.executable, str(repo / "scripts" / "document-variables"), "--role-readmes", *options],
                          capture_output=True, text=True)


def test_every_role_readme_says_what_the_role_does_and_lists_its_variables_from_the_spec():
    result = _document_role_readmes(REPO, "--check")
    assert result.returncode == 0, result.stderr
    for role in ROLES:
        prose = (role / "README.md").read_text().split("<!-- BEGIN VARIABLES")[0]
        assert prose.startswith(f"# {role.name}\n"), f"{role.name}/README.md: first line must be '# {role.name}'"
        assert len(prose.splitlines()) >= 10, f"{role.name}/README.md: what the role does, before its variables"


def _copy_of_the_roles_docs(tmp_path):
    """The script and each role's docs, so that the check can be run against a spec changed here."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "document-variables").write_text((REPO / "scripts" / "document-variables").read_text())
    for role in ROLES:
        for part in ("meta/argument_specs.yml", "defaults/main.yml", "README.md"):
            if (role / part).exists():
                (tmp_path / "roles" / role.name / part).parent.mkdir(parents=True, exist_ok=True)
                (tmp_path / "roles" / role.name / part).write_text((role / part).read_text())
        (tmp_path / "roles" / role.name / "tasks").mkdir(exist_ok=True)
    return tmp_path / "roles" / "sglang_watchdog"


def test_the_readme_check_fails_on_a_spec_changed_without_regenerating_and_regenerating_fixes_it(tmp_path):
    role = _copy_of_the_roles_docs(tmp_path)
    spec = role / "meta" / "argument_specs.yml"
    specs = yaml.safe_load(spec.read_text())
    specs["argument_specs"]["main"]["options"]["sglang_watchdog_new_option"] = {
        "type": "list", "elements": "str", "choices": ["a", "b"], "description": "An option added to the spec.",
        "default": ["a"]}
    spec.write_text(yaml.safe_dump(specs, sort_keys=False))
    result = _document_role_readmes(tmp_path, "--check")
    assert result.returncode != 0
    assert "roles/sglang_watchdog/README.md: its variables section differs" in result.stderr

    assert _document_role_readmes(tmp_path).returncode == 0
    assert _document_role_readmes(tmp_path, "--check").returncode == 0
    readme = (role / "README.md").read_text()
    assert ("- `sglang_watchdog_new_option` (list of str, one of `a`, `b`, default `[\"a\"]`): "
            "An option added to the spec.") in readme
    assert readme.split("<!-- BEGIN VARIABLES")[0] == (REPO / "roles" / "sglang_watchdog" / "README.md").read_text(
    ).split("<!-- BEGIN VARIABLES")[0], "the prose before the markers is kept as written"


def test_the_readme_check_fails_on_a_missing_readme_or_missing_markers(tmp_path):
    role = _copy_of_the_roles_docs(tmp_path)
    readme = role / "README.md"
    prose = readme.read_text().split("<!-- BEGIN VARIABLES")[0]
    readme.write_text(prose)
    result = _document_role_readmes(tmp_path, "--check")
    assert result.returncode != 0 and "roles/sglang_watchdog/README.md: wants one variables section" in result.stderr

    readme.write_text(prose + "<!-- END VARIABLES -->\n")
    result = _document_role_readmes(tmp_path)
    assert result.returncode != 0 and "roles/sglang_watchdog/README.md: wants one variables section" in result.stderr

    readme.unlink()
    result = _document_role_readmes(tmp_path, "--check")
    assert result.returncode != 0 and "roles/sglang_watchdog/README.md: missing" in result.stderr
