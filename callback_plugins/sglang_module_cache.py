"""Callback: keep the modules ansible-playbook builds for the nodes from one run to the next.

Before a module first runs in a run, a worker process builds its AnsiballZ payload: it compiles
the module and every module_util it imports to find what to zip, about 50 ms of the controller's
CPU for each module (120 ms for the fact gatherer). ansible-core keeps what it built only in the
run's own temporary folder (``ansible-local-*/ansiballz_cache``, removed at exit), so a no-op of
site.yml, which uses about 25 modules, rebuilt them all on every run.

This callback copies the built payloads into a folder of their own at the end of a run and back
into the next run's temporary folder before the first task. The folder's name is a digest of
everything a payload is built from: ansible-core's version and its modules and module_utils, the
configured module and module_utils paths (this project's library/ and module_utils/) and the
content of every file under them. An edit to any module or module_util therefore starts a new,
empty folder instead of reusing a payload built from the old code; folders unused for a week are
removed.

It is an optimisation only: a folder it cannot read or write is ignored (ansible-core builds the
payload itself, as without it), and it prints nothing. Set SGLANG_MODULE_CACHE=0 (or
``[callback_sglang_module_cache] enabled = false``) to run without it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import time

import ansible
from ansible import constants as C
from ansible.plugins.callback import CallbackBase
from ansible.utils.display import Display

DOCUMENTATION = r"""
name: sglang_module_cache
type: aggregate
short_description: Reuse the module payloads built for the nodes from one run to the next
description:
  - ansible-core builds a module's payload (AnsiballZ) once per run, in the run's temporary folder.
    This callback keeps the payloads of a run in O(path) and puts them back into the next run's
    temporary folder before the first task, so a run only builds what changed.
  - The payloads are kept under a digest of ansible-core's version, the configured module and
    module_utils paths and the content of every file under them and under ansible-core's own
    modules and module_utils, so an edited module never runs from an old payload.
  - Folders of other digests unused for O(max_age_days) days are removed.
  - Prints nothing and changes no result; a folder it cannot use is ignored.
requirements:
  - enabled in ansible.cfg (callbacks_enabled)
options:
  enabled:
    description: Keep and reuse the payloads.
    type: bool
    default: true
    env:
      - name: SGLANG_MODULE_CACHE
    ini:
      - section: callback_sglang_module_cache
        key: enabled
  path:
    description: The folder that holds one subfolder of payloads per digest.
    type: path
    default: ~/.cache/sglang-canon/ansiballz
    env:
      - name: SGLANG_MODULE_CACHE_PATH
    ini:
      - section: callback_sglang_module_cache
        key: path
  max_age_days:
    description: Remove the payload folders of other digests that no run used for this many days.
    type: int
    default: 7
    ini:
      - section: callback_sglang_module_cache
        key: max_age_days
"""

display = Display()

# The folder ansible-core's module_common builds payloads into, inside the run's temporary folder.
RUN_CACHE_NAME = "ansiballz_cache"


def source_roots():
    """Every folder a payload's code can come from: ansible-core's own and the configured ones."""
    package = os.path.dirname(ansible.__file__)
    roots = [os.path.join(package, "modules"), os.path.join(package, "module_utils")]
    for configured in (C.DEFAULT_MODULE_PATH, C.DEFAULT_MODULE_UTILS_PATH):
        roots.extend(configured or [])
    return [os.path.realpath(root) for root in roots]


def sources_digest(roots, extra=()):
    """A digest of the roots' paths and of the relative path and content of every file under them."""
    digest = hashlib.sha256()
    for value in extra:
        digest.update(f"{value}\0".encode())
    for root in roots:
        digest.update(f"root {root}\0".encode())
        if not os.path.isdir(root):
            continue
        for folder, subfolders, files in os.walk(root):
            subfolders[:] = sorted(name for name in subfolders if name != "__pycache__")
            for name in sorted(files):
                if name.endswith((".pyc", ".pyo")):
                    continue
                path = os.path.join(folder, name)
                digest.update(f"file {os.path.relpath(path, root)}\0".encode())
                with open(path, "rb") as source:
                    digest.update(hashlib.sha256(source.read()).digest())
    return digest.hexdigest()[:24]


def is_payload(name):
    """A finished payload file, not the lock or the half-written file module_common also leaves there."""
    return not name.endswith((".lock", "-part")) and not name.startswith(".")


def copy_missing(source, destination):
    """Copy every payload in source that destination lacks, each by a rename of a complete file."""
    for name in os.listdir(source):
        target = os.path.join(destination, name)
        if not is_payload(name) or os.path.exists(target):
            continue
        handle, partial = tempfile.mkstemp(dir=destination, prefix=".partial-")
        try:
            with os.fdopen(handle, "wb") as out, open(os.path.join(source, name), "rb") as payload:
                shutil.copyfileobj(payload, out)
            os.replace(partial, target)
        finally:
            if os.path.exists(partial):
                os.unlink(partial)


def remove_stale(parent, keep, max_age_seconds, now):
    """Remove the digest folders other than keep that no run touched for max_age_seconds."""
    for name in os.listdir(parent):
        folder = os.path.join(parent, name)
        if name != keep and os.path.isdir(folder) and now - os.path.getmtime(folder) > max_age_seconds:
            shutil.rmtree(folder, ignore_errors=True)


class CallbackModule(CallbackBase):
    """Restores the kept payloads at the start of a run and keeps the new ones at its end."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "sglang_module_cache"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self._enabled = True
        self._kept = None  # the digest folder of this run, once it is known
        self._run_cache = None

    def set_options(self, task_keys=None, var_options=None, direct=None):
        super().set_options(task_keys=task_keys, var_options=var_options, direct=direct)
        self._enabled = self.get_option("enabled")

    def v2_playbook_on_start(self, playbook):
        if not self._enabled:
            return
        try:
            parent = os.path.expanduser(self.get_option("path"))
            key = sources_digest(source_roots(), extra=(ansible.__version__, sys.version))
            kept = os.path.join(parent, key)
            # ansible-core unpickles what is in here: only this user may write to it.
            os.makedirs(kept, mode=0o700, exist_ok=True)
            os.utime(kept)
            remove_stale(parent, key, self.get_option("max_age_days") * 86400, time.time())
            # The run's temporary folder is made in this process, before any worker forks.
            run_cache = os.path.join(C.DEFAULT_LOCAL_TMP, RUN_CACHE_NAME)
            os.makedirs(run_cache, exist_ok=True)
            copy_missing(kept, run_cache)
        except OSError as error:
            display.vvv(f"sglang_module_cache: not used in this run: {error}")
            return
        self._kept, self._run_cache = kept, run_cache

    def v2_playbook_on_stats(self, stats):
        if self._kept is None:
            return
        try:
            copy_missing(self._run_cache, self._kept)
        except OSError as error:
            display.vvv(f"sglang_module_cache: could not keep this run's payloads: {error}")
