"""Pure helpers of tests/testnode (no side effects; unit-tested in tests/unit/test_testnode_cli.py)."""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re

# Linux IFNAMSIZ is 16 including the NUL; systemd-nspawn names the host side "ve-" + machine name.
IFNAME_MAX = 15
NAME_MAX = IFNAME_MAX - len("ve-")  # 12

# Host-wide state shared by all state dirs (subnet leases, name prefixes): on /run, gone at reboot
# like the nodes themselves.
RUN_DIR = "/run/sglang-canon-testnode"

DEFAULT_POOL = "10.213.0.0/16"
NODE_PREFIXLEN = 30  # one /30 per node: .1 host side, .2 node side

SSH_COMMON_ARGS = "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"


# --------------------------------------------------------------------------- names

def state_prefix(state_dir: str, salt: int = 0) -> str:
    """Short, stable name prefix for a state dir: 'tn' + 6 hex chars of a hash of its path."""
    h = hashlib.sha256(f"{state_dir}\0{salt}".encode()).hexdigest()
    return "tn" + h[:6]


def node_name(prefix: str, index: int | str) -> str:
    name = f"{prefix}-{index}"
    if len(name) > NAME_MAX:
        raise ValueError(f"node name {name!r} is longer than {NAME_MAX} characters")
    return name


def interface_name(name: str) -> str:
    ifname = "ve-" + name
    if len(ifname) > IFNAME_MAX:
        raise ValueError(f"interface name {ifname!r} is longer than {IFNAME_MAX} characters")
    return ifname


def cgroup_name(name: str) -> str:
    """Directory name of a node's own cgroup (directly below each hierarchy's root)."""
    return f"sglang-canon-testnode.{name}"


# --------------------------------------------------------------------------- addresses

def subnet_for_slot(pool: str, slot: int, prefixlen: int = NODE_PREFIXLEN) -> ipaddress.IPv4Network:
    net = ipaddress.ip_network(pool, strict=True)
    if prefixlen < net.prefixlen:
        raise ValueError("node prefix is larger than the pool")
    count = 1 << (prefixlen - net.prefixlen)
    if not 0 <= slot < count:
        raise ValueError(f"slot {slot} outside pool {pool} ({count} slots)")
    size = 1 << (32 - prefixlen)
    base = int(net.network_address) + slot * size
    return ipaddress.ip_network((base, prefixlen))


def pick_free_subnet(pool: str, taken: list[str], host_networks: list[str],
                     prefixlen: int = NODE_PREFIXLEN, start: int = 0) -> tuple[str, int]:
    """(subnet, slot): the first /prefixlen of the pool, searching round-robin from slot `start`, that
    overlaps no leased subnet and no network the host already has.

    Round-robin keeps a just-released address from coming back soon: an SSH ControlPersist master
    (Ansible's) for an old node must not be reused for a new node at the same address.
    """
    net = ipaddress.ip_network(pool, strict=True)
    busy = []
    for n in list(taken) + list(host_networks):
        try:
            busy.append(ipaddress.ip_network(n, strict=False))
        except ValueError:
            continue
    # a default route overlaps everything; only care about real IPv4 networks
    busy = [b for b in busy if b.version == 4 and b.prefixlen > 0 and b.overlaps(net)]
    count = 1 << (prefixlen - net.prefixlen)
    for i in range(count):
        slot = (start + i) % count
        sub = subnet_for_slot(pool, slot, prefixlen)
        if any(sub.overlaps(b) for b in busy):
            continue
        return str(sub), slot
    raise RuntimeError(f"no free /{prefixlen} left in {pool}")


def subnet_addresses(subnet: str) -> tuple[str, str, int]:
    """(host_ip, node_ip, prefixlen): the host side takes the first usable address, the node the second."""
    sub = ipaddress.ip_network(subnet, strict=True)
    it = sub.hosts()
    host_ip, node_ip = str(next(it)), str(next(it))
    return host_ip, node_ip, sub.prefixlen


def stale_leases(leases: dict[str, dict], read_nodes) -> list[str]:
    """Lease keys (subnets) whose owner no longer records them.

    A lease {"state_dir": D, "name": N} of subnet S is live while D/nodes.json lists node N with subnet S.
    read_nodes(D) returns the node list of D/nodes.json, or None.
    """
    stale = []
    for subnet, lease in leases.items():
        nodes = read_nodes(lease.get("state_dir", "")) or []
        if not any(n.get("name") == lease.get("name") and n.get("subnet") == subnet for n in nodes):
            stale.append(subnet)
    return stale


def stale_prefixes(prefixes: dict[str, str], read_prefix) -> list[str]:
    """Registered name prefixes whose state dir no longer claims them (read_prefix(D) -> prefix or None)."""
    return [p for p, state_dir in prefixes.items() if read_prefix(state_dir) != p]


# --------------------------------------------------------------------------- apt sources

def _deb822_paragraphs(text: str):
    para: dict[str, str] = {}
    last = None
    for raw in text.splitlines():
        if raw.startswith("#"):
            continue
        if not raw.strip():
            if para:
                yield para
            para, last = {}, None
            continue
        if raw[0] in " \t" and last:
            para[last] += " " + raw.strip()
            continue
        if ":" in raw:
            k, v = raw.split(":", 1)
            last = k.strip().lower()
            para[last] = v.strip()
    if para:
        yield para


def parse_apt_sources(files: dict[str, str], suite: str) -> tuple[str | None, str | None]:
    """(mirror URI, keyring) for `suite` from apt source files {path: text} (.sources deb822 or .list).

    The first 'deb' entry whose suites contain exactly `suite` wins.
    """
    for path, text in files.items():
        if path.endswith(".sources"):
            for p in _deb822_paragraphs(text):
                if p.get("enabled", "yes").lower() == "no":
                    continue
                if "deb" not in p.get("types", "").split():
                    continue
                if suite not in p.get("suites", "").split():
                    continue
                uris = p.get("uris", "").split()
                if uris:
                    key = p.get("signed-by") or None
                    if key and "\n" in key:
                        key = None
                    return uris[0], key
        elif path.endswith(".list") or path.endswith("sources.list"):
            for line in text.splitlines():
                line = line.split("#", 1)[0].strip()
                if not line.startswith("deb "):
                    continue
                opts = {}
                m = re.match(r"deb\s+\[([^\]]*)\]\s+(.*)", line)
                if m:
                    for o in m.group(1).split():
                        if "=" in o:
                            k, v = o.split("=", 1)
                            opts[k] = v
                    rest = m.group(2).split()
                else:
                    rest = line.split()[1:]
                if len(rest) >= 2 and rest[1] == suite:
                    return rest[0], opts.get("signed-by")
    return None, None


# --------------------------------------------------------------------------- image

def read_package_list(text: str) -> list[str]:
    pkgs = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            pkgs.append(line)
    return sorted(set(pkgs))


def image_key(packages: list[str], suite: str, recipe: str) -> str:
    """Cache key of the base image: hash of the package list, the suite and the build recipe."""
    h = hashlib.sha256()
    h.update(json.dumps({"suite": suite, "packages": sorted(set(packages))}, sort_keys=True).encode())
    h.update(b"\0")
    h.update(recipe.encode())
    return h.hexdigest()[:16]


# --------------------------------------------------------------------------- inventory / node files

def _q(value) -> str:
    """YAML double-quoted scalar (JSON string syntax is valid YAML)."""
    return json.dumps(str(value))


def add_to_group(node: dict, group: str, host_vars: dict | None = None) -> dict:
    """Put a node record into a named inventory group of its own (instead of the default group)
    and give it host variables; render_inventory writes both. Returns the record."""
    groups = node.setdefault("groups", [])
    if group not in groups:
        groups.append(group)
    node.setdefault("host_vars", {}).update(host_vars or {})
    return node


def render_inventory(nodes: list[dict], key_path: str, group: str = "sglang_nodes") -> str:
    """The nodes as an Ansible inventory: each in its record's "group" (default: group), or in
    the groups add_to_group gave it, with its host variables.

    The default group is always written (empty: `hosts: {}`); a node made for another role
    (e.g. `up --monitor`: group sglang_monitors) goes into its own group, in the order met.
    """
    groups: dict[str, list[dict]] = {group: []}
    for n in nodes:
        for name in n.get("groups") or [n.get("group") or group]:
            groups.setdefault(name, []).append(n)
    lines = [
        "---",
        "# Written by tests/testnode up; regenerated on every up.",
        "all:",
        "  children:",
    ]
    for name, members in groups.items():
        lines.append(f"    {name}:")
        if not members:
            lines.append("      hosts: {}")
            continue
        lines.append("      hosts:")
        for n in members:
            lines += [
                f"        {n['name']}:",
                f"          ansible_host: {_q(n['ip'])}",
                "          ansible_user: root",
                f"          ansible_ssh_private_key_file: {_q(key_path)}",
                f"          ansible_ssh_common_args: {_q(SSH_COMMON_ARGS)}",
                "          ansible_python_interpreter: /usr/bin/python3",
                f"          testnode_host_address: {_q(n['host_ip'])}",
            ]
            for name, value in sorted((n.get("host_vars") or {}).items()):
                lines.append(f"          {name}: {json.dumps(value)}")
    return "\n".join(lines) + "\n"


def render_network_file(node_ip: str, prefixlen: int, peers: str | None = None, via: str | None = None) -> str:
    """systemd-networkd file of the node's host0. Without peers the node reaches only the host;
    with peers (the pool, e.g. 10.213.0.0/16) and via (the host side of its link) it also reaches
    the other nodes through the host (`up --monitor`: the monitor scrapes the nodes)."""
    # 10- sorts before the image's 80-container-host0.network, so this one wins (first match).
    text = (
        "# Written by tests/testnode: static address, no gateway (the node reaches only the host).\n"
        "[Match]\n"
        "Name=host0\n"
        "\n"
        "[Network]\n"
        f"Address={node_ip}/{prefixlen}\n"
        "LinkLocalAddressing=no\n"
        "IPv6AcceptRA=no\n"
        "LLMNR=no\n"
        "MulticastDNS=no\n"
    )
    if peers:
        ipaddress.ip_network(peers, strict=True)
        ipaddress.ip_address(via)
        text += (
            "\n"
            "# The other test nodes of the pool, through the host (never a default route).\n"
            "[Route]\n"
            f"Destination={peers}\n"
            f"Gateway={via}\n"
        )
    return text


def render_hosts(name: str, host_ip: str) -> str:
    return (
        "127.0.0.1\tlocalhost\n"
        f"127.0.1.1\t{name}\n"
        f"{host_ip}\ttestnode-host\n"
        "::1\tlocalhost ip6-localhost ip6-loopback\n"
        "ff02::1\tip6-allnodes\n"
        "ff02::2\tip6-allrouters\n"
    )


def machine_id_to_uuid(mid: str) -> str:
    return f"{mid[0:8]}-{mid[8:12]}-{mid[12:16]}-{mid[16:20]}-{mid[20:32]}"


# --------------------------------------------------------------------------- /proc parsing

def parse_proc_stat(text: str) -> tuple[str, int]:
    """(state letter, starttime) from /proc/PID/stat; the comm field may hold spaces and parens."""
    rest = text[text.rindex(")") + 2:].split()
    # rest[0] is field 3 (state); starttime is field 22 -> rest[19]
    return rest[0], int(rest[19])


def mounts_under(mountinfo: str, root: str) -> list[str]:
    """Mount points at or below `root` in /proc/self/mountinfo text, deepest first."""
    root = root.rstrip("/") or "/"
    out = []
    for line in mountinfo.splitlines():
        parts = line.split()
        if len(parts) < 5:
            continue
        mp = parts[4].replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")
        if mp == root or mp.startswith(root + "/"):
            out.append(mp)
    # deepest first; for the same path, later (stacked) mounts first
    indexed = list(enumerate(out))
    indexed.sort(key=lambda t: (t[1].count("/"), t[0]), reverse=True)
    return [mp for _, mp in indexed]
