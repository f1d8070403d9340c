# -*- coding: utf-8 -*-
# Copyright: sglang-canon contributors
# MIT License (see roles/sglang_patches/meta/main.yml)
"""The copies of the applied patches a node keeps next to the manifest: the operator's record.

python_package_patch receives each patch's text; with O(keep_copies) it also keeps that text at
KEEP_COPIES/NAME (NAME may hold a set's folder, SET/FILE), in the same round trip as the patching.
Folders are made 0755 and files written 0644, both owned by uid:gid (root on a node); a copy that
differs, a folder or file whose mode or owner drifted, is put right (and reported, in check mode
without a write).
"""
from __future__ import annotations

import os
import shutil
import stat
import tempfile

FOLDER_MODE = 0o755
FILE_MODE = 0o644


def copy_path(directory, name):
    """directory/name, refusing a name that is absolute or climbs out of directory."""
    parts = name.split("/")
    if name.startswith("/") or any(part in ("", ".", "..") for part in parts):
        raise ValueError("patch name %r is not a relative path inside %s" % (name, directory))
    return os.path.join(directory, *parts)


def _wrong_owner_or_mode(path, mode, uid, gid):
    st = os.lstat(path)
    return stat.S_IMODE(st.st_mode) != mode or st.st_uid != uid or st.st_gid != gid


def _set_owner_and_mode(path, mode, uid, gid):
    os.chown(path, uid, gid)
    os.chmod(path, mode)


def _folders(directory, path):
    """The folders from directory down to path's own, outermost first."""
    folders = [directory]
    for part in os.path.relpath(os.path.dirname(path), directory).split(os.sep):
        if part != os.curdir:
            folders.append(os.path.join(folders[-1], part))
    return folders


def _read(path):
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def _write(path, data, uid, gid):
    """data to path through a temporary file in the same folder and os.replace."""
    fd, temporary = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), suffix=".tmp",
                                     dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        _set_owner_and_mode(temporary, FILE_MODE, uid, gid)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def sync_copies(directory, copies, check_mode=False, uid=0, gid=0):
    """Keep each (name, data) of copies at directory/name. Returns the folders and files made or
    put right (those that would be, in check mode), in order, each once."""
    changed = []
    for name, data in copies:
        path = copy_path(directory, name)
        for folder in _folders(directory, path):
            if folder in changed:
                continue
            if not os.path.isdir(folder):
                changed.append(folder)
                if not check_mode:
                    os.mkdir(folder)
                    _set_owner_and_mode(folder, FOLDER_MODE, uid, gid)
            elif _wrong_owner_or_mode(folder, FOLDER_MODE, uid, gid):
                changed.append(folder)
                if not check_mode:
                    _set_owner_and_mode(folder, FOLDER_MODE, uid, gid)
        if _read(path) != data:
            changed.append(path)
            if not check_mode:
                _write(path, data, uid, gid)
        elif _wrong_owner_or_mode(path, FILE_MODE, uid, gid):
            changed.append(path)
            if not check_mode:
                _set_owner_and_mode(path, FILE_MODE, uid, gid)
    return changed


def remove_copies(directory, names, check_mode=False):
    """Remove the copies of names: a set's whole folder (directory/SET of SET/FILE), or the file
    of a name without one. Returns what was (or would be) removed."""
    removed = []
    for name in names:
        copy_path(directory, name)  # refuses a name outside directory
        top = copy_path(directory, name.split("/")[0])
        if top in removed or not os.path.lexists(top):
            continue
        removed.append(top)
        if not check_mode:
            if os.path.isdir(top) and not os.path.islink(top):
                shutil.rmtree(top)
            else:
                os.unlink(top)
    return removed
