#!/usr/bin/python
"""Ansible module: are files and folders already as a play would write them? One round trip."""

from __future__ import annotations

import grp
import hashlib
import os
import pwd
import stat

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
---
module: sglang_files_in_place
short_description: Compare files and folders of the node with what the play would write, in one round trip
description:
  - For each entry of O(files), reads the path on the node (without following a link) and reports
    how it differs from the wanted state. A file must be a regular file whose SHA-1 is
    O(files[].checksum); a folder must be a folder; either must have the given owner, group and mode.
  - M(ansible.builtin.copy) and M(ansible.builtin.template) cost two module round trips per file on
    a no-op (a stat, then the file module for the attributes). A role that writes several files
    asks this module first, once, and includes its writing tasks only when something differs; they
    then write, report the change and show the diff as before.
  - Changes nothing.
version_added: "0.1.0"
author: sglang-canon
options:
  files:
    description: The files and folders to compare, each with the state the play would give it.
    type: list
    elements: dict
    required: true
    suboptions:
      path:
        description: Absolute path on the node.
        type: path
        required: true
      state:
        description: C(file) for a regular file, C(directory) for a folder.
        type: str
        choices: [file, directory]
        default: file
      checksum:
        description:
          - SHA-1 (hex) of the content the play would write, e.g.
            C(lookup('ansible.builtin.template', 'x.j2') | hash('sha1')). Required for C(file).
          - Not logged, as the checksum of a secrets file is not shown either.
        type: str
      owner:
        description: Owner name (or numeric uid); O(owner) when omitted; not compared when neither is set.
        type: str
      group:
        description: Group name (or numeric gid); O(group) when omitted; not compared when neither is set.
        type: str
      mode:
        description: Permissions as an octal string such as C("0644"); not compared when omitted.
        type: str
  owner:
    description: Owner of the entries that do not name their own.
    type: str
  group:
    description: Group of the entries that do not name their own.
    type: str
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
notes:
  - A link where a file or folder is wanted differs (C(type)); the writing task decides what to do
    with it.
"""

EXAMPLES = r"""
- name: Compare the program and its unit with what this run writes
  sglang_files_in_place:
    files:
      - {path: /usr/local/libexec/tool, state: directory, mode: "0755"}
      - path: /usr/local/libexec/tool/run
        checksum: "{{ lookup('ansible.builtin.file', 'run', rstrip=false) | hash('sha1') }}"
        mode: "0755"
    owner: root
    group: root
  register: installed

- name: Write what differs
  ansible.builtin.include_tasks: write.yml
  when: not installed.in_place
"""

RETURN = r"""
in_place:
  description: True when every entry of O(files) is as wanted.
  returned: always
  type: bool
differences:
  description:
    - For each path that differs, what differs, in this order - C(absent), C(type) (a link or another
      kind of file), C(content), C(owner), C(group), C(mode).
  returned: always
  type: dict
  sample: {/etc/systemd/system/tool.service: [content, mode]}
"""

MODES = {"file": stat.S_ISREG, "directory": stat.S_ISDIR}


class BadEntry(ValueError):
    """An entry the module cannot compare (no checksum for a file, a mode that is not octal)."""


def _name_matches(wanted, number, lookup):
    if wanted.isdigit():
        return int(wanted) == number
    try:
        return lookup(number) == wanted
    except KeyError:  # an id without a name is not the named owner
        return False


def _sha1(path):
    digest = hashlib.sha1()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 16), b""):
            digest.update(block)
    return digest.hexdigest()


def compare(entry, user_name=lambda uid: pwd.getpwuid(uid).pw_name, group_name=lambda gid: grp.getgrgid(gid).gr_name):
    """What differs at entry['path'] from the wanted entry, as a list of reasons (empty: in place)."""
    state, path = entry.get("state") or "file", entry["path"]
    if state == "file" and not entry.get("checksum"):
        raise BadEntry(f"{path}: a checksum is required for a file")
    mode = entry.get("mode")
    if mode is not None:
        try:
            mode = int(str(mode), 8)
        except ValueError:
            raise BadEntry(f"{path}: mode {entry['mode']!r} is not an octal string such as '0644'") from None
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return ["absent"]
    if not MODES[state](info.st_mode):
        return ["type"]
    reasons = []
    if state == "file" and _sha1(path) != entry["checksum"].lower():
        reasons.append("content")
    if entry.get("owner") and not _name_matches(str(entry["owner"]), info.st_uid, user_name):
        reasons.append("owner")
    if entry.get("group") and not _name_matches(str(entry["group"]), info.st_gid, group_name):
        reasons.append("group")
    if mode is not None and stat.S_IMODE(info.st_mode) != mode:
        reasons.append("mode")
    return reasons


def main():
    module = AnsibleModule(
        argument_spec={
            "files": {
                "type": "list",
                "elements": "dict",
                "required": True,
                "options": {
                    "path": {"type": "path", "required": True},
                    "state": {"type": "str", "choices": ["file", "directory"], "default": "file"},
                    "checksum": {"type": "str", "no_log": True},
                    "owner": {"type": "str"},
                    "group": {"type": "str"},
                    "mode": {"type": "str"},
                },
            },
            "owner": {"type": "str"},
            "group": {"type": "str"},
        },
        supports_check_mode=True,
    )
    differences = {}
    try:
        for entry in module.params["files"]:
            if not entry["path"].startswith("/"):
                raise BadEntry(f"{entry['path']}: expected an absolute path")
            reasons = compare({**entry, "owner": entry["owner"] or module.params["owner"],
                               "group": entry["group"] or module.params["group"]})
            if reasons:
                differences[entry["path"]] = reasons
    except (BadEntry, OSError) as error:
        module.fail_json(msg=f"files: {error}")
    module.exit_json(changed=False, in_place=not differences, differences=differences)


if __name__ == "__main__":
    main()
