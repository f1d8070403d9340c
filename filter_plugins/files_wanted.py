"""A role's declaration of the files it writes, as sglang_files_in_place compares it.

sglang_service and sglang_watchdog each declare every folder and file they write once, as a
list (their vars/main.yml): each entry has path and mode, and exactly one of state: directory
(a folder), src (a program of the role's files/, copied) or template (a file of its templates/,
rendered). Their write.yml writes each kind with one task looping over those entries; their
comparison gives the module this filter's result. sglang_files_wanted(files, copied, rendered)
takes the contents of the src entries (query('ansible.builtin.file', ...)) and of the template
entries (query('ansible.builtin.template', ...)), each in the declared order, and returns the
module's entries: path, mode, state, and a file's SHA-1. Unit-tested in
tests/unit/test_files_in_place_module.py.
"""

import hashlib

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # pragma: no cover - only outside Ansible
    AnsibleFilterError = ValueError

# The keys that say how an entry is written, one task of write.yml each.
KINDS = ("state", "src", "template")


def kind(entry):
    """Which of KINDS the entry is written by; refuses an entry with none or several."""
    kinds = [key for key in KINDS if key in entry]
    if len(kinds) != 1 or entry.get("state", "directory") != "directory":
        raise AnsibleFilterError(
            f"{entry.get('path')}: expected exactly one of state: directory, src or template, got {sorted(entry)}")
    return kinds[0]


def sglang_files_wanted(files, copied, rendered):
    """The sglang_files_in_place entries of a declaration, a file's content given as its SHA-1."""
    contents = {"src": list(copied), "template": list(rendered)}
    wanted = []
    for entry in files:
        how = kind(entry)
        item = {"path": entry["path"], "mode": entry["mode"]}
        if how == "state":
            item["state"] = "directory"
        else:
            if not contents[how]:
                raise AnsibleFilterError(f"{entry['path']}: no content given for its {how}")
            item["checksum"] = hashlib.sha1(contents[how].pop(0).encode("utf-8")).hexdigest()
        wanted.append(item)
    left = {how: len(texts) for how, texts in contents.items() if texts}
    if left:
        raise AnsibleFilterError(f"more contents given than entries declare: {left}")
    return wanted


class FilterModule:
    """sglang-canon's filter of declared files."""

    def filters(self):
        return {"sglang_files_wanted": sglang_files_wanted}
