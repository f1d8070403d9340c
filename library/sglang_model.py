#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: sglang-canon contributors
# MIT License
"""Ansible module: one model folder on the node, verified against its manifest and repaired
from its source by an atomic swap."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

DOCUMENTATION = r"""
---
module: sglang_model
short_description: Place a model folder from a pinned manifest, verify it, repair it atomically
description:
  - Verifies every file of O(manifest) (path, size, sha256) in the folder O(path). A routine run
    compares size and mtime with the record the module keeps in the folder (C(.sglang-model.json))
    and hashes nothing; a file whose size or mtime differs, or every file with O(verify=full), is hashed.
  - When a file is missing or wrong, builds the whole folder again in a staging folder next to
    O(path) (same filesystem); good files are hard-linked from the current folder, the others
    fetched from O(source) and checked against the manifest, then the staging folder is renamed
    into place. A failed fetch leaves the current folder untouched; a fetch interrupted mid-file
    is resumed from its partial file by the next run.
  - Refuses before fetching anything when the filesystem lacks the space the files still need.
  - Anything else in the folder (a file, link or folder not in O(manifest)) is reported on every
    run (a listing of the folder, no hashing) and removed by the same rebuild and swap, because
    SGLang loads whatever weights the folder holds.
  - A O(source.type=dir) gives only files inside its folder; a symbolic link that leads out of it
    is refused before anything is fetched. A source URL is recorded in the folder, so it must hold
    no credential (user and password before the host) or query; the sglang_models role refuses one
    on the controller before this module is given it (filter model_source_problems); credentials
    go in O(http_headers) or O(hf_token).
  - Files are owned by root, mode 0644, folders 0755; readable by the service user, writable by root only.
  - Without O(manifest) and with O(source.type=none) it only reads the folder (an unmanaged model).
  - In check mode reports what would be fetched and reads config.json (and the tensors asked for)
    from the source when the folder does not hold them yet.
version_added: "1.0.0"
author: sglang-canon contributors
options:
  path:
    description: The model folder on the node (what the server's --model-path points at).
    type: path
    required: true
  source:
    description: Where missing or wrong files come from.
    type: dict
    default: {type: none}
    suboptions:
      type:
        description:
          - none (verify only), dir (a folder on the node, e.g. NFS), http (plain files under
            O(source.url)) or hf (a Hugging Face Hub repository at a pinned commit, fetched with
            huggingface_hub under O(hf_python)).
        type: str
        choices: [none, dir, http, hf]
        default: none
      repo:
        description: The Hub repository, owner/name (type hf).
        type: str
      revision:
        description: The commit hash the files are pinned to, 40 hex digits; a branch or tag is refused (type hf).
        type: str
      endpoint:
        description: The Hub's URL (HF_ENDPOINT), for an internal mirror of the Hub; default huggingface_hub's own (type hf).
        type: str
      path:
        description: The source folder (type dir); symbolic links in it may only lead to files inside it.
        type: path
      url:
        description:
          - Base URL; a file is fetched from URL/PATH (type http). No user name, password, query or
            fragment (it is recorded on the node); put credentials in O(http_headers).
        type: str
      validate_certs:
        description: Check the HTTPS server's certificate (type http).
        type: bool
        default: true
      timeout:
        description: Seconds one HTTP request may stall (type http).
        type: int
        default: 60
  manifest:
    description:
      - Every file of the model, as path (relative), size (bytes) and sha256.
      - May be left out with O(source.type=hf); the manifest of the pinned commit is then read from
        the Hub (LFS sha256, git blob ids for the rest) on the first fetch and recorded in the folder.
    type: list
    elements: dict
  hf_python:
    description: Interpreter with huggingface_hub (SGLang's venv), for O(source.type=hf).
    type: path
    default: /opt/sglang/venv/bin/python
  hf_token:
    description: Hub token (from ansible-vault), passed to huggingface_hub as HF_TOKEN, never logged.
    type: str
  http_headers:
    description:
      - Headers sent with every request to an O(source.type=http) source, e.g. its C(Authorization)
        (from ansible-vault); never logged, returned or recorded.
    type: dict
    default: {}
  revision:
    description: A label of the source's version, recorded with the manifest (e.g. a mirror snapshot).
    type: str
  verify:
    description: quick compares size and recorded mtime, full hashes every file.
    type: str
    choices: [quick, full]
    default: quick
  label:
    description: The inventory variable of this model's source, used in every message.
    type: str
    default: model
  path_var:
    description: The inventory variable of O(path), named when the folder itself is wrong.
    type: str
    default: path
  inspect_tensors:
    description: Tensor names whose shapes are read from the safetensors headers (e.g. a drafter's d2t).
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
- name: The target model from an internal HTTP mirror, pinned by its manifest
  sglang_model:
    path: /data/models/target
    source: {type: http, url: "https://mirror.example/models/target"}
    manifest: "{{ sglang_models_target_manifest }}"
    label: sglang_models_target_source

- name: Hash every file (what playbooks/drift.yml -e sglang_models_verify=full does)
  sglang_model:
    path: /data/models/target
    manifest: "{{ sglang_models_target_manifest }}"
    verify: full
  check_mode: true

- name: The drafter from a mirror that asks for a password, the credential from ansible-vault
  sglang_model:
    path: /data/models/draft
    source: {type: http, url: "https://mirror.example/models/draft"}
    http_headers:
      Authorization: "Basic {{ (vault_mirror_user ~ ':' ~ vault_mirror_password) | b64encode }}"
    manifest: "{{ sglang_models_draft_manifest }}"
    label: sglang_models_draft_source
"""

RETURN = r"""
drifted:
  description: One line per file that differs (what playbooks/drift.yml lists).
  returned: always
  type: list
  elements: str
  sample: ["/data/models/target/model-00002-of-00002.safetensors: sha256 1f..., manifest says 9c..."]
in_sync:
  description: Nothing to change (the opposite of changed, kept when a plan task sets changed_when false).
  returned: always
  type: bool
state:
  description: C(verified) (nothing to do), C(recorded) (record rewritten), C(placed) (folder rebuilt), C(unmanaged).
  returned: always
  type: str
fetch:
  description: Files fetched from the source (or that would be, in check mode), with the reason.
  returned: always
  type: list
  elements: dict
  sample: [{"path": "model-00001-of-00002.safetensors", "reason": "missing"}]
unexpected:
  description: What the folder holds besides the manifest and its record (removed by the swap).
  returned: always
  type: list
  elements: str
  sample: ["model-00003-of-00002.safetensors"]
hashed:
  description: Files whose sha256 was computed in this run (empty on a routine no-op run).
  returned: always
  type: list
  elements: str
manifest_digest:
  description: sha256 over the manifest (null for an unmanaged model).
  returned: always
  type: str
files:
  description: path and size of every file of the model.
  returned: always
  type: list
  elements: dict
config:
  description: The model's config.json (from the folder, or from the source when it is not placed yet).
  returned: always
  type: dict
tensors:
  description: Shape of each tensor of O(inspect_tensors) found in the safetensors headers.
  returned: always
  type: dict
needed_bytes:
  description: Bytes still to fetch (partial files already fetched are counted off).
  returned: always
  type: int
available_bytes:
  description: Free bytes (for root) on the filesystem that holds O(path).
  returned: always
  type: int
filesystem:
  description: Device number of that filesystem, so that models sharing it are counted together.
  returned: always
  type: int
folder:
  description: The model folder (not C(path), which would make Ansible add the folder's file attributes).
  returned: always
  type: str
record:
  description: What production_v2.md records of the model.
  returned: always
  type: dict
  sample: {"label": "sglang_models_target_source", "path": "/data/models/target", "source": {"type": "http",
           "url": "https://mirror.internal/models/target"}, "revision": "2026-11-30",
           "manifest_digest": "9f2c...", "files": 6, "bytes": 1331646}
"""

import json
import os
import shutil
import stat

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.model_checks import safetensors_header
from ansible.module_utils.model_manifest import (
    HASH, OK, RECORD_NAME, ManifestError, file_sha256, free_space_problem, hashed_verdict, manifest_digest,
    normalise_manifest, parse_record, quick_verdict, record_text, staging_paths, unexpected_entries,
)
from ansible.module_utils.model_hub import HubError, HubSource, revision_problem
from ansible.module_utils.model_sources import DirectorySource, SourceError, make_source

FILE_MODE = 0o644
DIR_MODE = 0o755
# Where hf_hub_download puts files (and its resumable partial downloads) inside the staging folder.
HUB_DOWNLOADS = ".hub"


class ModelError(Exception):
    """A refusal of this module; the current folder is left as it was."""


def _stat(path):
    try:
        info = os.stat(path)
    except OSError:
        return None
    return {"size": info.st_size, "mtime_ns": info.st_mtime_ns}


def _read(path):
    try:
        with open(path) as handle:
            return handle.read()
    except (IOError, OSError):
        return None


def _sha256_of(path):
    with open(path, "rb") as handle:
        return file_sha256(handle).hexdigest()


def _existing_ancestor(path):
    while not os.path.isdir(path):
        path = os.path.dirname(path)
    return path


def _available(path):
    info = os.statvfs(_existing_ancestor(path))
    return info.f_bavail * info.f_frsize


def _filesystem(path):
    return os.stat(_existing_ancestor(path)).st_dev


def _wrong_ownership(path, mode):
    info = os.lstat(path)
    return info.st_uid != 0 or info.st_gid != 0 or stat.S_IMODE(info.st_mode) != mode


class ModelFolder:
    """The model at ``path`` against its manifest; ``source`` repairs it."""

    def __init__(self, module, path, manifest, source, label):
        self.module = module
        self.path = path.rstrip("/")
        self.manifest = manifest
        self.source = source
        self.label = label
        self.staging, self.previous = staging_paths(self.path)
        self.hashed = []

    # ---------------------------------------------------------------- verification

    def current(self):
        """The folder holding the last placed model: the target path, or the previous copy when a
        run stopped between the two renames of a swap."""
        if os.path.isdir(self.path):
            return self.path
        if os.path.isdir(self.previous):
            return self.previous
        return None

    def verdicts(self, full):
        """(path -> verdict of the current folder, its record)."""
        folder = self.current()
        record = parse_record(_read(os.path.join(folder, RECORD_NAME))) if folder else None
        recorded = (record or {}).get("mtime_ns", {})
        # A recorded mtime vouches only for the content the record pinned: when the inventory pins
        # another sha256 (a new revision), that file is hashed.
        recorded_entries = dict((e.get("path"), e) for e in (record or {}).get("manifest") or [] if isinstance(e, dict))
        verdicts = {}
        for entry in self.manifest:
            full_path = os.path.join(folder, entry["path"]) if folder else None
            vouched = recorded.get(entry["path"]) if recorded_entries.get(entry["path"]) == entry else None
            verdict = quick_verdict(entry, _stat(full_path) if folder else None, vouched, full)
            if verdict == HASH:
                self.hashed.append(entry["path"])
                verdict = hashed_verdict(entry, _sha256_of(full_path))
            verdicts[entry["path"]] = verdict
        return verdicts, record

    def unexpected(self):
        """What the current folder holds besides the manifest and its record: one listing, no stat
        of the files, so every run can afford it."""
        folder = self.current()
        if folder is None:
            return []
        listing = []
        for root, dirs, files in os.walk(folder):
            relative = os.path.relpath(root, folder)
            for name in dirs + files:
                full = os.path.join(root, name)
                path = name if relative == "." else os.path.join(relative, name)
                listing.append((path, os.path.isdir(full) and not os.path.islink(full)))
        return unexpected_entries([e["path"] for e in self.manifest], listing)

    def ownership_drift(self):
        """Paths of the placed folder that are not root-owned 0644 files / 0755 folders."""
        drift = []
        if _wrong_ownership(self.path, DIR_MODE):
            drift.append(self.path)
        for entry in self.manifest + [{"path": RECORD_NAME}]:
            full = os.path.join(self.path, entry["path"])
            parent = os.path.dirname(full)
            while parent != self.path:
                if _wrong_ownership(parent, DIR_MODE) and parent not in drift:
                    drift.append(parent)
                parent = os.path.dirname(parent)
            if _wrong_ownership(full, FILE_MODE):
                drift.append(full)
        return drift

    def fix_ownership(self, paths):
        for path in paths:
            os.chown(path, 0, 0)
            os.chmod(path, DIR_MODE if os.path.isdir(path) else FILE_MODE)

    # ---------------------------------------------------------------- fetching

    def partial_bytes(self, path):
        info = _stat(os.path.join(self.staging, path + ".part"))
        return info["size"] if info else 0

    def fetch(self, entry, resume=True):
        """Fetch one file into the staging folder, resuming its partial file, and check it."""
        final = os.path.join(self.staging, entry["path"])
        part = final + ".part"
        self._makedirs(os.path.dirname(final))
        if isinstance(self.source, HubSource):
            return self.fetch_from_hub(entry, final)
        offset = self.partial_bytes(entry["path"])
        if offset and (offset > entry["size"] or not resume):
            os.unlink(part)
            offset = 0
        with open(part, "ab+") as handle:
            handle.seek(0)
            digest = file_sha256(handle)
            stream, start = self.source.open(entry["path"], offset)
            if start != offset:  # the source restarted at byte 0
                handle.truncate(0)
                digest = file_sha256(handle)
            written = start
            try:
                with stream:
                    for chunk in iter(lambda: stream.read(1 << 20), b""):
                        handle.write(chunk)
                        digest.update(chunk)
                        written += len(chunk)
                        if written > entry["size"]:
                            break
            except Exception as exc:  # pylint: disable=broad-except  # a cut connection, a read error
                handle.flush()
                raise ModelError("fetching %s of %s was interrupted after %d of %d bytes (%s); the next run "
                                 "resumes it from %s" % (entry["path"], self.label, written, entry["size"], exc, part))
            handle.flush()
            os.fsync(handle.fileno())
        if written < entry["size"]:
            raise ModelError("the source of %s ended %s after %d of %d bytes; the next run resumes it from %s"
                             % (self.label, entry["path"], written, entry["size"], part))
        sha = digest.hexdigest()
        if (written != entry["size"] or sha != entry["sha256"]) and offset:
            # The partial file may be from another version of the source: fetch it whole once.
            return self.fetch(entry, resume=False)
        if written != entry["size"] or sha != entry["sha256"]:
            os.unlink(part)
            raise ModelError("the source of %s does not match the pinned manifest: %s has %s bytes with sha256 %s, the "
                             "manifest says %d bytes with sha256 %s; %s was left as it was"
                             % (self.label, entry["path"], "more than %d" % entry["size"] if written > entry["size"]
                                else written, sha, entry["size"], entry["sha256"], self.path))
        os.chmod(part, FILE_MODE)
        os.rename(part, final)
        return None

    def fetch_from_hub(self, entry, final):
        """hf_hub_download into the staging folder's .hub (it resumes there by itself), then check."""
        local = self.source.download(entry["path"], os.path.join(self.staging, HUB_DOWNLOADS))
        with open(local, "rb") as handle:
            sha = file_sha256(handle).hexdigest()
        size = os.path.getsize(local)
        if size != entry["size"] or sha != entry["sha256"]:
            os.unlink(local)
            raise ModelError("the source of %s does not match the pinned manifest: %s has %d bytes with sha256 %s, the "
                             "manifest says %d bytes with sha256 %s; %s was left as it was"
                             % (self.label, entry["path"], size, sha, entry["size"], entry["sha256"], self.path))
        os.chmod(local, FILE_MODE)
        os.rename(local, final)
        return None

    def _makedirs(self, folder):
        if not os.path.isdir(folder):
            os.makedirs(folder, DIR_MODE)

    def rebuild(self, verdicts, revision):
        """Staging folder = good files (hard links) + fetched ones + record, then swap it in."""
        current = self.current()
        self._makedirs(self.staging)
        for entry in self.manifest:
            staged = os.path.join(self.staging, entry["path"])
            if verdicts[entry["path"]] == OK:
                if os.path.lexists(staged):
                    os.unlink(staged)
                self._makedirs(os.path.dirname(staged))
                os.link(os.path.join(current, entry["path"]), staged)
            elif not self._staged_complete(entry, staged):
                self.fetch(entry)
        if os.path.isdir(os.path.join(self.staging, HUB_DOWNLOADS)):  # huggingface_hub's own metadata
            shutil.rmtree(os.path.join(self.staging, HUB_DOWNLOADS))
        self.write_record(self.staging, revision)
        for root, dirs, files in os.walk(self.staging):
            self.fix_ownership([os.path.join(root, name) for name in dirs + files])
        self.fix_ownership([self.staging])
        if os.path.isdir(self.path):
            if os.path.isdir(self.previous):
                shutil.rmtree(self.previous)
            os.rename(self.path, self.previous)
        os.rename(self.staging, self.path)
        if os.path.isdir(self.previous):
            shutil.rmtree(self.previous)

    def _staged_complete(self, entry, staged):
        """A file an earlier, interrupted run already fetched and checked (hashed again: cheap
        next to fetching, and the staging folder is no proof of anything)."""
        if not os.path.isfile(staged):
            return False
        self.hashed.append(entry["path"])
        if _stat(staged)["size"] == entry["size"] and _sha256_of(staged) == entry["sha256"]:
            return True
        os.unlink(staged)
        return False

    def write_record(self, folder, revision):
        mtimes = dict((e["path"], _stat(os.path.join(folder, e["path"]))["mtime_ns"]) for e in self.manifest)
        text = record_text(self.manifest, self.source.describe() if self.source else {"type": "none"}, revision, mtimes)
        tmp = os.path.join(folder, RECORD_NAME + ".tmp")
        with open(tmp, "w") as handle:
            handle.write(text)
        os.chmod(tmp, FILE_MODE)
        os.rename(tmp, os.path.join(folder, RECORD_NAME))

    # ---------------------------------------------------------------- what the checks read

    def reader(self, local_paths, local_folder):
        """(path, offset, length) -> bytes: files of ``local_paths`` from ``local_folder``, others from the source."""
        def read_range(path, offset, length):
            if path not in local_paths or local_folder is None:
                if self.source is None:
                    raise ModelError("%s: %s is not in %s and there is no source" % (self.label, path, self.path))
                return self.source.read_range(path, offset, length)
            with open(os.path.join(local_folder, path), "rb") as handle:
                handle.seek(offset)
                return handle.read(length)
        return read_range

    def config(self, read_range):
        entry = next((e for e in self.manifest if e["path"] == "config.json"), None)
        if entry is None:
            raise ModelError("the manifest of %s lists no config.json" % self.label)
        data = read_range("config.json", 0, entry["size"])
        if len(data) != entry["size"]:
            raise ModelError("config.json of %s has %d bytes, the manifest says %d" % (self.label, len(data), entry["size"]))
        return json.loads(data.decode("utf-8"))

    def tensors(self, read_range, names):
        found = {}
        if not names:
            return found
        for entry in self.manifest:
            if entry["path"].endswith(".safetensors"):
                shapes = safetensors_header(lambda offset, length, p=entry["path"]: read_range(p, offset, length))
                found.update((name, shapes[name]) for name in names if name in shapes)
        return found


def recorded_hub_manifest(path, source):
    """The manifest recorded in the folder on a first fetch from the same repository and pinned
    commit (whatever the endpoint), else None: a commit's files never change, so the Hub is not asked again."""
    for folder in (path,) + staging_paths(path)[1:]:
        record = parse_record(_read(os.path.join(folder, RECORD_NAME)))
        recorded = (record or {}).get("source") or {}
        if (recorded.get("type"), recorded.get("repo"), recorded.get("revision")) == ("hf", source.repo, source.revision) \
                and isinstance(record.get("manifest"), list):
            return record["manifest"]
    return None


def unmanaged(module, path, inspect):
    """No manifest and no source: read the folder as it is (a model put there by hand)."""
    if not os.path.isfile(os.path.join(path, "config.json")):
        module.fail_json(msg="%s: %s has no config.json: the model folder is missing or incomplete, and %s gives no "
                             "source to fetch it from" % (module.params["path_var"], path, module.params["label"]))
    files = []
    for root, _dirs, names in os.walk(path):
        for name in names:
            full = os.path.join(root, name)
            files.append({"path": os.path.relpath(full, path), "size": os.path.getsize(full)})
    folder = ModelFolder(module, path, sorted(files, key=lambda f: f["path"]), None, module.params["label"])
    reader = folder.reader(set(f["path"] for f in files), path)
    config = folder.config(reader)
    tensors = folder.tensors(reader, inspect)
    record = dict(label=module.params["label"], path=path, source={"type": "none"}, revision=None,
                  manifest_digest=None, files=len(files), bytes=sum(f["size"] for f in files))
    module.exit_json(changed=False, in_sync=True, state="unmanaged", folder=path, record=record, fetch=[], hashed=[], manifest_digest=None,
                     files=folder.manifest, config=config, tensors=tensors, needed_bytes=0,
                     available_bytes=_available(path), filesystem=_filesystem(path))


def run(module):
    params = module.params
    label = params["label"]
    if params["source"]["type"] == "hf":
        problem = revision_problem(params["source"], label) if params["source"].get("repo") else (
            "%s: a source of type hf needs repo" % label)
        if problem:
            module.fail_json(msg=problem)
        source = HubSource(params["source"], module, params["hf_python"], params["hf_token"])
    else:
        source = make_source(params["source"], label, params["http_headers"])
    if params["source"]["type"] == "dir" and not params["source"].get("path"):
        module.fail_json(msg="%s: a source of type dir needs path" % label)
    if params["source"]["type"] == "http" and not params["source"].get("url"):
        module.fail_json(msg="%s: a source of type http needs url" % label)
    pinned = params["manifest"]
    if pinned is None and isinstance(source, HubSource):
        pinned = recorded_hub_manifest(params["path"], source) or source.manifest(label)
    if pinned is None:
        if source is not None:
            module.fail_json(msg="%s has a source but no manifest: pin every file (path, size, sha256)" % label)
        unmanaged(module, params["path"], params["inspect_tensors"])
    try:
        manifest = normalise_manifest(pinned, label.replace("_source", "_manifest"))
    except ManifestError as exc:
        module.fail_json(msg=str(exc))

    folder = ModelFolder(module, params["path"], manifest, source, label)
    verdicts, record = folder.verdicts(params["verify"] == "full")
    bad = [{"path": p, "reason": v} for p, v in sorted(verdicts.items()) if v != OK]
    if isinstance(source, DirectorySource):
        for entry in bad:  # a link out of the source is refused before anything is fetched, in check mode too
            source.check(entry["path"])
    unexpected = folder.unexpected()
    # A stop between the swap's renames leaves the folder at its previous name: a rebuild puts it back.
    misplaced = folder.current() not in (None, folder.path)
    result = dict(changed=False, folder=folder.path, fetch=bad, manifest_digest=manifest_digest(manifest),
                  needed_bytes=0, available_bytes=_available(folder.path), filesystem=_filesystem(folder.path),
                  files=[{"path": e["path"], "size": e["size"]} for e in manifest], unexpected=unexpected)
    result["record"] = dict(label=label, path=folder.path, source=source.describe() if source else {"type": "none"},
                            revision=params["revision"], manifest_digest=result["manifest_digest"],
                            files=len(manifest), bytes=sum(e["size"] for e in manifest))

    if bad or misplaced or unexpected:
        # Files to remove and a swap to finish need no source: the good files are hard-linked.
        if bad and source is None:
            module.fail_json(msg="%s: %s does not match its manifest and %s gives no source to repair it from: %s"
                             % (params["path_var"], folder.path, label, "; ".join("%s: %s" % (b["path"], b["reason"]) for b in bad)), **result)
        sizes = dict((e["path"], e["size"]) for e in manifest)
        result["needed_bytes"] = sum(sizes[b["path"]] - folder.partial_bytes(b["path"]) for b in bad)
        problem = free_space_problem(label, _existing_ancestor(os.path.dirname(folder.path)),
                                     result["needed_bytes"], result["available_bytes"])
        result.update(changed=True, state="placed", free_space_problem=problem)
        if not module.check_mode:
            if problem:
                module.fail_json(msg=problem, **result)
            folder.rebuild(verdicts, params["revision"])
    else:
        stale_record = (record is None or record.get("manifest_digest") != result["manifest_digest"]
                        or record.get("mtime_ns") != dict((e["path"], _stat(os.path.join(folder.path, e["path"]))["mtime_ns"])
                                                         for e in manifest))
        drift = folder.ownership_drift() if not stale_record else []
        result["state"] = "recorded" if stale_record else "verified"
        if stale_record or drift:
            result.update(changed=True, ownership=drift)
            if not module.check_mode:
                folder.write_record(folder.path, params["revision"])
                folder.fix_ownership(folder.ownership_drift())
        leftovers = [p for p in (folder.staging, folder.previous) if os.path.isdir(p)]
        if leftovers:  # what an abandoned fetch or a stopped swap left behind
            result.update(changed=True, leftovers=leftovers)
            if not module.check_mode:
                for leftover in leftovers:
                    shutil.rmtree(leftover)

    # The checks read config.json and headers from the folder when it holds them (or will, once
    # placed), else from the source: in check mode nothing was fetched yet.
    from_folder = set(verdicts) if not (bad and module.check_mode) else set(p for p, v in verdicts.items() if v == OK)
    reader = folder.reader(from_folder, folder.current() if module.check_mode else folder.path)
    result["config"] = folder.config(reader)
    result["tensors"] = folder.tensors(reader, params["inspect_tensors"])
    result["hashed"] = folder.hashed
    result["in_sync"] = not result["changed"]
    # What playbooks/drift.yml lists for this model (callback_plugins/sglang_drift.py reads it).
    result["drifted"] = (["%s: %s" % (os.path.join(folder.path, b["path"]), b["reason"]) for b in bad]
                         + ["%s: not root-owned %s" % (p, "0755" if p == folder.path or os.path.isdir(p) else "0644")
                            for p in result.get("ownership", [])]
                         + ["%s: left over" % p for p in result.get("leftovers", [])]
                         + ["%s: not in the manifest" % os.path.join(folder.path, p) for p in unexpected]
                         + (["%s: only at %s (a swap stopped halfway)" % (folder.path, folder.previous)]
                            if misplaced else []))
    module.exit_json(**result)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            source=dict(type="dict", default={"type": "none"}, options=dict(
                type=dict(type="str", choices=["none", "dir", "http", "hf"], default="none"),
                path=dict(type="path"),
                url=dict(type="str"),
                repo=dict(type="str"),
                revision=dict(type="str"),
                endpoint=dict(type="str"),
                validate_certs=dict(type="bool", default=True),
                timeout=dict(type="int", default=60),
            )),
            manifest=dict(type="list", elements="dict"),
            revision=dict(type="str"),
            verify=dict(type="str", choices=["quick", "full"], default="quick"),
            label=dict(type="str", default="model"),
            path_var=dict(type="str", default="path"),
            inspect_tensors=dict(type="list", elements="str", default=[]),
            hf_python=dict(type="path", default="/opt/sglang/venv/bin/python"),
            hf_token=dict(type="str", no_log=True),
            http_headers=dict(type="dict", default={}, no_log=True),
        ),
        supports_check_mode=True,
    )
    try:
        run(module)
    except (ModelError, SourceError, HubError) as exc:
        module.fail_json(msg=str(exc))
    except ValueError as exc:  # config.json or a safetensors header that does not parse
        module.fail_json(msg="%s: %s" % (module.params["label"], exc))


if __name__ == "__main__":
    main()
