"""The formats role variables must have before they reach a command line, a config file or a query.

Ansible's argument specs carry types only: `type: str` lets "sglang_canon; insert rule ..." through
to nft, and "15d --web.enable-admin-api" through to Prometheus's command line. So each role declares
how its variables look, beside its spec, in roles/ROLE/meta/value_formats.yml:

    value_formats:
      sglang_firewall_table: identifier
      sglang_watchdog_failure_threshold: int 1..20
      sglang_gateway_requirements_file: absolute_path or empty
    free_text:
      sglang_gateway_tls_cert: PEM, parsed with cryptography on the controller (why no format applies)

role_value_formats(roles_dir) merges the value_formats of every role under roles_dir (a variable
two roles declare must have one format), and value_format_errors(values, formats) returns one line
per value that does not have its format:

    sglang_firewall_table: expected an identifier (...), got "sglang_canon; insert ..." (a string)

A list's format applies to each element (the line names NAME[INDEX]); null is an unset optional
variable and is not checked; "FORMAT or empty" also takes "". Integers and numbers may be given as
strings that are exactly one ("5", as `-e name=5` gives them), never as booleans. The shared role
refuses every such value in play 1, before anything on a node changes
(roles/sglang/tasks/check_value_formats.yml).

Pure Python, unit-tested in tests/unit/test_value_formats.py.
"""

import ipaddress
import json
import re
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

import yaml
from packaging.requirements import InvalidRequirement, Requirement

try:  # a vaulted value that templating has not decrypted yet
    from ansible.parsing.vault import EncryptedString
except ImportError:  # pragma: no cover - only outside Ansible
    EncryptedString = str

_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_INTEGER = re.compile(r"^[+-]?[0-9]+$")
_NUMBER = re.compile(r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?$")
# Prometheus's model.ParseDuration: units largest first, each at most once; "0" alone is zero.
_PROMETHEUS_DURATION = re.compile(r"^(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?$")
_PATH_CHARACTERS = re.compile(r"^[A-Za-z0-9._+@%=:,/-]+$")
_DNS_LABEL = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
_LISTEN_ADDRESS = re.compile(r"^(?:\[(?P<ipv6>[^\]]+)\]|(?P<host>[^:\[\]]*)):(?P<port>[0-9]+)$")
_RANGE = re.compile(r"^(?P<kind>int|number) (?P<low>[+-]?[0-9.]+)\.\.(?P<high>[+-]?[0-9.]+)$")
_OR_EMPTY = " or empty"


def _matches(pattern):
    compiled = re.compile(pattern)
    return lambda text: compiled.fullmatch(text) is not None  # fullmatch: '$' would let a final newline through


def _ip_address(text):
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _ip_network(text):
    try:
        ipaddress.ip_network(text, strict=False)
    except ValueError:
        return False
    return True


def _host(text):
    return _ip_address(text) or (len(text) <= 253 and all(_DNS_LABEL.fullmatch(label) for label in text.split(".")))


def _listen_address(text):
    match = _LISTEN_ADDRESS.fullmatch(text)
    if not match or not 1 <= int(match["port"]) <= 65535:
        return False
    if match["ipv6"] is not None:
        return ":" in match["ipv6"] and _ip_address(match["ipv6"])
    return match["host"] == "" or (":" not in match["host"] and _ip_address(match["host"]))


def _path(text):
    return _PATH_CHARACTERS.fullmatch(text) is not None and ".." not in text.split("/")


def _absolute_path(text):
    return text.startswith("/") and _path(text)


def _http_url(text):
    if re.search(r"[\s\"'<>\\`]", text):
        return False
    try:
        parts = urlsplit(text)
        _ = parts.port  # raises ValueError for a port that is not one
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _pip_index_url(text):
    """pip reads an index or a find-links folder over http(s) or from a local folder as a file: URL."""
    if text.startswith("file://"):
        return _absolute_path(text[len("file://"):])
    return _http_url(text)


def _regex(text):
    try:
        re.compile(text)
    except re.error:
        return False
    return True


def _pip_requirement(text):
    if text.strip().startswith("-"):
        return False  # an option of pip's, not a requirement
    try:
        Requirement(text)
    except InvalidRequirement:
        return False
    return True


# name -> (what a message says was expected, test of a string)
_STRING_FORMATS = {
    "identifier": ("an identifier (a letter, then up to 63 letters, digits or '_')",
                   _matches(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")),
    "unit_name": ("a systemd unit name ending in .service, .timer, .socket, .target, .mount or .path",
                  _matches(r"^[A-Za-z0-9_.:@-]+\.(service|timer|socket|target|mount|path)$")),
    "service_name": ("a systemd unit name without its suffix (a letter, digit or '_', then letters, digits, '_', '.', ':', '-')",
                     _matches(r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,200}$")),
    "user_name": ("a user or group name (a letter or '_', then up to 31 letters, digits, '_', '.' or '-')",
                  _matches(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")),
    "simple_name": ("a name (a letter or digit, then letters, digits, '_', '.', '+' or '-')",
                    _matches(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}$")),
    "inventory_host": ("an inventory host name (letters, digits, '_', '.', ':', '-')",
                       _matches(r"^[A-Za-z0-9_][A-Za-z0-9_.:-]*$")),
    "prometheus_duration": ("a Prometheus duration (e.g. 15d, 1h30m, 500ms)",
                            lambda text: text == "0" or (text != "" and _PROMETHEUS_DURATION.fullmatch(text) is not None)),
    "prometheus_size": ("a Prometheus byte size (e.g. 512MB, 2GB)", _matches(r"^[0-9]+(B|KB|MB|GB|TB|PB|EB)$")),
    "ip_address": ("an IPv4 or IPv6 address", _ip_address),
    "ip_network": ("an IP address or a CIDR network", _ip_network),
    "listen_address": ("[HOST]:PORT with HOST empty or an IP address (IPv6 in brackets), e.g. 127.0.0.1:9090 or :9100",
                       _listen_address),
    "host": ("an IP address or a DNS name", _host),
    "url_path": ("a URL path (starting with '/', no spaces, quotes, '?' or '#')",
                 _matches(r"^/[A-Za-z0-9._~!$&()*+,;=:@%/-]*$")),
    "absolute_path": ("an absolute path of letters, digits and ._+@%=:,/- without a '..' component", _absolute_path),
    "path": ("a path of letters, digits and ._+@%=:,/- without a '..' component", _path),
    "http_url": ("an http:// or https:// URL with a host and no spaces or quotes", _http_url),
    "pip_index_url": ("an http:// or https:// URL with a host, or file:// and an absolute path", _pip_index_url),
    "version": ("a version (a digit, then letters, digits or .+!_-, e.g. 0.5.9 or 595.58.03)",
                _matches(r"^[0-9][0-9A-Za-z.+!_-]*$")),
    "regex": ("a regular expression that compiles", _regex),
    "python_package": ("a Python project name (PEP 508)", _matches(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")),
    "pip_requirement": ("a pip requirement (PEP 508, e.g. sglang==0.5.9), not an option", _pip_requirement),
    "debian_package": ("a Debian package name", _matches(r"^[a-z0-9][a-z0-9+.-]+$")),
    "file_mode": ("a file mode as a quoted octal string (e.g. \"0644\")", _matches(r"^[0-7]{3,4}$")),
    "device_allow": ("a systemd DeviceAllow= entry (a /dev path, char-NAME or block-NAME, then r, w and/or m)",
                     _matches(r"^(/dev/[A-Za-z0-9._/-]+|(char|block)-[A-Za-z0-9._*-]+)( [rwm]{1,3})?$")),
}


def format_check(spec):
    """(description, test of one value) for a format of value_formats.yml; raises ValueError for an unknown one."""
    if not isinstance(spec, str):
        raise ValueError(f"a format is a string, not {spec!r}")
    or_empty = spec.endswith(_OR_EMPTY)
    name = spec[:-len(_OR_EMPTY)] if or_empty else spec
    if name == "port":
        description, test = _range_check("int", 1, 65535)
        description = "a port, " + description
    elif _RANGE.fullmatch(name):
        match = _RANGE.fullmatch(name)
        kind, low, high = match["kind"], float(match["low"]), float(match["high"])
        if kind == "int" and not (low.is_integer() and high.is_integer()):
            raise ValueError(f"{spec}: an int range has integer bounds")
        if low > high:
            raise ValueError(f"{spec}: the low bound is above the high one")
        description, test = _range_check(kind, int(low) if kind == "int" else low, int(high) if kind == "int" else high)
    elif name in _STRING_FORMATS:
        description, string_test = _STRING_FORMATS[name]

        def test(value):
            return isinstance(value, str) and string_test(value)
    else:
        raise ValueError(f"unknown format {spec!r}; known: port, int A..B, number A..B, {', '.join(sorted(_STRING_FORMATS))}")
    if or_empty:
        return f"{description}, or empty", lambda value: value == "" or test(value)
    return description, test


def _range_check(kind, low, high):
    def test(value):
        if isinstance(value, bool):
            return False
        if isinstance(value, str):
            if not (_INTEGER if kind == "int" else _NUMBER).fullmatch(value):
                return False
            value = int(value) if kind == "int" else float(value)
        if kind == "int" and not isinstance(value, int):
            return False
        if not isinstance(value, (int, float)):
            return False
        return low <= value <= high
    return (f"an integer in {low}..{high}" if kind == "int" else f"a number in {low}..{high}"), test


def value_format_errors(values, formats):
    """'NAME: expected DESCRIPTION, got VALUE' for each value of `values` (variable name -> value)
    that does not have its format in `formats` (variable name -> format); names without a format
    and null values are not checked."""
    if not isinstance(values, Mapping) or not isinstance(formats, Mapping):
        raise TypeError("value_format_errors expects a mapping of variable names to values and one of names to formats")
    errors = []
    for name, value in values.items():
        if name not in formats or value is None:
            continue
        description, test = format_check(formats[name])
        items = [(f"{name}[{index}]", item) for index, item in enumerate(value)] if isinstance(value, (list, tuple)) \
            else [(name, value)]
        for shown_name, item in items:
            if isinstance(item, EncryptedString):
                item = str(item)  # decrypts a vaulted value
            if item is not None and not test(item):
                errors.append(f"{shown_name}: expected {description}, got {_shown(item)}")
    return errors


def _shown(value):
    """'"30001" (a string)', '30001 (an integer)', 'True (a boolean)': a message names the type too."""
    if isinstance(value, str):
        return f"{json.dumps(str(value), ensure_ascii=False)} (a string)"
    kinds = ((bool, "a boolean"), (int, "an integer"), (float, "a float"), (Mapping, "a mapping"), (list, "a list"))
    kind = next((name for cls, name in kinds if isinstance(value, cls)), type(value).__name__)
    return f"{value} ({kind})"


def role_value_formats(roles_dir):
    """Variable name -> format, merged from roles_dir/*/meta/value_formats.yml.

    Raises ValueError for an unknown format or a variable two roles give different formats,
    naming the file: a typo there must stop the run, not let a value through unchecked."""
    merged, declared_by = {}, {}
    for path in sorted(Path(roles_dir).glob("*/meta/value_formats.yml")):
        document = yaml.load(path.read_text(encoding="utf-8"), Loader=_SAFE_LOADER) or {}
        for name, spec in (document.get("value_formats") or {}).items():
            try:
                format_check(spec)
            except ValueError as error:
                raise ValueError(f"{path}: {name}: {error}") from None
            if name in merged and merged[name] != spec:
                raise ValueError(f"{path}: {name}: format {spec!r}, but {declared_by[name]} says {merged[name]!r}")
            merged[name], declared_by[name] = spec, path
    return merged


class FilterModule:
    """sglang-canon's value formats."""

    def filters(self):
        return {
            "role_value_formats": role_value_formats,
            "value_format_errors": value_format_errors,
        }
