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

# ECMA-48 escape sequences: CSI (nvidia-smi underlines the topo -m header with one), also in its
# 8-bit form, OSC, and the two- or three-byte ones such as "ESC ( B" that `tput sgr0` emits.
_ANSI_RE = re.compile(r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[ -/]*[0-~]")
# What is left of an SGR sequence when a paste dropped the ESC byte ("[4mGPU0") or showed it
# in caret notation ("^[[4mGPU0"); no topo -m cell holds "[" followed by digits and "m".
_LOST_ESCAPE_RE = re.compile(r"(?:\^\[)?\[[0-9;]*m")
_GPU_LABEL_RE = re.compile(r"^GPU(\d+)$")
# Device columns of topo -m: GPU0, NIC3, or a NIC by its device name (mlx5_0) on older drivers.
_DEVICE_NAME_RE = re.compile(r"^[A-Za-z][\w.-]*\d$")
_NVLINK_RE = re.compile(r"^NV\d+$")
_NIC_LEGEND_RE = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")
# Trailing columns of the matrix that are not devices; their names hold spaces. Older drivers
# print no "GPU NUMA ID".
_AFFINITY_NAMES = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_AFFINITY_HEADER_RE = re.compile(r"CPU\s+Affinity|NUMA\s+Affinity|GPU\s+NUMA\s+ID")
# Tab widths a capture may have been expanded with: terminals and `expand` use 8, some editors 4.
_TAB_SIZES = (8, 4)
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


def _clean_lines(text):
    """The lines of a topo -m capture without escape sequences, whatever its line ends."""
    text = _LOST_ESCAPE_RE.sub("", strip_ansi(text))
    return re.split(r"\r\n|\r|\n", text)


def _header_columns(line):
    """(device columns, affinity columns, affinity layout) when `line` is the topo -m header, else None.

    The header names devices (GPU0 first, then GPUs and NICs, each ending in its number) and
    then the affinity columns, whose names hold spaces; tabs, spaces or both may separate them.
    Rows are never taken for the header: they carry an X on the diagonal, which names no device.
    A column a newer driver adds after the affinity columns is kept (and not reported) when tabs
    separate the names; in space-aligned text its words cannot be told from the next name's.
    The layout is the tab-separated header's fields after the devices, "" where a second tab pads
    a wide name ("CPU Affinity<TAB><TAB>NUMA Affinity"): the rows leave an empty cell there too.
    It is None for a header whose tabs became spaces.
    """
    affinity = list(_AFFINITY_HEADER_RE.finditer(line))
    devices = line[: affinity[0].start()].split() if affinity else line.split()
    if not devices or not _GPU_LABEL_RE.match(devices[0]):
        return None
    if not all(_DEVICE_NAME_RE.match(name) for name in devices):
        return None
    if not affinity:
        return devices, [], None
    trailing = line[affinity[0].start() :]
    if "\t" in trailing:
        layout = [" ".join(name.split()) for name in trailing.split("\t")]
        while not layout[-1]:
            layout.pop()
        return devices, [name for name in layout if name], layout
    unknown = _AFFINITY_HEADER_RE.sub("", trailing).strip()
    if unknown:
        raise GpuTopologyParseError(
            "unknown column %r after the affinity columns (expected only %s) in the space-aligned header %r"
            % (unknown, ", ".join(_AFFINITY_NAMES), line)
        )
    return devices, [" ".join(match.group().split()) for match in affinity], None


def _find_header(lines):
    for number, line in enumerate(lines):
        columns = _header_columns(line)
        if columns:
            return number, columns
    mentions_gpu = [line for line in lines if re.search(r"\bGPU\d+\b", line)]
    if mentions_gpu:
        raise GpuTopologyParseError(
            "no header row naming the GPU columns (GPU0 GPU1 ... CPU Affinity NUMA Affinity) before %r"
            % mentions_gpu[0]
        )
    first = next((line for line in lines if line.strip()), "")
    raise GpuTopologyParseError("no topology matrix in the topo -m output, it starts with %r" % first)


def _matrix_lines(lines):
    """Split the lines after the header into the matrix rows and what follows (the legends).

    The matrix ends at a blank line or at the first legend line ("Legend:", "X = Self",
    "NIC0: mlx5_0"): no row cell holds ":" or "=", so a legend without the blank line before it
    (a log collector dropped it) still ends the matrix.
    """
    for number, line in enumerate(lines):
        if not line.strip() or ":" in line or "=" in line:
            return lines[:number], lines[number:]
    return lines, []


def _grid_cells(line, tab_size):
    """Cells of a row whose tabs were expanded to spaces, or None if it is not on that tab grid.

    nvidia-smi ends every cell with a tab, so after expansion each cell starts on a tab stop
    (the self cell " X " shows its X one column later) and a blank cell is one more stop
    skipped. Columns count from the row label, so a uniformly indented paste reads the same.
    """
    words = list(re.finditer(r"\S+", line))
    indent = words[0].start()
    cells = [words[0].group()]
    end = words[0].end() - indent
    for word in words[1:]:
        start = word.start() - indent
        if start % tab_size == 1 and word.group() == "X":
            start -= 1
        stops_passed = start // tab_size - end // tab_size
        if start % tab_size or stops_passed < 1:
            return None
        cells.extend([""] * (stops_passed - 1) + [word.group()])
        end = word.end() - indent
    return cells


def _tab_size(aligned_rows, header):
    """The tab width the rows were expanded with (8, as terminals and `expand` use, or 4), or None.

    Rows fit the grid of their width only. Where they fit both (one GPU, " X " and a single
    value: "X" then a cell 16 columns on is one tab of 8 or three of 4), the header's leading
    tab, if it survived, gives the width: GPU0 sits one tab in.
    """
    fitting = [size for size in _TAB_SIZES if all(_grid_cells(line, size) is not None for line in aligned_rows)]
    if aligned_rows and "\t" not in header:
        indent = len(aligned_rows[0]) - len(aligned_rows[0].lstrip())
        header_lead = len(header) - len(header.lstrip()) - indent
        if header_lead in fitting:
            return header_lead
    return fitting[0] if fitting else None


def _grid_layout(header, tab_size):
    """The affinity layout of a header whose tabs became spaces, as _header_columns gives it for
    tabs: a name that ends more than one tab stop before the next one was padded with a tab.
    Columns count from the first name, which sat on a tab stop (an escape code stripped from
    the header after expansion shifts the whole header, not the names' distances)."""
    layout, end = [], None
    names = list(_AFFINITY_HEADER_RE.finditer(header))
    for match in names:
        start = match.start() - names[0].start()
        if end is not None:
            layout += [""] * (start // tab_size - end // tab_size - 1)
        layout.append(" ".join(match.group().split()))
        end = match.end() - names[0].start()
    return layout


def _fit_trailing(cells, names, line, layout=None):
    """Match a row's cells after the links to the affinity columns `names`.

    Recent drivers print an empty spacer cell before "GPU NUMA ID" ("0-31<TAB>0<TAB><TAB>N/A"),
    some pad the wide affinity names of the header with a second tab and each row with an empty
    cell at the same place ("0-11<TAB><TAB>N/A"), and some rows end in tabs. Blank cells are real
    values too (NIC rows, or a GPU without CPU affinity), so only these go: trailing blanks; the
    cells at the padding of a padded header (`layout`); that one spacer; and, where tabs became
    spaces and no layout is left, empty cells right after a value, first come first.
    """
    cells = [cell.strip() for cell in cells]
    while len(cells) > len(names) and cells[-1] == "":
        cells.pop()
    if layout and len(names) < len(layout) and len(cells) <= len(layout):
        if all(cells[position] == "" for position, name in enumerate(layout[: len(cells)]) if not name):
            return {name: (cells[position] if position < len(cells) else "")
                    for position, name in enumerate(layout) if name}
    spacer = names.index("GPU NUMA ID") if "GPU NUMA ID" in names else None
    if len(cells) == len(names) + 1 and spacer is not None and cells[spacer] == "":
        del cells[spacer]
    while len(cells) > len(names):
        # the links end in a value, so a first blank cell follows one
        padding = next((position for position, cell in enumerate(cells)
                        if cell == "" and (position == 0 or cells[position - 1] != "")), None)
        if padding is None:
            break
        del cells[padding]
    if len(cells) > len(names):
        raise GpuTopologyParseError(
            "%d cells after the links where the header names %d (%s): %r"
            % (len(cells), len(names), ", ".join(names), line)
        )
    return dict(zip(names, cells + [""] * (len(names) - len(cells))))


def _read_rows(matrix, header, columns, affinity_names, affinity_layout):
    """Read the matrix rows into {label: (links, {affinity column: cell}, line)}.

    Tab-separated rows split on tabs. Rows whose tabs became spaces split on the tab grid they
    were expanded with; hand-aligned rows (on no grid) split into words, which places the
    affinity cells only when all of them or none are printed.
    """
    aligned = [line for line in matrix if "\t" not in line]
    tab_size = _tab_size(aligned, header)
    if tab_size and affinity_layout is None and aligned:
        affinity_layout = _grid_layout(header, tab_size)
    rows = {}
    for line in matrix:
        if "\t" in line:
            cells = line.split("\t")
        elif tab_size:
            cells = _grid_cells(line, tab_size)
        else:
            cells = line.split()
            printed = len(cells) - 1 - len(columns)
            if 0 < printed < len(affinity_names):
                raise GpuTopologyParseError(
                    "cannot tell which of the columns %s the %d affinity cells fill: the row is aligned "
                    "neither on tabs nor on 8- or 4-column tab stops: %r" % (", ".join(affinity_names), printed, line)
                )
        label = cells[0].strip()
        if label not in columns:
            raise GpuTopologyParseError(
                "row %s is not a column of the header (%s): %r" % (label, " ".join(columns), line)
            )
        if label in rows:
            raise GpuTopologyParseError("row %s appears twice in the topo -m output: %r" % (label, line))
        links = [cell.strip() for cell in cells[1 : len(columns) + 1]]
        if len(links) != len(columns) or not all(links):
            raise GpuTopologyParseError(
                "row %s has %d link cells for %d columns: %r"
                % (label, len(list(filter(None, links))), len(columns), line)
            )
        rows[label] = (links, _fit_trailing(cells[len(columns) + 1 :], affinity_names, line, affinity_layout), line)
    return rows


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
    lines = _clean_lines(text)
    header_at, (columns, affinity_names, affinity_layout) = _find_header(lines)
    matrix_rows, legends = _matrix_lines(lines[header_at + 1 :])
    rows = _read_rows(matrix_rows, lines[header_at], columns, affinity_names, affinity_layout)
    header = lines[header_at].strip()
    nic_legend = dict(match.groups() for match in map(_NIC_LEGEND_RE.match, legends) if match)

    without_row = [name for name in columns if name not in rows]
    if without_row:
        raise GpuTopologyParseError(
            "rows and columns differ: no row for %s, which the header names: %r" % (", ".join(without_row), header)
        )
    gpu_columns = [
        (position, int(_GPU_LABEL_RE.match(name).group(1)))
        for position, name in enumerate(columns)
        if _GPU_LABEL_RE.match(name)
    ]
    gpu_indexes = [index for _position, index in gpu_columns]
    if gpu_indexes != sorted(set(gpu_indexes)):
        raise GpuTopologyParseError("GPU columns out of order or repeated in the header %r" % header)

    gpus, matrix = [], []
    for index in gpu_indexes:
        links, affinity, _line = rows["GPU%d" % index]
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

    for position, name in enumerate(columns):
        links_of_row, _affinity, line = rows[name]
        if links_of_row[position] != "X":
            raise GpuTopologyParseError("%s's own cell is %r, not X: %r" % (name, links_of_row[position], line))

    links = []
    for first in range(len(gpu_indexes)):
        for second in range(first + 1, len(gpu_indexes)):
            links.append({"a": gpu_indexes[first], "b": gpu_indexes[second], "link": matrix[first][second]})

    nics = []
    for name in columns:
        if _GPU_LABEL_RE.match(name):
            continue
        links_of_nic = rows[name][0]
        nics.append(
            {
                "name": name,
                "device": nic_legend.get(name, name),
                "links": [links_of_nic[gpu_position] for gpu_position, _index in gpu_columns],
            }
        )

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
