# -*- coding: utf-8 -*-
# Copyright: sglang-canon contributors
# MIT License (see roles/sglang_patches/meta/main.yml)
"""Unified diffs of the python_package_patch module: parse them, apply or reverse them in memory.

parse_patch() reads a plain ``diff -u`` or ``git diff`` into a Patch (its header text, and per
file the hunks); apply_patches() applies the hunks of one file in set order, or reverses them,
with a strict applier: exact context, no fuzz, ordered hunks, an offset only where the context
matches at exactly one other place. Only edits of existing files are accepted.

Only the standard library is used: this file runs on the managed node.
"""

import hashlib
import posixpath
import re


class PatchError(Exception):
    """Any refusal: malformed patch, conflict, version mismatch, unknown state."""


class PatchConflict(PatchError):
    """A patch does not apply to the pristine file."""


def sha256_hex(data):
    return hashlib.sha256(data).hexdigest()


def split_lines(data):
    """Split bytes after each LF, keeping the LF (CR is data, unlike bytes.splitlines)."""
    if not data:
        return []
    parts = data.split(b"\n")
    lines = [p + b"\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


# --------------------------------------------------------------------------
# Unified diff parsing
# --------------------------------------------------------------------------

_HUNK_RE = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_UNSUPPORTED = (
    b"new file mode",
    b"deleted file mode",
    b"rename from",
    b"rename to",
    b"copy from",
    b"copy to",
    b"GIT binary patch",
    b"Binary files",
)


class Hunk(object):
    def __init__(self, old_start, old_len, new_start, new_len, header):
        self.old_start = old_start
        self.old_len = old_len
        self.new_start = new_start
        self.new_len = new_len
        self.header = header
        # (tag, bytes) with tag one of b" ", b"-", b"+"
        self.lines = []

    def old_lines(self):
        return [body for tag, body in self.lines if tag in (b" ", b"-")]

    def new_lines(self):
        return [body for tag, body in self.lines if tag in (b" ", b"+")]


class FilePatch(object):
    def __init__(self, path):
        self.path = path
        self.hunks = []


class Patch(object):
    def __init__(self, name, data, header, files):
        self.name = name
        self.data = data
        self.sha256 = sha256_hex(data)
        self.header = header
        self.files = files

    def paths(self):
        seen = []
        for fp in self.files:
            if fp.path not in seen:
                seen.append(fp.path)
        return seen


def _diff_path(raw, name):
    text = raw.rstrip(b"\r\n").split(b"\t", 1)[0].rstrip(b" ")
    try:
        text = text.decode("utf-8")
    except UnicodeDecodeError:
        raise PatchError("%s: file name %r is not UTF-8" % (name, raw))
    if len(text) >= 2 and text[0] == '"' and text[-1] == '"':
        text = text[1:-1]
    return text


def check_relpath(path, name):
    """A path inside a patch must be a clean path relative to site-packages."""
    if (
        not path
        or path.startswith("/")
        or "\\" in path
        or posixpath.normpath(path) != path
        or path.split("/")[0] == ".."
    ):
        raise PatchError("%s: path %r must be relative to site-packages (e.g. sglang/srt/environ.py)" % (name, path))
    return path


def parse_patch(name, data):
    """Parse a unified diff (plain ``diff -u`` or ``git diff``) into a Patch.

    The header is the text before the first ``diff ``/``--- `` line; it says what
    the patch changes and why. Creating, deleting, renaming files and binary
    patches are refused: a patch set only edits files the package installed.
    """
    if isinstance(data, str):
        data = data.encode("utf-8")
    lines = split_lines(data)
    i = 0
    header = []
    while i < len(lines):
        line = lines[i]
        if line.startswith(b"diff ") or (
            line.startswith(b"--- ") and i + 1 < len(lines) and lines[i + 1].startswith(b"+++ ")
        ):
            break
        header.append(line)
        i += 1

    files = []
    current = None
    while i < len(lines):
        line = lines[i]
        if line.startswith(_UNSUPPORTED):
            raise PatchError(
                "%s: %r: only edits of existing files are supported (no new, deleted, renamed or binary files)"
                % (name, line.rstrip().decode("utf-8", "replace"))
            )
        if line.startswith(b"--- ") and i + 1 < len(lines) and lines[i + 1].startswith(b"+++ "):
            old = _diff_path(line[4:], name)
            new = _diff_path(lines[i + 1][4:], name)
            if old == "/dev/null" or new == "/dev/null":
                raise PatchError("%s: creating or deleting files is not supported (%s -> %s)" % (name, old, new))
            if old.startswith("a/") and new.startswith("b/"):
                old, new = old[2:], new[2:]
            current = FilePatch(check_relpath(new, name))
            files.append(current)
            i += 2
            continue
        if line.startswith(b"@@"):
            if current is None:
                raise PatchError("%s: hunk before any ---/+++ file header" % name)
            match = _HUNK_RE.match(line)
            if not match:
                raise PatchError("%s: malformed hunk header %r" % (name, line.rstrip().decode("utf-8", "replace")))
            old_start = int(match.group(1))
            old_len = int(match.group(2)) if match.group(2) is not None else 1
            new_start = int(match.group(3))
            new_len = int(match.group(4)) if match.group(4) is not None else 1
            hunk = Hunk(old_start, old_len, new_start, new_len, line.rstrip(b"\r\n").decode("utf-8", "replace"))
            i += 1
            old_seen = new_seen = 0
            while old_seen < old_len or new_seen < new_len:
                if i >= len(lines):
                    raise PatchError("%s: %s: hunk %s is truncated" % (name, current.path, hunk.header))
                body_line = lines[i]
                if body_line.startswith(b"\\"):
                    _no_newline(hunk, name, current.path)
                    i += 1
                    continue
                if body_line in (b"\n", b"\r\n"):
                    # A blank context line whose leading space an editor stripped.
                    tag, body = b" ", body_line
                else:
                    tag, body = body_line[:1], body_line[1:]
                if tag == b" ":
                    old_seen += 1
                    new_seen += 1
                elif tag == b"-":
                    old_seen += 1
                elif tag == b"+":
                    new_seen += 1
                else:
                    raise PatchError(
                        "%s: %s: unexpected line in hunk %s: %r"
                        % (name, current.path, hunk.header, body_line.rstrip().decode("utf-8", "replace"))
                    )
                hunk.lines.append((tag, body))
                i += 1
            if old_seen != old_len or new_seen != new_len:
                raise PatchError(
                    "%s: %s: hunk %s line counts do not match its header" % (name, current.path, hunk.header)
                )
            if i < len(lines) and lines[i].startswith(b"\\"):
                _no_newline(hunk, name, current.path)
                i += 1
            current.hunks.append(hunk)
            continue
        # Anything else between files (git's index lines, a format-patch
        # signature, comments) is not part of a file change.
        i += 1

    if not files or not any(fp.hunks for fp in files):
        raise PatchError("%s: no file changes found (not a unified diff?)" % name)
    return Patch(name, data, b"".join(header).decode("utf-8", "replace"), files)


def _no_newline(hunk, name, path):
    if not hunk.lines:
        raise PatchError("%s: %s: '\\ No newline at end of file' before any line" % (name, path))
    tag, body = hunk.lines[-1]
    if body.endswith(b"\n"):
        body = body[:-1]
    hunk.lines[-1] = (tag, body)


# --------------------------------------------------------------------------
# Strict application
# --------------------------------------------------------------------------


def apply_file_patch(original, file_patch, patch_name, reverse=False, placements=None):
    """Apply (or reverse) one file's hunks to bytes. Exact context, no fuzz.

    Each hunk must match at the line its header states; if it does not, it may
    match at exactly one other place after the previous hunk (an offset, as when
    a patch was made against a file with a few lines more or less), otherwise it
    is a conflict. Hunks must come in file order and must not overlap.
    ``placements``, a list, gets (hunk number, line stated, line found) per hunk,
    1-based: the upgrade report tells an offset from a clean application by them.
    """
    src = split_lines(original)
    out = []
    pos = 0
    for number, hunk in enumerate(file_patch.hunks, 1):
        if reverse:
            old, new, start = hunk.new_lines(), hunk.old_lines(), hunk.new_start
        else:
            old, new, start = hunk.old_lines(), hunk.new_lines(), hunk.old_start
        length = len(old)
        want = start if length == 0 else start - 1
        if want >= pos and src[want : want + length] == old:
            at = want
        else:
            matches = []
            if length:
                for k in range(pos, len(src) - length + 1):
                    if src[k] == old[0] and src[k : k + length] == old:
                        matches.append(k)
                        if len(matches) > 1:
                            break
            if len(matches) != 1:
                raise PatchConflict(
                    "patch %s does not apply to %s: hunk %d (%s): %s"
                    % (
                        patch_name,
                        file_patch.path,
                        number,
                        hunk.header,
                        "context matches in several places" if matches else "context differs",
                    )
                )
            at = matches[0]
        if placements is not None:
            placements.append((number, want + 1, at + 1))
        out.extend(src[pos:at])
        out.extend(new)
        pos = at + length
    out.extend(src[pos:])
    return b"".join(out)


def apply_patches(original, path, patches, reverse=False):
    """Apply every file patch for ``path`` in set order (reverse: undo, last first)."""
    steps = [(p, fp) for p in patches for fp in p.files if fp.path == path]
    if reverse:
        steps.reverse()
    data = original
    for patch, fp in steps:
        data = apply_file_patch(data, fp, patch.name, reverse=reverse)
    return data


def target_paths(patches):
    seen = []
    for patch in patches:
        for path in patch.paths():
            if path not in seen:
                seen.append(path)
    return seen
