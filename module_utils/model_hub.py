# -*- coding: utf-8 -*-
# Copyright: sglang-canon contributors
# MIT License (see galaxy_info of roles/sglang_models)
"""A Hugging Face Hub repository at a pinned commit as a source of the sglang_model module.

The Hub is reached with huggingface_hub itself (it is in SGLang's closure, in the serving venv,
not in the Python that runs Ansible modules): a small program runs under that interpreter with
the token in HF_TOKEN (never on a command line) and HF_ENDPOINT for an internal mirror. Files are
downloaded by hf_hub_download into a folder inside the staging folder, where huggingface_hub
resumes an interrupted download by itself. The manifest of the pinned commit is read from the
Hub's file list: sha256 for LFS files, and for the small git files their bytes, checked against
the git blob id the Hub gives, then hashed.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import base64
import hashlib
import json
import os
import re

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")

# Runs under the serving venv's Python: argv[1] is a command, the rest its arguments.
HUB_PROGRAM = r"""
import base64, json, os, sys
from huggingface_hub import HfApi, hf_hub_download, hf_hub_url
from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

command, repo, revision = sys.argv[1:4]
if command == "list":
    info = HfApi().model_info(repo, revision=revision, files_metadata=True)
    files = [{"path": s.rfilename, "size": s.size, "blob_id": s.blob_id,
              "sha256": s.lfs.sha256 if s.lfs else None} for s in info.siblings]
    print(json.dumps({"commit": info.sha, "files": files}))
elif command == "read":
    path, offset, length = sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
    headers = build_hf_headers()
    headers["Range"] = "bytes=%d-%d" % (offset, offset + length - 1)
    response = get_session().get(hf_hub_url(repo, path, revision=revision), headers=headers)
    hf_raise_for_status(response)
    data = response.content if response.status_code == 206 else response.content[offset:offset + length]
    print(base64.b64encode(data).decode())
elif command == "download":
    path, local_dir = sys.argv[4], sys.argv[5]
    print(hf_hub_download(repo, path, revision=revision, local_dir=local_dir))
"""


class HubError(Exception):
    """The Hub or huggingface_hub refused; names the repository and revision."""


def git_blob_id(data):
    """The git object id of a file's bytes, what the Hub reports as a file's blobId."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def revision_problem(spec, label):
    """A refusal when the revision is not a commit hash (a branch or tag can move), else None."""
    revision = str(spec.get("revision") or "")
    if COMMIT_RE.match(revision):
        return None
    return ("%s.revision must be the commit hash of the files (40 hex digits), not a branch or tag that can move: %r"
            % (label, revision))


def manifest_from_listing(listing, revision, read_file, label):
    """A manifest (path, size, sha256) of the pinned commit from the Hub's file list.

    LFS files carry their sha256; the others are read whole with ``read_file(path)`` and must
    match the git blob id the Hub lists before their sha256 is trusted.
    """
    if listing.get("commit") != revision:
        raise HubError("%s: the Hub answered commit %s for revision %s" % (label, listing.get("commit"), revision))
    entries = []
    for item in listing["files"]:
        sha256 = item.get("sha256")
        if not sha256:
            data = read_file(item["path"])
            if git_blob_id(data) != item.get("blob_id"):
                raise HubError("%s: %s has git blob id %s, the Hub lists %s" % (label, item["path"], git_blob_id(data),
                                                                              item.get("blob_id")))
            sha256 = hashlib.sha256(data).hexdigest()
        entries.append({"path": item["path"], "size": item["size"], "sha256": sha256})
    return entries


class HubSource:
    """Files of a Hub repository at a pinned commit, through huggingface_hub under ``python``."""

    def __init__(self, spec, module, python, token):
        self.repo = spec["repo"]
        self.revision = spec["revision"]
        self.endpoint = spec.get("endpoint")
        self.module = module
        self.python = python
        self.token = token

    def describe(self):
        described = {"type": "hf", "repo": self.repo, "revision": self.revision}
        if self.endpoint:
            described["endpoint"] = self.endpoint
        return described

    def _run(self, *args):
        environ = {"HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
        if self.endpoint:
            environ["HF_ENDPOINT"] = self.endpoint
        if self.token:
            environ["HF_TOKEN"] = self.token
        rc, out, err = self.module.run_command([self.python, "-c", HUB_PROGRAM] + [str(a) for a in args],
                                               environ_update=environ)
        if rc != 0:
            last = (err.strip().splitlines() or ["exit status %d" % rc])[-1]
            raise HubError("huggingface_hub (%s) failed on %s at %s: %s" % (self.python, self.repo, self.revision, last))
        return out

    def manifest(self, label):
        listing = json.loads(self._run("list", self.repo, self.revision))
        sizes = dict((f["path"], f["size"]) for f in listing["files"])
        return manifest_from_listing(listing, self.revision, lambda path: self.read_range(path, 0, sizes[path]), label)

    def read_range(self, path, offset, length):
        if length <= 0:
            return b""
        return base64.b64decode(self._run("read", self.repo, self.revision, path, offset, length))

    def download(self, path, folder):
        """Download one file into ``folder`` with hf_hub_download (which resumes its own partial
        download there); returns where it is."""
        local = self._run("download", self.repo, self.revision, path, folder).strip().splitlines()[-1]
        if not os.path.isfile(local):
            raise HubError("huggingface_hub reported %s for %s, which is not a file" % (local, path))
        return local
