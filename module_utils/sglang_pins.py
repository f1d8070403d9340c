# -*- coding: utf-8 -*-
# Copyright: sglang-canon contributors
# MIT License (see galaxy_info of roles/sglang_install)
"""Pure, dependency-free pin logic shared by the sglang_wheel_pins and sglang_pip_probe modules.

Nothing here touches the node: parsing of requirement strings (requirements-file lines and
wheel ``Requires-Dist`` entries), extraction of a release's exact pins into a pip constraints
file, version comparison, and the drift decision of the install role. It runs under whatever
Python Ansible finds on the node, so it uses the standard library only (no ``packaging``).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import email.parser
import re
import zipfile

_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_REQUIREMENT_RE = re.compile(
    r"^(?P<name>" + _NAME + r")\s*"
    r"(?:\[(?P<extras>[^\]]*)\])?\s*"
    r"(?P<rest>[^;]*?)\s*"
    r"(?:;\s*(?P<marker>.*?))?\s*$"
)
_SPEC_RE = re.compile(r"^(===|==|!=|~=|<=|>=|<|>)\s*(\S+)$")
_EXTRA_MARKER_RE = re.compile(r"\bextra\s*==")
_HASH_OPTION_RE = re.compile(r"\s--hash[= ]\S+")


class RequirementError(ValueError):
    """A requirement string this module does not understand."""


def canonical_name(name):
    """PEP 503 normalised project name: 'Typing_Extensions' -> 'typing-extensions'."""
    return re.sub(r"[-_.]+", "-", name).lower()


def strip_comment(line):
    """A requirements-file line without its comment (pip: '#' at the start or after a blank)."""
    if line.lstrip().startswith("#"):
        return ""
    return re.split(r"\s#", line, maxsplit=1)[0].strip()


def parse_requirement(text):
    """Parse one PEP 508 requirement (also the old 'name (==1.0)' Requires-Dist form).

    Returns a dict: text (as given), name, canonical, extras (list), specs (list of
    (op, version)), marker (str or None), url (str or None), pin (the exact version or None).
    """
    original = text
    text = _HASH_OPTION_RE.sub("", " " + text).strip()
    match = _REQUIREMENT_RE.match(text)
    if not match:
        raise RequirementError("not a requirement: %r" % text)
    rest = match.group("rest").strip()
    url = None
    specs = []
    if rest.startswith("@"):
        url = rest[1:].strip()
    elif rest:
        if rest.startswith("(") and rest.endswith(")"):
            rest = rest[1:-1]
        for part in rest.split(","):
            spec = _SPEC_RE.match(part.strip())
            if not spec:
                raise RequirementError("bad version specifier %r in %r" % (part.strip(), text))
            specs.append((spec.group(1), spec.group(2)))
    pin = None
    if len(specs) == 1 and specs[0][0] in ("==", "===") and "*" not in specs[0][1]:
        pin = specs[0][1]
    extras = [e.strip() for e in (match.group("extras") or "").split(",") if e.strip()]
    return {
        "text": original,
        "name": match.group("name"),
        "canonical": canonical_name(match.group("name")),
        "extras": extras,
        "specs": specs,
        "marker": match.group("marker") or None,
        "url": url,
        "pin": pin,
    }


def parse_requirements_text(text, source="requirements"):
    """Requirements-file text -> list of parsed requirements. Option lines (-r, -c, --index-url,
    -e ...) are refused: the drift probe could not tell what they install."""
    requirements = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = strip_comment(raw)
        if not line:
            continue
        if line.startswith("-"):
            raise RequirementError("%s:%d: option lines are not supported: %r" % (source, number, raw))
        try:
            requirements.append(parse_requirement(line))
        except RequirementError as exc:
            raise RequirementError("%s:%d: %s" % (source, number, exc))
    return requirements


def is_extra_only(requirement):
    """True for a Requires-Dist entry that only applies to an extra (sglang[test] ...)."""
    return bool(requirement["marker"] and _EXTRA_MARKER_RE.search(requirement["marker"]))


def release_pins(requires_dist, exclude=()):
    """The exact (==) pins among a release's base Requires-Dist entries, in order.

    Entries for extras are left out; other markers are kept so pip can evaluate them.
    ``exclude`` names (any spelling) are dropped: the deliberate deviations of a node.
    """
    excluded = set(canonical_name(n) for n in exclude)
    pins = []
    for entry in requires_dist or []:
        requirement = parse_requirement(entry)
        if requirement["pin"] is None or is_extra_only(requirement):
            continue
        if requirement["canonical"] in excluded:
            continue
        pins.append(requirement)
    return pins


def constraints_text(pins, header=None):
    """pip constraints-file text for the given parsed pins (no extras: pip refuses them)."""
    lines = []
    if header:
        lines.extend("# " + h for h in header.splitlines())
    for pin in pins:
        line = "%s==%s" % (pin["name"], pin["pin"])
        if pin["marker"]:
            line += "; " + pin["marker"]
        lines.append(line)
    return "\n".join(lines) + "\n"


def wheel_filename_parts(filename):
    """(canonical name, version) of a wheel file name, or None for anything else."""
    if not filename.endswith(".whl"):
        return None
    parts = filename[: -len(".whl")].split("-")
    if len(parts) < 5:
        return None
    return canonical_name(parts[0]), parts[1]


def find_wheel(filenames, name, version):
    """The one file name among ``filenames`` that is a wheel of name==version (or None)."""
    wanted = (canonical_name(name), version)
    matches = sorted(
        f for f in filenames
        if wheel_filename_parts(f) is not None
        and wheel_filename_parts(f)[0] == wanted[0]
        and versions_equal(version, wheel_filename_parts(f)[1])
    )
    return matches[0] if matches else None


def wheel_metadata(path):
    """(Name, Version, [Requires-Dist]) read from a wheel's .dist-info/METADATA."""
    with zipfile.ZipFile(path) as wheel:
        names = [n for n in wheel.namelist()
                 if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        if len(names) != 1:
            raise ValueError("%s: expected one .dist-info/METADATA, found %d" % (path, len(names)))
        raw = wheel.read(names[0]).decode("utf-8")
    message = email.parser.Parser().parsestr(raw, headersonly=True)
    return message["Name"], message["Version"], message.get_all("Requires-Dist") or []


def _version_key(version):
    """Comparable form of a version: case, a leading 'v' and trailing '.0's do not matter."""
    version = version.strip().lower()
    if version.startswith("v"):
        version = version[1:]
    match = re.match(r"^(\d+(?:\.\d+)*)(.*)$", version)
    if not match:
        return ((), version)
    release = [int(p) for p in match.group(1).split(".")]
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    return (tuple(release), match.group(2))


def _local_label(label):
    """PEP 440 normal form of a local version label: case and the separators '-', '_', '.'
    do not matter ('CU130' == 'cu130', 'rocm-6.4' == 'rocm.6.4')."""
    return re.sub(r"[-_.]", ".", label.strip().lower())


def versions_equal(wanted, installed):
    """PEP 440 '==' in the cases pins meet: '2.9.1' matches '2.9.1+cu130' (a pin without a
    local label ignores the installed one's), '2.9.1+cu130' only matches '2.9.1+cu130'.

    That is what lets PyTorch's cu130 build satisfy SGLang's own 'torch==2.9.1', while a pin
    of a package source ('torch==2.9.1+cu130') still tells that build from PyPI's."""
    if installed is None:
        return False
    wanted_public, _, wanted_local = wanted.partition("+")
    installed_public, _, installed_local = installed.partition("+")
    if wanted_local and _local_label(wanted_local) != _local_label(installed_local):
        return False
    return _version_key(wanted_public) == _version_key(installed_public)


def source_pins(sources):
    """The pins of the package sources (sglang_install_sources entries: name, pins, ...), parsed,
    each with 'origin' set to its source's name. Every pin must be exact ('torch==2.9.1+cu130'):
    a pin is what picks a source's build out of everything pip sees."""
    parsed = []
    for source in sources or []:
        name = source.get("name") or "unnamed source"
        for text in source.get("pins") or []:
            requirement = parse_requirement(text)
            if requirement["pin"] is None or requirement["marker"] or requirement["extras"]:
                raise RequirementError(
                    "package source %r: pin %r is not an exact 'name==version' pin" % (name, text))
            requirement["origin"] = name
            parsed.append(requirement)
    return parsed


def find_drift(wanted, installed, release=None, release_requires=None, exclude=(),
               require_release_deps=False, marker_results=None, pinned_sources=()):
    """What differs between the wanted state and what the target interpreter has.

    wanted            parsed requirements that must be installed (pins: at that version;
                      others: at any version).
    installed         {canonical name: version} of the target interpreter.
    release           name of the release whose own == pins are checked too (e.g. 'sglang'),
                      read from ``release_requires`` (its installed Requires-Dist; None when
                      the release is not installed: then only ``wanted`` is checked).
    exclude           names whose release pin is deliberately not followed on this node.
    require_release_deps  a pinned dependency that is missing is drift too (full installs);
                      with False (--no-deps installs) only installed ones must match.
    marker_results    {Requires-Dist entry: True/False/None} evaluated by the target; False
                      entries do not apply, None (unknown) ones count as applying.
    pinned_sources    source_pins() of the package sources: constraints, so an installed
                      package must be at its source's pin (label included); a missing one is
                      left to the other checks (a source only picks the build of what is pulled in).
    Returns a list of {name, wanted, installed, source} dicts, in a stable order.
    """
    drift = []
    explicit = set()
    seen = set()
    for requirement in wanted:
        key = (requirement["canonical"], tuple(requirement["specs"]))
        if key in seen:  # the same requirement from the list and from the file
            continue
        seen.add(key)
        explicit.add(requirement["canonical"])
        have = installed.get(requirement["canonical"])
        if have is None:
            drift.append(_drift(requirement, have, "requested"))
        elif requirement["pin"] is not None and not versions_equal(requirement["pin"], have):
            drift.append(_drift(requirement, have, "requested"))
    for pin in pinned_sources:
        have = installed.get(pin["canonical"])
        if have is not None and not versions_equal(pin["pin"], have):
            drift.append(_drift(pin, have, "pin of source %s" % pin["origin"]))
    if release is None or release_requires is None:
        return drift
    marker_results = marker_results or {}
    for pin in release_pins(release_requires, exclude):
        if pin["canonical"] in explicit or marker_results.get(pin["text"]) is False:
            continue
        have = installed.get(pin["canonical"])
        if have is None and not require_release_deps:
            continue
        if not versions_equal(pin["pin"], have):
            drift.append(_drift(pin, have, "%s pin" % release))
    return drift


def _drift(requirement, have, source):
    if requirement["pin"] is not None:
        want = "==" + requirement["pin"]
    elif requirement["specs"]:
        want = ",".join(op + v for op, v in requirement["specs"])
    else:
        want = "any"
    return {"name": requirement["name"], "wanted": want, "installed": have, "source": source}


def describe_drift(entry):
    """One line for a drift entry: 'transformers: 4.56.0 installed, wanted ==4.57.1 (sglang pin)'."""
    have = "not installed" if entry["installed"] is None else entry["installed"] + " installed"
    return "%s: %s, wanted %s (%s)" % (entry["name"], have, entry["wanted"], entry["source"])
