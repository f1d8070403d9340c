"""Checks of inventory values before they reach a file on the node.

control_characters(mapping) walks a mapping of variable name -> value (nested mappings and
lists included, keys as well as values) and returns one line per string that holds a control
character (U+0000-U+001F or U+007F), e.g.

    sglang_service_device_allow[1]: control character \\n at position 17
    sglang_server_args.served_model_name: control character \\r at position 2

Positions count characters from 1. A control character in a value that lands in a systemd
unit, an environment file, a Python block or any other line-based file ends the line early
and lets the rest of the value be read as a directive of its own (ExecStartPre=+..., a second
User=), so the shared role refuses them everywhere, before anything on a node changes
(roles/sglang/tasks/check_control_characters.yml). No value is ever echoed: secrets pass
through here too.

role_options(roles_dir) names every option of every role's meta/argument_specs.yml under
roles_dir (all entry points): the variables the check above walks, so that a new role is
covered by declaring its variables in its argument spec.

value_with_type(value) describes a value with its type for messages, so that a quoted
"30001" reads as the string it is: '"30001" (a string)', '1.5 (a float)'.

Pure Python, unit-tested in tests/unit/test_inventory_values.py.
"""

from collections.abc import Mapping
from pathlib import Path

import yaml

try:  # a vaulted value that templating has not decrypted yet
    from ansible.parsing.vault import EncryptedString
except ImportError:  # pragma: no cover - only outside Ansible
    EncryptedString = str

_CONTROL = {code: f"\\x{code:02x}" for code in [*range(0x20), 0x7F]}
_CONTROL.update({0x00: "\\0", 0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"})

# libyaml's loader where PyYAML was built with it: the pure-Python one spends ~50 ms of every
# run's first check on the roles' argument specs (safe either way: no Python tags).
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# bool before int: True is an int too. isinstance, since Ansible hands over tagged subclasses.
_TYPE_NAMES = ((bool, "a boolean"), (int, "an integer"), (float, "a float"), (type(None), "null"))


def control_characters(mapping):
    """Return 'NAME[.key][[index]]: control character C at position N' for each string in
    the mapping that holds a control character (the first one of each string)."""
    if not isinstance(mapping, Mapping):
        raise TypeError(f"control_characters expects a mapping of variable names to values, got {type(mapping).__name__}")
    found = []
    for name, value in mapping.items():
        _walk(str(name), value, found)
    return found


def _walk(path, value, found):
    if isinstance(value, (str, EncryptedString)):
        _scan(path, str(value), found)  # str() decrypts a vaulted value; no value is ever printed
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if isinstance(key, str):
                _scan(f"{path} key \"{key.encode('unicode_escape').decode()}\"", key, found)
            _walk(f"{path}.{key}", item, found)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _walk(f"{path}[{index}]", item, found)


def _scan(path, text, found):
    for position, char in enumerate(text, start=1):
        if ord(char) in _CONTROL:
            found.append(f"{path}: control character {_CONTROL[ord(char)]} at position {position}")
            return


def role_options(roles_dir):
    """Sorted names of the options declared in roles_dir/*/meta/argument_specs.yml."""
    names = set()
    for spec_file in sorted(Path(roles_dir).glob("*/meta/argument_specs.yml")):
        specs = (yaml.load(spec_file.read_text(encoding="utf-8"), Loader=_SAFE_LOADER) or {}).get("argument_specs") or {}
        for entry in specs.values():
            names.update((entry or {}).get("options") or {})
    return sorted(names)


def value_with_type(value):
    """'"30001" (a string)', '30001 (an integer)', '[1, 2] (a list)' -- for wrong-type messages."""
    if isinstance(value, str):
        return f'"{value}" (a string)'
    if isinstance(value, Mapping):
        return f"{dict(value)} (a mapping)"
    if isinstance(value, (list, tuple)):
        return f"{list(value)} (a list)"
    name = next((name for kind, name in _TYPE_NAMES if isinstance(value, kind)), type(value).__name__)
    return f"{value} ({name})"


class FilterModule:
    """sglang-canon's checks of inventory values."""

    def filters(self):
        return {
            "control_characters": control_characters,
            "role_options": role_options,
            "value_with_type": value_with_type,
        }
