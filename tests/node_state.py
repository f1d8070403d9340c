"""What the integration tests read from a test node: a fingerprint of everything site.yml
manages, the server's process, its health, and the messages of a failed run.

One SSH round trip per read: a small Python program runs on the node with its system Python.
"""

from __future__ import annotations

import base64
import json
import shlex
import time

import expected

SERVICE = "sglang.service"
UNIT = "/etc/systemd/system/sglang.service"
ENV_FILE = "/etc/sglang/sglang.env"
SECRETS_FILE = "/etc/sglang/sglang.secrets.env"
LAST_GOOD = "/etc/sglang/last-good"
LIBEXEC = "/usr/local/libexec/sglang-canon"
PROBE = f"{LIBEXEC}/sglang-wait-healthy"
WATCHDOG_PROGRAM = f"{LIBEXEC}/sglang-watchdog"
WATCHDOG_UNITS = ("/etc/systemd/system/sglang-watchdog.service", "/etc/systemd/system/sglang-watchdog.timer")
WATCHDOG_TIMER = WATCHDOG_UNITS[1]
STATE_DIR = "/var/lib/sglang-canon"
# One patch record per release (sglang_patches_dir), the one of the release the test node serves.
MANIFEST = expected.testnode_vars()["sglang_patches_manifest"]
NCCL_RECORD = f"{STATE_DIR}/nccl/applied.json"
DOC = "/root/production_v2.md"
HEALTH_URL = "http://127.0.0.1:30000/health"

# Runs on the node: argv[1] = JSON list of paths. Prints one JSON object.
_FINGERPRINT = r"""
import grp, hashlib, json, os, pwd, stat, subprocess, sys

def owner(uid, gid):
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = uid
    try:
        group = grp.getgrgid(gid).gr_name
    except KeyError:
        group = gid
    return user, group

def describe(path):
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "missing"
    user, group = owner(st.st_uid, st.st_gid)
    entry = {"owner": f"{user}:{group}", "mode": oct(stat.S_IMODE(st.st_mode))}
    if stat.S_ISLNK(st.st_mode):
        entry["link"] = os.readlink(path)
    elif stat.S_ISDIR(st.st_mode):
        entry["dir"] = sorted(os.listdir(path))
    else:
        with open(path, "rb") as handle:
            entry["sha256"] = hashlib.sha256(handle.read()).hexdigest()
    return entry

def show(unit, *props):
    out = subprocess.run(["systemctl", "show", unit, *("--property=" + p for p in props)],
                         capture_output=True, text=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

unit = show("sglang.service", "LoadState", "ActiveState", "SubState", "UnitFileState", "MainPID", "FragmentPath")
pid = int(unit.pop("MainPID") or 0)
process = None
if pid:
    with open(f"/proc/{pid}/status") as handle:
        ids = {l.split(":")[0]: l.split()[1] for l in handle if l.startswith(("Uid:", "Gid:"))}
    process = owner(int(ids["Uid"]), int(ids["Gid"]))
try:
    user = pwd.getpwnam("sglang")
    account = {"uid": user.pw_uid, "group": owner(0, user.pw_gid)[1], "home": user.pw_dir, "shell": user.pw_shell}
except KeyError:
    account = "missing"
print(json.dumps({
    "files": {path: describe(path) for path in json.loads(sys.argv[1])},
    "unit": unit,
    "process_runs_as": process,
    "service_user": account,
    "enabled": subprocess.run(["systemctl", "is-enabled", "sglang.service"], capture_output=True, text=True).stdout.strip(),
}, sort_keys=True))
"""


def _remote_python(node, program, *args):
    """Run a Python program on the node (its /usr/bin/python3); return stdout."""
    encoded = base64.b64encode(program.encode()).decode()
    quoted = " ".join(shlex.quote(str(a)) for a in args)
    done = node.ssh(
        f"echo {encoded} | base64 -d > /tmp/.node_state.py && /usr/bin/python3 /tmp/.node_state.py {quoted}"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def ssh(node, command):
    """Run a shell command on the node; fail the test when it fails; return stdout."""
    done = node.ssh(command)
    assert done.returncode == 0, f"{command}: rc {done.returncode}\n{done.stdout}{done.stderr}"
    return done.stdout


def managed_paths(node):
    """Every file site.yml writes on the node, found from its own records there."""
    manifest = json.loads(ssh(node, f"cat {MANIFEST}"))
    record = json.loads(ssh(node, f"cat {NCCL_RECORD}"))
    paths = [UNIT, "/etc/sglang", ENV_FILE, SECRETS_FILE, LAST_GOOD, MANIFEST, NCCL_RECORD, DOC, STATE_DIR]
    # the helper programs of the server's and the watchdog's units, the watchdog's units
    paths += [LIBEXEC] + [f"{LIBEXEC}/{name}" for name in ("sglang-wait-healthy", "sglang-wait-active",
                                                           "systemd-unit-verify", "sglang-watchdog")]
    paths += list(WATCHDOG_UNITS)
    paths += sorted(f"{LAST_GOOD}/{name}" for name in ("sglang.service", "sglang.env", "sglang.secrets.env"))
    paths += sorted(f"{manifest['site_packages']}/{rel}" for rel in manifest["files"])
    paths += [
        place for place in (record.get("places") or {}).values() if isinstance(place, str) and place.startswith("/")
    ]
    return paths


def fingerprint(node, paths):
    """sha256/owner/mode of each path, the unit's state, the service user, who the server runs as."""
    return json.loads(_remote_python(node, _FINGERPRINT, json.dumps(paths)))


def differences(before, after):
    """Human-readable list of what differs between two fingerprints."""
    found = []
    for key in sorted(set(before) | set(after)):
        if key == "files":
            for path in sorted(set(before["files"]) | set(after["files"])):
                if before["files"].get(path) != after["files"].get(path):
                    found.append(f"{path}: {before['files'].get(path)} -> {after['files'].get(path)}")
        elif before.get(key) != after.get(key):
            found.append(f"{key}: {before.get(key)} -> {after.get(key)}")
    return found


def main_pid(node):
    return int(ssh(node, f"systemctl show --property=MainPID --value {SERVICE}").strip() or 0)


def process_environ(node, pid):
    lines = ssh(node, f"tr '\\0' '\\n' < /proc/{pid}/environ").splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def health_code(node):
    return node.ssh(f"curl -s -o /dev/null -m 5 -w '%{{http_code}}' {HEALTH_URL}").stdout.strip()


def wait_healthy(node, timeout, other_than_pid=None):
    """Poll until the service is active, /health answers 200 and (optionally) the MainPID is
    not other_than_pid; return (pid, seconds waited). Fails the test at the deadline."""
    start = time.monotonic()
    state = ""
    while time.monotonic() - start < timeout:
        pid = main_pid(node) if node.ssh("true").returncode == 0 else 0
        if pid and pid != other_than_pid:
            active = node.ssh(f"systemctl is-active {SERVICE}").stdout.strip()
            code = health_code(node)
            state = f"pid {pid}, {active}, /health {code}"
            if active == "active" and code == "200":
                return pid, time.monotonic() - start
        time.sleep(1)
    raise AssertionError(f"{SERVICE} not healthy within {timeout} s ({state or 'no new MainPID'})")


def failure_messages(result):
    """msg of every failed task of a run, loop items included (a loop's own msg only says that
    'one or more items failed')."""
    messages = []
    for event in result.events:
        if event.get("event") not in ("runner_on_failed", "runner_item_on_failed"):
            continue
        res = event["event_data"].get("res", {})
        messages.append(str(res.get("msg", "")))
        messages += [str(item.get("msg", "")) for item in res.get("results", []) if item.get("failed")]
    return [m for m in messages if m]


def host_changed(result, host):
    """The host's changed count in ansible-runner's stats."""
    return result.count("changed", host)
