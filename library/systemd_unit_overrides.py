#!/usr/bin/python
"""Ansible module: find, and remove, what overrides a managed systemd unit."""

from __future__ import annotations

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils import systemd_overrides

DOCUMENTATION = r"""
---
module: systemd_unit_overrides
short_description: Find and remove the drop-ins and unit files that override a managed systemd unit
description:
  - A managed unit is only what it says if nothing overrides it. This module lists every drop-in
    (C(*.conf)) systemd would merge into O(unit) -- its own C(NAME.d) folders, the C(PREFIX-.service.d)
    folders of dashed names and the type-wide C(service.d), in every folder of the system unit search
    path, C(/etc/systemd/system.control) and C(/run/systemd/system.control) (written by
    C(systemctl set-property)) and C(/run/systemd/transient) included -- every other unit file of the
    same name, and the C(DropInPaths) systemd has loaded (which may predate a daemon-reload).
  - Anything there that is not O(fragment) or in O(allowed) is foreign. With O(state=absent) the
    foreign files that belong to this unit alone (a unit file of its name or a file in its own
    C(NAME.d) folder, under C(/etc) or C(/run)) are removed, with their emptied folders; a foreign
    drop-in that also applies to other units (C(service.d), C(PREFIX-.service.d)) or that a package
    installed (C(/usr), C(/lib)) is not removed and fails the task, naming it.
  - The caller reloads systemd and restarts the unit when the result is changed.
  - Generic; the unit is a parameter, for sglang.service and any other unit sglang-canon manages.
version_added: "0.1.0"
author: sglang-canon
options:
  unit:
    description: Full unit name, e.g. C(sglang.service).
    type: str
    required: true
  fragment:
    description: Path of the managed unit file, e.g. C(/etc/systemd/system/sglang.service).
    type: path
    required: true
  allowed:
    description: Drop-in paths the project itself writes for this unit.
    type: list
    elements: path
    default: []
  state:
    description: C(absent) removes the foreign overrides it can; C(reported) only lists them.
    type: str
    choices: [absent, reported]
    default: absent
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
notes:
  - In check mode nothing is removed; changed says whether anything would be.
"""

EXAMPLES = r"""
- name: Remove drop-ins and overrides that sglang-canon did not write
  systemd_unit_overrides:
    unit: sglang.service
    fragment: /etc/systemd/system/sglang.service
  register: overrides

- name: Reload systemd when one was removed
  ansible.builtin.systemd_service:
    daemon_reload: true
  when: overrides is changed
"""

RETURN = r"""
overrides:
  description: Every foreign override found, sorted.
  returned: always
  type: list
  elements: str
  sample: [/etc/systemd/system/sglang.service.d/zz.conf]
removed:
  description: The overrides removed (or that would be, in check mode).
  returned: always
  type: list
  elements: str
drifted:
  description: Same as overrides; the drift callback names them in its report.
  returned: always
  type: list
  elements: str
"""


def _existing_files(unit):
    unit_files, dropin_dirs = systemd_overrides.candidate_paths(unit, systemd_overrides.SEARCH_PATH)
    found, seen_dirs = [], set()
    for path in unit_files:
        if os.path.lexists(path):
            found.append(path)
    for folder in dropin_dirs:
        real = os.path.realpath(folder)
        if real in seen_dirs or not os.path.isdir(folder):
            continue  # /lib is /usr/lib on merged-/usr systems
        seen_dirs.add(real)
        found += [f"{folder}/{name}" for name in sorted(os.listdir(folder)) if name.endswith(".conf")]
    return found


def main():
    module = AnsibleModule(
        argument_spec={
            "unit": {"type": "str", "required": True},
            "fragment": {"type": "path", "required": True},
            "allowed": {"type": "list", "elements": "path", "default": []},
            "state": {"type": "str", "choices": ["absent", "reported"], "default": "absent"},
        },
        supports_check_mode=True,
    )
    unit, fragment = module.params["unit"], module.params["fragment"]
    rc, out, err = module.run_command(
        ["systemctl", "show", unit, "--property=DropInPaths"], environ_update={"LC_ALL": "C"}
    )
    if rc != 0:
        module.fail_json(msg=f"systemctl show {unit} failed: {err.strip()}")
    loaded = systemd_overrides.parse_show(out).get("DropInPaths", "").split()
    foreign, removable = systemd_overrides.foreign_overrides(
        unit, fragment, _existing_files(unit), loaded, module.params["allowed"]
    )
    kept = [path for path in foreign if path not in removable]
    result = {"overrides": foreign, "drifted": foreign, "removed": [], "changed": bool(foreign)}
    if module.params["state"] == "reported" or module.check_mode:
        result["removed"] = removable if module.params["state"] == "absent" else []
        module.exit_json(**result)
    for path in removable:
        if os.path.lexists(path):
            os.remove(path)
        result["removed"].append(path)
        folder = os.path.dirname(path)
        if folder.endswith(f"/{unit}.d") and os.path.isdir(folder) and not os.listdir(folder):
            os.rmdir(folder)
    if kept:
        module.fail_json(
            msg=f"{unit} is overridden by {', '.join(kept)}: these apply to other units too or belong to a package, so "
            f"sglang-canon does not remove them; remove them (or move their settings into the inventory) and run again",
            **result,
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
