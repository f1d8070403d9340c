#!/usr/bin/python
"""Ansible module: make one nftables table equal to what a rules file loads, touching nothing else."""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.nft_table import differences

DOCUMENTATION = r"""
---
module: sglang_nft_table
short_description: Keep one nftables table equal to a rules file, leaving every other table alone
description:
  - Compares the table O(family) O(table) as the kernel holds it (C(nft -j list table)) with the
    table the rules file O(path) loads. The expected side is read by loading the file into a
    scratch network namespace (C(unshare --net)), so both sides are in the kernel's canonical form
    and handles, counters and spelling do not count as differences.
  - When they differ (a rule deleted or added by hand, a table missing after C(nft flush ruleset),
    a new rules file), loads the file with C(nft -f) in one transaction; the file itself must replace
    only its own table (begin with C(table FAMILY NAME {}) and C(delete table FAMILY NAME)).
  - With O(state=absent), deletes the table when it exists.
  - In check mode nothing is loaded or deleted; C(changed) says whether it would be, and
    C(drifted) what differs, for the drift scan.
version_added: "0.1.0"
author: sglang-canon
options:
  table:
    description: Name of the table this module owns.
    type: str
    required: true
  family:
    description: Family of the table.
    type: str
    default: inet
    choices: [ip, ip6, inet, arp, bridge, netdev]
  path:
    description: Rules file that defines the table (validated with C(nft -c -f) before it was written). Required when O(state=present).
    type: path
  state:
    description: C(present) makes the live table equal to the file's; C(absent) deletes it.
    type: str
    default: present
    choices: [present, absent]
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
requirements:
  - nft (Debian package nftables) and unshare (util-linux) on the node; root
notes:
  - Other tables are never read, flushed or changed.
"""

EXAMPLES = r"""
- name: Load the project's table when the live one differs from the rules file
  sglang_nft_table:
    table: sglang_canon
    path: /etc/nftables.d/sglang-canon.nft

- name: Remove the project's table
  sglang_nft_table:
    table: sglang_canon
    state: absent
"""

RETURN = r"""
drifted:
  description: How the live table differed from the rules file before the run (empty when equal).
  returned: always
  type: list
  elements: str
  sample: ["1 rule(s) missing"]
"""

_SCRATCH = 'nft -f "$1" && nft -j list table "$2" "$3"'


def _live(module, nft, family, table):
    rc, out, err = module.run_command([nft, "-j", "list", "table", family, table])
    if rc == 0:
        return out
    if "No such file or directory" in err:
        return ""
    module.fail_json(msg=f"nft list table {family} {table} failed: {err.strip()}")
    return None


def _expected(module, family, table, path):
    unshare = module.get_bin_path("unshare", required=True)
    rc, out, err = module.run_command([unshare, "--net", "--", "sh", "-c", _SCRATCH, "sh", path, family, table])
    if rc != 0:
        module.fail_json(msg=f"{path} does not load into a scratch network namespace: {err.strip()}")
    return out


def main():
    module = AnsibleModule(
        argument_spec={
            "table": {"type": "str", "required": True},
            "family": {"type": "str", "default": "inet", "choices": ["ip", "ip6", "inet", "arp", "bridge", "netdev"]},
            "path": {"type": "path"},
            "state": {"type": "str", "default": "present", "choices": ["present", "absent"]},
        },
        required_if=[("state", "present", ["path"])],
        supports_check_mode=True,
    )
    module.run_command_environ_update = {"LC_ALL": "C"}
    table, family, path, state = (module.params[k] for k in ("table", "family", "path", "state"))

    nft = module.get_bin_path("nft")
    if nft is None:
        if state == "absent":
            module.exit_json(changed=False, drifted=[])
        if module.check_mode:  # the package is installed by an earlier task of the real run
            module.exit_json(changed=True, drifted=["nft not installed"])
        module.fail_json(msg="nft not found on the node (Debian package nftables)")

    live = _live(module, nft, family, table)
    if state == "absent":
        if live and not module.check_mode:
            rc, _, err = module.run_command([nft, "delete", "table", family, table])
            if rc != 0:
                module.fail_json(msg=f"nft delete table {family} {table} failed: {err.strip()}")
        module.exit_json(changed=bool(live), drifted=["table present"] if live else [])

    try:
        with open(path, "rb"):
            pass
    except OSError as error:
        if module.check_mode:  # written by an earlier task of the real run
            module.exit_json(changed=True, drifted=[f"{path} not written yet"])
        module.fail_json(msg=f"cannot read {path}: {error}")

    expected = _expected(module, family, table, path)
    drifted = differences(live, expected)
    if drifted and not module.check_mode:
        rc, _, err = module.run_command([nft, "-f", path])
        if rc != 0:
            module.fail_json(msg=f"nft -f {path} failed, the table is as it was: {err.strip()}", drifted=drifted)
        still = differences(_live(module, nft, family, table), expected)
        if still:
            module.fail_json(msg=f"after nft -f {path} the table still differs: {'; '.join(still)}", drifted=drifted)
    module.exit_json(changed=bool(drifted), drifted=drifted)


if __name__ == "__main__":
    main()
