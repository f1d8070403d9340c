# -*- coding: utf-8 -*-
# Copyright: sglang-canon contributors
# MIT License (see galaxy_info of roles/sglang_models)
"""Pure manifest logic of the sglang_model module: what a model folder must hold, and how a
folder on the node is judged against it.

A manifest is a list of ``{path, size, sha256}`` (paths relative to the model folder). The
module records, next to the files it placed, each file's mtime; a routine run then compares
size and mtime only (no hashing), and hashes a file when those differ or when asked for a full
verification. Standard library only: this runs under whatever Python Ansible finds on the node.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import hashlib
import json
import posixpath
import re

# The record the module writes into every model folder it placed (the manifest "lives with
# the model"); SGLang and transformers only read the files they know, so it is never loaded.
RECORD_NAME = ".sglang-model.json"
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
HASH_CHUNK = 4 * 1024 * 1024

# Verdicts of one manifest entry against the folder.
OK = "ok"            # size and recorded mtime agree (quick), or the sha256 agrees (full)
HASH = "hash"        # present with the right size, but only its sha256 can tell
MISSING = "missing"  # no such file
WRONG_SIZE = "wrong size"


class ManifestError(ValueError):
    """A manifest the inventory gave that cannot be used, naming the entry."""


def normalise_manifest(entries, name="manifest"):
    """Check and normalise a manifest: a list of {path, size, sha256}, sorted by path.

    Paths must be relative, inside the folder, unique; sizes non-negative integers; sha256
    64 hex digits (any case, lower-cased here). Raises ManifestError naming ``name``.
    """
    if not isinstance(entries, list) or not entries:
        raise ManifestError("%s must be a non-empty list of {path, size, sha256}" % name)
    seen = set()
    result = []
    for number, entry in enumerate(entries, 1):
        if not isinstance(entry, dict) or set(entry) != {"path", "size", "sha256"}:
            raise ManifestError("%s entry %d must have exactly path, size and sha256: %r" % (name, number, entry))
        path = str(entry["path"])
        clean = posixpath.normpath(path)
        if path.startswith("/") or clean != path or clean.startswith("..") or clean == RECORD_NAME:
            raise ManifestError("%s entry %d: path %r must be a plain relative path inside the model folder"
                                % (name, number, path))
        if clean in seen:
            raise ManifestError("%s entry %d: path %r is listed twice" % (name, number, path))
        seen.add(clean)
        try:
            size = int(entry["size"])
        except (TypeError, ValueError):
            size = -1
        if size < 0 or str(entry["size"]).strip() != str(size):
            raise ManifestError("%s entry %d (%s): size %r is not a byte count" % (name, number, path, entry["size"]))
        sha = str(entry["sha256"]).lower()
        if not _SHA256_RE.match(sha):
            raise ManifestError("%s entry %d (%s): sha256 %r is not 64 hex digits" % (name, number, path, entry["sha256"]))
        result.append({"path": clean, "size": size, "sha256": sha})
    return sorted(result, key=lambda e: e["path"])


def manifest_digest(entries):
    """One sha256 over a normalised manifest (sha256sum-style lines plus sizes): the short name
    of a model's exact content, recorded in production_v2.md."""
    text = "".join("%s  %d  %s\n" % (e["sha256"], e["size"], e["path"]) for e in entries)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def quick_verdict(entry, observed, recorded_mtime_ns, full):
    """Verdict of one entry from a stat alone: OK, HASH, MISSING or WRONG_SIZE.

    ``observed`` is {size, mtime_ns} of the file (None when missing); ``recorded_mtime_ns`` the
    mtime the module recorded when it placed the file (None when it never did). A file of the
    right size is OK without hashing only when its mtime is the recorded one and ``full`` is off.
    """
    if observed is None:
        return MISSING
    if observed["size"] != entry["size"]:
        return WRONG_SIZE
    if not full and recorded_mtime_ns is not None and observed["mtime_ns"] == recorded_mtime_ns:
        return OK
    return HASH


def unexpected_entries(manifest_paths, listing):
    """What a model folder holds besides its manifest and record, sorted: each file, link or other
    entry not listed, and each folder that holds no listed file (named once, not what is in it).

    ``listing`` is every entry under the folder as (relative path, is a folder), parents first
    (os.walk's order). SGLang and transformers read whatever the folder offers (a stray
    *.safetensors is loaded as weights), so the folder must hold the manifest and nothing else.
    """
    expected = set(manifest_paths) | {RECORD_NAME}
    folders = set()
    for path in manifest_paths:
        parent = posixpath.dirname(path)
        while parent:
            folders.add(parent)
            parent = posixpath.dirname(parent)
    extra = []
    for path, is_folder in listing:
        if any(path.startswith(reported + "/") for reported in extra):
            continue  # inside a folder already reported
        if (path not in folders) if is_folder else (path not in expected):
            extra.append(path)
    return sorted(extra)


def hashed_verdict(entry, sha256):
    """Verdict of an entry whose file was hashed."""
    return OK if sha256 == entry["sha256"] else "sha256 %s, manifest says %s" % (sha256, entry["sha256"])


def file_sha256(handle, start=None):
    """sha256 of an open binary file, read in chunks; ``start`` is a hashlib object to continue."""
    digest = start or hashlib.sha256()
    for chunk in iter(lambda: handle.read(HASH_CHUNK), b""):
        digest.update(chunk)
    return digest


def record_text(entries, source, revision, mtimes):
    """The record written into a placed model folder: manifest, digest, source and mtimes."""
    return json.dumps({
        "manifest": entries,
        "manifest_digest": manifest_digest(entries),
        "source": source,
        "revision": revision,
        "mtime_ns": mtimes,
    }, indent=1, sort_keys=True) + "\n"


def parse_record(text):
    """The record's dict, or None when it is missing or unreadable (then every file is hashed)."""
    if text is None:
        return None
    try:
        record = json.loads(text)
    except ValueError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("mtime_ns"), dict):
        return None
    return record


def staging_paths(dest):
    """(staging, previous) folders next to ``dest``, on the same filesystem so that rename is atomic."""
    parent, name = posixpath.split(posixpath.normpath(dest))
    return (posixpath.join(parent, ".%s.sglang-staging" % name),
            posixpath.join(parent, ".%s.sglang-previous" % name))


def gib(count):
    """Bytes as GiB with two decimals, for messages."""
    return "%.2f GiB" % (count / float(1 << 30))


def free_space_problem(label, folder, needed, available):
    """A refusal naming both numbers when ``needed`` bytes do not fit in ``available``, else None."""
    if needed <= available:
        return None
    return ("not enough free space for %s: the files still to fetch need %d bytes (%s) on the "
            "filesystem of %s, %d bytes (%s) are available"
            % (label, needed, gib(needed), folder, available, gib(available)))
