"""Base image of the test nodes: a Debian 12 rootfs built by debootstrap, cached by content hash.

The cache key covers packages.txt and this file's source, so editing either rebuilds the image.
"""

from __future__ import annotations

import fcntl
import glob
import json
import os
import re
import time
from pathlib import Path

from . import sysops, util

SUITE = "bookworm"
HERE = Path(__file__).resolve().parent
PACKAGES_FILE = HERE / "packages.txt"

SSHD_DROPIN = """\
# tests/testnode: root by key only, no passwords, fast logins.
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
UseDNS no
HostKey /etc/ssh/ssh_host_ed25519_key
"""

# Units that only add noise (or fail) in an air-gapped container.
MASK_UNITS = [
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "apt-daily.service",
    "apt-daily-upgrade.service",
    "e2scrub_all.timer",
    "e2scrub_all.service",
    "e2scrub_reap.service",
    "fstrim.timer",
    "dpkg-db-backup.timer",
    "systemd-hwdb-update.service",
]

ENABLE_UNITS = ["systemd-networkd.service", "ssh.service"]


def packages() -> list[str]:
    return util.read_package_list(PACKAGES_FILE.read_text())


def key() -> str:
    recipe = Path(__file__).read_text()
    return util.image_key(packages(), SUITE, recipe)


def cache_root(repo: Path) -> Path:
    env = os.environ.get("TESTNODE_CACHE_DIR")
    return Path(os.path.abspath(env)) if env else repo / ".cache" / "testnode"


def image_dir(repo: Path) -> Path:
    return cache_root(repo) / f"base-{key()}"


def find_mirror() -> tuple[str, str | None]:
    env = os.environ.get("TESTNODE_DEBIAN_MIRROR")
    if env:
        return env, None
    files = {}
    paths = ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*.sources")) \
        + sorted(glob.glob("/etc/apt/sources.list.d/*.list"))
    for p in paths:
        try:
            files[p] = Path(p).read_text()
        except OSError:
            pass
    uri, keyring = util.parse_apt_sources(files, SUITE)
    if not uri:
        raise sysops.Fail(f"no 'deb' source for suite {SUITE} found in the host's apt sources "
                          "(set TESTNODE_DEBIAN_MIRROR to a Debian mirror URI)")
    return uri, keyring


def ensure_image(repo: Path, log) -> Path:
    """Return the cached base rootfs, building it first if needed (serialised by a lock in the cache)."""
    d = image_dir(repo)
    rootfs = d / "rootfs"
    if (d / "complete").exists():
        return rootfs
    root = cache_root(repo)
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lockf:
        fcntl.flock(lockf, fcntl.LOCK_EX)
        if (d / "complete").exists():
            return rootfs
        build(d, log)
        prune(root, keep=d, log=log)
    return rootfs


def images_in_use() -> set[str]:
    """Image rootfs paths recorded by the nodes of every state dir in the host-wide registry."""
    used = set()
    reg = sysops.read_json(Path(util.RUN_DIR) / "registry.json") or {}
    for state_dir in set((reg.get("prefixes") or {}).values()):
        nodes = sysops.read_json(Path(state_dir) / "nodes.json")
        for n in nodes if isinstance(nodes, list) else []:
            if n.get("image"):
                used.add(os.path.realpath(n["image"]))
    return used


def prune(root: Path, keep: Path, log) -> None:
    """Remove older images no node uses (mounted as an overlay lower dir or recorded in a state dir)
    and half-built ones. Called with the cache lock held, so no build is in progress."""
    mi = sysops.mountinfo()
    used = images_in_use()
    for d in root.iterdir():
        if d == keep or not d.is_dir():
            continue
        if re.fullmatch(r"base-[0-9a-f]{16}", d.name):
            rootfs = os.path.realpath(d / "rootfs")
            if rootfs in used or str(d) in mi:
                continue
            log(f"removing unused old image {d.name}")
        elif not re.fullmatch(r"\.build-base-[0-9a-f]{16}-[0-9]+", d.name):
            continue
        try:
            sysops.safe_rmtree(d)
        except (OSError, sysops.Fail) as e:
            log(f"could not remove {d}: {e}")


def build(d: Path, log) -> None:
    sysops.need_tools("debootstrap", "chroot")
    mirror, keyring = find_mirror()
    tmp = d.parent / f".build-{d.name}-{os.getpid()}"
    if tmp.exists():
        sysops.safe_rmtree(tmp)
    if d.exists():
        sysops.safe_rmtree(d)
    tmp.mkdir(parents=True)
    target = tmp / "rootfs"
    t0 = time.monotonic()
    pkgs = packages()
    log(f"building base image {d.name} (debootstrap {SUITE}, {len(pkgs)} packages); takes about a minute")
    cmd = ["debootstrap", "--variant=minbase", "--components=main",
           "--include=" + ",".join(pkgs)]
    if keyring and os.path.exists(keyring):
        cmd.append("--keyring=" + keyring)
    cmd += [SUITE, str(target), mirror]
    try:
        with open(tmp / "debootstrap.log", "w") as lf:
            rc = sysops.run_group(cmd, stdout=lf)
        if rc != 0:
            tail = (tmp / "debootstrap.log").read_text(errors="replace").splitlines()[-25:]
            dbl = target / "debootstrap" / "debootstrap.log"
            if dbl.exists():
                tail += ["--- debootstrap/debootstrap.log:"] + dbl.read_text(errors="replace").splitlines()[-25:]
            raise sysops.Fail("debootstrap failed:\n  " + "\n  ".join(tail))
        configure(target)
        manifest = {
            "key": d.name,
            "suite": SUITE,
            "packages": pkgs,
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "build_seconds": round(time.monotonic() - t0, 1),
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        (tmp / "debootstrap.log").unlink(missing_ok=True)
        # Everything under tmp is plain files now (debootstrap unmounted proc/sys).
        if sysops.mounts_below(tmp):
            raise sysops.Fail(f"mounts left below {tmp}: {sysops.mounts_below(tmp)}")
        (tmp / "complete").write_text(manifest["built_at"] + "\n")
        os.rename(tmp, d)
    except BaseException:
        sysops.safe_rmtree(tmp)
        raise
    size = sysops.du_mb(d / "rootfs")
    log(f"base image ready in {time.monotonic() - t0:.0f} s ({size} MB): {d}")


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    if path.is_symlink() or path.exists():
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chmod(path, mode)


def configure(r: Path) -> None:
    """Image-wide configuration; per-node bits (address, keys, machine-id, hostname) come at node creation."""
    # sshd: key-only root login; host keys are made per node.
    _write(r / "etc/ssh/sshd_config.d/10-testnode.conf", SSHD_DROPIN)
    for k in glob.glob(str(r / "etc/ssh/ssh_host_*")):
        os.unlink(k)
    (r / "root/.ssh").mkdir(mode=0o700, exist_ok=True)
    os.chmod(r / "root/.ssh", 0o700)

    # machine-id: empty in the image, written per node.
    _write(r / "etc/machine-id", "", 0o444)
    dbus_mid = r / "var/lib/dbus/machine-id"
    if dbus_mid.is_symlink() or dbus_mid.exists():
        dbus_mid.unlink()
    dbus_mid.parent.mkdir(parents=True, exist_ok=True)
    os.symlink("/etc/machine-id", dbus_mid)

    # identity and name resolution: written per node; no DNS (air-gapped).
    for p in ("etc/hostname",):
        (r / p).unlink(missing_ok=True)
    _write(r / "etc/resolv.conf", "# air-gapped test node: no DNS\n")
    _write(r / "etc/default/locale", "LANG=C.UTF-8\n")
    _write(r / "etc/fstab", "# test node: no file systems to mount\n")
    # debootstrap's sources.list names the build host's mirror; the nodes cannot reach it anyway.
    _write(r / "etc/apt/sources.list", "# air-gapped test node: no package sources\n")

    # systemd units
    sysops.run(["chroot", str(r), "systemctl", "enable", "--quiet"] + ENABLE_UNITS, quiet=True)
    for u in MASK_UNITS:
        link = r / "etc/systemd/system" / u
        if link.is_symlink() or link.exists():
            link.unlink()
        os.symlink("/dev/null", link)
    # Network file placeholder (the real one is written per node with its address).
    (r / "etc/systemd/network").mkdir(parents=True, exist_ok=True)

    # journald: keep it small and volatile-friendly.
    _write(r / "etc/systemd/journald.conf.d/10-testnode.conf",
           "[Journal]\nSystemMaxUse=32M\nRuntimeMaxUse=32M\n")

    # mount points for the read-only binds and model fixtures
    for p in ("srv/wheelhouse", "opt/sglang-test-double", "srv/models"):
        (r / p).mkdir(parents=True, exist_ok=True)

    # shrink
    for p in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for f in glob.glob(str(r / p / "*")):
            if os.path.isfile(f) and not f.endswith("/lock"):
                os.unlink(f)
    for f in glob.glob(str(r / "var/cache/apt/*.bin")):
        os.unlink(f)
    for p in ("var/log/bootstrap.log",):
        (r / p).unlink(missing_ok=True)
