"""Every role variable is documented, and the production inventory's docs are current."""

import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
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
