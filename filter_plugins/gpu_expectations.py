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
(tp_size, pp_size, dp_size, nnodes, base_gpu_id, gpu_id_step) by gpu_layout_problem, so a layout
that cannot work or leaves GPUs idle (unless allow_idle_gpus) is refused here, before anything
changes on the node. The same rule, as the filter gpu_layout_mismatches, judges the values SGLang
resolved from them (sglang_service's flag check, tasks/check_parser.yml): one rule, two moments,
in this file alone. A value nvidia-smi reports as N/A cannot be verified and counts as a mismatch.
Pure Python (the controller's), unit-tested in tests/unit/test_gpu_expectations.py.
"""

import re

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


def gpus_used(resolved):
    """How many GPUs of one node the parallel sizes use, SGLang's layout: dp replicas of tp x pp
    GPUs each (dp attention shares the tp GPUs), split over nnodes."""
    tp = int(resolved.get("tp_size") or 1)
    pp = int(resolved.get("pp_size") or 1)
    dp = int(resolved.get("dp_size") or 1)
    nnodes = int(resolved.get("nnodes") or 1)
    dp_factor = 1 if resolved.get("enable_dp_attention") else dp
    return max(1, -(-(tp * pp * dp_factor) // nnodes))


def gpus_needed(resolved):
    """(count, explanation) of the GPU indexes the parallel sizes use on one node (gpus_used,
    from base_gpu_id by gpu_id_step)."""
    tp = int(resolved.get("tp_size") or 1)
    pp = int(resolved.get("pp_size") or 1)
    dp = int(resolved.get("dp_size") or 1)
    nnodes = int(resolved.get("nnodes") or 1)
    per_node = gpus_used(resolved)
    base = int(resolved.get("base_gpu_id") or 0)
    step = int(resolved.get("gpu_id_step") or 1)
    highest = base + (per_node - 1) * step
    parts = ["tp_size %d" % tp]
    if pp != 1:
        parts.append("pp_size %d" % pp)
    if dp != 1:
        parts.append("dp_size %d%s" % (dp, " (dp attention: inside tp)" if resolved.get("enable_dp_attention") else ""))
    explanation = " x ".join(parts)
    if nnodes != 1:
        explanation += " over %d nodes" % nnodes
    if base or step != 1:
        explanation += ", GPU ids from %d step %d" % (base, step)
    return highest + 1, "%s = %d GPU(s) per node" % (explanation, per_node)


# The ServerArgs fields that place the server on a node's GPUs (gpus_needed reads them).
LAYOUT_FIELDS = ("tp_size", "pp_size", "dp_size", "nnodes", "base_gpu_id", "gpu_id_step")


def gpu_layout_problem(resolved, gpu_count, allow_idle_gpus=False):
    """Why the parallel sizes do not fit a node of gpu_count GPUs, or None: the one rule for them,
    applied to the inventory's sglang_server_args by the gpu_preflight role before anything
    changes, and to SGLang's resolved values by sglang_service's flag check (filter
    gpu_layout_mismatches)."""
    needed, explanation = gpus_needed(resolved)
    count = int(gpu_count)
    idle = count - gpus_used(resolved)
    if needed > count:
        return "%s, but the node has %d GPU(s)" % (explanation, count)
    if idle > 0 and not allow_idle_gpus:
        # A smaller tp_size than the node's GPUs is legal but almost always a slip: the server
        # would run on part of the hardware. Only an explicit choice deploys it.
        return ("%s, so %d of the node's %d GPU(s) would sit idle; set sglang_allow_idle_gpus: true to deploy it "
                "anyway" % (explanation, idle, count))
    return None


def gpu_layout_mismatches(layout, gpu_count, allow_idle_gpus=False, given=None):
    """['sglang_server_args.FIELD, ...: PROBLEM'] when the parallel sizes of `layout` do not fit
    gpu_count GPUs, else []. layout: the inventory's sglang_server_args, or the ServerArgs fields
    SGLang resolved from them (sglang_server_args_check's `resolved`); given: the fields the
    inventory's sglang_server_args sets, named in the line (default: those of layout)."""
    sizes = {field: layout[field] for field in LAYOUT_FIELDS if field in layout}
    sizes["enable_dp_attention"] = bool(layout.get("enable_dp_attention"))
    try:
        problem = gpu_layout_problem(sizes, gpu_count, bool(allow_idle_gpus))
    except (TypeError, ValueError):
        return []  # not integers: the sglang role's type check names them, before this rule runs
    if problem is None:
        return []
    set_fields = layout if given is None else given
    named = ", ".join(f"sglang_server_args.{field}" for field in LAYOUT_FIELDS if field in set_fields)
    return [f"{named or 'sglang_server_args.tp_size'}: {problem}"]


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

    if server_args is not None:
        out += gpu_layout_mismatches(server_args, count, allow_idle_gpus)

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
        return {"gpu_topology_mismatches": gpu_topology_mismatches, "gpu_layout_mismatches": gpu_layout_mismatches}
