# -*- coding: utf-8 -*-
# Copyright: sglang-canon contributors
# MIT License (see LICENSE or https://opensource.org/licenses/MIT)
"""Pure parsing logic of the sglang_stack_facts module.

Everything here is text in, data out: no subprocess, no file access, so it is unit-tested
on real captures (tests/fixtures/stack/). Only the standard library is used: this file runs
on the managed node inside the module.

PROBE_SOURCE is the script the module hands to the Python that runs SGLang: one process
that imports torch once and prints one JSON document, which parse_probe_output() turns into
the facts' python/torch/nccl/sglang sections.
"""

from __future__ import annotations

import json
import re

# ---------------------------------------------------------------------------- nvidia-smi

# "Driver Version : 595.58.03" (nvidia-smi -q) and "Driver Version: 580.159.04" (banner).
_DRIVER_RE = re.compile(r"Driver Version\s*:\s*([0-9][0-9.]*)")
# "CUDA Version : 13.2" (-q) and "CUDA Version: 13.0" (banner). Newer drivers may print the
# kernel-mode and user-mode CUDA versions on separate lines; the first one is the driver's.
_CUDA_RE = re.compile(r"CUDA Version\s*:\s*([0-9][0-9.]*)")
_ATTACHED_RE = re.compile(r"^\s*Attached GPUs\s*:\s*(\d+)\s*$", re.MULTILINE)
# A GPU row of the banner table: "|   0  NVIDIA H200      On  |   00000000:00:06.0 Off |"
_BANNER_GPU_RE = re.compile(r"^\|\s+\d+\s+.*\|\s+[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]\s")
_NO_DEVICES_RE = re.compile(r"No devices were found", re.IGNORECASE)


def _empty_driver():
    return {"driver_version": None, "cuda_version": None, "gpu_count": None}


def parse_nvidia_smi_q(text):
    """Header of `nvidia-smi -q`: {'driver_version', 'cuda_version', 'gpu_count'} (None where absent).

    Only the lines before the first GPU section are read, so nothing of a GPU's own report
    (which has other "... Version" lines) can be mistaken for the header.
    """
    result = _empty_driver()
    if not text:
        return result
    header_lines = []
    for line in text.splitlines():
        if re.match(r"^GPU [0-9A-Fa-f]{4,8}:", line):
            break
        header_lines.append(line)
    header = "\n".join(header_lines)
    match = _DRIVER_RE.search(header)
    if match:
        result["driver_version"] = match.group(1).rstrip(".")
    match = _CUDA_RE.search(header)
    if match:
        result["cuda_version"] = match.group(1).rstrip(".")
    match = _ATTACHED_RE.search(header)
    if match:
        result["gpu_count"] = int(match.group(1))
    elif _NO_DEVICES_RE.search(text):
        result["gpu_count"] = 0
    return result


def parse_nvidia_smi_banner(text):
    """The table plain `nvidia-smi` prints: driver version, supported CUDA version, GPU rows."""
    result = _empty_driver()
    if not text:
        return result
    match = _DRIVER_RE.search(text)
    if match:
        result["driver_version"] = match.group(1).rstrip(".")
    match = _CUDA_RE.search(text)
    if match:
        result["cuda_version"] = match.group(1).rstrip(".")
    if result["driver_version"] is not None:
        result["gpu_count"] = sum(1 for line in text.splitlines() if _BANNER_GPU_RE.match(line))
    elif _NO_DEVICES_RE.search(text):
        result["gpu_count"] = 0
    return result


def parse_nvidia_smi_query_driver(text):
    """`nvidia-smi --query-gpu=driver_version --format=csv,noheader`: one version per GPU, no CUDA version."""
    result = _empty_driver()
    if not text:
        return result
    versions = [line.strip() for line in text.splitlines() if re.match(r"^\s*[0-9]+(\.[0-9]+)+\s*$", line)]
    if versions:
        result["driver_version"] = versions[0]
        result["gpu_count"] = len(versions)
    elif _NO_DEVICES_RE.search(text):
        result["gpu_count"] = 0
    return result


# ---------------------------------------------------------------------------- nvcc

# "Cuda compilation tools, release 13.0, V13.0.88"
_NVCC_RE = re.compile(r"release\s+([0-9]+\.[0-9]+)\s*,\s*V([0-9][0-9.]*)")


def parse_nvcc_version(text):
    """`nvcc --version` -> {'release': '13.0', 'version': '13.0.88'}, or None when not recognised."""
    if not text:
        return None
    match = _NVCC_RE.search(text)
    if not match:
        return None
    return {"release": match.group(1), "version": match.group(2).rstrip(".")}


# ---------------------------------------------------------------------------- versions

def version_tuple(value):
    """'13.0.88' -> (13, 0, 88); '2.9.1+cu130' -> (2, 9, 1); None or junk -> None.

    Only the leading dotted run of integers counts (a local tag or a pre-release suffix is
    ignored), which is how the expectations compare versions.
    """
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        try:
            return tuple(int(part) for part in value)
        except (TypeError, ValueError):
            return None
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    match = re.match(r"^\s*v?(\d+(?:\.\d+)*)", str(value))
    if not match:
        return None
    return tuple(int(part) for part in match.group(1).split("."))


def nccl_version_string(value):
    """torch.cuda.nccl.version() gives (2, 28, 9) or, in old torch, an int like 22809 / 2809."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return ".".join(str(int(part)) for part in value)
    if isinstance(value, int) and not isinstance(value, bool):
        # NCCL_VERSION_CODE: major*10000 + minor*100 + patch since 2.9; major*1000 + minor*100 + patch before.
        if value >= 10000:
            major, rest = divmod(value, 10000)
        else:
            major, rest = divmod(value, 1000)
        minor, patch = divmod(rest, 100)
        return "%d.%d.%d" % (major, minor, patch)
    text = str(value).strip()
    return text or None


def split_local_version(version):
    """'2.9.1+cu130' -> ('2.9.1', 'cu130'); '2.13.0' -> ('2.13.0', None)."""
    if version is None:
        return None, None
    public, sep, local = str(version).partition("+")
    return public, (local if sep else None)


# ---------------------------------------------------------------------------- python probe

# Run as `PYTHON -c PROBE_SOURCE` (no file on the node). Prints one marked JSON line; every
# step is guarded, so a missing torch or sglang is data, not a crash. Keep it compatible
# with Python 3.8+ (the node's SGLang Python can be any supported one).
FINGERPRINT_SOURCE = r'''
import hashlib, json, os, sys

def stack_fingerprint():
    """Changes when a package is installed, removed or upgraded in this Python (the
    directories on sys.path change mtime when entries are added or removed)."""
    parts = [os.path.realpath(sys.executable), sys.version]
    for entry in sys.path:
        if not entry:
            continue
        try:
            parts.append("%s %d" % (entry, os.stat(entry).st_mtime_ns))
        except OSError:
            parts.append("%s -" % entry)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()
'''

# Cheap check (no torch import) used to reuse facts gathered earlier in the run.
FINGERPRINT_PROBE_SOURCE = FINGERPRINT_SOURCE + r'''
sys.stdout.write("\nSGLANG_STACK_FINGERPRINT " + stack_fingerprint() + "\n")
'''

PROBE_SOURCE = FINGERPRINT_SOURCE + r'''
import platform
out = {"python": {"executable": sys.executable, "version": platform.python_version(),
                  "prefix": sys.prefix}, "errors": {}, "fingerprint": stack_fingerprint()}
try:
    import importlib.metadata as md
except ImportError:  # Python < 3.8
    md = None

def dist_version(*names):
    for name in names:
        try:
            return name, md.version(name)
        except Exception:
            continue
    return None, None

torch_info = {"version": None, "cuda": None, "git_version": None, "cuda_available": None,
              "device_count": None, "devices": [], "cudnn_version": None, "location": None}
nccl = {"version": None, "source": None}
try:
    import torch
    torch_info["version"] = str(torch.__version__)
    torch_info["cuda"] = getattr(torch.version, "cuda", None)
    torch_info["git_version"] = getattr(torch.version, "git_version", None)
    torch_info["location"] = os.path.dirname(torch.__file__)
    try:
        torch_info["cuda_available"] = bool(torch.cuda.is_available())
        torch_info["device_count"] = int(torch.cuda.device_count()) if torch_info["cuda_available"] else 0
        for index in range(torch_info["device_count"]):
            major, minor = torch.cuda.get_device_capability(index)
            torch_info["devices"].append({"index": index, "name": torch.cuda.get_device_name(index),
                                          "compute_capability": "%d.%d" % (major, minor)})
    except Exception as exc:
        out["errors"]["cuda"] = "%s: %s" % (type(exc).__name__, exc)
    try:
        cudnn = torch.backends.cudnn.version()
        torch_info["cudnn_version"] = cudnn
    except Exception:
        pass
    try:
        nccl["version"] = torch.cuda.nccl.version()
        nccl["source"] = "torch.cuda.nccl.version()"
    except Exception as exc:
        out["errors"]["nccl"] = "%s: %s" % (type(exc).__name__, exc)
except Exception as exc:
    out["errors"]["torch"] = "%s: %s" % (type(exc).__name__, exc)
out["torch"] = torch_info

if nccl["version"] is None and md is not None:
    name, version = dist_version("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11", "nvidia-nccl")
    if version:
        nccl["version"] = version
        nccl["source"] = "wheel " + name
out["nccl"] = nccl

sglang = {"version": None, "location": None}
if md is not None:
    try:
        dist = md.distribution("sglang")
        sglang["version"] = dist.version
        sglang["location"] = str(dist.locate_file("sglang"))
    except Exception as exc:
        out["errors"]["sglang"] = "%s: %s" % (type(exc).__name__, exc)
try:
    import importlib.util
    spec = importlib.util.find_spec("sglang")
    if spec is not None and spec.submodule_search_locations:
        sglang["location"] = list(spec.submodule_search_locations)[0]
except Exception:
    pass
out["sglang"] = sglang
sys.stdout.write("\nSGLANG_STACK_PROBE " + json.dumps(out, default=str) + "\n")
'''

PROBE_MARKER = "SGLANG_STACK_PROBE "
FINGERPRINT_MARKER = "SGLANG_STACK_FINGERPRINT "


class ProbeOutputError(ValueError):
    """The Python probe printed no usable JSON."""


def parse_probe_output(stdout):
    """The probe's stdout -> dict with python, torch, nccl, sglang and errors sections.

    The JSON is the last line that starts with PROBE_MARKER (torch may print warnings first).
    Normalises the NCCL version to 'major.minor.patch' and adds the compute capabilities list.
    """
    payload = None
    for line in (stdout or "").splitlines():
        if line.startswith(PROBE_MARKER):
            payload = line[len(PROBE_MARKER):]
    if payload is None:
        raise ProbeOutputError("the probe printed no %r line" % PROBE_MARKER.strip())
    try:
        data = json.loads(payload)
    except ValueError as exc:
        raise ProbeOutputError("the probe's JSON does not parse: %s" % exc)
    if not isinstance(data, dict):
        raise ProbeOutputError("the probe's JSON is not an object")
    torch_info = dict(data.get("torch") or {})
    devices = list(torch_info.get("devices") or [])
    torch_info["devices"] = devices
    torch_info["compute_capabilities"] = [d.get("compute_capability") for d in devices]
    public, local = split_local_version(torch_info.get("version"))
    torch_info["version_public"] = public
    torch_info["version_local"] = local
    nccl = dict(data.get("nccl") or {})
    nccl["version"] = nccl_version_string(nccl.get("version"))
    return {
        "python": dict(data.get("python") or {}),
        "torch": torch_info,
        "nccl": nccl,
        "sglang": dict(data.get("sglang") or {}),
        "errors": dict(data.get("errors") or {}),
        "fingerprint": data.get("fingerprint"),
    }


def parse_fingerprint_output(stdout):
    """The fingerprint probe's stdout -> the hex digest, or None."""
    found = None
    for line in (stdout or "").splitlines():
        if line.startswith(FINGERPRINT_MARKER):
            found = line[len(FINGERPRINT_MARKER):].strip() or None
    return found


def empty_python_facts(executable, error):
    """Facts for a Python that could not be run at all (missing interpreter, probe crash)."""
    return {
        "python": {"executable": executable, "version": None, "prefix": None},
        "torch": {"version": None, "version_public": None, "version_local": None, "cuda": None,
                  "git_version": None, "cuda_available": None, "device_count": None, "devices": [],
                  "compute_capabilities": [], "cudnn_version": None, "location": None},
        "nccl": {"version": None, "source": None},
        "sglang": {"version": None, "location": None},
        "errors": {"python": error},
        "fingerprint": None,
    }
