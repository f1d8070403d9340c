#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: sglang-canon contributors
# MIT License (see roles/sglang_patches/meta/main.yml)
"""Ansible module: apply, verify and restore a set of local patches to an installed Python package."""

from __future__ import annotations

import os
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_bytes, to_native
from ansible.module_utils import package_patch_node
from ansible.module_utils.patch_copies import remove_copies, sync_copies
from ansible.module_utils.package_patch import (
    build_plan,
    default_pristine_dir,
    execute,
    file_diff,
    load_manifest,
    parse_probe_output,
)
from ansible.module_utils.unified_diff import PatchError, parse_patch, target_paths

DOCUMENTATION = r"""
---
module: python_package_patch
short_description: Apply a set of local patches to an installed Python package, idempotently
description:
  - Applies an ordered set of unified diffs to the files of an installed Python distribution
    (for example C(sglang)), keeps a JSON manifest of what it did, and restores the pristine files
    on O(state=absent).
  - The package is found through O(python) with C(importlib.metadata), without importing it,
    so the patched files are those that interpreter really loads. If its version is not
    O(version), the module fails before touching any file and names both versions.
  - The pristine bytes of every file the set touches are verified against the sha256 in the
    distribution's C(RECORD) and a copy is kept next to the manifest (O(pristine_dir)). The
    wanted bytes are always computed as pristine + every patch in order, in memory, with a strict
    applier (exact context, no fuzz, hunks in order). So an applied set is left alone, a reinstalled
    (pristine) file is patched again, and an updated patch replaces the old result instead of being
    stacked on top of it.
  - A file that is neither pristine, nor the wanted result, nor the result recorded by the last
    run was edited by hand or half patched; it is reported in RV(drifted) and restored.
  - A patch that does not apply to the pristine file (a conflict) fails the task before any
    write. All writes come last, each through a temporary file and C(os.replace), keeping mode
    and owner; if a write fails, the files already written get their previous bytes back.
  - Before writing, the patched sources are compiled by O(python) (a syntax error fails the task);
    after writing, they are byte-compiled by O(python) so the C(.pyc) files match that interpreter.
  - What runs under O(python) (finding the package, the compile check, byte-compiling) is the module
    utility C(package_patch_node), sent to the node with the module and run with C(python -c).
  - Not ansible.posix's C(patch) module, which runs GNU C(patch) on the node for one diff at a time
    (fuzz allowed, decided by a dry run on the file as it is now); it neither checks the pristine
    files against C(RECORD), nor builds the wanted bytes from the pristine ones, nor finds a file
    edited by hand, nor restores the package.
version_added: "0.1.0"
author: sglang-canon
options:
  python:
    description:
      - Interpreter whose C(site-packages) holds the package (for example C(/opt/sglang/venv/bin/python)).
      - A bare command name is looked up in C(PATH).
    type: str
    required: true
  package:
    description: Distribution name of the package, as C(pip) knows it.
    type: str
    required: true
  version:
    description:
      - Version of the package the patch set was made for.
      - The installed version must be exactly this one, else the module fails and changes nothing.
    type: str
    required: true
  patches:
    description:
      - Ordered list of unified diffs. Paths inside each diff are relative to the C(site-packages)
        directory that holds the package (C(sglang/srt/environ.py)); C(a/) and C(b/) prefixes of
        C(git diff) are understood. Only edits of files the package installed are supported.
      - Each item is either the path of a patch file on the node, or a dictionary with C(name) and
        C(content) (the text of the diff), which lets check mode work before the files are copied,
        or with C(path) instead of C(content). Other keys of the dictionary are ignored.
      - The text before the first C(diff )/C(--- ) line is the patch's header, which should say what
        it changes and why.
      - May be empty with O(state=absent); the files listed in the manifest are restored then.
    type: list
    elements: raw
    default: []
  state:
    description:
      - V(present) applies the set; V(absent) restores the pristine bytes of every file the manifest
        or the set lists (sha256 equal to C(RECORD)), then removes the manifest and the kept copies.
    type: str
    choices: [present, absent]
    default: present
  manifest:
    description:
      - Path of the JSON manifest on the node. It records the package, its version, each patch's name and
        sha256 and the sha256 of every file after patching; it is how later runs tell an updated set
        from a hand edit.
    type: path
    required: true
  pristine_dir:
    description:
      - Directory for the verified pristine copies of the patched files.
      - Defaults to the manifest path without C(.json) and C(.manifest), plus C(.pristine)
        (C(sglang.manifest.json) keeps its copies in C(sglang.pristine/)).
    type: path
  pristine_wheel:
    description:
      - Path on the node of the pristine wheel of O(package) O(version).
      - Only read when a file is not pristine on disk and no kept copy exists, for example on a node
        patched by hand before this module managed it. Members are verified against C(RECORD).
    type: path
  byte_compile:
    description: Byte-compile the files written, with O(python).
    type: bool
    default: true
  keep_copies:
    description:
      - Folder on the node where the text of each patch is kept, at C(KEEP_COPIES/NAME) (a name
        C(SET/FILE) gets the set's folder), as the operator's record of what is applied, in the same
        round trip as the patching.
      - With O(state=present), each copy is written when it differs (folders 0755, files 0644, owned
        by the user the module runs as, root on a node; a drifted mode or owner is put right too),
        after the package files. With
        O(state=absent), the copies of the named patches go (a set's whole folder).
      - Unset, no copies are kept or removed.
    type: path
attributes:
  check_mode:
    support: full
    details: Reads everything and compiles the would-be sources in a temporary directory; writes nothing.
  diff_mode:
    support: full
    details: One before/after entry per package file that would change.
notes:
  - Only the standard library is needed on the node; O(python) must be Python 3.8 or newer.
  - Run as the owner of the C(site-packages) directory (usually root).
  - Several patch sets for one package must go through one call, in order, with one manifest;
    two manifests for the same files would undo each other.
seealso:
  - name: Recording installed files (RECORD)
    description: The wheel format's list of installed files and their hashes.
    link: https://packaging.python.org/en/latest/specifications/recording-installed-packages/
"""

EXAMPLES = r"""
- name: Apply the SGLang 0.5.9 patch set
  python_package_patch:
    python: /opt/sglang/venv/bin/python
    package: sglang
    version: "0.5.9"
    patches:
      - /var/lib/sglang-canon/patches/sglang-0.5.9/0001-strict-sglang-enable-spec-v2.patch
      - /var/lib/sglang-canon/patches/sglang-0.5.9/0002-spec-v2-skip-drafting-at-running-requests.patch
    manifest: /var/lib/sglang-canon/patches/sglang.manifest.json
  register: sglang_patch

- name: Same, with the diffs read on the controller (check mode works before any copy)
  python_package_patch:
    python: /opt/sglang/venv/bin/python
    package: sglang
    version: "0.5.9"
    patches:
      - name: 0001-strict-sglang-enable-spec-v2.patch
        content: "{{ lookup('ansible.builtin.file', 'files/sglang-0.5.9/0001-strict-sglang-enable-spec-v2.patch', rstrip=false) }}"
    manifest: /var/lib/sglang-canon/patches/sglang.manifest.json

- name: Restore the pristine SGLang files and drop the manifest
  python_package_patch:
    python: /opt/sglang/venv/bin/python
    package: sglang
    version: "0.5.9"
    state: absent
    manifest: /var/lib/sglang-canon/patches/sglang.manifest.json
"""

RETURN = r"""
package:
  description: Distribution name.
  returned: always
  type: str
  sample: sglang
installed_version:
  description: Version of the installed distribution, as O(python) sees it.
  returned: when the package was found
  type: str
  sample: 0.5.9
site_packages:
  description: Directory the patch paths are relative to.
  returned: when the package was found
  type: str
  sample: /opt/sglang/venv/lib/python3.11/site-packages
manifest:
  description: Path of the manifest.
  returned: always
  type: str
  sample: /var/lib/sglang-canon/patches/sglang.manifest.json
patches:
  description: The patches of the set, in order.
  returned: success
  type: list
  elements: dict
  sample:
    - name: 0001-strict-sglang-enable-spec-v2.patch
      sha256: 5f0c...e1
      header: "Make SGLANG_ENABLE_SPEC_V2 strict ..."
files:
  description:
    - One entry per package file the set or the manifest names.
    - C(action) is V(ok) (already as wanted), V(apply) (pristine file patched), V(update) (result of an
      older set replaced), V(revert) (patched file restored to pristine) or V(restore) (drift repaired).
  returned: success
  type: list
  elements: dict
  sample:
    - path: sglang/srt/environ.py
      action: apply
      before_sha256: 6c4c...
      after_sha256: 0b1d...
      pristine_sha256: 6c4c...
      pristine_source: disk
      note: pristine file (fresh install or reinstalled)
copies_changed:
  description: Folders and copies of O(keep_copies) made, put right or removed (or that would be, in check mode).
  returned: success
  type: list
  elements: str
  sample: [/var/lib/sglang-canon/patches/sglang-0.5.9/0001-strict-sglang-enable-spec-v2.patch]
files_changed:
  description: Package files written (or that would be written in check mode). Empty means no restart is needed.
  returned: success
  type: list
  elements: str
  sample: [sglang/srt/environ.py]
drifted:
  description: Package files found edited by hand, half patched or missing, and restored.
  returned: success
  type: list
  elements: str
  sample: [sglang/srt/speculative/eagle_worker_v2.py]
byte_compiled:
  description: Files byte-compiled by O(python) after writing.
  returned: success
  type: list
  elements: str
notes:
  description: Remarks, for example files of an older release dropped from the manifest.
  returned: success
  type: list
  elements: str
diff:
  description: Before/after of each package file that changes, with headers (diff mode).
  returned: diff mode and something changes
  type: list
  elements: dict
"""


def _python(module):
    python = module.params["python"]
    if "/" not in python:
        python = module.get_bin_path(python, required=True)
    if not os.access(python, os.X_OK):
        module.fail_json(msg="python %s is not an executable file" % python)
    return python


def _load_patches(module):
    patches = []
    for index, item in enumerate(module.params["patches"]):
        if isinstance(item, dict):
            name = item.get("name")
            content = item.get("content")
            path = item.get("path")
            if content is None and path is None:
                module.fail_json(msg="patches[%d]: a dictionary needs content (or path)" % index)
            if content is None:
                item = path
            else:
                if not name:
                    module.fail_json(msg="patches[%d]: a dictionary with content needs a name" % index)
                patches.append(parse_patch(str(name), to_bytes(content, errors="surrogate_or_strict")))
                continue
        if not isinstance(item, str):
            module.fail_json(msg="patches[%d]: expected a path or a dictionary, got %r" % (index, item))
        path = os.path.expanduser(item)
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except (IOError, OSError) as exc:
            module.fail_json(msg="cannot read patch %s: %s" % (path, to_native(exc)))
        patches.append(parse_patch(os.path.basename(path), data))
    names = [p.name for p in patches]
    duplicates = sorted(set(n for n in names if names.count(n) > 1))
    if duplicates:
        module.fail_json(msg="patch names must be unique in a set: %s" % ", ".join(duplicates))
    return patches


def _run(module, argv, what):
    rc, out, err = module.run_command(argv, cwd="/", environ_update={"LC_ALL": "C", "PYTHONDONTWRITEBYTECODE": "1"})
    if rc != 0:
        raise PatchError("%s failed (rc=%s): %s" % (what, rc, (err or out).strip()[-2000:]))
    return out


def node_program():
    """Source of module_utils/package_patch_node.py: shipped in the module's payload, run by the package's Python."""
    loader = getattr(package_patch_node, "__loader__", None)
    source = loader.get_source(package_patch_node.__name__) if loader is not None and hasattr(loader, "get_source") else None
    if not source:
        with open(package_patch_node.__file__) as handle:
            source = handle.read()
    return source


def _compile_check(module, python, plan):
    """Compile every would-be .py source with the target interpreter; nothing is written in the package."""
    pending = [f for f in plan.files_changed if f.path.endswith(".py")]
    if not pending:
        return
    tmpdir = tempfile.mkdtemp(prefix="package-patch-", dir=getattr(module, "tmpdir", None))
    try:
        argv = [python, "-c", node_program(), "compile-check"]
        for index, fplan in enumerate(pending):
            path = os.path.join(tmpdir, "%d.py" % index)
            with open(path, "wb") as fh:
                fh.write(fplan.desired)
            argv.extend([path, fplan.path])
        try:
            _run(module, argv, "compiling the patched sources with %s" % python)
        except PatchError as exc:
            raise PatchError("the patched sources do not compile; nothing was changed: %s" % exc)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            python=dict(type="str", required=True),
            package=dict(type="str", required=True),
            version=dict(type="str", required=True),
            patches=dict(type="list", elements="raw", default=[]),
            state=dict(type="str", choices=["present", "absent"], default="present"),
            manifest=dict(type="path", required=True),
            pristine_dir=dict(type="path"),
            pristine_wheel=dict(type="path"),
            byte_compile=dict(type="bool", default=True),
            keep_copies=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    package = params["package"]
    manifest_path = params["manifest"]
    pristine_dir = params["pristine_dir"] or default_pristine_dir(manifest_path)
    result = dict(changed=False, package=package, manifest=manifest_path)

    try:
        python = _python(module)
        patches = _load_patches(module)
        if params["state"] == "present" and not patches:
            raise PatchError("state=present needs at least one patch")
        manifest = load_manifest(manifest_path)
        wanted = target_paths(patches) + sorted((manifest or {}).get("files", {}))
        info = parse_probe_output(
            package,
            _run(module, [python, "-c", node_program(), "probe", package] + wanted,
                 "finding %s with %s" % (package, python)),
        )
        result.update(installed_version=info.version, site_packages=info.base)
        plan = build_plan(
            info,
            package,
            params["version"],
            patches,
            params["state"],
            manifest_path,
            pristine_dir=pristine_dir,
            wheel_path=params["pristine_wheel"],
        )
        _compile_check(module, python, plan)
    except PatchError as exc:
        result["msg"] = to_native(exc)
        module.fail_json(**result)

    changed_files = plan.files_changed
    result.update(
        changed=plan.changed,
        patches=[{"name": p.name, "sha256": p.sha256, "header": p.header.strip()} for p in patches],
        files=[f.as_dict() for f in plan.files],
        files_changed=[f.path for f in changed_files],
        drifted=[f.path for f in plan.files if f.drifted],
        byte_compiled=[],
        notes=list(plan.notes),
    )
    if module._diff and changed_files:
        result["diff"] = [file_diff(plan, f) for f in changed_files]

    if not module.check_mode and plan.changed:
        try:
            written = execute(plan)
        except (OSError, IOError) as exc:
            result["msg"] = "writing failed, the package files were put back as they were: %s" % to_native(exc)
            module.fail_json(**result)
        to_compile = [plan.abspath(rel) for rel in written if rel.endswith(".py")]
        if params["byte_compile"] and to_compile:
            try:
                _run(module, [python, "-c", node_program(), "byte-compile"] + to_compile, "byte-compiling with %s" % python)
            except PatchError as exc:
                result["msg"] = "files were patched but byte-compiling failed: %s" % exc
                module.fail_json(**result)
            result["byte_compiled"] = to_compile

    # After the package files: a copy says what was applied.
    if params["keep_copies"]:
        try:
            if params["state"] == "present":
                copies = sync_copies(params["keep_copies"], [(p.name, p.data) for p in patches], module.check_mode,
                                     uid=os.geteuid(), gid=os.getegid())
            else:
                copies = remove_copies(params["keep_copies"], [p.name for p in patches], module.check_mode)
        except (OSError, ValueError) as exc:
            result["msg"] = "the package files are done, but keeping the patches' copies failed: %s" % to_native(exc)
            module.fail_json(**result)
        result.update(copies_changed=copies, changed=result["changed"] or bool(copies))

    summary = {}
    for fplan in plan.files:
        summary.setdefault(fplan.action, []).append(fplan.path)
    result["msg"] = "%s %s %s: %s" % (
        params["state"],
        package,
        info.version,
        "; ".join("%s %s" % (action, ", ".join(paths)) for action, paths in sorted(summary.items())) or "nothing to do",
    )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
