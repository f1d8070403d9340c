"""One naming style for the variables a role makes itself: registers, loop variables, set_facts.

Each is an option of the role (meta/argument_specs.yml), a fact the role hands to others, or
private: `__ROLE_name`, the role's own name after a double underscore. A fact counts as handed on
when another role, a playbook or site.yml reads it, or when the role's README lists it under
"## Facts".
"""

import re

import yaml
from project_modules import REPO

ROLES = sorted(p for p in (REPO / "roles").iterdir() if (p / "tasks").is_dir())
SET_FACT = ("ansible.builtin.set_fact", "ansible.legacy.set_fact", "set_fact")
SET_FACT_ARGUMENTS = {"cacheable"}


class _Loader(yaml.SafeLoader):
    """Safe loading that takes Ansible's tags (!unsafe, !vault) as plain values."""


_Loader.add_multi_constructor("!", lambda loader, suffix, node: None)


def _made_names(tasks):
    """(kind, name) of every register, loop_var and set_fact in a task list, blocks included."""
    for task in tasks or []:
        if not isinstance(task, dict):
            continue
        if "register" in task:
            yield "register", task["register"]
        loop_control = task.get("loop_control")
        if isinstance(loop_control, dict) and "loop_var" in loop_control:
            yield "loop_var", loop_control["loop_var"]
        for key in SET_FACT:
            if isinstance(task.get(key), dict):
                for name in set(task[key]) - SET_FACT_ARGUMENTS:
                    yield "set_fact", name
        for section in ("block", "rescue", "always"):
            yield from _made_names(task.get(section))


def _options(role):
    specs = yaml.load((role / "meta" / "argument_specs.yml").read_text(), Loader=_Loader)["argument_specs"]
    return {name for entry in specs.values() for name in (entry.get("options") or {})}


def _readme_facts(role):
    readme = role / "README.md"
    if not readme.exists():
        return set()
    section = re.search(r"^## Facts\n(.*?)(?=^## |\Z)", readme.read_text(), re.M | re.S)
    return set(re.findall(r"^- `(\w+)`", section.group(1), re.M)) if section else set()


def _read_outside(role, name):
    """Whether another role, a playbook or site.yml mentions the name."""
    word = re.compile(r"(?<!\w)%s(?!\w)" % re.escape(name))
    others = [p for p in (REPO / "roles").rglob("*") if p.is_file() and role not in p.parents]
    places = others + sorted((REPO / "playbooks").glob("*.yml")) + [REPO / "site.yml"]
    return any(word.search(path.read_text(errors="replace")) for path in places)


def _made_by_each_role():
    made = {}
    for role in ROLES:
        for path in sorted(role.glob("tasks/**/*.yml")) + sorted(role.glob("handlers/*.yml")):
            for kind, name in _made_names(yaml.load(path.read_text(), Loader=_Loader)):
                made.setdefault(role, set()).add((kind, name, path.relative_to(REPO).as_posix()))
    return made


def test_every_name_a_role_makes_is_an_option_a_handed_on_fact_or_private():
    wrong = []
    for role, made in _made_by_each_role().items():
        options, facts = _options(role), _readme_facts(role)
        for kind, name, where in sorted(made):
            if name.startswith(f"__{role.name}_") or name in options:
                continue
            if kind == "set_fact" and (name in facts or _read_outside(role, name)):
                continue
            if kind == "register" and _read_outside(role, name):
                continue
            wrong.append(f"{where}: {kind} {name} (private names are __{role.name}_*)")
    assert not wrong, "\n".join(wrong)
