# -*- coding: utf-8 -*-
# Copyright: sglang-canon contributors
# MIT License (see the role's meta/main.yml)
"""Plan and execute a patch set for the python_package_patch module.

A patch set is an ordered list of unified diffs (module_utils/unified_diff.py parses and
applies them) whose paths are relative to the site-packages directory that holds the
package (``sglang/srt/environ.py``). The programs this module runs under the package's own
interpreter are module_utils/package_patch_node.py.

The design never stacks patches and never leaves a half-patched package:

* the *pristine* bytes of every file the set touches are known and verified
  against the sha256 in the wheel's RECORD (taken from disk when the file is
  pristine, else from a kept copy, else recovered by reverse-applying the set,
  else read from a pristine wheel);
* the *desired* bytes are pristine + every patch applied in order, in memory,
  with a strict applier (exact context, no fuzz, ordered hunks);
* the file on disk is then compared with the desired bytes: equal means
  nothing to do; pristine means apply; the bytes a previous run wrote (recorded
  in the manifest) mean an updated set (revert + apply); anything else is drift
  (hand edit, partial application) and is reported and restored.

Everything is computed first (conflicts fail before any write); the writes come
last, each atomic, with a roll-back of the files already written on error.

Only the standard library is used: this file runs on the managed node.
"""

import base64
import json
import os
import stat
import tempfile
import zipfile

from ansible.module_utils.unified_diff import PatchConflict, PatchError, apply_patches, check_relpath, sha256_hex, target_paths

MANIFEST_FORMAT = 1


def record_hash_to_hex(value):
    """RECORD's ``sha256=<urlsafe base64, no padding>`` -> hex digest (None if absent/other)."""
    if not value:
        return None
    mode, _, digest = value.partition("=")
    if mode != "sha256" or not digest:
        return None
    padded = digest + "=" * (-len(digest) % 4)
    return base64.urlsafe_b64decode(padded.encode("ascii")).hex()


# --------------------------------------------------------------------------
# Installed package, manifest
# --------------------------------------------------------------------------


class PackageInfo(object):
    """What the target interpreter says about the installed distribution."""

    def __init__(self, version, base, record, python=None, cache_tag=None):
        self.version = version
        self.base = base
        # relpath -> sha256 hex digest, or None if RECORD has no usable hash
        self.record = record
        self.python = python
        self.cache_tag = cache_tag


def parse_probe_output(package, text):
    try:
        data = json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise PatchError("could not read the package probe's output: %r" % text[-500:])
    if not data.get("found"):
        raise PatchError(
            "%s is not installed for this interpreter (Python %s)%s"
            % (package, data.get("python", "?"), ": " + data["error"] if data.get("error") else "")
        )
    record = dict((k, record_hash_to_hex(v)) for k, v in data.get("record", {}).items())
    return PackageInfo(data["version"], data["base"], record, data.get("python"), data.get("cache_tag"))


def load_manifest(path):
    if not os.path.exists(path):
        return None
    try:
        with open(path, "rb") as fh:
            data = json.loads(fh.read().decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise PatchError("manifest %s is not valid JSON (%s); move it away to start over" % (path, exc))
    if not isinstance(data, dict) or not isinstance(data.get("files", {}), dict):
        raise PatchError("manifest %s has an unknown layout" % path)
    return data


def default_pristine_dir(manifest_path):
    """``/x/sglang.manifest.json`` -> ``/x/sglang.pristine`` (``/x/m`` -> ``/x/m.pristine``)."""
    root = manifest_path[:-5] if manifest_path.endswith(".json") else manifest_path
    if root.endswith(".manifest"):
        root = root[: -len(".manifest")]
    return root + ".pristine"


def render_manifest(data):
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode("utf-8")


def _read(path):
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except (IOError, OSError):
        return None


# --------------------------------------------------------------------------
# Planning
# --------------------------------------------------------------------------


class FilePlan(object):
    """What happens to one package file."""

    def __init__(self, path, action, current, desired, pristine, pristine_source, note=""):
        self.path = path
        self.action = action  # ok | apply | update | revert | restore
        self.current = current
        self.desired = desired
        self.pristine = pristine
        self.pristine_source = pristine_source
        self.note = note

    @property
    def changed(self):
        return self.action != "ok"

    @property
    def drifted(self):
        return self.action == "restore"

    def as_dict(self):
        return {
            "path": self.path,
            "action": self.action,
            "before_sha256": sha256_hex(self.current) if self.current is not None else None,
            "after_sha256": sha256_hex(self.desired),
            "pristine_sha256": sha256_hex(self.pristine),
            "pristine_source": self.pristine_source,
            "note": self.note,
        }


class Plan(object):
    def __init__(self, state, package, version, info, manifest_path, pristine_dir):
        self.state = state
        self.package = package
        self.version = version
        self.info = info
        self.manifest_path = manifest_path
        self.pristine_dir = pristine_dir
        self.files = []
        self.store_writes = {}  # relpath -> pristine bytes to keep
        self.store_removals = []  # relpaths whose kept copy goes
        self.manifest_bytes = None  # new manifest (present)
        self.manifest_remove = False  # absent
        self.manifest_changed = False
        self.patches = []
        self.notes = []

    @property
    def files_changed(self):
        return [f for f in self.files if f.changed]

    @property
    def changed(self):
        return bool(self.files_changed or self.store_writes or self.store_removals or self.manifest_changed)

    def abspath(self, rel):
        return os.path.join(self.info.base, *rel.split("/"))

    def store_path(self, rel):
        return os.path.join(self.pristine_dir, *rel.split("/"))


def _find_pristine(rel, current, expected, plan, patches, wheel_path):
    """Pristine bytes of ``rel`` verified against RECORD, and where they came from."""
    if current is not None and sha256_hex(current) == expected:
        return current, "disk"
    kept = _read(plan.store_path(rel))
    if kept is not None and sha256_hex(kept) == expected:
        return kept, "kept copy"
    if current is not None and patches:
        try:
            candidate = apply_patches(current, rel, patches, reverse=True)
        except PatchError:
            candidate = None
        if candidate is not None and sha256_hex(candidate) == expected:
            return candidate, "reverse-applied set"
    if wheel_path:
        try:
            with zipfile.ZipFile(wheel_path) as wheel:
                candidate = wheel.read(rel)
        except (IOError, OSError, KeyError, zipfile.BadZipfile):
            candidate = None
        if candidate is not None and sha256_hex(candidate) == expected:
            return candidate, "wheel"
    raise PatchError(
        "%s: the file on disk is not the pristine %s %s file (its sha256 differs from RECORD) and no "
        "verified pristine copy was found (kept copy in %s%s); reinstall the package "
        "(pip install --force-reinstall --no-deps %s==%s) or pass pristine_wheel; nothing was changed"
        % (
            rel,
            plan.package,
            plan.info.version,
            plan.pristine_dir,
            ", wheel %s" % wheel_path if wheel_path else "",
            plan.package,
            plan.info.version,
        )
    )


def build_plan(info, package, version, patches, state, manifest_path, pristine_dir=None, wheel_path=None):
    """Compute everything a run will do; raise PatchError before any write if it can't.

    ``patches`` are parsed Patch objects in set order. ``info`` is the installed
    distribution as the target interpreter sees it.
    """
    if state not in ("present", "absent"):
        raise PatchError("state must be present or absent, not %r" % state)
    if info.version != version:
        raise PatchError(
            "installed %s is %s but the patch set was made for %s %s; refusing to touch any file"
            % (package, info.version, package, version)
        )
    pristine_dir = pristine_dir or default_pristine_dir(manifest_path)
    plan = Plan(state, package, version, info, manifest_path, pristine_dir)
    plan.patches = patches

    manifest = load_manifest(manifest_path)
    if manifest is not None and manifest.get("package") not in (None, package):
        raise PatchError("manifest %s belongs to %s, not %s" % (manifest_path, manifest.get("package"), package))
    old_files = dict(manifest.get("files", {})) if manifest else {}
    same_release = bool(manifest) and manifest.get("version") == info.version

    targets = target_paths(patches)
    everything = list(targets) + [p for p in sorted(old_files) if p not in targets]

    for rel in everything:
        check_relpath(rel, "manifest" if rel not in targets else "patch set")
        if os.path.islink(plan.abspath(rel)):
            raise PatchError("%s is a symbolic link; refusing to patch through it" % rel)
        expected = info.record.get(rel, None)
        if rel not in info.record:
            if rel not in targets and not same_release:
                # A file a previous release's set patched that this release no
                # longer ships: nothing to revert.
                plan.notes.append(
                    "%s: not part of %s %s any more; dropped from the manifest" % (rel, package, info.version)
                )
                continue
            raise PatchError(
                "%s is not a file of %s %s (not in its RECORD); nothing was changed" % (rel, package, info.version)
            )
        if expected is None:
            raise PatchError(
                "%s has no sha256 in the RECORD of %s %s; cannot tell pristine bytes" % (rel, package, info.version)
            )

        current = _read(plan.abspath(rel))
        pristine, source = _find_pristine(rel, current, expected, plan, patches, wheel_path)
        if state == "present" and rel in targets:
            try:
                desired = apply_patches(pristine, rel, patches)
            except PatchConflict as exc:
                raise PatchConflict("%s (pristine %s %s); nothing was changed" % (exc, package, info.version))
        else:
            desired = pristine

        recorded = old_files.get(rel, {}).get("sha256") if same_release else None
        if current == desired:
            action, note = "ok", ""
        elif current is None:
            action, note = "restore", "file was missing"
        elif current == pristine:
            action, note = "apply", "pristine file (fresh install or reinstalled)"
        elif recorded and sha256_hex(current) == recorded:
            if desired == pristine:
                action, note = "revert", "previously patched; restoring pristine bytes"
            else:
                action, note = "update", "patch set changed: reverting the old result and applying the new set"
        elif desired == pristine and patches and _is_result_of(pristine, rel, patches, current):
            action, note = "revert", "patched by this set; restoring pristine bytes"
        else:
            action, note = "restore", "edited by hand or partially patched (drift)"
        plan.files.append(FilePlan(rel, action, current, desired, pristine, source, note))

        keep = state == "present" and rel in targets
        if keep:
            if _read(plan.store_path(rel)) != pristine:
                plan.store_writes[rel] = pristine
        elif os.path.lexists(plan.store_path(rel)):
            plan.store_removals.append(rel)

    if state == "present":
        kept_files = dict(
            (f.path, {"pristine_sha256": sha256_hex(f.pristine), "sha256": sha256_hex(f.desired)})
            for f in plan.files
            if f.path in targets
        )
        data = {
            "format": MANIFEST_FORMAT,
            "package": package,
            "version": info.version,
            "site_packages": info.base,
            "pristine_dir": pristine_dir,
            "patches": [{"name": p.name, "sha256": p.sha256} for p in patches],
            "files": kept_files,
        }
        plan.manifest_bytes = render_manifest(data)
        plan.manifest_changed = _read(manifest_path) != plan.manifest_bytes
    else:
        plan.manifest_remove = os.path.lexists(manifest_path)
        plan.manifest_changed = plan.manifest_remove
    return plan


def _is_result_of(pristine, rel, patches, current):
    try:
        return apply_patches(pristine, rel, patches) == current
    except PatchError:
        return False


# --------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------


def atomic_write(path, data, mode=None, template=None):
    """Write bytes through a temp file in the same directory + os.replace.

    Keeps the mode and owner of ``template`` (default: the file being replaced).
    """
    directory = os.path.dirname(path) or "."
    ref = template if template is not None else path
    try:
        st = os.stat(ref)
    except OSError:
        st = None
    fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if st is not None:
            os.chmod(tmp, stat.S_IMODE(st.st_mode))
            try:
                os.chown(tmp, st.st_uid, st.st_gid)
            except (OSError, AttributeError):
                pass
        elif mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _makedirs(path):
    if not os.path.isdir(path):
        os.makedirs(path, 0o755)


def _prune_empty_dirs(start, stop):
    """Remove empty directories from ``start`` up to (not including) ``stop``."""
    stop = os.path.abspath(stop)
    current = os.path.abspath(start)
    while current.startswith(stop + os.sep) or current == stop:
        try:
            os.rmdir(current)
        except OSError:
            return
        if current == stop:
            return
        current = os.path.dirname(current)


def execute(plan):
    """Carry out a plan: kept pristine copies, package files, manifest.

    Package files are replaced atomically one by one; if one write fails the
    files already written get their previous bytes back before the error is
    raised, so a failed run leaves the package as it found it.
    Returns the relpaths of the package files written.
    """
    for rel, data in sorted(plan.store_writes.items()):
        dest = plan.store_path(rel)
        _makedirs(os.path.dirname(dest))
        atomic_write(dest, data, mode=0o644, template=dest if os.path.exists(dest) else None)

    written = []
    try:
        for fplan in plan.files_changed:
            dest = plan.abspath(fplan.path)
            template = dest if os.path.exists(dest) else None
            atomic_write(dest, fplan.desired, mode=0o644, template=template)
            written.append(fplan)
    except BaseException:
        for fplan in reversed(written):
            if fplan.current is not None:
                try:
                    atomic_write(plan.abspath(fplan.path), fplan.current)
                except OSError:
                    pass
        raise

    if plan.manifest_bytes is not None and plan.manifest_changed:
        _makedirs(os.path.dirname(plan.manifest_path) or ".")
        atomic_write(plan.manifest_path, plan.manifest_bytes, mode=0o644)
    if plan.manifest_remove and os.path.lexists(plan.manifest_path):
        os.unlink(plan.manifest_path)

    for rel in plan.store_removals:
        path = plan.store_path(rel)
        if os.path.lexists(path):
            os.unlink(path)
        _prune_empty_dirs(os.path.dirname(path), plan.pristine_dir)
    if plan.state == "absent" and os.path.isdir(plan.pristine_dir):
        _prune_empty_dirs(plan.pristine_dir, plan.pristine_dir)
    return [f.path for f in written]


def file_diff(plan, fplan):
    """Ansible diff entry (before/after with headers) for one file."""
    before = fplan.current.decode("utf-8", "replace") if fplan.current is not None else ""
    return {
        "before_header": "%s (%s)" % (plan.abspath(fplan.path), "missing" if fplan.current is None else "on disk"),
        "after_header": "%s (%s)" % (plan.abspath(fplan.path), _after_label(fplan)),
        "before": before,
        "after": fplan.desired.decode("utf-8", "replace"),
    }


def _after_label(fplan):
    return "pristine" if fplan.desired == fplan.pristine else "patched"
