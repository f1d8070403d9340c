"""Which inventory variable is behind each problem sglang_server_args_check finds.

Pure logic, used by library/sglang_server_args_check.py on the node's Ansible Python (not the
probe that runs under SGLang's Python). A problem names the flag as argv gives it
("--tensor-parallel-size/--tp-size", "--tp-size, --base-gpu-id") or an environment variable as
"NAME=value"; the inventory names the variables the argv and the environment came from.
"""

from __future__ import annotations

import re


def _mentions_field(flag, field):
    """Whether a problem's flag text names the ServerArgs field (as --field-with-dashes)."""
    return re.search(r"(^|[ /,])--%s($|[ /,=])" % re.escape(field.replace("_", "-")), flag) is not None


def _mentions_environment(flag, name):
    return re.search(r"(^|[ ,])%s=" % re.escape(name), flag) is not None


def variables_for(flag, variables, environment=()):
    """The inventory variables behind one problem's flag text, in the order the inventory lists them.

    variables: inventory variable name -> its keys (ServerArgs fields for the server-args mapping,
    NAMEs for an environment mapping), e.g. {"sglang_server_args": ["tp_size", ...],
    "sglang_service_environment": ["SGLANG_ENABLE_SPEC_V2"]}; each match is named VARIABLE.KEY.
    environment: the names of the effective environment; one that no variable lists (set by
    another role) is named by itself.
    """
    if not flag:
        return []
    named = []
    listed = set()
    for variable, keys in (variables or {}).items():
        for key in keys or []:
            key = str(key)
            listed.add(key)
            if _mentions_field(flag, key) or _mentions_environment(flag, key):
                named.append("%s.%s" % (variable, key))
    for name in environment or []:
        if str(name) not in listed and _mentions_environment(flag, str(name)):
            named.append(str(name))
    return list(dict.fromkeys(named))


def name_variables(errors, variables, environment=()):
    """Each problem with its `variables` added, and every variable named, in order, without repeats."""
    named_errors = []
    everything = []
    for error in errors or []:
        found = variables_for(error.get("flag"), variables, environment)
        named_errors.append(dict(error, variables=found))
        everything += found
    return named_errors, list(dict.fromkeys(everything))
