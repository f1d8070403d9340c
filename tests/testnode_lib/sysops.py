"""Side-effecting host helpers of tests/testnode: commands, mounts, processes, cgroups."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from . import util

CGROUP_ROOT = Path("/sys/fs/cgroup")


class Fail(Exception):
    """An error with a message meant for the user (no traceback)."""


def log(msg: str) -> None:
    print(f"testnode: {msg}", file=sys.stderr, flush=True)


def run(cmd: list[str], check: bool = True, capture: bool = False, timeout: float | None = None,
        quiet: bool = False) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, stdin=subprocess.DEVNULL, text=True, timeout=timeout,
                       stdout=subprocess.PIPE if (capture or quiet) else sys.stderr,
                       stderr=subprocess.PIPE if (capture or quiet) else sys.stderr)
    if check and r.returncode != 0:
        detail = ((r.stderr or "") + (r.stdout or "")).strip() if (capture or quiet) else ""
        raise Fail(f"command failed ({r.returncode}): {' '.join(cmd)}" + (f"\n  {detail}" if detail else ""))
    return r


def run_group(cmd: list[str], stdout) -> int:
    """Run cmd in its own process group; if we are interrupted, the whole group is killed."""
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.STDOUT,
                         start_new_session=True)
    try:
        return p.wait()
    except BaseException:
        for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                break
            try:
                p.wait(wait)
                break
            except subprocess.TimeoutExpired:
                pass
        # stragglers of the group (dpkg in the chroot) may outlive the leader
        end = time.monotonic() + 10
        while time.monotonic() < end:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        raise


def read_json(path: Path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def need_tools(*tools: str) -> None:
    missing = [t for t in tools if not shutil.which(t)]
    if missing:
        raise Fail("missing host tools: " + ", ".join(missing) +
                   " (apt-get install debootstrap systemd-container openssh-client iproute2)")


def du_mb(path: Path) -> int:
    r = run(["du", "-sxm", str(path)], check=False, capture=True)
    try:
        return int(r.stdout.split()[0])
    except (IndexError, ValueError):
        return -1


# --------------------------------------------------------------------------- mounts

def mountinfo() -> str:
    return Path("/proc/self/mountinfo").read_text()


def mounts_below(path: Path) -> list[str]:
    return util.mounts_under(mountinfo(), os.path.realpath(path))


def is_mountpoint(path: Path) -> bool:
    return os.path.realpath(path) in mounts_below(path)


def unmount_below(path: Path) -> None:
    """Unmount everything at or below path (deepest first); lazily if busy."""
    for _ in range(3):
        mps = mounts_below(path)
        if not mps:
            return
        for mp in mps:
            r = run(["umount", mp], check=False, quiet=True)
            if r.returncode != 0:
                run(["umount", "-l", mp], check=False, quiet=True)
    left = mounts_below(path)
    if left:
        raise Fail(f"could not unmount: {left}")


def safe_rmtree(path: Path) -> None:
    """rm -rf that first unmounts anything below path and never crosses into a mount."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return
    unmount_below(path)
    if mounts_below(path):
        raise Fail(f"refusing to delete {path}: mounts below it")
    shutil.rmtree(path, ignore_errors=False)


# --------------------------------------------------------------------------- processes

def proc_identity(pid: int) -> int | None:
    """starttime of a live (non-zombie) process, or None."""
    try:
        state, start = util.parse_proc_stat(Path(f"/proc/{pid}/stat").read_text())
    except (OSError, ValueError, IndexError):
        return None
    if state in ("Z", "X"):
        return None
    return start


def is_alive(pid: int | None, start: int | None) -> bool:
    if not pid:
        return False
    s = proc_identity(pid)
    return s is not None and (start is None or s == start)


def reap(pid: int) -> None:
    """Collect an exited child of ours (no-op for non-children)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    except OSError:
        pass


def wait_gone(pid: int, start: int | None, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        reap(pid)
        if not is_alive(pid, start):
            return True
        time.sleep(0.1)
    reap(pid)
    return not is_alive(pid, start)


def terminate(pid: int | None, start: int | None, timeout: float = 30.0, name: str = "") -> bool:
    """Stop systemd-nspawn: SIGTERM (clean poweroff of the container), after `timeout` a second SIGTERM
    (nspawn then terminates the container at once), then SIGKILL. True when the first SIGTERM sufficed.

    A container whose systemd has not yet installed its signal handlers ignores the first one, so
    callers stopping a node that is still booting pass a short timeout.
    """
    if not pid or not is_alive(pid, start):
        if pid:
            reap(pid)
        return True
    what = name or f"pid {pid}"
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGTERM, 5.0), (signal.SIGKILL, 10.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return True
        if wait_gone(pid, start, wait):
            return sig == signal.SIGTERM and wait == timeout
        log(f"{what} still running {wait:.0f} s after {signal.Signals(sig).name}; escalating")
    return False


# --------------------------------------------------------------------------- cgroups

def cgroup_hierarchies() -> list[Path]:
    """Writable hierarchies a node's cgroup is created in: name=systemd (v1) and the unified (v2) one.

    On a pure cgroup v2 host /sys/fs/cgroup itself is the unified hierarchy.
    """
    out = []
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        return [CGROUP_ROOT]
    for h in ("systemd", "unified"):
        p = CGROUP_ROOT / h
        if (p / "cgroup.procs").exists():
            out.append(p)
    return out


def cgroup_paths(cgname: str) -> list[Path]:
    return [h / cgname for h in cgroup_hierarchies()]


def cgroup_create(cgname: str) -> list[str]:
    paths = []
    for p in cgroup_paths(cgname):
        if p.exists():
            cgroup_remove(p)
        p.mkdir()
        paths.append(str(p))
    return paths


def cgroup_procs(path: Path) -> list[int]:
    pids = []
    for d, _dirs, files in os.walk(path):
        if "cgroup.procs" in files:
            try:
                pids += [int(x) for x in Path(d, "cgroup.procs").read_text().split()]
            except OSError:
                pass
    return pids


def cgroup_remove(path: Path, timeout: float = 10.0) -> None:
    """Kill anything left in a cgroup tree we made, then remove its directories bottom-up."""
    path = Path(path)
    if not path.exists():
        return
    end = time.monotonic() + timeout
    while True:
        pids = cgroup_procs(path)
        if not pids:
            break
        if time.monotonic() > end:
            raise Fail(f"processes still in {path}: {pids}")
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            reap(pid)
        time.sleep(0.1)
    dirs = [d for d, _s, _f in os.walk(path)]
    for d in sorted(dirs, key=lambda x: x.count("/"), reverse=True):
        for _ in range(50):
            try:
                os.rmdir(d)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise Fail(f"could not remove cgroup {d}")


def cgroup_enter(paths: list[str]) -> None:
    """Move the calling process into the given cgroups (used as preexec_fn before exec of nspawn)."""
    for p in paths:
        with open(os.path.join(p, "cgroup.procs"), "w") as f:
            f.write("0")


def remove_unheld_lock(path: Path) -> None:
    """Delete a lock file left behind, unless some process still holds a lock on it."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        # a POSIX record lock conflicts with the OFD locks systemd takes (flock would not)
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return
    try:
        os.unlink(path)
    except OSError:
        pass
    os.close(fd)


# --------------------------------------------------------------------------- network

def link_exists(ifname: str) -> bool:
    return Path("/sys/class/net", ifname).exists()


def host_networks() -> list[str]:
    """IPv4 networks the host already uses (addresses and routes), to keep node subnets clear of them."""
    nets = []
    r = run(["ip", "-4", "-o", "addr", "show"], check=False, capture=True)
    for line in r.stdout.splitlines():
        parts = line.split()
        if "inet" in parts:
            nets.append(parts[parts.index("inet") + 1])
    r = run(["ip", "-4", "route", "show", "table", "all"], check=False, capture=True)
    for line in r.stdout.splitlines():
        parts = line.split()
        if not parts:
            continue
        dst = parts[1] if parts[0] in ("local", "broadcast", "unicast", "unreachable", "blackhole",
                                      "prohibit", "throw") and len(parts) > 1 else parts[0]
        if dst == "default":
            continue
        nets.append(dst)
    return nets
