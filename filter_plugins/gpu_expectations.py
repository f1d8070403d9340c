"""Compare the gpu_topology fact (library/gpu_topology.py) with the inventory's hardware expectations.

gpu_topology_mismatches(topology, expectations, server_args=None, allow_idle_gpus=False) returns one line per way the node
differs, each naming the variable that holds the expectation (gpu_preflight_ + key) and what was
found, so that the gpu_preflight role fails once, listing every mismatch.

Keys of `expectations` (all required, the role's variables without their gpu_preflight_ prefix):

  expected_gpu_count        number of GPUs nvidia-smi lists
  gpu_name_pattern          Python regular expression searched in every GPU's product name
  min_compute_capability    lowest "major.minor" accepted on every GPU
  expected_pcie_gen         lowest max PCIe generation of every GPU (max: idle links train down)
  expected_pcie_width       lowest max PCIe width of every GPU
  expected_interconnect     gpu_topology.interconnect: pcie, nvlink, mixed or none
  driver_version_min        lowest driver, inclusive, numerically per dotted component; empty: none
  driver_version_max        highest driver, compared on the components it gives ("595" = any 595.x); empty: none

server_args (sglang_server_args), when given, must fit the GPUs found: its parallel sizes
(tp_size, pp_size, dp_size, nnodes, base_gpu_id, gpu_id_step) by the rule the server's flag check
applies to SGLang's resolved values (gpu_layout_problem in module_utils/sglang_args_probe.py,
loaded from there: one rule, two moments), so a layout that cannot work or leaves GPUs idle
(unless allow_idle_gpus) is refused here, before anything changes on the node. A value nvidia-smi
reports as N/A cannot be verified and counts as a mismatch.
Pure Python (the controller's), unit-tested in tests/unit/test_gpu_expectations.py.
"""

import importlib.util
import re
from pathlib import Path

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # pragma: no cover - only outside Ansible
    AnsibleFilterError = ValueError

PREFIX = "gpu_preflight_"
KEYS = (
    "expected_gpu_count",
    "gpu_name_pattern",
    "min_compute_capability",
    "expected_pcie_gen",
    "expected_pcie_width",
    "expected_interconnect",
    "driver_version_min",
    "driver_version_max",
)
_NVLINK = re.compile(r"^NV[0-9]+$")


def _int(value, default=0):
    """Jinja's int filter: a number, or `default` for anything that is not one."""
    try:
        return int(value)
    except (TypeError, ValueError):
        try:
            return int(float(value))
        except (TypeError, ValueError):
            return default


def _components(version):
    """'595.58.03' -> [595, 58, 3]; a component that is not a number counts as 0."""
    return [_int(part) for part in str(version).split(".")]


def _shown(value):
    """nvidia-smi's N/A (parsed to None or '') as N/A."""
    return "N/A" if value in (None, "") else value


def _quoted(name):
    """A GPU's product name as the messages quote it."""
    return f"'{_shown(name)}'"


def _by_value(gpus, value_of):
    """'VALUE on GPU 0, 1; OTHER on GPU 2' for GPUs grouped by a value, values in first-seen order."""
    groups = {}
    for gpu in gpus:
        groups.setdefault(value_of(gpu), []).append(str(gpu.get("index")))
    return "; ".join(f"{value} on GPU {', '.join(indexes)}" for value, indexes in groups.items())


def _link_list(gpus, key, unit, expected):
    """'GPU 5 (00000000:85:00.0) at Gen4, ...' for each GPU whose max link is below `expected`."""
    low = [gpu for gpu in gpus if _int(gpu.get(key)) < expected]
    return ", ".join(f"GPU {gpu.get('index')} ({gpu.get('pci_bus_id')}) at {unit}{_shown(gpu.get(key))}" for gpu in low)


def _probe():
    """module_utils/sglang_args_probe.py, the server flag check's in-node probe (standard library only)."""
    path = Path(__file__).resolve().parents[1] / "module_utils" / "sglang_args_probe.py"
    spec = importlib.util.spec_from_file_location("sglang_canon_args_probe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_ARGS_PROBE = _probe()


def _layout_mismatch(server_args, count, allow_idle_gpus):
    """'sglang_server_args.tp_size: ...' when the parallel sizes do not fit `count` GPUs."""
    layout = {field: server_args[field] for field in _ARGS_PROBE.LAYOUT_FIELDS if field in server_args}
    layout["enable_dp_attention"] = bool(server_args.get("enable_dp_attention"))
    try:
        problem = _ARGS_PROBE.gpu_layout_problem(layout, count, bool(allow_idle_gpus))
    except (TypeError, ValueError):
        return None  # not integers: the sglang role's type check names them, before this role runs
    if problem is None:
        return None
    named = ", ".join(f"sglang_server_args.{field}" for field in _ARGS_PROBE.LAYOUT_FIELDS if field in server_args)
    return f"{named or 'sglang_server_args.tp_size'}: {problem}"


def gpu_topology_mismatches(topology, expectations, server_args=None, allow_idle_gpus=False):
    """Every way the node differs from the expectations, as 'VARIABLE: expected X, found Y' lines."""
    if not isinstance(topology, dict):
        raise AnsibleFilterError(f"gpu_topology must be a mapping (the gpu_topology fact), got {type(topology).__name__}")
    if not isinstance(expectations, dict) or set(expectations) != set(KEYS):
        given = sorted(expectations) if isinstance(expectations, dict) else type(expectations).__name__
        raise AnsibleFilterError(f"expectations must have exactly the keys {', '.join(KEYS)}; got {given}")
    want = expectations
    gpus = list(topology.get("gpus") or [])
    links = list(topology.get("links") or [])
    count = _int(topology.get("gpu_count"))
    out = []

    expected_count = _int(want["expected_gpu_count"])
    if count != expected_count:
        out.append(f"{PREFIX}expected_gpu_count: expected {expected_count} GPUs, found {count}")

    layout_problem = None if server_args is None else _layout_mismatch(server_args, count, allow_idle_gpus)
    if layout_problem:
        out.append(layout_problem)

    pattern = re.compile(str(want["gpu_name_pattern"]))
    misnamed = sorted((gpu for gpu in gpus if not pattern.search(str(gpu.get("name") or ""))),
                      key=lambda gpu: str(gpu.get("name") or ""))
    if misnamed:
        out.append(f"{PREFIX}gpu_name_pattern: expected GPU names matching '{want['gpu_name_pattern']}', "
                   f"found {_by_value(misnamed, lambda gpu: _quoted(gpu.get('name')))}")

    minimum = _components(want["min_compute_capability"])
    below = [gpu for gpu in gpus
             if _shown(gpu.get("compute_capability")) == "N/A" or _components(gpu["compute_capability"]) < minimum]
    if below:
        out.append(f"{PREFIX}min_compute_capability: expected compute capability {want['min_compute_capability']} "
                   f"or higher on every GPU, found {_by_value(below, lambda gpu: _shown(gpu.get('compute_capability')))}")

    gen = _int(want["expected_pcie_gen"])
    slow = _link_list(gpus, "pcie_link_gen_max", "Gen", gen)
    if slow:
        out.append(f"{PREFIX}expected_pcie_gen: expected every GPU's max PCIe link at Gen{gen} or better, found {slow}")
    width = _int(want["expected_pcie_width"])
    narrow = _link_list(gpus, "pcie_link_width_max", "x", width)
    if narrow:
        out.append(f"{PREFIX}expected_pcie_width: expected every GPU's max PCIe link at x{width} or wider, found {narrow}")

    if topology.get("interconnect") != want["expected_interconnect"]:
        nvlink = [link["link"] for link in links if _NVLINK.match(str(link.get("link")))]
        kinds = ": " + ", ".join(dict.fromkeys(nvlink)) if nvlink else ""
        out.append(f"{PREFIX}expected_interconnect: expected {want['expected_interconnect']}, "
                   f"found {topology.get('interconnect')} (NVLink joins {len(nvlink)} of {len(links)} GPU pairs{kinds})")

    driver = topology.get("driver_version")
    low, high = want["driver_version_min"], want["driver_version_max"]
    if driver and low and _components(driver) < _components(low):
        out.append(f"{PREFIX}driver_version_min: expected NVIDIA driver {low} or newer, found {driver}")
    if driver and high and _components(driver)[: len(_components(high))] > _components(high):
        out.append(f"{PREFIX}driver_version_max: expected NVIDIA driver {high} or older "
                   f"(compared on the components given), found {driver}")

    return out


class FilterModule:
    """sglang-canon's GPU expectation filter."""

    def filters(self):
        return {"gpu_topology_mismatches": gpu_topology_mismatches}
