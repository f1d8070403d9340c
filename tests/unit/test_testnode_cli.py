"""Fast unit tests of the pure helpers behind tests/testnode (no root, no containers)."""

import ipaddress
import json
import os

import pytest
import yaml  # PyYAML: ansible-core's own dependency, always in .venv
from testnode_lib import image, node, util


# --------------------------------------------------------------------------- names

def test_names_fit_linux_interface_limit():
    prefix = util.state_prefix("/some/state/dir")
    assert prefix.startswith("tn") and len(prefix) == 8
    name = util.node_name(prefix, 99)
    assert len(name) <= util.NAME_MAX == 12
    assert len(util.interface_name(name)) <= 15


def test_name_too_long_is_refused():
    with pytest.raises(ValueError):
        util.node_name("tn1234567", 100)
    with pytest.raises(ValueError):
        util.interface_name("x" * 13)


def test_prefix_is_stable_and_differs_per_state_dir_and_salt():
    a = util.state_prefix("/a")
    assert a == util.state_prefix("/a")
    assert a != util.state_prefix("/b")
    assert a != util.state_prefix("/a", salt=1)


# --------------------------------------------------------------------------- subnets

def test_subnet_slots_and_addresses():
    assert str(util.subnet_for_slot("10.213.0.0/16", 0)) == "10.213.0.0/30"
    assert str(util.subnet_for_slot("10.213.0.0/16", 3)) == "10.213.0.12/30"
    assert util.subnet_addresses("10.213.0.12/30") == ("10.213.0.13", "10.213.0.14", 30)
    with pytest.raises(ValueError):
        util.subnet_for_slot("10.213.0.0/16", 1 << 14)


def test_pick_free_subnet_skips_leases_and_host_networks():
    taken = ["10.213.0.0/30"]
    host = ["10.213.0.5/30", "192.0.2.0/24", "0.0.0.0/0", "fd00::/64", "garbage"]
    subnet, slot = util.pick_free_subnet("10.213.0.0/16", taken, host)
    assert (subnet, slot) == ("10.213.0.8/30", 2)


def test_pick_free_subnet_is_round_robin_and_wraps():
    pool = "10.213.0.0/28"  # four /30 slots
    assert util.pick_free_subnet(pool, [], [], start=2) == ("10.213.0.8/30", 2)
    assert util.pick_free_subnet(pool, ["10.213.0.12/30"], [], start=3) == ("10.213.0.0/30", 0)
    # a host route covering the whole pool leaves nothing
    with pytest.raises(RuntimeError):
        util.pick_free_subnet(pool, [], ["10.213.0.0/24"])


def test_pick_free_subnet_never_returns_a_taken_one():
    pool = "10.213.0.0/26"
    taken = []
    for i in range(16):
        subnet, _slot = util.pick_free_subnet(pool, taken, [], start=i * 7)
        assert subnet not in taken
        taken.append(subnet)
    nets = [ipaddress.ip_network(s) for s in taken]
    assert all(not a.overlaps(b) for i, a in enumerate(nets) for b in nets[i + 1:])
    with pytest.raises(RuntimeError):
        util.pick_free_subnet(pool, taken, [])


def test_stale_leases_and_prefixes():
    nodes = {
        "/s1": [{"name": "tnaaaaaa-1", "subnet": "10.213.0.0/30"}],
        "/s2": [],
    }
    leases = {
        "10.213.0.0/30": {"state_dir": "/s1", "name": "tnaaaaaa-1"},   # live
        "10.213.0.4/30": {"state_dir": "/s1", "name": "tnaaaaaa-2"},   # not recorded any more
        "10.213.0.8/30": {"state_dir": "/s2", "name": "tnbbbbbb-1"},   # state dir has no nodes
        "10.213.0.12/30": {"state_dir": "/gone", "name": "tncccccc-1"},  # state dir removed
    }
    assert sorted(util.stale_leases(leases, nodes.get)) == ["10.213.0.12/30", "10.213.0.4/30",
                                                             "10.213.0.8/30"]
    claimed = {"/s1": "tnaaaaaa", "/s2": "tnbbbbbb"}
    prefixes = {"tnaaaaaa": "/s1", "tnbbbbbb": "/s2", "tncccccc": "/gone", "tndddddd": "/s1"}
    assert sorted(util.stale_prefixes(prefixes, claimed.get)) == ["tncccccc", "tndddddd"]


# --------------------------------------------------------------------------- apt sources / image

DEB822 = """\
Types: deb
# a comment
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
"""


def test_parse_apt_sources_deb822():
    uri, key = util.parse_apt_sources({"/etc/apt/sources.list.d/debian.sources": DEB822}, "bookworm")
    assert uri == "http://mirror.example/debian"
    assert key == "/usr/share/keyrings/debian-archive-keyring.gpg"
    assert util.parse_apt_sources({"x.sources": DEB822}, "trixie") == (None, None)


def test_parse_apt_sources_one_line_format():
    text = ("# deb http://old.example/debian bookworm main\n"
            "deb-src http://src.example/debian bookworm main\n"
            "deb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian bookworm main contrib\n")
    assert util.parse_apt_sources({"/etc/apt/sources.list": text}, "bookworm") == \
        ("http://mirror.example/debian", "/k.gpg")


def test_package_list_and_image_key():
    pkgs = util.read_package_list("# c\nsystemd\n\npython3  # inline\nsystemd\n")
    assert pkgs == ["python3", "systemd"]
    k = util.image_key(pkgs, "bookworm", "recipe")
    assert k == util.image_key(list(reversed(pkgs)), "bookworm", "recipe")
    assert k != util.image_key(pkgs + ["less"], "bookworm", "recipe")
    assert k != util.image_key(pkgs, "bookworm", "recipe v2")


def test_image_package_list_has_what_the_project_needs():
    need = {"systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "python3-venv", "python3-pip",
            "iproute2", "procps", "curl", "sudo", "ca-certificates", "patch", "libpam-systemd", "less"}
    assert need <= set(image.packages())


# --------------------------------------------------------------------------- rendered files

def _node(name, ip, host_ip):
    return {"name": name, "ip": ip, "host_ip": host_ip}


def test_render_inventory():
    nodes = [_node("tnaaaaaa-1", "10.213.0.2", "10.213.0.1"), _node("tnaaaaaa-2", "10.213.0.6", "10.213.0.5")]
    text = util.render_inventory(nodes, "/state dir/id_ed25519")
    assert "tnaaaaaa-2:" in text and 'ansible_host: "10.213.0.6"' in text
    assert 'ansible_ssh_private_key_file: "/state dir/id_ed25519"' in text
    assert "StrictHostKeyChecking=no" in text
    inv = yaml.safe_load(text)
    hosts = inv["all"]["children"]["sglang_nodes"]["hosts"]
    assert hosts["tnaaaaaa-1"] == {
        "ansible_host": "10.213.0.2",
        "ansible_user": "root",
        "ansible_ssh_private_key_file": "/state dir/id_ed25519",
        "ansible_ssh_common_args": util.SSH_COMMON_ARGS,
        "ansible_python_interpreter": "/usr/bin/python3",
        "testnode_host_address": "10.213.0.1",
    }


def test_render_inventory_empty_is_valid():
    text = util.render_inventory([], "/k")
    assert yaml.safe_load(text)["all"]["children"]["sglang_nodes"]["hosts"] == {}


def test_network_file_is_static_without_gateway():
    text = util.render_network_file("10.213.0.2", 30)
    assert "Name=host0" in text and "Address=10.213.0.2/30" in text
    assert "Gateway" not in text and "DHCP" not in text


def test_hosts_file_names_node_and_host():
    text = util.render_hosts("tnaaaaaa-1", "10.213.0.1")
    assert "127.0.1.1\ttnaaaaaa-1" in text and "10.213.0.1\ttestnode-host" in text


def test_machine_id_to_uuid():
    assert util.machine_id_to_uuid("0123456789abcdef0123456789abcdef") == "01234567-89ab-cdef-0123-456789abcdef"


# --------------------------------------------------------------------------- /proc parsing

def test_parse_proc_stat_handles_odd_comm():
    fields = ["S", "1"] + [str(i) for i in range(5, 22)] + ["424242", "0"]
    text = "123 (we ird) (x) " + " ".join(fields) + "\n"
    assert util.parse_proc_stat(text) == ("S", 424242)
    real = open(f"/proc/{os.getpid()}/stat").read()
    state, start = util.parse_proc_stat(real)
    assert state in "RS" and start > 0


def test_mounts_under_deepest_first_and_escaped():
    mi = "\n".join([
        "20 1 0:1 / / rw - ext4 /dev/vda rw",
        "30 20 0:2 / /st/nodes/a/rootfs rw - overlay overlay rw",
        "31 30 0:3 / /st/nodes/a/rootfs/proc rw - proc proc rw",
        "32 20 0:4 / /st/nodes/a\\040b rw - tmpfs tmpfs rw",
        "33 20 0:5 / /st/nodes/ab rw - tmpfs tmpfs rw",
    ])
    assert util.mounts_under(mi, "/st/nodes/a") == ["/st/nodes/a/rootfs/proc", "/st/nodes/a/rootfs"]
    assert util.mounts_under(mi, "/st/nodes/a b/") == ["/st/nodes/a b"]
    assert util.mounts_under(mi, "/nothing") == []


# --------------------------------------------------------------------------- CLI

def test_cli_parsing():
    p = node.parser()
    a = p.parse_args(["up"])
    assert a.cmd == "up" and a.count == 1
    assert p.parse_args(["up", "3"]).count == 3
    a = p.parse_args(["ssh", "tnaaaaaa-1", "--", "systemctl", "is-active", "-q", "ssh"])
    assert a.name == "tnaaaaaa-1"
    assert [x for x in a.command if x != "--"] == ["systemctl", "is-active", "-q", "ssh"]
    assert p.parse_args(["list"]).cmd == "list"
    for cmd in ("reset", "reboot", "stop", "start"):
        assert p.parse_args([cmd, "n1"]).name == "n1"
    with pytest.raises(SystemExit):
        p.parse_args(["reset"])
    assert p.parse_args(["up", "3", "--from-snapshot", "/s"]).from_snapshot == "/s"
    assert p.parse_args(["up"]).from_snapshot is None
    assert p.parse_args(["reset", "n1", "--to-snapshot", "/s"]).to_snapshot == "/s"
    assert p.parse_args(["reset", "n1"]).to_snapshot is None
    a = p.parse_args(["snapshot", "n1", "/s"])
    assert (a.cmd, a.name, a.dir) == ("snapshot", "n1", "/s")
    with pytest.raises(SystemExit):
        p.parse_args(["snapshot", "n1"])


def test_overlay_stacks_snapshot_layers_over_the_image(tmp_path):
    st = node.State(tmp_path)
    rec = node.new_node_record(st, "tnaaaaaa-1", 1, "10.213.0.4/30", tmp_path / "img")
    nd = tmp_path / "nodes" / "tnaaaaaa-1"
    assert rec["layers"] == []
    assert node.overlay_options(rec) == f"lowerdir={tmp_path / 'img'},upperdir={nd / 'upper'},workdir={nd / 'work'}"
    rec["layers"] = ["/snap/b/upper", "/snap/a/upper"]  # topmost first
    assert node.overlay_options(rec).startswith(f"lowerdir=/snap/b/upper:/snap/a/upper:{tmp_path / 'img'},")


def test_a_snapshot_needs_its_record_and_its_layers(tmp_path):
    with pytest.raises(node.Fail, match="no snapshot.json"):
        node.read_snapshot(tmp_path)
    (tmp_path / "image").mkdir()
    (tmp_path / "upper").mkdir()
    meta = {"node": "tnaaaaaa-1", "state_dir": "/s", "machine_id": "0" * 32, "mode": "overlay",
            "image": str(tmp_path / "image"), "layers": [str(tmp_path / "upper")]}
    (tmp_path / "snapshot.json").write_text(json.dumps(meta))
    assert node.read_snapshot(tmp_path) == meta
    (tmp_path / "upper").rmdir()
    with pytest.raises(node.Fail, match="is gone"):
        node.read_snapshot(tmp_path)


def test_state_dir_from_env(monkeypatch, tmp_path):
    monkeypatch.setenv("TESTNODE_STATE_DIR", str(tmp_path / "s"))
    assert node.state_dir() == tmp_path / "s"
    monkeypatch.delenv("TESTNODE_STATE_DIR")
    assert node.state_dir() == node.REPO / ".testnodes"


def test_nodes_json_roundtrip(tmp_path):
    st = node.State(tmp_path)
    rec = node.new_node_record(st, "tnaaaaaa-1", 1, "10.213.0.4/30", tmp_path / "img")
    assert (rec["ip"], rec["host_ip"], rec["interface"]) == ("10.213.0.6", "10.213.0.5", "ve-tnaaaaaa-1")
    st.nodes.append(rec)
    st.save()
    data = json.loads((tmp_path / "nodes.json").read_text())
    assert isinstance(data, list)  # tests/testnodes.py reads it as a list of records
    assert data[0]["rootfs"] == str(tmp_path / "nodes" / "tnaaaaaa-1" / "rootfs")
    assert {"name", "ip", "host_ip", "pid", "rootfs"} <= set(data[0])
    assert node.State(tmp_path).node("tnaaaaaa-1")["subnet"] == "10.213.0.4/30"
    with pytest.raises(node.Fail):
        st.node("nope")


def test_render_inventory_puts_a_node_of_another_role_into_its_group():
    nodes = [_node("tnaaaaaa-1", "10.213.0.2", "10.213.0.1"),
             {**_node("tnaaaaaa-mon", "10.213.0.6", "10.213.0.5"), "group": "sglang_monitors"}]
    children = yaml.safe_load(util.render_inventory(nodes, "/k"))["all"]["children"]
    assert list(children["sglang_nodes"]["hosts"]) == ["tnaaaaaa-1"]
    assert list(children["sglang_monitors"]["hosts"]) == ["tnaaaaaa-mon"]
    assert children["sglang_monitors"]["hosts"]["tnaaaaaa-mon"]["ansible_host"] == "10.213.0.6"


def test_network_file_with_peers_routes_only_the_pool_through_the_host():
    text = util.render_network_file("10.213.0.2", 30, "10.213.0.0/16", "10.213.0.1")
    assert "[Route]\nDestination=10.213.0.0/16\nGateway=10.213.0.1\n" in text
    assert "0.0.0.0/0" not in text and text.count("Gateway=") == 1


def test_up_monitor_adds_one_monitoring_host():
    args = node.parser().parse_args(["up", "2", "--monitor"])
    assert args.count == 2 and node.extra_nodes(args) == [("mon", "sglang_monitors")]
    assert node.extra_nodes(node.parser().parse_args(["up", "2"])) == []


@pytest.mark.parametrize("roles", [["--monitor"], ["--gateway"], ["--monitor", "--gateway"]])
def test_a_fleet_with_another_host_serves_each_node_at_its_own_address(tmp_path, monkeypatch, roles):
    # A monitor (or a gateway) is another host: a server on loopback is out of its reach, and site.yml
    # refuses a monitored one (roles/sglang_monitoring/tasks/check.yml). `up 2 --monitor` alone once
    # left the servers there.
    monkeypatch.setattr(node.gateway, "make_tls", lambda folder, name, ip: {"ca": "/ca", "cert": "/c", "key": "/k"})
    args = node.parser().parse_args(["up", "2", *roles])
    nodes = [_node("tnaaaaaa-1", "10.213.0.2", "10.213.0.1"), _node("tnaaaaaa-2", "10.213.0.6", "10.213.0.5")]
    for i, (suffix, group) in enumerate(node.extra_nodes(args)):
        nodes.append({**_node(f"tnaaaaaa-{suffix}", f"10.213.0.{10 + 4 * i}", f"10.213.0.{9 + 4 * i}"), "group": group})
    (tmp_path / "gateway").mkdir()
    node.assign_other_hosts(tmp_path, nodes, 2, args)
    children = yaml.safe_load(util.render_inventory(nodes, "/k"))["all"]["children"]
    serving = children["sglang_nodes"]["hosts"]
    assert {name: host.get("sglang_worker_host") for name, host in serving.items()} == {
        "tnaaaaaa-1": "10.213.0.2", "tnaaaaaa-2": "10.213.0.6"}
    if "--monitor" in roles:
        assert "sglang_worker_host" not in children["sglang_monitors"]["hosts"]["tnaaaaaa-mon"]


def test_a_fleet_of_serving_nodes_alone_keeps_the_servers_on_loopback(tmp_path):
    args = node.parser().parse_args(["up", "2"])
    nodes = [_node("tnaaaaaa-1", "10.213.0.2", "10.213.0.1"), _node("tnaaaaaa-2", "10.213.0.6", "10.213.0.5")]
    node.assign_other_hosts(tmp_path, nodes, 2, args)
    assert all("sglang_worker_host" not in n.get("host_vars", {}) for n in nodes)
