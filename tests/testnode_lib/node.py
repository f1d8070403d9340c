"""tests/testnode: throw-away Debian 12 'servers' (systemd-nspawn containers with systemd as PID 1,
reached over SSH) for the integration tests.

Layout of a state dir ($TESTNODE_STATE_DIR, default <repo>/.testnodes):
  id_ed25519{,.pub}     SSH key pair (made once)
  nodes.json            list of the nodes this state dir made: name, ip, host_ip, pid, rootfs,
                        cgroups, mount mode, subnet, console log, state
  testnode.json         the state dir's unique node-name prefix
  inventory.yml         Ansible inventory of the nodes (written by up)
  nodes/NAME/           upper/ work/ rootfs/ (overlay on the cached base image) or rootfs/ (a copy),
                        console.log (the node's console)
Snapshots (`snapshot NAME DIR`, then `up N --from-snapshot DIR` or `reset NAME --to-snapshot DIR`):
  DIR/snapshot.json     the node it was taken of (name, state dir, machine-id), its mode, base image
                        and layers
  DIR/upper/            overlay mode: the node's upper dir, moved (not copied) out of the node while
                        it was powered off; from then on a read-only layer between the base image and
                        the upper dir of every node made or reset from it (so taking and restoring a
                        snapshot copies nothing)
  DIR/rootfs/           copy mode (no overlayfs): a full copy of the rootfs
A snapshot may serve nodes of other state dirs: remove DIR only after those nodes are down.
Host-global state (shared by all state dirs): /run/sglang-canon-testnode/{lock,registry.json}: the
subnet leases and name prefixes in use, so concurrent state dirs never collide.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path

from . import gateway, image, sysops, util
from .sysops import Fail, log
from project_modules import REPO  # tests/ is on sys.path (tests/testnode, conftest.py)
RUN_DIR = Path(util.RUN_DIR)
SSH_TIMEOUT = float(os.environ.get("TESTNODE_SSH_TIMEOUT", "120"))
STOP_TIMEOUT = float(os.environ.get("TESTNODE_STOP_TIMEOUT", "45"))  # clean poweroff of a booted node
BOOTING_STOP_TIMEOUT = 3.0  # a node still booting may miss the first SIGTERM


# --------------------------------------------------------------------------- signals

class Interrupted(BaseException):
    pass


_deferred: list[int] = []
_shield_depth = 0


def _on_signal(signum, _frame):
    if _shield_depth:
        _deferred.append(signum)
        log(f"got signal {signum} during clean-up; finishing clean-up first")
        return
    raise Interrupted(signum)


def install_signal_handlers() -> None:
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, _on_signal)


@contextlib.contextmanager
def shielded():
    """Defer SIGINT/SIGTERM/SIGHUP while cleaning up."""
    global _shield_depth
    _shield_depth += 1
    try:
        yield
    finally:
        _shield_depth -= 1
        if _shield_depth == 0 and _deferred:
            signum = _deferred[0]
            _deferred.clear()
            raise Interrupted(signum)


# --------------------------------------------------------------------------- state

def state_dir() -> Path:
    d = os.environ.get("TESTNODE_STATE_DIR")
    p = Path(d) if d else REPO / ".testnodes"
    return Path(os.path.abspath(p))


read_json = sysops.read_json


def write_json(path: Path, data) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def read_nodes_of(state_dir_path: str) -> list | None:
    if not state_dir_path:
        return None
    data = read_json(Path(state_dir_path) / "nodes.json")
    return data if isinstance(data, list) else None


def read_prefix_of(state_dir_path: str) -> str | None:
    if not state_dir_path:
        return None
    data = read_json(Path(state_dir_path) / "testnode.json")
    return data.get("prefix") if isinstance(data, dict) else None


@contextlib.contextmanager
def flocked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class State:
    """nodes.json: the list of node records (name, ip, host_ip, pid, rootfs, ...);
    testnode.json: this state dir's own settings (its unique node name prefix)."""

    def __init__(self, path: Path):
        self.dir = path
        self.file = path / "nodes.json"
        self.meta_file = path / "testnode.json"
        self.key = path / "id_ed25519"
        self.inventory = path / "inventory.yml"
        nodes = read_json(self.file)
        self.nodes: list[dict] = nodes if isinstance(nodes, list) else []
        meta = read_json(self.meta_file)
        self.meta: dict = meta if isinstance(meta, dict) else {}
        self.meta.setdefault("version", 1)
        self.meta["state_dir"] = str(path)

    def node(self, name: str) -> dict:
        for n in self.nodes:
            if n["name"] == name:
                return n
        known = ", ".join(n["name"] for n in self.nodes) or "none"
        raise Fail(f"no node {name!r} in {self.dir} (nodes: {known})")

    def save(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        write_json(self.meta_file, self.meta)
        write_json(self.file, self.nodes)

    def ensure_key(self) -> None:
        if self.key.exists() and Path(str(self.key) + ".pub").exists():
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        for p in (self.key, Path(str(self.key) + ".pub")):
            p.unlink(missing_ok=True)
        sysops.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "testnode@" + self.dir.name,
                    "-f", str(self.key)], quiet=True)
        os.chmod(self.key, 0o600)


# --------------------------------------------------------------------------- global registry

@contextlib.contextmanager
def registry():
    """The host-wide registry of leased subnets and name prefixes, under an exclusive lock."""
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    with flocked(RUN_DIR / "lock"):
        path = RUN_DIR / "registry.json"
        reg = read_json(path) or {}
        reg.setdefault("leases", {})
        reg.setdefault("prefixes", {})
        yield reg
        write_json(path, reg)


def ensure_prefix(st: State, reg: dict) -> str:
    """A name prefix unique among all live state dirs (registered in the global registry)."""
    for p in util.stale_prefixes(reg["prefixes"], read_prefix_of):
        if reg["prefixes"][p] != str(st.dir):
            del reg["prefixes"][p]
    prefix = st.meta.get("prefix")
    if prefix and reg["prefixes"].get(prefix, str(st.dir)) == str(st.dir):
        reg["prefixes"][prefix] = str(st.dir)
        return prefix
    for salt in range(1000):
        p = util.state_prefix(str(st.dir), salt)
        owner = reg["prefixes"].get(p)
        if owner not in (None, str(st.dir)):
            continue
        if any(n.startswith("ve-" + p + "-") for n in os.listdir("/sys/class/net")):
            continue  # someone (not registered) uses it: stay away
        reg["prefixes"][p] = str(st.dir)
        st.meta["prefix"] = p
        st.save()
        return p
    raise Fail("could not find a free node name prefix")


def drop_stale_leases(reg: dict) -> None:
    for s in util.stale_leases(reg["leases"], read_nodes_of):
        del reg["leases"][s]


def lease_subnet(st: State, reg: dict, name: str, host_networks: list[str]) -> str:
    pool = os.environ.get("TESTNODE_SUBNET_POOL", util.DEFAULT_POOL)
    subnet, slot = util.pick_free_subnet(pool, list(reg["leases"]), host_networks,
                                         start=int(reg.get("next_slot", 0)))
    reg["next_slot"] = slot + 1
    reg["leases"][subnet] = {"state_dir": str(st.dir), "name": name}
    return subnet


def release_subnet(st: State, node: dict) -> None:
    with registry() as reg:
        lease = reg["leases"].get(node.get("subnet"))
        if lease and lease.get("state_dir") == str(st.dir) and lease.get("name") == node["name"]:
            del reg["leases"][node["subnet"]]


# --------------------------------------------------------------------------- binds and fixtures

def wheelhouse_dir() -> Path | None:
    env = os.environ.get("TESTNODE_BIND_WHEELHOUSE")
    if env:
        p = Path(env).resolve()
        if not p.is_dir():
            raise Fail(f"TESTNODE_BIND_WHEELHOUSE={env} is not a directory")
        return p
    p = REPO / ".cache" / "wheelhouse"
    return p.resolve() if p.is_dir() else None


def debs_dir() -> Path | None:
    """Debian packages for the air-gapped nodes (scripts/fetch-monitoring-debs), bound at /srv/debs."""
    env = os.environ.get("TESTNODE_BIND_DEBS")
    p = Path(env) if env else REPO / ".cache" / "debs"
    return p.resolve() if p.is_dir() else None


def models_dir() -> Path:
    """Stand-in model weights copied into every fresh node's /srv/models/ (contents, not the dir)."""
    env = os.environ.get("TESTNODE_MODELS_DIR")
    return Path(env) if env else REPO / "tests" / "fixtures" / "testnode-model"


def bind_args() -> list[str]:
    args = []
    wh = wheelhouse_dir()
    if wh:
        args.append(f"--bind-ro={wh}:/srv/wheelhouse")
    debs = debs_dir()
    if debs:
        args.append(f"--bind-ro={debs}:/srv/debs")
    double = REPO / "tests" / "double"
    if double.is_dir():
        args.append(f"--bind-ro={double}:/opt/sglang-test-double")
    return args


# --------------------------------------------------------------------------- node lifecycle

def new_node_record(st: State, name: str, index: int, subnet: str, image_rootfs: Path,
                    group: str | None = None, peers: str | None = None) -> dict:
    """group: the inventory group (None: sglang_nodes); peers: the pool the node reaches through
    the host (None: the host only)."""
    host_ip, node_ip, plen = util.subnet_addresses(subnet)
    nd = st.dir / "nodes" / name
    return {
        "name": name,
        "index": index,
        "subnet": subnet,
        "ip": node_ip,
        "host_ip": host_ip,
        "prefixlen": plen,
        "interface": util.interface_name(name),
        "node_dir": str(nd),
        "rootfs": str(nd / "rootfs"),
        "image": str(image_rootfs),
        "mode": None,
        "layers": [],
        "console_log": str(nd / "console.log"),
        "pid": None,
        "pid_start": None,
        "cgroups": [],
        "machine_id": None,
        "state": "creating",
        "group": group,
        "peers": peers,
    }


def rootfs_mode() -> str:
    m = os.environ.get("TESTNODE_ROOTFS_MODE", "auto")
    if m not in ("auto", "overlay", "copy"):
        raise Fail("TESTNODE_ROOTFS_MODE must be auto, overlay or copy")
    return m


def overlay_options(node: dict) -> str:
    """mount -o of the node's overlay: its snapshot layers (topmost first) over the base image."""
    nd = Path(node["node_dir"])
    lowerdir = ":".join([*node.get("layers", []), node["image"]])
    return f"lowerdir={lowerdir},upperdir={nd / 'upper'},workdir={nd / 'work'}"


def mount_rootfs(node: dict) -> None:
    """Make the node's rootfs available: mount the overlay (if not mounted); a copy needs nothing."""
    nd = Path(node["node_dir"])
    rootfs = Path(node["rootfs"])
    if node["mode"] == "copy":
        return
    if sysops.is_mountpoint(rootfs):
        return
    for lower in [*node.get("layers", []), node["image"]]:
        if not Path(lower).is_dir():
            raise Fail(f"{node['name']}: its layer {lower} is gone; `reset` it or `up` again")
    opts = overlay_options(node)
    sysops.run(["mount", "-t", "overlay", "overlay", "-o", opts, str(rootfs)], quiet=True)


def read_snapshot(directory: Path) -> dict:
    meta = read_json(Path(directory) / "snapshot.json")
    if not isinstance(meta, dict):
        raise Fail(f"{directory} is not a snapshot made by `tests/testnode snapshot` (no snapshot.json)")
    for lower in [*meta.get("layers", []), meta["image"]]:
        if not Path(lower).is_dir():
            raise Fail(f"snapshot {directory}: its layer {lower} is gone")
    return meta


def create_rootfs(node: dict, snapshot: dict | None = None) -> None:
    """Fresh rootfs from the base image, or from a snapshot (wipes any previous one of this node)."""
    nd = Path(node["node_dir"])
    for sub in ("rootfs", "upper", "work"):
        sysops.safe_rmtree(nd / sub)
    nd.mkdir(parents=True, exist_ok=True)
    if snapshot is not None:
        node["image"] = snapshot["image"]
        if snapshot["mode"] == "overlay":
            node["layers"] = list(snapshot["layers"])
            node["mode"] = "overlay"
            for sub in ("rootfs", "upper", "work"):
                (nd / sub).mkdir()
            mount_rootfs(node)
        else:
            node["layers"] = []
            node["mode"] = "copy"
            sysops.run(["cp", "-a", "--reflink=auto", snapshot["rootfs"], str(nd / "rootfs")], quiet=True)
        return
    node["layers"] = []
    mode = rootfs_mode()
    if mode in ("auto", "overlay"):
        for sub in ("rootfs", "upper", "work"):
            (nd / sub).mkdir()
        node["mode"] = "overlay"
        try:
            mount_rootfs(node)
            return
        except Fail as e:
            if mode == "overlay":
                raise
            log(f"{node['name']}: overlayfs not usable here ({str(e).splitlines()[-1].strip()}); copying the image")
            for sub in ("rootfs", "upper", "work"):
                sysops.safe_rmtree(nd / sub)
    node["mode"] = "copy"
    sysops.run(["cp", "-a", "--reflink=auto", node["image"], str(nd / "rootfs")], quiet=True)


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    if path.is_symlink() or path.exists():
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chmod(path, mode)


def personalize(st: State, node: dict) -> None:
    """Per-node identity written into a fresh rootfs: machine-id, hostname, address, SSH keys, models."""
    r = Path(node["rootfs"])
    if not (r / "usr/lib/systemd/systemd").exists() and not (r / "lib/systemd/systemd").exists():
        raise Fail(f"{r} does not look like the base image")
    mid = secrets.token_hex(16)
    node["machine_id"] = mid
    _write(r / "etc/machine-id", mid + "\n", 0o444)
    _write(r / "etc/hostname", node["name"] + "\n")
    _write(r / "etc/hosts", util.render_hosts(node["name"], node["host_ip"]))
    _write(r / "etc/systemd/network/10-host0.network",
           util.render_network_file(node["ip"], node["prefixlen"], node.get("peers"),
                                    node["host_ip"] if node.get("peers") else None))
    # SSH: node host key, our public key
    for f in (r / "etc/ssh").glob("ssh_host_*"):
        f.unlink()
    sysops.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "root@" + node["name"],
                "-f", str(r / "etc/ssh/ssh_host_ed25519_key")], quiet=True)
    sshdir = r / "root/.ssh"
    sshdir.mkdir(mode=0o700, exist_ok=True)
    os.chmod(sshdir, 0o700)
    _write(sshdir / "authorized_keys", Path(str(st.key) + ".pub").read_text(), 0o600)
    # stand-in model weights
    models_src = models_dir()
    if models_src.is_dir():
        dst = r / "srv/models"
        dst.mkdir(parents=True, exist_ok=True)
        sysops.run(["cp", "-a", "--no-preserve=ownership", f"{models_src}/.", str(dst)], quiet=True)


def nspawn_cmd(node: dict) -> list[str]:
    return [
        "systemd-nspawn",
        "--boot",
        "--register=no",
        "--keep-unit",
        "--network-veth",
        f"--machine={node['name']}",
        f"--uuid={util.machine_id_to_uuid(node['machine_id'])}",
        "-D", node["rootfs"],
        "--link-journal=no",
        "--resolv-conf=off",
        "--timezone=off",
        "--console=read-only",
        *bind_args(),
    ]


def boot(st: State, node: dict) -> None:
    """Start systemd-nspawn for the node in the background, in its own cgroup."""
    if sysops.is_alive(node.get("pid"), node.get("pid_start")):
        raise Fail(f"{node['name']} is already running (pid {node['pid']})")
    if sysops.link_exists(node["interface"]):
        # a leftover host veth of this very node (its name is unique to this state dir)
        sysops.run(["ip", "link", "del", node["interface"]], check=False, quiet=True)
    cgname = util.cgroup_name(node["name"])
    node["cgroups"] = sysops.cgroup_create(cgname)
    st.save()
    cmd = nspawn_cmd(node)
    cg = list(node["cgroups"])

    def preexec():
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
            signal.signal(s, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        sysops.cgroup_enter(cg)

    with open(node["console_log"], "ab") as logf:
        logf.write(f"\n===== testnode: boot {time.strftime('%Y-%m-%d %H:%M:%S')} =====\n".encode())
        logf.flush()
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                             start_new_session=True, preexec_fn=preexec, close_fds=True)
    node["pid"] = p.pid
    node["pid_start"] = sysops.proc_identity(p.pid)
    # nspawn's host-wide lock of the rootfs; not always removed when nspawn exits
    stt = os.stat(node["rootfs"])
    node["nspawn_lock"] = f"/run/systemd/nspawn/locks/inode-{stt.st_dev}:{stt.st_ino}"
    node["state"] = "booting"
    st.save()


def console_tail(node: dict, lines: int = 30) -> str:
    try:
        text = Path(node["console_log"]).read_text(errors="replace")
    except OSError:
        return "(no console log)"
    return "\n    ".join(text.splitlines()[-lines:])


def check_alive(node: dict) -> None:
    if not sysops.is_alive(node.get("pid"), node.get("pid_start")):
        sysops.reap(node.get("pid") or 0)
        raise Fail(f"{node['name']}: systemd-nspawn exited; console log {node['console_log']}:\n    "
                   + console_tail(node))


def configure_host_link(node: dict, timeout: float = 20.0) -> None:
    ifname = node["interface"]
    end = time.monotonic() + timeout
    while not sysops.link_exists(ifname):
        check_alive(node)
        if time.monotonic() > end:
            raise Fail(f"{node['name']}: host interface {ifname} did not appear")
        time.sleep(0.05)
    r = sysops.run(["ip", "addr", "add", f"{node['host_ip']}/{node['prefixlen']}", "dev", ifname],
                   check=False, quiet=True)
    if r.returncode != 0 and "exists" not in (r.stderr or ""):
        raise Fail(f"ip addr add on {ifname} failed: {r.stderr.strip()}")
    sysops.run(["ip", "link", "set", ifname, "up"], quiet=True)
    if node.get("peers"):
        # Forward what arrives on this node's link only (the host's ip_forward stays as it is):
        # with its route to the pool, the node reaches the other nodes through the host.
        Path(f"/proc/sys/net/ipv4/conf/{ifname}/forwarding").write_text("1\n")


def ssh_base(st: State, node: dict, connect_timeout: int = 5, batch: bool = True) -> list[str]:
    return ["ssh", "-i", str(st.key), *util.SSH_COMMON_ARGS.split(),
            "-o", f"BatchMode={'yes' if batch else 'no'}", "-o", f"ConnectTimeout={connect_timeout}",
            "-o", "ServerAliveInterval=15",
            f"root@{node['ip']}"]


def wait_ready(st: State, nodes: list[dict], timeout: float = SSH_TIMEOUT) -> None:
    """Wait until every node answers SSH, then until its systemd finished booting."""
    pending = {n["name"]: n for n in nodes}
    link_done: set[str] = set()
    end = time.monotonic() + timeout
    while pending:
        for name, n in list(pending.items()):
            check_alive(n)
            if name not in link_done:
                configure_host_link(n)
                link_done.add(name)
            # a plain ssh probe (a bare TCP probe would leave sshd errors in the node's journal)
            try:
                r = subprocess.run(ssh_base(st, n, connect_timeout=1) + ["true"], stdin=subprocess.DEVNULL,
                                   capture_output=True, text=True, timeout=20)
                if r.returncode == 0:
                    del pending[name]
            except subprocess.TimeoutExpired:
                pass
        if not pending:
            break
        if time.monotonic() > end:
            raise Fail(f"SSH did not answer within {timeout:.1f} s on: "
                       + ", ".join(f"{n['name']} ({n['ip']}, console {n['console_log']})"
                                   for n in pending.values()))
        time.sleep(0.2)
    for n in nodes:
        r = subprocess.run(ssh_base(st, n) + ["timeout 90 systemctl is-system-running --wait"],
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
        status = r.stdout.strip() or r.stderr.strip()
        if status != "running":
            failed = subprocess.run(ssh_base(st, n) + ["systemctl --failed --no-legend --plain"],
                                    stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                    timeout=30).stdout.strip()
            log(f"{n['name']}: system is {status!r}; failed units: {failed or 'none'}")
        n["state"] = "running"


def shutdown(st: State, node: dict) -> None:
    """Power the node off (SIGTERM to nspawn: clean poweroff), then remove its cgroups and host veth."""
    with shielded():
        timeout = STOP_TIMEOUT if node.get("state") == "running" else BOOTING_STOP_TIMEOUT
        sysops.terminate(node.get("pid"), node.get("pid_start"), timeout, node["name"])
        for cg in node.get("cgroups") or []:
            sysops.cgroup_remove(Path(cg))
        node["cgroups"] = []
        if sysops.link_exists(node["interface"]):
            sysops.run(["ip", "link", "del", node["interface"]], check=False, quiet=True)
        if node.get("nspawn_lock"):
            sysops.remove_unheld_lock(Path(node["nspawn_lock"]))
            node["nspawn_lock"] = None
        # nspawn's per-machine propagation dir; it cannot always remove it when /run is not a tmpfs
        prop = Path("/run/systemd/nspawn/propagate") / node["name"]
        if prop.is_dir() and not prop.is_symlink() and not sysops.mounts_below(prop):
            shutil.rmtree(prop, ignore_errors=True)
        node["pid"] = None
        node["pid_start"] = None
        node["state"] = "stopped"
        st.save()


def destroy(st: State, node: dict) -> None:
    with shielded():
        shutdown(st, node)
        sysops.safe_rmtree(Path(node["node_dir"]))
        release_subnet(st, node)
        st.nodes[:] = [n for n in st.nodes if n["name"] != node["name"]]
        st.save()


def sweep_leftovers(st: State) -> None:
    """Remove what this state dir may have made without recording it (a crash between two steps).

    Only things named with this state dir's unique prefix or lying under its directory are touched.
    """
    with shielded():
        prefix = st.meta.get("prefix")
        known = {n["name"] for n in st.nodes}
        if prefix:
            for h in sysops.cgroup_hierarchies():
                for d in h.glob(util.cgroup_name(prefix + "-") + "*"):
                    if d.name[len(util.cgroup_name("")):] not in known:
                        sysops.cgroup_remove(d)
            for ifname in os.listdir("/sys/class/net"):
                if ifname.startswith("ve-" + prefix + "-") and ifname[3:] not in known:
                    sysops.run(["ip", "link", "del", ifname], check=False, quiet=True)
        nodes_root = st.dir / "nodes"
        if nodes_root.exists():
            for d in nodes_root.iterdir():
                if d.name not in known:
                    sysops.safe_rmtree(d)


def write_inventory(st: State) -> Path:
    st.inventory.write_text(util.render_inventory(st.nodes, str(st.key)))
    return st.inventory


# --------------------------------------------------------------------------- commands

def state_lock(st: State):
    return flocked(st.dir / ".lock")


def cmd_image(_args) -> int:
    sysops.need_tools("debootstrap", "systemd-nspawn")
    rootfs = image.ensure_image(REPO, log)
    print(rootfs)
    return 0


def _down_all(st: State) -> None:
    for n in list(st.nodes):
        log(f"removing {n['name']}")
        destroy(st, n)
    sweep_leftovers(st)


def extra_nodes(args) -> list[tuple[str, str]]:
    """(name suffix, inventory group) of each node `up` makes besides the N serving nodes."""
    extra = []
    if getattr(args, "monitor", False):
        extra.append(("mon", "sglang_monitors"))
    if getattr(args, "gateway", False):
        extra.append(("gw", gateway.GATEWAY_GROUP))
    return extra


def assign_other_hosts(state_dir: Path, nodes: list[dict], count: int, args) -> None:
    """Host variables for a fleet whose first `count` nodes serve and whose others are monitors or
    gateways. Any such host is another machine: it reaches each server at the node's own address
    (sglang_worker_host), never at the node's loopback, where a server stays without them (site.yml
    refuses a monitored server on loopback). A gateway also gets its TLS and API key (gateway.assign)."""
    serving = nodes[:count]
    if extra_nodes(args):
        for n in serving:
            n.setdefault("host_vars", {})["sglang_worker_host"] = n["ip"]
    gateways = [n for n in nodes if n.get("group") == gateway.GATEWAY_GROUP]
    if gateways:
        gateway.assign(state_dir, gateways[0], monitored=getattr(args, "monitor", False))


def cmd_up(args) -> int:
    count = args.count
    if count < 1 or count > 99:
        raise Fail("N must be between 1 and 99")
    sysops.need_tools("systemd-nspawn", "ssh", "ssh-keygen", "ip", "mount")
    t0 = time.monotonic()
    snapshot = read_snapshot(Path(args.from_snapshot)) if args.from_snapshot else None
    image_rootfs = Path(snapshot["image"]) if snapshot else image.ensure_image(REPO, log)
    st = State(state_dir())
    st.dir.mkdir(parents=True, exist_ok=True)
    with state_lock(st):
        st = State(st.dir)  # re-read under the lock
        if st.nodes:
            log(f"replacing the {len(st.nodes)} node(s) already up in {st.dir}")
        _down_all(st)
        st.inventory.unlink(missing_ok=True)
        st.ensure_key()
        ok = False
        try:
            with registry() as reg:
                prefix = ensure_prefix(st, reg)
                drop_stale_leases(reg)
                host_nets = sysops.host_networks()
                extra = extra_nodes(args)
                # Nodes of other roles reach the serving nodes (and back) through the host.
                peers = os.environ.get("TESTNODE_SUBNET_POOL", util.DEFAULT_POOL) if extra else None
                for i in range(1, count + 1):
                    name = util.node_name(prefix, i)
                    subnet = lease_subnet(st, reg, name, host_nets)
                    st.nodes.append(new_node_record(st, name, i, subnet, image_rootfs, peers=peers))
                for i, (suffix, group) in enumerate(extra, start=count + 1):
                    name = util.node_name(prefix, suffix)
                    subnet = lease_subnet(st, reg, name, host_nets)
                    st.nodes.append(new_node_record(st, name, i, subnet, image_rootfs, group=group, peers=peers))
                assign_other_hosts(st.dir, st.nodes, count, args)
                st.save()  # recorded under the registry lock: the leases are live from here on
            for n in st.nodes:
                # Only serving nodes start from a snapshot of a converged node; a monitor or gateway
                # host runs no SGLang server, so it starts from the base image.
                create_rootfs(n, snapshot if n.get("group") is None else None)
                personalize(st, n)  # a node made from a snapshot gets its own identity all the same
                st.save()
            for n in st.nodes:
                boot(st, n)
            wait_ready(st, st.nodes)
            st.save()
            inv = write_inventory(st)
            ok = True
        finally:
            if not ok:
                log("up failed or was interrupted: removing the nodes it made")
                with shielded():
                    _down_all(st)
    log(f"{len(st.nodes)} node(s) up in {time.monotonic() - t0:.1f} s: "
        + ", ".join(f"{n['name']}={n['ip']}" for n in st.nodes))
    print(inv)
    return 0


def cmd_down(_args) -> int:
    st = State(state_dir())
    if not st.dir.exists():
        return 0
    with state_lock(st):
        st = State(st.dir)
        _down_all(st)
        st.inventory.unlink(missing_ok=True)
        nodes_root = st.dir / "nodes"
        if nodes_root.exists() and not any(nodes_root.iterdir()):
            nodes_root.rmdir()
        st.save()
    return 0


def _same_identity(st: State, node: dict, snapshot: dict) -> bool:
    return snapshot.get("node") == node["name"] and snapshot.get("state_dir") == str(st.dir)


def _restart(st: State, node: dict, fresh: bool, snapshot: dict | None = None) -> None:
    t0 = time.monotonic()
    shutdown(st, node)
    if fresh:
        with shielded():
            sysops.unmount_below(Path(node["rootfs"]))
        if snapshot is not None:
            create_rootfs(node, snapshot)
            if _same_identity(st, node, snapshot):
                node["machine_id"] = snapshot["machine_id"]  # the snapshot's files, byte for byte
            else:
                personalize(st, node)
        else:
            if not Path(node["image"]).is_dir():
                node["image"] = str(image.ensure_image(REPO, log))
            create_rootfs(node)
            personalize(st, node)
        st.save()
    else:
        mount_rootfs(node)
    boot(st, node)
    try:
        wait_ready(st, [node])
    finally:
        st.save()
    log(f"{node['name']} back in {time.monotonic() - t0:.1f} s")


def cmd_reset(args) -> int:
    st = State(state_dir())
    snapshot = read_snapshot(Path(args.to_snapshot)) if args.to_snapshot else None
    with state_lock(st):
        st = State(st.dir)
        _restart(st, st.node(args.name), fresh=True, snapshot=snapshot)
    return 0


def cmd_snapshot(args) -> int:
    """Power the node off, keep its filesystem as the snapshot DIR, boot it again on top of it.

    Overlay mode moves the node's upper dir into DIR (nothing is copied) and stacks it as a
    read-only layer under a new, empty upper dir: the node goes on from exactly the snapshot,
    and later changes of the node never reach the snapshot. Copy mode copies the rootfs.
    """
    st = State(state_dir())
    target = Path(os.path.abspath(args.dir))
    with state_lock(st):
        st = State(st.dir)
        node = st.node(args.name)
        if target.exists() or target.is_symlink():
            raise Fail(f"{target} already exists: remove it (once no node uses it) or pick another directory")
        t0 = time.monotonic()
        shutdown(st, node)
        nd = Path(node["node_dir"])
        with shielded():
            sysops.unmount_below(Path(node["rootfs"]))
            target.mkdir(parents=True)
            meta = {"node": node["name"], "state_dir": str(st.dir), "machine_id": node["machine_id"],
                    "mode": node["mode"], "image": node["image"], "taken": time.strftime("%Y-%m-%d %H:%M:%S")}
            if node["mode"] == "overlay":
                shutil.move(str(nd / "upper"), str(target / "upper"))
                node["layers"] = [str(target / "upper"), *node.get("layers", [])]
                meta["layers"] = list(node["layers"])
                for sub in ("upper", "work"):
                    sysops.safe_rmtree(nd / sub)
                    (nd / sub).mkdir()
            else:
                sysops.run(["cp", "-a", "--reflink=auto", node["rootfs"], str(target / "rootfs")], quiet=True)
                meta["layers"] = []
                meta["rootfs"] = str(target / "rootfs")
            write_json(target / "snapshot.json", meta)
            st.save()
        mount_rootfs(node)
        boot(st, node)
        try:
            wait_ready(st, [node])
        finally:
            st.save()
    log(f"{node['name']}: snapshot {target} taken, node back in {time.monotonic() - t0:.1f} s")
    return 0


def cmd_reboot(args) -> int:
    st = State(state_dir())
    with state_lock(st):
        st = State(st.dir)
        _restart(st, st.node(args.name), fresh=False)
    return 0


def cmd_stop(args) -> int:
    st = State(state_dir())
    with state_lock(st):
        st = State(st.dir)
        node = st.node(args.name)
        shutdown(st, node)
        with shielded():
            sysops.unmount_below(Path(node["rootfs"]))
    return 0


def cmd_start(args) -> int:
    st = State(state_dir())
    with state_lock(st):
        st = State(st.dir)
        node = st.node(args.name)
        if sysops.is_alive(node.get("pid"), node.get("pid_start")):
            log(f"{node['name']} is already running")
            return 0
        _restart(st, node, fresh=False)
    return 0


def cmd_ssh(args) -> int:
    st = State(state_dir())
    node = st.node(args.name)
    cmd = list(args.command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:  # interactive shell
        ssh = ssh_base(st, node, batch=False)
        ssh.insert(1, "-t")
    else:
        ssh = ssh_base(st, node) + ["--"]
    r = subprocess.run(ssh + cmd)
    return r.returncode


def cmd_list(args) -> int:
    """One line per node: NAME IP running|stopped (status: also pid, rootfs, and the inventory)."""
    st = State(state_dir())
    for n in st.nodes:
        alive = "running" if sysops.is_alive(n.get("pid"), n.get("pid_start")) else "stopped"
        if args.cmd == "status":
            print(f"{n['name']}\t{n['ip']}\t{alive}\tpid={n.get('pid')}\t{n['rootfs']}")
        else:
            print(f"{n['name']}\t{n['ip']}\t{alive}")
    if args.cmd == "status" and st.inventory.exists():
        print(st.inventory)
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tests/testnode", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("up", help="make N fresh nodes; last stdout line: inventory path")
    s.add_argument("count", nargs="?", type=int, default=1, metavar="N")
    s.add_argument("--from-snapshot", metavar="DIR", help="start from a snapshot, each node with its own identity")
    s.add_argument("--monitor", action="store_true",
                   help="also make one monitoring host (NAME-mon) in the inventory group sglang_monitors")
    s.add_argument("--gateway", action="store_true",
                   help="also make one gateway host (NAME-gw) in the inventory group sglang_gateways, with a test CA, "
                        "certificate and API key; the N serving nodes listen on their own address")
    s.set_defaults(func=cmd_up)
    sub.add_parser("down", help="stop and remove every node of this state dir").set_defaults(func=cmd_down)
    sub.add_parser("image", help="build (or reuse) the cached base image").set_defaults(func=cmd_image)
    sub.add_parser("list", help="the nodes of this state dir: NAME IP STATE").set_defaults(func=cmd_list)
    sub.add_parser("status", help="list, with pids, rootfs paths and the inventory").set_defaults(func=cmd_list)
    for name, func, hlp in (("reset", cmd_reset, "fresh rootfs from the base image, boot, wait for SSH"),
                            ("reboot", cmd_reboot, "clean poweroff, boot the same rootfs, wait for SSH"),
                            ("stop", cmd_stop, "clean poweroff, keep the rootfs"),
                            ("start", cmd_start, "boot a stopped node, wait for SSH")):
        s = sub.add_parser(name, help=hlp)
        s.add_argument("name")
        if name == "reset":
            s.add_argument("--to-snapshot", metavar="DIR",
                           help="from this snapshot instead of the base image (the snapshot's own node keeps its identity)")
        s.set_defaults(func=func)
    s = sub.add_parser("snapshot", help="clean poweroff, keep the node's filesystem as snapshot DIR, boot again")
    s.add_argument("name")
    s.add_argument("dir")
    s.set_defaults(func=cmd_snapshot)
    s = sub.add_parser("ssh", help="run a command on a node: ssh NAME -- CMD...")
    s.add_argument("name")
    s.add_argument("command", nargs=argparse.REMAINDER)
    s.set_defaults(func=cmd_ssh)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if os.geteuid() != 0 and args.cmd not in ("ssh", "list", "status"):
        log("must run as root")
        return 2
    install_signal_handlers()
    try:
        return args.func(args)
    except Fail as e:
        log(f"error: {e}")
        return 1
    except Interrupted as e:
        log(f"interrupted by signal {e.args[0]}")
        return 128 + int(e.args[0])
