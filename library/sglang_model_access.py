#!/usr/bin/python
"""Ansible module: are the model folders there, and can the service user read them? One round trip."""

from __future__ import annotations

import os
import pwd

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
---
module: sglang_model_access
short_description: Check that each model folder exists and that the service user can read it
description:
  - For each folder of O(folders), reports whether it is a folder on the node (RV(missing) names
    those that are not, a relative path among them).
  - When O(user) exists, tries each folder that exists as that user, with its own groups
    (C(runuser --user=USER -- find FOLDER -maxdepth 1 ...)), because the user must traverse every
    folder down to it, list it and read the files in it. RV(denied) names each folder it cannot read
    and why. A user that does not exist yet (a first deploy, before the role creates it) is
    reported in RV(user_exists), and nothing is tried.
  - Replaces a loop of M(ansible.builtin.stat), a M(ansible.builtin.getent) and a loop of
    M(ansible.builtin.command), in one module round trip instead of five on a no-op run.
  - Changes nothing.
version_added: "0.1.0"
author: sglang-canon
options:
  folders:
    description:
      - The name of each folder (the variable that sets it, e.g. C(model_path)) and its absolute
        path. The names are those of RV(missing) and RV(denied).
    type: dict
    required: true
  user:
    description: The user the server runs as.
    type: str
    required: true
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
requirements:
  - runuser (util-linux), run as root
"""

EXAMPLES = r"""
- name: Look up the model folders and try each as the service user
  sglang_model_access:
    folders:
      model_path: /srv/models/target
      speculative_draft_model_path: /srv/models/draft
    user: sglang
  register: models

- name: Fail naming each folder that is missing or unreadable
  ansible.builtin.assert:
    that: (models.missing + models.denied) | length == 0
"""

RETURN = r"""
missing:
  description: The folders of O(folders) that are not a folder on the node, in the order given.
  returned: always
  type: list
  elements: dict
  sample: [{name: model_path, path: /srv/models/absent}]
user_exists:
  description: Whether O(user) exists on the node (the folders were tried as it only then).
  returned: always
  type: bool
denied:
  description:
    - The folders O(user) cannot read, with the reason (runuser's or find's first error line, or
      the entries it cannot read).
  returned: always
  type: list
  elements: dict
  sample: [{name: model_path, path: /srv/locked/target, reason: "find: '/srv/locked/target': Permission denied"}]
"""

# find prints each entry the user cannot read, and each folder it cannot enter.
_UNREADABLE = ["-maxdepth", "1", "(", "!", "-readable", "-o", "-type", "d", "!", "-executable", ")", "-print"]


def user_exists(user):
    """Whether the passwd database knows user."""
    try:
        pwd.getpwnam(user)
    except KeyError:
        return False
    return True


def denial(rc, stdout, stderr):
    """Why the user cannot read the folder, from runuser+find's result; None when it can."""
    unreadable = [line for line in stdout.splitlines() if line]
    if rc == 0 and not unreadable:
        return None
    first_error = next((line for line in stderr.splitlines() if line.strip()), "")
    if first_error:
        return first_error
    if unreadable:
        return "cannot read " + ", ".join(unreadable)
    return f"runuser exited with {rc}"


def is_folder(path):
    """An absolute path to a folder (a relative one would be read from the module's own cwd)."""
    return os.path.isabs(path) and os.path.isdir(path)


def check_folders(folders, user, run, exists=user_exists, isdir=is_folder):
    """(missing, user_exists, denied) for folders {name: path}; run(argv) -> (rc, stdout, stderr)."""
    missing = [{"name": name, "path": path} for name, path in folders.items() if not isdir(path)]
    known = exists(user)
    denied = []
    if known:
        for name, path in folders.items():
            if not isdir(path):
                continue
            rc, stdout, stderr = run(["runuser", f"--user={user}", "--", "find", path, *_UNREADABLE])
            reason = denial(rc, stdout, stderr)
            if reason is not None:
                denied.append({"name": name, "path": path, "reason": reason})
    return missing, known, denied


def main():
    module = AnsibleModule(
        argument_spec={
            "folders": {"type": "dict", "required": True},
            "user": {"type": "str", "required": True},
        },
        supports_check_mode=True,
    )
    folders = {name: str(path) for name, path in module.params["folders"].items()}

    def run(argv):
        return module.run_command(argv, cwd="/")

    missing, known, denied = check_folders(folders, module.params["user"], run)
    module.exit_json(changed=False, missing=missing, user_exists=known, denied=denied)


if __name__ == "__main__":
    main()
