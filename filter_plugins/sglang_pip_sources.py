"""Turn the sglang_install role's package sources into pip arguments and one readable line.

pip has no per-package index: every index and --find-links location it is given is searched for
every package. So the sources are given to ONE pip run, all at once, and each source's exact pins
(a constraints file) choose its build: `torch==2.9.1+cu130` can only be met by a wheel that
carries the +cu130 label, which PyPI cannot host (it refuses local version labels), so the pin
picks the PyTorch index's build however the indexes are ordered, and fails loudly when that
index is unreachable instead of quietly taking PyPI's. See roles/sglang_install/README.md.

  sglang_pip_source_args(sources, index_url, wheelhouse)     the pip arguments, in order
  sglang_pip_source_summary(sources, index_url, wheelhouse)  where each family comes from, one line
  sglang_pip_source_constraints(sources)                     the sources' pins as a constraints file

A source is a dict: name, pins (list of name==version), and index_url and/or find_links. With a
wheelhouse (an air-gapped node) pip runs with --no-index: only the wheelhouse and the sources'
find_links are searched, the index URLs are left out. Pure Python, unit-tested in
tests/unit/test_sglang_pip_sources.py.
"""

import re

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # pragma: no cover - only outside Ansible
    AnsibleFilterError = ValueError

# scheme://user:token@host/... -> scheme://***@host/... (an index URL may carry credentials).
_USERINFO_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@]*@")


def _redact(url):
    return _USERINFO_RE.sub(r"\1***@", url)


def _checked(sources):
    if sources is None:
        return []
    if not isinstance(sources, list):
        raise AnsibleFilterError("sglang_install_sources must be a list, got %s" % type(sources).__name__)
    for source in sources:
        if not isinstance(source, dict) or not source.get("name"):
            raise AnsibleFilterError("every sglang_install_sources entry needs a name, got %r" % (source,))
    return sources


def _unique(items):
    seen = []
    for item in items:
        if item and item not in seen:
            seen.append(item)
    return seen


def sglang_pip_source_args(sources, index_url="", wheelhouse=""):
    """pip install/download arguments naming every place to look (duplicates given once)."""
    sources = _checked(sources)
    find_links = _unique([wheelhouse] + [s.get("find_links") for s in sources])
    if wheelhouse:
        indexes = []
        args = ["--no-index"]
    else:
        indexes = _unique([s.get("index_url") for s in sources])
        args = ["--index-url", index_url] if index_url else []
    for url in indexes:
        args += ["--extra-index-url", url]
    for location in find_links:
        args += ["--find-links", location]
    return args


def _origin(source, wheelhouse):
    places = []
    if source.get("index_url") and not wheelhouse:
        places.append("index %s" % _redact(source["index_url"]))
    if source.get("find_links"):
        places.append("files in %s" % _redact(source["find_links"]))
    if wheelhouse and not source.get("find_links"):
        places.append("the wheelhouse")
    return " and ".join(places) or "pip's configured index"


def sglang_pip_source_summary(sources, index_url="", wheelhouse=""):
    """'PyTorch cu130 (torch==2.9.1+cu130, ...) from index https://...; everything else from ...'"""
    parts = []
    for source in _checked(sources):
        pins = ", ".join(source.get("pins") or []) or "no pins"
        parts.append("%s (%s) from %s" % (source["name"], pins, _origin(source, wheelhouse)))
    if wheelhouse:
        rest = "the wheelhouse %s (no index)" % wheelhouse
    elif index_url:
        rest = "index %s" % _redact(index_url)
    else:
        rest = "pip's configured index"
    parts.append(("everything else from " if parts else "everything from ") + rest)
    return "; ".join(parts)


def sglang_pip_source_constraints(sources):
    """A pip constraints file of every source's pins, each under a comment naming its source."""
    lines = ["# Pins of sglang_install_sources: each picks its source's build. Generated; do not edit."]
    for source in _checked(sources):
        lines.append("# %s" % source["name"])
        lines.extend(source.get("pins") or [])
    return "\n".join(lines) + "\n"


class FilterModule:
    """sglang-canon's package source filters."""

    def filters(self):
        return {
            "sglang_pip_source_args": sglang_pip_source_args,
            "sglang_pip_source_summary": sglang_pip_source_summary,
            "sglang_pip_source_constraints": sglang_pip_source_constraints,
        }
