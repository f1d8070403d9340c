#!/usr/bin/python
"""Ansible module: who listens on a TCP port, and which systemd unit they belong to."""

from __future__ import annotations

import os
import re

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
---
module: sglang_port_listeners
short_description: List the processes listening on a TCP port and their systemd units
description:
  - Reads C(/proc/net/tcp) and C(/proc/net/tcp6) for sockets in LISTEN state on O(port), maps
    each socket to the processes holding it and each process to its systemd unit (from
    C(/proc/PID/cgroup)).
  - Used before a deployment to refuse a port already taken by another program, while a
    port held by the service being deployed is fine. With O(owner), the module refuses such a
    port itself, naming each other program (one task instead of a lookup and an assert).
  - Needs no tools on the node (no ss, no lsof). Changes nothing.
version_added: "0.1.0"
author: sglang-canon
options:
  port:
    description: TCP port to look up.
    type: int
    required: true
  owner:
    description:
      - The systemd unit that may hold the port (the service being deployed). When given, the
        module fails if any other process listens on it.
    type: str
  name:
    description: What the port is called in the refusal, e.g. the variable that sets it.
    type: str
    default: port
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
notes:
  - Run as root to see the processes of every user.
"""

EXAMPLES = r"""
- name: Find who listens on the server's port
  sglang_port_listeners:
    port: 30000
  register: port

- name: Refuse a port taken by another program
  ansible.builtin.assert:
    that: port.listeners | rejectattr('unit', 'equalto', 'sglang.service') | list | length == 0

- name: The same in one task, the refusal naming the variable behind the port
  sglang_port_listeners:
    port: 30000
    owner: sglang.service
    name: sglang_server_args.port
"""

RETURN = r"""
listeners:
  description: One entry per listening socket and process holding it.
  returned: always
  type: list
  elements: dict
  sample:
    - address: 127.0.0.1
      port: 30000
      pid: 812
      command: python3
      unit: sglang.service
"""

_LISTEN = "0A"


def parse_proc_net_tcp(text, port):
    """Return [(address, inode)] of LISTEN sockets on port from /proc/net/tcp{,6} text."""
    found = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != _LISTEN:
            continue
        address_hex, port_hex = fields[1].rsplit(":", 1)
        if int(port_hex, 16) != port:
            continue
        found.append((_decode_address(address_hex), int(fields[9])))
    return found


def _decode_address(address_hex):
    raw = bytes.fromhex(address_hex)
    # The kernel prints each 32-bit word in host (little-endian) order.
    words = [raw[i:i + 4][::-1] for i in range(0, len(raw), 4)]
    packed = b"".join(words)
    if len(packed) == 4:
        return ".".join(str(b) for b in packed)
    groups = [packed[i:i + 2].hex() for i in range(0, 16, 2)]
    if groups[:6] == ["0000"] * 5 + ["ffff"]:
        return "::ffff:" + ".".join(str(b) for b in packed[12:])
    return ":".join(groups)


def unit_of(cgroup_text):
    """The systemd unit (e.g. sglang.service) named in a /proc/PID/cgroup text, or None."""
    for line in cgroup_text.splitlines():
        path = line.split(":", 2)[-1]
        units = re.findall(r"[^/]+\.(?:service|scope)", path)
        if units:
            return units[-1]
    return None


def _read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def _socket_owners(inodes):
    owners = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            match = re.fullmatch(r"socket:\[(\d+)\]", target)
            if match and int(match.group(1)) in inodes:
                owners.setdefault(int(match.group(1)), set()).add(int(pid))
    return owners


def listeners_on(port):
    sockets = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        sockets.extend(parse_proc_net_tcp(_read(table), port))
    owners = _socket_owners({inode for _, inode in sockets})
    result = []
    for address, inode in sockets:
        for pid in sorted(owners.get(inode, ())):
            result.append({
                "address": address,
                "port": port,
                "pid": pid,
                "command": _read(f"/proc/{pid}/comm").strip(),
                "unit": unit_of(_read(f"/proc/{pid}/cgroup")),
            })
    return result


def refusal(name, port, listeners, owner):
    """Why the port cannot be used, naming each listener that is not owner's; None when it can."""
    others = [one for one in listeners if one["unit"] != owner]
    if not others:
        return None
    holders = ", ".join(f"{one['command']} (pid {one['pid']}, unit {one['unit'] or 'none'})" for one in others)
    return f"{name}: {port} is already taken by {holders}"


def main():
    module = AnsibleModule(
        argument_spec={
            "port": {"type": "int", "required": True},
            "owner": {"type": "str"},
            "name": {"type": "str", "default": "port"},
        },
        supports_check_mode=True,
    )
    port = module.params["port"]
    if not 1 <= port <= 65535:
        module.fail_json(msg=f"{module.params['name']}: expected 1..65535, got {port}")
    listeners = listeners_on(port)
    if module.params["owner"] is not None:
        why = refusal(module.params["name"], port, listeners, module.params["owner"])
        if why:
            module.fail_json(msg=why, listeners=listeners)
    module.exit_json(changed=False, listeners=listeners)


if __name__ == "__main__":
    main()
