# -*- coding: utf-8 -*-
# Copyright: (c) sglang-canon contributors
# MIT License (see LICENSE or https://opensource.org/licenses/MIT)
"""Pure parsers for nvidia-smi output, shared by the gpu_topology module and its unit tests.

Nothing here runs a command or touches the system: every function takes the text nvidia-smi
printed and returns plain data (lists, dicts, str, int, bool, None), so tests can feed them
recorded captures directly.
"""

from __future__ import annotations

import csv
import re


class GpuTopologyParseError(ValueError):
    """nvidia-smi printed something the parser cannot make sense of."""


def _text(value):
    return value


def _int(value):
    try:
        return int(value)
    except ValueError:
        # Some fields (e.g. memory with units left on) carry a suffix: keep the leading number.
        match = re.match(r"^\s*(-?\d+)", value)
        if match is None:
            raise GpuTopologyParseError("expected an integer, got %r" % value)
        return int(match.group(1))


def _enabled(value):
    lowered = value.lower()
    if lowered in ("enabled", "on", "1", "yes", "true"):
        return True
    if lowered in ("disabled", "off", "0", "no", "false"):
        return False
    raise GpuTopologyParseError("expected Enabled or Disabled, got %r" % value)


# (nvidia-smi --query-gpu field, key in the facts, converter), in the order the module asks.
QUERY_FIELDS = (
    ("index", "index", _int),
    ("name", "name", _text),
    ("uuid", "uuid", _text),
    ("pci.bus_id", "pci_bus_id", _text),
    ("memory.total", "memory_total_mib", _int),
    ("compute_cap", "compute_capability", _text),
    ("driver_version", "driver_version", _text),
    ("pcie.link.gen.current", "pcie_link_gen_current", _int),
    ("pcie.link.gen.max", "pcie_link_gen_max", _int),
    ("pcie.link.width.current", "pcie_link_width_current", _int),
    ("pcie.link.width.max", "pcie_link_width_max", _int),
    ("persistence_mode", "persistence_mode", _enabled),
)

QUERY_FIELD_NAMES = tuple(field for field, _key, _convert in QUERY_FIELDS)

# SGR and other CSI sequences (nvidia-smi underlines the topo -m header), plus stray OSC/ESC pairs.
_ANSI_RE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_GPU_LABEL_RE = re.compile(r"^GPU(\d+)$")
_NVLINK_RE = re.compile(r"^NV\d+$")
_NIC_LEGEND_RE = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")
# Trailing columns of the matrix that are not devices.
_AFFINITY_COLUMNS = {
    "CPU Affinity": "cpu_affinity",
    "NUMA Affinity": "numa_affinity",
    "GPU NUMA ID": "gpu_numa_id",
}
# nvidia-smi's ways of saying "no value".
_NO_VALUE_RE = re.compile(r"^(?:|N/A|\[.*\])$", re.IGNORECASE)

NO_DEVICES_MESSAGE = "No devices were found"


def strip_ansi(text):
    """Return text without ANSI escape sequences."""
    return _ANSI_RE.sub("", text)


def no_value(value):
    """True when an nvidia-smi field holds no value: empty, N/A, [N/A], [Not Supported], ..."""
    return value is None or bool(_NO_VALUE_RE.match(value.strip()))


def is_nvlink(link):
    """True for an NVLink cell of the topo matrix (NV1, NV4, NV12, NV18, ...)."""
    return bool(_NVLINK_RE.match(link or ""))


def parse_id_list(value):
    """Expand a CPU/NUMA list as nvidia-smi prints it ("0-63,128-191", "0", "N/A") to sorted ints."""
    if no_value(value):
        return []
    ids = set()
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        match = re.match(r"^(\d+)(?:-(\d+))?$", part)
        if match is None:
            raise GpuTopologyParseError("cannot read %r as a list of ids" % value)
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        if last < first:
            raise GpuTopologyParseError("cannot read %r as a list of ids" % value)
        ids.update(range(first, last + 1))
    return sorted(ids)


def parse_query_gpu(text, fields=QUERY_FIELD_NAMES):
    """Parse `nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits`.

    Returns one dict per GPU, keyed as in QUERY_FIELDS (unknown fields keep their nvidia-smi
    name), sorted by index. Values nvidia-smi reports as N/A or [Not Supported] become None.
    "No devices were found" (a driver without GPUs) is an empty list.
    """
    converters = dict((field, (key, convert)) for field, key, convert in QUERY_FIELDS)
    text = strip_ansi(text)
    if NO_DEVICES_MESSAGE in text:
        return []
    gpus = []
    for row in csv.reader(text.splitlines(), skipinitialspace=True):
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) != len(fields):
            raise GpuTopologyParseError(
                "expected %d comma-separated values (%s), got %d in %r"
                % (len(fields), ", ".join(fields), len(row), ", ".join(row))
            )
        gpu = {}
        for field, cell in zip(fields, row):
            key, convert = converters.get(field, (field, _text))
            cell = cell.strip()
            gpu[key] = None if no_value(cell) else convert(cell)
        if "index" in gpu and gpu["index"] is None:
            raise GpuTopologyParseError("a GPU row has no index: %r" % ", ".join(row))
        gpus.append(gpu)
    if gpus and "index" in gpus[0]:
        gpus.sort(key=lambda gpu: gpu["index"])
        indexes = [gpu["index"] for gpu in gpus]
        if len(set(indexes)) != len(indexes):
            raise GpuTopologyParseError("GPU indexes repeat: %s" % indexes)
    return gpus


def _split_header(line):
    """Split the topo -m header into device column labels and trailing affinity column names."""
    names = [cell.strip() for cell in line.split("\t")]
    names = [name for name in names if name]
    devices, trailing = [], []
    for name in names:
        if name in _AFFINITY_COLUMNS or trailing:
            trailing.append(name)
        else:
            devices.append(name)
    return devices, trailing


def _fit_trailing(cells, count):
    """Match a row's trailing cells to `count` affinity columns.

    Recent drivers print an empty spacer cell before "GPU NUMA ID" ("0-31<TAB>0<TAB><TAB>N/A"),
    so a row can carry one cell more than the header names; blank cells are real values too
    (NIC rows, or a GPU without CPU affinity), so only the spacer before the last column goes.
    """
    cells = list(cells)
    while len(cells) > count and count >= 2 and cells[-2] == "":
        del cells[-2]
    while len(cells) > count and cells and cells[-1] == "":
        del cells[-1]
    if len(cells) > count:
        raise GpuTopologyParseError("unexpected cells after the affinity columns: %r" % cells)
    return cells + [""] * (count - len(cells))


def _numa_node(numa_ids):
    return numa_ids[0] if len(numa_ids) == 1 else None


def parse_topo_matrix(text):
    """Parse `nvidia-smi topo -m`.

    Returns a dict:
      gpus: per GPU (by index) {index, cpu_affinity, numa_affinity, numa_node, numa_nodes, gpu_numa_id}
      links: [{a, b, link}] for every unordered GPU pair, a < b, link as printed (PIX, NODE, NV18, ...)
      matrix: the GPU x GPU link matrix as printed ("X" on the diagonal)
      nics: [{name, device, links}] for NIC rows (links: one cell per GPU, by GPU index)
    """
    lines = strip_ansi(text).replace("\r\n", "\n").split("\n")
    header_at = None
    for number, line in enumerate(lines):
        devices, _trailing = _split_header(line)
        if devices and _GPU_LABEL_RE.match(devices[0]) and not _GPU_LABEL_RE.match(line.split("\t")[0].strip()):
            header_at = number
            break
    if header_at is None:
        if any("GPU0" in line for line in lines):
            raise GpuTopologyParseError("no tab-separated header with GPU columns in the topo -m output")
        raise GpuTopologyParseError("no topology matrix in the topo -m output: %r" % text[:200])
    columns, trailing = _split_header(lines[header_at])
    labels = set()
    rows = {}
    nic_legend = {}
    in_matrix = True
    for line in lines[header_at + 1 :]:
        if in_matrix and (not line.strip() or line.strip().endswith(":")):
            in_matrix = False
        if not in_matrix:
            match = _NIC_LEGEND_RE.match(line)
            if match:
                nic_legend[match.group(1)] = match.group(2)
            continue
        cells = line.split("\t")
        label = cells[0].strip()
        if label in labels:
            raise GpuTopologyParseError("row %s appears twice in the topo -m output" % label)
        labels.add(label)
        links = [cell.strip() for cell in cells[1 : len(columns) + 1]]
        if len(links) != len(columns) or any(not link for link in links):
            raise GpuTopologyParseError(
                "row %s has %d link cells for %d columns: %r" % (label, len(links), len(columns), line)
            )
        affinity = _fit_trailing([cell.strip() for cell in cells[len(columns) + 1 :]], len(trailing))
        rows[label] = (links, dict(zip(trailing, affinity)))

    gpu_columns = [
        (position, int(_GPU_LABEL_RE.match(name).group(1)))
        for position, name in enumerate(columns)
        if _GPU_LABEL_RE.match(name)
    ]
    gpu_indexes = [index for _position, index in gpu_columns]
    if gpu_indexes != sorted(set(gpu_indexes)):
        raise GpuTopologyParseError("GPU columns out of order or repeated: %s" % columns)
    missing = [index for index in gpu_indexes if "GPU%d" % index not in rows]
    extra = [label for label in rows if _GPU_LABEL_RE.match(label) and int(label[3:]) not in gpu_indexes]
    if missing or extra:
        raise GpuTopologyParseError(
            "GPU rows and columns differ (rows without columns: %s, columns without rows: %s)"
            % (extra, ["GPU%d" % index for index in missing])
        )

    gpus, matrix = [], []
    for index in gpu_indexes:
        links, affinity = rows["GPU%d" % index]
        matrix.append([links[position] for position, _other in gpu_columns])
        numa_affinity = affinity.get("NUMA Affinity", "")
        cpu_affinity = affinity.get("CPU Affinity", "")
        gpu_numa_id = affinity.get("GPU NUMA ID", "")
        numa_nodes = parse_id_list(numa_affinity)
        gpus.append(
            {
                "index": index,
                "cpu_affinity": None if no_value(cpu_affinity) else cpu_affinity,
                "numa_affinity": None if no_value(numa_affinity) else numa_affinity,
                "numa_nodes": numa_nodes,
                "numa_node": _numa_node(numa_nodes),
                "gpu_numa_id": None if no_value(gpu_numa_id) else _int(gpu_numa_id),
            }
        )

    for row_number, row in enumerate(matrix):
        if row[row_number] != "X":
            raise GpuTopologyParseError("GPU%d's own cell is %r, not X" % (gpu_indexes[row_number], row[row_number]))

    links = []
    for first in range(len(gpu_indexes)):
        for second in range(first + 1, len(gpu_indexes)):
            links.append({"a": gpu_indexes[first], "b": gpu_indexes[second], "link": matrix[first][second]})

    nics = []
    for position, name in enumerate(columns):
        if _GPU_LABEL_RE.match(name) or name not in rows:
            continue
        links_of_nic = rows[name][0]
        nics.append(
            {
                "name": name,
                "device": nic_legend.get(name, name),
                "links": [links_of_nic[gpu_position] for gpu_position, _index in gpu_columns],
            }
        )
        if links_of_nic[position] != "X":
            raise GpuTopologyParseError("%s's own cell is %r, not X" % (name, links_of_nic[position]))

    return {"gpus": gpus, "links": links, "matrix": matrix, "nics": nics}


def classify_interconnect(links, gpu_count):
    """Name how the GPUs talk to each other.

    nvlink: every GPU pair is an NV# link; pcie: no pair is; mixed: some are.
    none: fewer than two GPUs, so there is no pair to judge.
    """
    if gpu_count < 2 or not links:
        return "none"
    nvlink_pairs = sum(1 for link in links if is_nvlink(link["link"]))
    if nvlink_pairs == len(links):
        return "nvlink"
    if nvlink_pairs == 0:
        return "pcie"
    return "mixed"


def build_topology(query_text, topo_text, fields=QUERY_FIELD_NAMES):
    """Merge the --query-gpu CSV and the topo -m matrix into the gpu_topology facts."""
    gpus = parse_query_gpu(query_text, fields)
    if gpus:
        topo = parse_topo_matrix(topo_text)
    else:
        topo = {"gpus": [], "links": [], "matrix": [], "nics": []}
    by_index = dict((gpu["index"], gpu) for gpu in topo["gpus"])
    query_indexes = [gpu["index"] for gpu in gpus]
    if sorted(by_index) != query_indexes:
        raise GpuTopologyParseError(
            "--query-gpu lists GPUs %s but topo -m lists GPUs %s" % (query_indexes, sorted(by_index))
        )
    merged = []
    for gpu in gpus:
        entry = dict(gpu)
        entry.update(by_index[gpu["index"]])
        merged.append(entry)
    numa_nodes = sorted(set(node for gpu in merged for node in gpu["numa_nodes"]))
    drivers = sorted(set(gpu.get("driver_version") for gpu in merged if gpu.get("driver_version")))
    return {
        "gpu_count": len(merged),
        "gpus": merged,
        "links": topo["links"],
        "link_matrix": topo["matrix"],
        "nvlink": any(is_nvlink(link["link"]) for link in topo["links"]),
        "interconnect": classify_interconnect(topo["links"], len(merged)),
        "numa_nodes": numa_nodes,
        "driver_version": drivers[0] if len(drivers) == 1 else (", ".join(drivers) or None),
        "nics": topo["nics"],
    }
