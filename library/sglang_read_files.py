#!/usr/bin/python
"""Ansible module: read several small text files of a node in one round trip."""

from __future__ import annotations

import errno

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
---
module: sglang_read_files
short_description: Read several small text files of the node in one round trip
description:
  - Reads each file of O(files) as UTF-8 text and returns the texts by name; a file that does
    not exist is left out of RV(contents) and named in RV(missing).
  - Replaces a loop of M(ansible.builtin.stat) followed by a loop of M(ansible.builtin.slurp).
    A run that reads N records costs one module round trip instead of up to 2N, which matters
    on a no-op run where every task is overhead.
  - Fails, naming the file, when a path exists but cannot be read as a file (a directory, no
    permission) or is larger than O(max_bytes), because a record the play cannot read is not
    the same as no record.
  - Changes nothing.
version_added: "0.1.0"
author: sglang-canon
options:
  files:
    description:
      - Name of each file to read and its absolute path. The names are the keys of
        RV(contents).
    type: dict
    required: true
  max_bytes:
    description: The largest file read, in bytes; the records read this way are small.
    type: int
    default: 1048576
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
notes:
  - Bytes that are not UTF-8 are replaced by U+FFFD, as the documents that use the texts print
    them.
"""

EXAMPLES = r"""
- name: Read the record of an earlier run and a measured choice, those that exist
  sglang_read_files:
    files:
      applied: /var/lib/sglang-canon/nccl/applied.json
      choice: /var/lib/sglang-canon/nccl/choice.json
  register: state

- name: Use the record when there is one
  ansible.builtin.set_fact:
    previous: "{{ state.contents.applied | default('{}') | from_json }}"
"""

RETURN = r"""
contents:
  description: The text of each file that exists, by its name in O(files).
  returned: always
  type: dict
  sample:
    applied: '{"places": {"sitecustomize": "/usr/lib/python3/dist-packages/sitecustomize.py"}}'
missing:
  description: The names of O(files) whose path does not exist, in the order given.
  returned: always
  type: list
  elements: str
  sample: [choice]
"""


class UnreadableFile(Exception):
    """A path that exists but is not a readable file of at most max_bytes."""


def read_text(path, max_bytes):
    """The text of the file at path, or None when nothing exists there."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(max_bytes + 1)
    except FileNotFoundError:
        return None
    except OSError as error:
        reason = "a directory" if error.errno == errno.EISDIR else error.strerror
        raise UnreadableFile(f"{path}: cannot be read ({reason})") from error
    if len(data) > max_bytes:
        raise UnreadableFile(f"{path}: larger than max_bytes ({max_bytes} bytes)")
    return data.decode("utf-8", errors="replace")


def read_files(files, max_bytes):
    """(contents by name of the files that exist, names of those that do not)."""
    contents, missing = {}, []
    for name, path in files.items():
        text = read_text(path, max_bytes)
        if text is None:
            missing.append(name)
        else:
            contents[name] = text
    return contents, missing


def main():
    module = AnsibleModule(
        argument_spec={
            "files": {"type": "dict", "required": True},
            "max_bytes": {"type": "int", "default": 1048576},
        },
        supports_check_mode=True,
    )
    files = module.params["files"]
    relative = sorted(name for name, path in files.items() if not str(path).startswith("/"))
    if relative:
        module.fail_json(msg=f"files: expected an absolute path for each name, got a relative one for {relative}")
    try:
        contents, missing = read_files({name: str(path) for name, path in files.items()}, module.params["max_bytes"])
    except UnreadableFile as error:
        module.fail_json(msg=str(error))
    module.exit_json(changed=False, contents=contents, missing=missing)


if __name__ == "__main__":
    main()
