#!/usr/bin/python
"""Ansible module: make one nftables table equal to what a rules file loads, touching nothing else."""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.nft_table import defines_table, differences, identifier_error, ownership

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
    only its own table (begin with C(table FAMILY NAME {}) and C(delete table FAMILY NAME)) and give
    it the comment O(owner_comment).
  - The table comment O(owner_comment) marks a table as the caller's. A table of that name without it
    belongs to someone else and is refused, naming O(name), before anything changes (in check mode
    too). Other tables that carry the mark are the caller's under an earlier name; they are deleted
    after the file is loaded, so none is left guarding ports nobody manages.
  - O(table) must be an nft identifier (a letter, then letters, digits or C(_), at most 64
    characters), checked before nft runs, since nft joins its arguments into one command line and runs
    each C(;)-separated command of it.
  - A table of that name without the mark that the rules file O(earlier_rules_path) defines (written
    by a release of the caller from before the mark, which carries O(earlier_rules_signature)) is the
    caller's; it is replaced (and so gets the mark) or deleted like a marked one.
  - With O(state=absent), deletes every table that carries the mark; a table of that name without it
    is left alone.
  - In check mode nothing is loaded or deleted; C(changed) says whether it would be, and
    C(drifted) what differs, for the drift scan.
  - No collection of the ansible package does this, so it is a module of this project
    (community.general's C(iptables_state) saves and restores iptables rules, ansible.posix's
    C(firewalld) drives firewalld's zones; neither keeps one nftables table of one's own).
version_added: "0.1.0"
author: sglang-canon
options:
  table:
    description: Name of the table this module owns; an nft identifier (C(^[A-Za-z][A-Za-z0-9_]{0,63}$)).
    type: str
    required: true
  family:
    description: Family of the table.
    type: str
    default: inet
    choices: [ip, ip6, inet, arp, bridge, netdev]
  path:
    description: Rules file that defines the table (validated with C(nft -c -f) before it was written). Required when
      O(state=present), unless O(only_check_owner).
    type: path
  owner_comment:
    description: The table comment that marks a table as the caller's; the rules file gives its table this comment.
    type: str
    required: true
  name:
    description: What O(table) is called in a refusal, e.g. the variable that sets it.
    type: str
    default: table
  earlier_rules_path:
    description:
      - The caller's rules file as an earlier release may have left it; a table of that name without the
        mark that this file defines is taken over, not refused. Unset, an unmarked table is always another
        owner's.
    type: path
  earlier_rules_signature:
    description: Text the caller's rules files always carry (their header), so that a file another owner
      put at O(earlier_rules_path) does not count.
    type: str
    default: (roles/sglang_firewall)
  only_check_owner:
    description:
      - Only refuse a table of that name that another owner made, reading nothing else and changing
        nothing (O(path) is not needed). Run before the rules file is written, so that a name that is
        refused never reaches the file the boot unit loads.
    type: bool
    default: false
  state:
    description: C(present) makes the live table equal to the file's; C(absent) deletes the caller's tables.
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
  - Other tables are only read (C(nft -t list ruleset), for their names and comments), never flushed or changed.
  - nft 1.0.6 leaves table comments out of its JSON listing; the mark is read from the text listing.
"""

EXAMPLES = r"""
- name: Refuse a table of that name made by another owner, before the rules file is written
  sglang_nft_table:
    table: sglang_canon
    owner_comment: managed by sglang-canon
    name: sglang_firewall_table
    earlier_rules_path: /etc/nftables.d/sglang-canon.nft
    only_check_owner: true

- name: Load the project's table when the live one differs from the rules file
  sglang_nft_table:
    table: sglang_canon
    path: /etc/nftables.d/sglang-canon.nft
    owner_comment: managed by sglang-canon
    name: sglang_firewall_table

- name: Remove the project's tables
  sglang_nft_table:
    table: sglang_canon
    owner_comment: managed by sglang-canon
    state: absent
"""

RETURN = r"""
drifted:
  description: How the live tables differed from the rules file before the run (empty when equal).
  returned: always
  type: list
  elements: str
  sample: ["1 rule(s) missing", "table inet sglang_old still loaded (marked as ours, under another name)"]
"""

_SCRATCH = 'nft -f "$1" && nft -j list table "$2" "$3"'


def _tables(module, nft, mark, family, table):
    """(state, others) of module_utils.nft_table.ownership, from the node's text listing."""
    rc, out, err = module.run_command([nft, "-t", "list", "ruleset"])
    if rc != 0:
        module.fail_json(msg=f"nft -t list ruleset failed: {err.strip()}")
    return ownership(out, family, table, mark)


def _earlier_release_made(module, family, table):
    """Whether the table is one an earlier release made, before tables carried the mark: the
    caller's own rules file (earlier_rules_path) defines it."""
    path = module.params["earlier_rules_path"]
    if not path:
        return False
    try:
        with open(path, encoding="utf-8", errors="replace") as rules:
            text = rules.read()
    except OSError:
        return False
    return defines_table(text, family, table, module.params["earlier_rules_signature"])


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


def _delete(module, nft, tables):
    for family, table in tables:  # identifiers: table_comments() lists no other names
        rc, _, err = module.run_command([nft, "delete", "table", family, table])
        if rc != 0:
            module.fail_json(msg=f"nft delete table {family} {table} failed: {err.strip()}")


def main():
    module = AnsibleModule(
        argument_spec={
            "table": {"type": "str", "required": True},
            "family": {"type": "str", "default": "inet", "choices": ["ip", "ip6", "inet", "arp", "bridge", "netdev"]},
            "path": {"type": "path"},
            "owner_comment": {"type": "str", "required": True},
            "name": {"type": "str", "default": "table"},
            "earlier_rules_path": {"type": "path"},
            "earlier_rules_signature": {"type": "str", "default": "(roles/sglang_firewall)"},
            "only_check_owner": {"type": "bool", "default": False},
            "state": {"type": "str", "default": "present", "choices": ["present", "absent"]},
        },
        supports_check_mode=True,
    )
    module.run_command_environ_update = {"LC_ALL": "C"}
    table, family, path, mark, name, only_owner, state = (
        module.params[k] for k in ("table", "family", "path", "owner_comment", "name", "only_check_owner", "state"))
    if state == "present" and not only_owner and not path:
        module.fail_json(msg="path is required with state=present")
    # Before nft runs at all, in check mode too: nft would run whatever a ';' in the name adds.
    refusal = identifier_error(table, name)
    if refusal:
        module.fail_json(msg=refusal)

    nft = module.get_bin_path("nft")
    if nft is None:  # no nft, no table of anyone's
        if state == "absent" or only_owner:
            module.exit_json(changed=False, drifted=[])
        if module.check_mode:  # the package is installed by an earlier task of the real run
            module.exit_json(changed=True, drifted=["nft not installed"])
        module.fail_json(msg="nft not found on the node (Debian package nftables)")

    held, others = _tables(module, nft, mark, family, table)
    earlier = held == "foreign" and _earlier_release_made(module, family, table)
    if earlier:  # ours, from before the mark: replaced (the load gives it the mark) or deleted
        held = "ours"
    if state == "absent":
        ours = ([(family, table)] if held == "ours" else []) + others
        if not module.check_mode:
            _delete(module, nft, ours)
        module.exit_json(changed=bool(ours), drifted=[f"table {f} {t} present" for f, t in ours])

    if held == "foreign":
        module.fail_json(msg=(
            f"{name}: the node already has a table {family} {table} that is not ours (its comment is not "
            f'"{mark}"); loading the rules file would replace it. Choose another name, or delete that table '
            "first if nothing needs it."))
    if only_owner:
        module.exit_json(changed=False, drifted=[])

    try:
        with open(path, "rb"):
            pass
    except OSError as error:
        if module.check_mode:  # written by an earlier task of the real run
            module.exit_json(changed=True, drifted=[f"{path} not written yet"])
        module.fail_json(msg=f"cannot read {path}: {error}")

    expected = _expected(module, family, table, path)
    table_drift = differences(_live(module, nft, family, table) if held == "ours" else "", expected)
    if earlier and not table_drift:  # nft's JSON has no comments: only a load adds the mark
        table_drift = ["table without the mark (made by an earlier release)"]
    drifted = table_drift + [f"table {f} {t} still loaded (marked as ours, under another name)" for f, t in others]
    if not module.check_mode:
        if table_drift:
            _load(module, nft, path, (family, table), expected, mark, drifted)
        # After ours is loaded: the ports stay guarded while the old table goes.
        _delete(module, nft, others)
    module.exit_json(changed=bool(drifted), drifted=drifted)


def _load(module, nft, path, key, expected, mark, drifted):
    family, table = key
    rc, _, err = module.run_command([nft, "-f", path])
    if rc != 0:
        module.fail_json(msg=f"nft -f {path} failed, the table is as it was: {err.strip()}", drifted=drifted)
    still = differences(_live(module, nft, family, table), expected)
    if still:
        module.fail_json(msg=f"after nft -f {path} the table still differs: {'; '.join(still)}", drifted=drifted)
    held, _ = _tables(module, nft, mark, family, table)
    if held != "ours":  # the next run would take the table for someone else's
        module.fail_json(msg=f'{path} does not give table {family} {table} the comment "{mark}"', drifted=drifted)


if __name__ == "__main__":
    main()
