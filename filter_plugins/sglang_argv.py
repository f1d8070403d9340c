"""Turn sglang_server_args (ServerArgs field names -> values) into the server's argv.

This is the only place where the mapping becomes a command line: the unit's ExecStart,
the pre-restart flag check, the production doc and the tests all go through it.
"""

import re

from ansible.errors import AnsibleFilterError

_FIELD_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
# Characters after which systemd's ExecStart= parser needs an argument quoted.
_NEEDS_QUOTING = re.compile(r"[\s\"'\\;]")


def sglang_argv(server_args, name="sglang_server_args"):
    """Return the argv list for a mapping of ServerArgs fields.

    true renders a bare flag, false/None omits it, a list renders the flag followed by
    each item (SGLang's nargs options), anything else renders "--flag value".
    `name` is the variable named in errors (sglang_gateway_args renders the same way).
    """
    if not isinstance(server_args, dict):
        raise AnsibleFilterError(
            f"{name} must be a mapping of "
            + ("ServerArgs field names" if name == "sglang_server_args" else "option names")
            + f" to values, got {type(server_args).__name__}"
        )
    argv = []
    for field, value in server_args.items():
        if not isinstance(field, str) or not _FIELD_NAME.match(field):
            raise AnsibleFilterError(
                f"{name}: {field!r} is not "
                + ("a ServerArgs field name" if name == "sglang_server_args" else "an option name")
                + " (expected lower_snake_case, e.g. tp_size)"
            )
        flag = "--" + field.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            argv.append(flag)
        elif isinstance(value, (list, tuple)):
            argv.append(flag)
            argv.extend(_scalar(field, item, name) for item in value)
        elif isinstance(value, dict):
            raise AnsibleFilterError(f"{name}.{field}: a mapping cannot be rendered as a command-line value")
        else:
            argv.extend([flag, _scalar(field, value, name)])
    return argv


def _scalar(field, value, name="sglang_server_args"):
    if isinstance(value, (dict, list, tuple)) or value is None:
        raise AnsibleFilterError(f"{name}.{field}: nested value {value!r} cannot be rendered")
    return str(value)


def systemd_exec_line(argv):
    """Quote an argv list for a systemd ExecStart= line.

    systemd expands %specifiers and $VARIABLES in ExecStart=, so both are escaped; arguments
    with whitespace, quotes or backslashes are double-quoted with C-style escapes.
    """
    words = []
    for arg in argv:
        arg = str(arg).replace("%", "%%").replace("$", "$$")
        if arg == "" or _NEEDS_QUOTING.search(arg):
            arg = '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'
        words.append(arg)
    return " ".join(words)


class FilterModule:
    """sglang-canon's command-line filters."""

    def filters(self):
        return {"sglang_argv": sglang_argv, "systemd_exec_line": systemd_exec_line}
