"""nvidia-smi parsers of the gpu_topology module, on real and hand-built captures.

Replayable captures (the ones the nvidia-smi test double serves) live in tests/double/captures/;
parser-only captures and the real sources the replayable ones were built from live in
tests/fixtures/nvidia-smi/.
"""

import re
from itertools import combinations

import pytest
from project_modules import load_at_collection
from project_modules import REPO

CAPTURES = REPO / "tests" / "double" / "captures"
FIXTURES = REPO / "tests" / "fixtures" / "nvidia-smi"
SOURCES = FIXTURES / "sources"
DRIVER_DOWN = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."

# SHAPES and shape_cases() below, parametrize lists, apply the parser's own escape stripping.
parse = load_at_collection("module_utils/gpu_topology_parse.py")


def read(path):
    with open(path, encoding="utf-8", newline="") as handle:
        return handle.read()


def query_rows(capture):
    """What `--format=csv,noheader,nounits` prints for the module's fields: the capture without its header."""
    text = read(CAPTURES / capture / "query-gpu.csv")
    header, _, rows = text.partition("\n")
    fields = [re.sub(r"\s*\[.*\]$", "", cell.strip()) for cell in header.split(",")]
    assert tuple(fields) == parse.QUERY_FIELD_NAMES, "capture columns must be the module's query, in order"
    return rows


def topology(capture):
    return parse.build_topology(query_rows(capture), read(CAPTURES / capture / "topo-m.txt"))


def link_map(result):
    return {(link["a"], link["b"]): link["link"] for link in result["links"]}


REPLAYABLE = sorted(path.name for path in CAPTURES.iterdir() if (path / "topo-m.txt").exists())
PARSER_ONLY = sorted(path.name for path in FIXTURES.iterdir() if (path / "topo-m.txt").exists())


# --- the canonical node: 8 x RTX PRO 6000 Blackwell on PCIe Gen5 ------------------------------

BLACKWELL_PIX = {(0, 1), (2, 3), (4, 5), (6, 7)}


def blackwell_link(a, b, halves=((0, 1, 2, 3), (4, 5, 6, 7))):
    if (a, b) in BLACKWELL_PIX:
        return "PIX"
    return "NODE" if any(a in half and b in half for half in halves) else "SYS"


def test_blackwell_node_every_pair_exactly():
    result = topology("rtx-pro-6000-8x")
    expected = {(a, b): blackwell_link(a, b) for a, b in combinations(range(8), 2)}
    assert link_map(result) == expected
    assert len(result["links"]) == 28
    assert all(link["a"] < link["b"] for link in result["links"])
    assert result["link_matrix"][0] == ["X", "PIX", "NODE", "NODE", "SYS", "SYS", "SYS", "SYS"]
    assert [row[index] for index, row in enumerate(result["link_matrix"])] == ["X"] * 8


def test_blackwell_node_is_pcie_without_nvlink():
    result = topology("rtx-pro-6000-8x")
    assert result["gpu_count"] == 8
    assert result["nvlink"] is False
    assert result["interconnect"] == "pcie"
    assert result["driver_version"] == "595.58.03"
    assert result["nics"] == []


def test_blackwell_node_numa_affinity_two_nodes():
    result = topology("rtx-pro-6000-8x")
    assert result["numa_nodes"] == [0, 1]
    assert [gpu["numa_node"] for gpu in result["gpus"]] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [gpu["cpu_affinity"] for gpu in result["gpus"]] == ["0-63,128-191"] * 4 + ["64-127,192-238"] * 4
    assert all(gpu["numa_affinity"] in ("0", "1") for gpu in result["gpus"])
    assert all(gpu["gpu_numa_id"] is None for gpu in result["gpus"])  # printed as N/A


def test_blackwell_node_per_gpu_values():
    gpu = topology("rtx-pro-6000-8x")["gpus"][0]
    assert gpu == {
        "index": 0,
        "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        "uuid": "GPU-e588912b-1368-6b4f-0e2a-0d08f8afb39b",
        "pci_bus_id": "00000000:06:00.0",
        "memory_total_mib": 97887,
        "compute_capability": "12.0",
        "driver_version": "595.58.03",
        "pcie_link_gen_current": 1,
        "pcie_link_gen_max": 5,
        "pcie_link_width_current": 16,
        "pcie_link_width_max": 16,
        "persistence_mode": True,
        "cpu_affinity": "0-63,128-191",
        "numa_affinity": "0",
        "numa_nodes": [0],
        "numa_node": 0,
        "gpu_numa_id": None,
    }


def test_canonical_query_capture_agrees_with_the_real_nvidia_smi_q():
    """query-gpu.csv of rtx-pro-6000-8x was built from nvidia-smi -q of the same machine as topo-m.txt."""
    text = read(SOURCES / "rtx-pro-6000-blackwell-8x" / "nvidia-smi-q.txt")
    blocks = re.split(r"^GPU (0000\S+)\n", text, flags=re.M)[1:]
    real = []
    for bus, body in zip(blocks[::2], blocks[1::2]):
        real.append(
            {
                "pci_bus_id": bus,
                "uuid": re.search(r"GPU UUID\s*:\s*(\S+)", body).group(1),
                "name": re.search(r"Product Name\s*:\s*(.+)", body).group(1).strip(),
                "memory_total_mib": int(re.search(r"FB Memory Usage\n\s+Total\s*:\s*(\d+)", body).group(1)),
                "pcie_link_gen_max": int(re.search(r"PCIe Generation\n\s+Max\s*:\s*(\d+)", body).group(1)),
                "pcie_link_gen_current": int(re.search(r"PCIe Generation\n.*\n\s+Current\s*:\s*(\d+)", body).group(1)),
                "pcie_link_width_max": int(re.search(r"Link Width\n\s+Max\s*:\s*(\d+)x", body).group(1)),
                "pcie_link_width_current": int(re.search(r"Link Width\n.*\n\s+Current\s*:\s*(\d+)x", body).group(1)),
                "persistence_mode": re.search(r"Persistence Mode\s*:\s*(\S+)", body).group(1) == "Enabled",
            }
        )
    gpus = topology("rtx-pro-6000-8x")["gpus"]
    assert len(real) == len(gpus) == 8
    for expected, gpu in zip(real, gpus):  # nvidia-smi numbers GPUs in PCI bus order, as -q lists them
        assert {key: gpu[key] for key in expected} == expected
    assert "Driver Version                                         : 595.58.03" in text


# --- the other replayable captures ------------------------------------------------------------


def test_seven_gpus_renumbered_after_the_missing_card():
    result = topology("rtx-pro-6000-7x")
    assert result["gpu_count"] == 7
    assert "00000000:85:00.0" not in [gpu["pci_bus_id"] for gpu in result["gpus"]]
    assert [gpu["index"] for gpu in result["gpus"]] == list(range(7))
    links = link_map(result)
    assert links[(0, 1)] == links[(2, 3)] == links[(5, 6)] == "PIX"
    assert links[(4, 5)] == links[(4, 6)] == "NODE"
    assert links[(3, 4)] == "SYS"
    assert result["interconnect"] == "pcie"


def test_gen4_x8_card_shows_in_max_values_only_on_that_card():
    gpus = topology("rtx-pro-6000-8x-gen4x8")["gpus"]
    slow = [gpu for gpu in gpus if gpu["pcie_link_gen_max"] < 5 or gpu["pcie_link_width_max"] < 16]
    assert [
        (gpu["index"], gpu["pci_bus_id"], gpu["pcie_link_gen_max"], gpu["pcie_link_width_max"]) for gpu in slow
    ] == [(5, "00000000:85:00.0", 4, 8)]
    assert all(gpu["pcie_link_gen_current"] == 1 for gpu in gpus)  # idle: current says nothing


def test_h200_pair_real_capture_is_nvlink():
    result = topology("h200-2x-nvlink")
    assert result["gpu_count"] == 2
    assert result["links"] == [{"a": 0, "b": 1, "link": "NV18"}]
    assert result["nvlink"] is True
    assert result["interconnect"] == "nvlink"
    assert [gpu["compute_capability"] for gpu in result["gpus"]] == ["9.0", "9.0"]
    assert [gpu["memory_total_mib"] for gpu in result["gpus"]] == [143771, 143771]
    assert result["driver_version"] == "580.159.04"


def test_h200_query_capture_agrees_with_the_real_csv():
    """The real csv (with units, other field order) in topo-extra.txt says the same as the replayable capture."""
    text = read(SOURCES / "h200x2-nvlink" / "topo-extra.txt").split("== csv\n", 1)[1].split("\n== ", 1)[0]
    header, _, rows = text.partition("\n")
    fields = tuple(re.sub(r"\s*\[.*\]$", "", cell.strip()) for cell in header.split(","))
    real = parse.parse_query_gpu(rows, fields)
    replayed = parse.parse_query_gpu(query_rows("h200-2x-nvlink"))
    assert real == replayed  # "143771 MiB" with units and "143771" without read the same


def test_h200_nvswitch_every_pair_nv18():
    result = topology("h200-8x-nvswitch")
    assert result["gpu_count"] == 8
    assert set(link_map(result).values()) == {"NV18"}
    assert len(result["links"]) == 28
    assert result["interconnect"] == "nvlink"
    assert result["numa_nodes"] == [0, 1]


@pytest.mark.parametrize("capture", REPLAYABLE)
def test_every_replayable_capture_merges(capture):
    result = topology(capture)
    count = result["gpu_count"]
    assert len(result["links"]) == count * (count - 1) // 2
    assert [gpu["index"] for gpu in result["gpus"]] == list(range(count))


# --- parser-only captures -------------------------------------------------------------------


def topo_fixture(name):
    return parse.parse_topo_matrix(read(FIXTURES / name / "topo-m.txt"))


def test_mixed_nvlink_pairs():
    result = topo_fixture("mixed-nvlink-4x")
    assert link_map(result) == {
        (0, 1): "NV4",
        (0, 2): "NODE",
        (0, 3): "NODE",
        (1, 2): "NODE",
        (1, 3): "NODE",
        (2, 3): "NV4",
    }
    assert parse.classify_interconnect(result["links"], 4) == "mixed"


def test_nic_rows_after_gpu_rows_with_nic_legend_and_two_numa_nodes():
    result = topo_fixture("nic-rows-after-4x-2numa")
    assert [gpu["index"] for gpu in result["gpus"]] == [0, 1, 2, 3]
    assert link_map(result) == {
        (0, 1): "PXB",
        (0, 2): "SYS",
        (0, 3): "SYS",
        (1, 2): "SYS",
        (1, 3): "SYS",
        (2, 3): "PXB",
    }
    assert [gpu["numa_node"] for gpu in result["gpus"]] == [0, 0, 1, 1]
    assert [gpu["cpu_affinity"] for gpu in result["gpus"]] == ["0-23,48-71"] * 2 + ["24-47,72-95"] * 2
    assert result["nics"] == [
        {"name": "NIC0", "device": "mlx5_0", "links": ["PIX", "PXB", "SYS", "SYS"]},
        {"name": "NIC1", "device": "mlx5_1", "links": ["PXB", "PIX", "SYS", "SYS"]},
        {"name": "NIC2", "device": "mlx5_2", "links": ["SYS", "SYS", "PIX", "PXB"]},
        {"name": "NIC3", "device": "mlx5_3", "links": ["SYS", "SYS", "PXB", "PIX"]},
    ]
    assert parse.classify_interconnect(result["links"], 4) == "pcie"


def test_nic_rows_between_gpu_rows_named_by_device_blank_affinity():
    result = topo_fixture("nic-rows-between-mlx5")
    assert [gpu["index"] for gpu in result["gpus"]] == [0, 1, 2, 3]
    assert link_map(result) == {
        (0, 1): "PIX",
        (0, 2): "SYS",
        (0, 3): "SYS",
        (1, 2): "SYS",
        (1, 3): "SYS",
        (2, 3): "PIX",
    }
    assert [gpu["cpu_affinity"] for gpu in result["gpus"]] == ["0-15", "0-15", None, "16-31"]  # GPU2's is blank
    assert [gpu["numa_node"] for gpu in result["gpus"]] == [0, 0, 1, 1]
    assert all(gpu["gpu_numa_id"] is None for gpu in result["gpus"])  # no such column
    assert [(nic["name"], nic["device"], nic["links"]) for nic in result["nics"]] == [
        ("mlx5_0", "mlx5_0", ["PXB", "PXB", "SYS", "SYS"]),
        ("mlx5_1", "mlx5_1", ["SYS", "SYS", "PXB", "PXB"]),
    ]


def test_no_gpu_numa_id_column_eight_nv12_four_numa_nodes():
    result = topo_fixture("no-gpu-numa-id-8x-nv12")
    assert set(link_map(result).values()) == {"NV12"}
    assert [gpu["numa_node"] for gpu in result["gpus"]] == [3, 3, 1, 1, 7, 7, 5, 5]
    assert result["gpus"][4]["cpu_affinity"] == "112-127,240-255"
    assert [nic["device"] for nic in result["nics"]] == ["mlx5_0", "mlx5_1"]
    assert parse.classify_interconnect(result["links"], 8) == "nvlink"


def test_padded_affinity_header_reads_as_the_real_capture():
    # nvidia-smi pads the wide affinity names of the header with a second tab, and every row with
    # an empty cell at the same place: "0-63,128-191<TAB><TAB>0<TAB><TAB>N/A". Made from the real
    # capture of the canonical node with that extra tab.
    padded = topo_fixture("padded-affinity-header-8x")
    assert padded == parse.parse_topo_matrix(read(CAPTURES / "rtx-pro-6000-8x" / "topo-m.txt"))
    assert (padded["gpus"][0]["cpu_affinity"], padded["gpus"][0]["numa_affinity"]) == ("0-63,128-191", "0")


def test_padded_affinity_header_without_gpu_numa_id_leaves_an_empty_cell_after_the_cpu_affinity():
    # "...<TAB>NODE<TAB>0-11<TAB><TAB>N/A": the empty cell is padding, not a blank NUMA affinity.
    result = topo_fixture("padded-affinity-header-4x-no-gpu-numa-id")
    expected = topo_fixture("mixed-nvlink-4x")
    for gpu in expected["gpus"]:
        gpu.update(cpu_affinity="0-11", numa_affinity=None, numa_nodes=[], numa_node=None, gpu_numa_id=None)
    assert result == expected


def test_padding_and_real_blank_cells_in_one_padded_row_are_told_apart():
    # A blank CPU affinity (a real value) before the padding, and the padding then the spacer before
    # GPU NUMA ID: the header's layout says which empty cell is which.
    text = read(FIXTURES / "padded-affinity-header-8x" / "topo-m.txt")
    text = text.replace("GPU1\tPIX\t X \tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\t0-63,128-191\t\t0\t\tN/A",
                        "GPU1\tPIX\t X \tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\t\t\t0\t\tN/A")
    text = text.replace("GPU2\tNODE\tNODE\t X \tPIX\tSYS\tSYS\tSYS\tSYS\t0-63,128-191\t\t0\t\tN/A",
                        "GPU2\tNODE\tNODE\t X \tPIX\tSYS\tSYS\tSYS\tSYS\t0-63,128-191\t\t\t\t2")
    result = parse.parse_topo_matrix(text)
    assert result["gpus"][1]["cpu_affinity"] is None and result["gpus"][1]["numa_node"] == 0
    assert (result["gpus"][2]["cpu_affinity"], result["gpus"][2]["numa_affinity"], result["gpus"][2]["gpu_numa_id"]) == (
        "0-63,128-191", None, 2)


def test_single_gpu_na_numa_and_no_final_newline():
    text = read(FIXTURES / "single-gpu-vm-no-newline" / "topo-m.txt")
    assert not text.endswith("\n")
    result = parse.parse_topo_matrix(text)
    assert result["links"] == []
    assert result["gpus"][0]["cpu_affinity"] == "0-15"
    assert result["gpus"][0]["numa_affinity"] is None
    assert result["gpus"][0]["numa_node"] is None
    assert parse.classify_interconnect(result["links"], 1) == "none"


@pytest.mark.parametrize("name", PARSER_ONLY)
def test_every_parser_only_capture_has_a_symmetric_matrix(name):
    result = topo_fixture(name)
    matrix = result["matrix"]
    size = len(matrix)
    assert all(matrix[a][b] == matrix[b][a] for a in range(size) for b in range(size))


# --- every shape of a capture reads as the clean capture does ---------------------------------
# Escape codes, blank or N/A cells, no GPU NUMA ID column, tabs expanded to spaces: each variant is
# made here from the captures above and must give the very facts the capture itself gives.

ALL_CAPTURES = [CAPTURES / name / "topo-m.txt" for name in REPLAYABLE] + [
    FIXTURES / name / "topo-m.txt" for name in PARSER_ONLY
]
AFFINITY_NAMES = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")


def matrix_line_numbers(text):
    """Numbers of the header and row lines of a topo -m capture (up to the first blank line)."""
    lines = text.split("\n")
    header = next(number for number, line in enumerate(lines) if "GPU0" in line)
    end = next((number for number in range(header, len(lines)) if not lines[number].strip()), len(lines))
    return range(header, end)


def change_matrix_lines(text, change):
    lines = text.split("\n")
    for number in matrix_line_numbers(text):
        lines[number] = change(lines[number])
    return "\n".join(lines)


def device_count(text):
    header = parse.strip_ansi(text.split("\n")[matrix_line_numbers(text)[0]])
    return len([name for name in header.split("\t") if name.strip() and name.strip() not in AFFINITY_NAMES])


def escapes_around_every_cell(text):
    """Bold-underlined header cells and coloured row labels, reset the way `tput sgr0` does."""

    def colour(line):
        cells = line.split("\t")
        painted = ["\x1b[1;4m%s\x1b(B\x1b[m" % cell if cell else cell for cell in cells[1:]]
        return "\t".join(["\x1b[32m%s\x1b[0m" % cells[0] if cells[0] else ""] + painted)

    return "\x1b]0;nvidia-smi topo -m\x07" + change_matrix_lines(parse.strip_ansi(text), colour)


def without_gpu_numa_id(text):
    """The capture as a driver without the GPU NUMA ID column prints it (the values were all N/A)."""
    count = device_count(text)

    def drop(line):
        if "GPU NUMA ID" in line:
            return re.sub(r"\t+GPU NUMA ID", "", line)
        cells = line.split("\t")
        while len(cells) > count + 1 and not cells[-1].strip():
            cells.pop()  # rows that end in a tab, NIC rows' blank affinity cells
        if len(cells) > count + 3:  # the GPU NUMA ID (N/A), then the spacer or padding before it
            assert cells.pop().strip() == "N/A", line
            while not cells[-1].strip():
                cells.pop()
        return "\t".join(cells)

    return change_matrix_lines(text, drop) if "GPU NUMA ID" in text else text


def na_cells_blank(text):
    return re.sub(r"(?<=\t)N/A(?=\t|$)", "", text, flags=re.M)


def single_spaces(text):
    """A capture copied from a rendered web page: every run of blanks is one space."""
    return "\n".join(" ".join(line.split()) for line in parse.strip_ansi(text).split("\n"))


def expanded(tab_size, indent=""):
    return lambda text: "\n".join(indent + line for line in text.expandtabs(tab_size).split("\n"))


SHAPES = {
    "escapes stripped": parse.strip_ansi,
    "escapes around every cell, tput sgr0 resets, a title": escapes_around_every_cell,
    "ESC byte lost in a paste ([4mGPU0)": lambda text: text.replace("\x1b", ""),
    "escapes in caret notation (^[[4m)": lambda text: text.replace("\x1b", "^["),
    "leading tab of the header stripped": lambda text: text.lstrip(),
    "CRLF line ends": lambda text: text.replace("\n", "\r\n"),
    "rows end in a tab": lambda text: change_matrix_lines(text, lambda line: line + "\t"),
    "trailing blanks stripped": lambda text: "\n".join(line.rstrip() for line in text.split("\n")),
    "N/A cells blank": na_cells_blank,
    "no GPU NUMA ID column": without_gpu_numa_id,
    "expand (tab stops every 8)": expanded(8),
    "expand -t 4": expanded(4),
    "expand, escapes stripped first": lambda text: parse.strip_ansi(text).expandtabs(8),
    "expand, indented 4 (markdown code block)": expanded(8, "    "),
    "expand, trailing blanks stripped": lambda text: "\n".join(line.rstrip() for line in expanded(8)(text).split("\n")),
    "expand, N/A cells blank": lambda text: expanded(8)(na_cells_blank(text)),
    "expand -t 4, N/A cells blank": lambda text: expanded(4)(na_cells_blank(text)),
    "expand, no GPU NUMA ID column": lambda text: expanded(8)(without_gpu_numa_id(text)),
    "expand, ESC byte lost": lambda text: expanded(8)(text.replace("\x1b", "")),
}


def shape_cases():
    """Every (capture, shape) pair where the shape changes the capture's text."""
    for path in ALL_CAPTURES:
        text = read(path)
        for name, shape in SHAPES.items():
            if shape(text) != text:
                yield pytest.param(path, name, id="%s: %s" % (path.parent.name, name))


@pytest.mark.parametrize("path, shape", list(shape_cases()))
def test_every_shape_reads_as_the_clean_capture(path, shape):
    text = read(path)
    assert parse.parse_topo_matrix(SHAPES[shape](text)) == parse.parse_topo_matrix(text)


def test_every_shape_is_tried_on_some_capture():
    tried = {case.values[1] for case in shape_cases()}
    assert sorted(set(SHAPES) - tried) == []


@pytest.mark.parametrize("name", sorted({path.parent.name for path in ALL_CAPTURES} - {"nic-rows-between-mlx5"}))
def test_single_spaced_capture_reads_the_same_when_no_affinity_cell_is_blank(name):
    path = CAPTURES / name / "topo-m.txt" if name in REPLAYABLE else FIXTURES / name / "topo-m.txt"
    text = read(path)
    assert parse.parse_topo_matrix(single_spaces(text)) == parse.parse_topo_matrix(text)


def test_single_spaced_row_with_a_blank_affinity_cell_is_refused_not_guessed():
    text = single_spaces(read(FIXTURES / "nic-rows-between-mlx5" / "topo-m.txt"))
    with pytest.raises(parse.GpuTopologyParseError, match="cannot tell which of the columns") as refused:
        parse.parse_topo_matrix(text)
    assert repr("GPU2 SYS SYS SYS X PIX PXB 1") in str(refused.value)


def blank_cells(text, blanks, values=None):
    """The capture with the affinity cells `blanks` ({gpu index: [column name]}) left empty and the
    cells `values` ({gpu index: {column name: value}}) set, in nvidia-smi's tab layout."""
    count = device_count(text)
    where = {"CPU Affinity": count + 1, "NUMA Affinity": count + 2, "GPU NUMA ID": count + 4}  # + 3: the spacer

    def edit(line):
        cells = line.split("\t")
        index = int(cells[0][3:]) if re.match(r"^GPU\d+$", cells[0]) else None
        for name in blanks.get(index, []):
            cells[where[name]] = ""
        for name, value in (values or {}).get(index, {}).items():
            cells[where[name]] = value
        return "\t".join(cells)

    return change_matrix_lines(text, edit)


@pytest.mark.parametrize(
    "shape",
    [
        "escapes stripped",
        "rows end in a tab",
        "expand (tab stops every 8)",
        "expand -t 4",
        "expand, indented 4 (markdown code block)",
    ],
)
def test_blank_affinity_cells_are_unknown_in_their_own_column(shape):
    """Which cell is blank shows only in the layout: the facts must name the right column."""
    text = read(CAPTURES / "rtx-pro-6000-8x" / "topo-m.txt")
    blanks = {1: ["CPU Affinity"], 2: ["NUMA Affinity"], 3: ["CPU Affinity", "NUMA Affinity"], 4: ["NUMA Affinity"]}
    edited = blank_cells(text, blanks, values={4: {"GPU NUMA ID": "2"}, 5: {"CPU Affinity": "64-127,192-238,240-255"}})
    expected = parse.parse_topo_matrix(text)
    for index in (1, 3):
        expected["gpus"][index]["cpu_affinity"] = None
    for index in (2, 3, 4):
        expected["gpus"][index].update(numa_affinity=None, numa_nodes=[], numa_node=None)
    expected["gpus"][4]["gpu_numa_id"] = 2
    expected["gpus"][5]["cpu_affinity"] = "64-127,192-238,240-255"  # 22 characters: spans three tab stops
    assert parse.parse_topo_matrix(SHAPES[shape](edited)) == expected


def topo_m(gpu_count, link=lambda a, b: "NV18", nic_count=0):
    """topo -m text in nvidia-smi's own layout (as in the real captures): `link(a, b)` joins GPUs a < b;
    each NIC hangs off GPU 0's switch and the NIC legend names them all."""
    names = ["GPU%d" % index for index in range(gpu_count)] + ["NIC%d" % index for index in range(nic_count)]

    def cell(a, b):
        if a == b:
            return " X "
        if a < gpu_count and b < gpu_count:
            return link(min(a, b), max(a, b))
        return "PIX" if 0 in (a, b) or min(a, b) >= gpu_count else "NODE"

    lines = ["\t\x1b[4m" + "\t".join(names + list(AFFINITY_NAMES)) + "\x1b[0m"]
    for a, name in enumerate(names):
        affinity = ["0-31", "0", "", "N/A"] if a < gpu_count else ["", "", "", ""]
        lines.append("\t".join([name] + [cell(a, b) for b in range(len(names))] + affinity))
    legend = read(CAPTURES / "h200-2x-nvlink" / "topo-m.txt").split("\n\n", 1)[1]
    lines += ["", legend.rstrip("\n")]
    if nic_count:
        lines += ["", "NIC Legend:", ""] + ["  NIC%d: mlx5_%d" % (index, index) for index in range(nic_count)] + [""]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("gpu_count", range(1, 17))
def test_one_to_sixteen_gpus_in_tabs_and_in_spaces(gpu_count):
    text = topo_m(gpu_count)
    result = parse.parse_topo_matrix(text)
    assert [gpu["index"] for gpu in result["gpus"]] == list(range(gpu_count))
    assert link_map(result) == {pair: "NV18" for pair in combinations(range(gpu_count), 2)}
    assert parse.classify_interconnect(result["links"], gpu_count) == ("nvlink" if gpu_count > 1 else "none")
    assert parse.parse_topo_matrix(text.expandtabs(8)) == parse.parse_topo_matrix(text.expandtabs(4)) == result


@pytest.mark.parametrize("link", ["NV%d" % count for count in range(1, 19)] + ["PIX", "PXB", "PHB", "NODE", "SYS"])
def test_every_link_kind_in_tabs_and_in_spaces(link):
    text = topo_m(3, link=lambda a, b: link if (a, b) == (0, 1) else "SYS")
    for shape in (text, text.expandtabs(8), text.expandtabs(4)):
        result = parse.parse_topo_matrix(shape)
        assert link_map(result) == {(0, 1): link, (0, 2): "SYS", (1, 2): "SYS"}
        assert parse.classify_interconnect(result["links"], 3) == ("mixed" if parse.is_nvlink(link) else "pcie")


@pytest.mark.parametrize("nic_count", [1, 4, 12, 18])
def test_nic_rows_and_a_nic_legend_of_any_length(nic_count):
    text = topo_m(8, nic_count=nic_count)
    result = parse.parse_topo_matrix(text)
    assert [nic["name"] for nic in result["nics"]] == ["NIC%d" % index for index in range(nic_count)]
    assert [nic["device"] for nic in result["nics"]] == ["mlx5_%d" % index for index in range(nic_count)]
    assert result["nics"][-1]["links"] == ["PIX"] + ["NODE"] * 7
    assert all(gpu["cpu_affinity"] == "0-31" and gpu["gpu_numa_id"] is None for gpu in result["gpus"])
    assert parse.parse_topo_matrix(text.expandtabs(8)) == parse.parse_topo_matrix(text.expandtabs(4)) == result


@pytest.mark.parametrize(
    "cut_after", ["NIC Legend:", "  NIC0: mlx5_0\n", "  NIC2: mlx5_2\n", "  NIC3:", "  X    = Self\n"]
)
def test_truncated_legend_leaves_the_unlisted_nics_by_name(cut_after):
    """A capture cut short in its legends: the matrix is whole, NICs the legend no longer lists keep their name."""
    text = topo_m(4, nic_count=6)
    truncated = text[: text.index(cut_after) + len(cut_after)]
    listed = [int(number) for number in re.findall(r"NIC(\d+): mlx5", truncated)]
    result = parse.parse_topo_matrix(truncated)
    assert [nic["device"] for nic in result["nics"]] == [
        "mlx5_%d" % index if index in listed else "NIC%d" % index for index in range(6)
    ]
    assert result["gpus"] == parse.parse_topo_matrix(text)["gpus"]


def test_legend_right_after_the_matrix_without_a_blank_line():
    text = topo_m(2, nic_count=2)
    squeezed = "\n".join(line for line in text.split("\n") if line.strip())
    assert parse.parse_topo_matrix(squeezed) == parse.parse_topo_matrix(text)


def test_single_gpu_with_every_affinity_blank_in_spaces():
    """A single GPU with blank CPU and NUMA affinity: the GPU NUMA ID after them keeps its column."""
    text = "\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\nGPU0\t X \t\t\t\tN/A\n"
    expected = {
        "gpus": [
            {
                "index": 0,
                "cpu_affinity": None,
                "numa_affinity": None,
                "numa_nodes": [],
                "numa_node": None,
                "gpu_numa_id": None,
            }
        ],
        "links": [],
        "matrix": [["X"]],
        "nics": [],
    }
    assert parse.parse_topo_matrix(text) == parse.parse_topo_matrix(text.expandtabs(8)) == expected
    with_id = text.replace("N/A", "1")
    assert parse.parse_topo_matrix(with_id.expandtabs(8))["gpus"][0]["gpu_numa_id"] == 1
    # Expanded by 4, this row reads as well with tab stops of 8 (one blank cell): the header's leading
    # tab, 4 columns wide, says which.
    assert parse.parse_topo_matrix(with_id.expandtabs(4))["gpus"][0]["gpu_numa_id"] == 1


# --- edge cases -----------------------------------------------------------------------------


def test_ansi_escapes_are_stripped():
    assert parse.strip_ansi("\t\x1b[4mGPU0\tGPU1\x1b[0m") == "\tGPU0\tGPU1"
    assert parse.strip_ansi("\x1b[1;4mA\x1b[0m\x1b[2KB") == "AB"
    assert parse.strip_ansi("\x1b]0;title\x07\x1b[4mA\x1b(B\x1b[m\x9b4mB\x9b0m") == "AB"  # OSC, tput sgr0, 8-bit CSI
    raw = read(CAPTURES / "rtx-pro-6000-8x" / "topo-m.txt")
    assert "\x1b[4m" in raw  # the real capture carries them
    assert parse.parse_topo_matrix(raw) == parse.parse_topo_matrix(parse.strip_ansi(raw))


def test_matrix_alone_without_legend_or_final_newline():
    raw = read(CAPTURES / "rtx-pro-6000-8x" / "topo-m.txt")
    matrix_only = raw.split("\n\n", 1)[0]
    assert not matrix_only.endswith("\n")
    assert parse.parse_topo_matrix(matrix_only) == parse.parse_topo_matrix(raw)


def test_crlf_line_ends():
    raw = read(CAPTURES / "h200-2x-nvlink" / "topo-m.txt")
    assert parse.parse_topo_matrix(raw.replace("\n", "\r\n"))["links"] == [{"a": 0, "b": 1, "link": "NV18"}]


def test_blank_cpu_affinity_and_spacer_before_gpu_numa_id():
    text = (
        "\t\x1b[4mGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
        "GPU0\t X \tNV18\tNODE\t0-35\t0\t\t2\n"
        "GPU1\tNV18\t X \tNODE\t\t1\t\tN/A\n"
        "NIC0\tNODE\tNODE\t X \t\t\t\t\n"
    )
    result = parse.parse_topo_matrix(text)
    assert [(gpu["cpu_affinity"], gpu["numa_affinity"], gpu["gpu_numa_id"]) for gpu in result["gpus"]] == [
        ("0-35", "0", 2),
        (None, "1", None),
    ]
    assert result["nics"] == [{"name": "NIC0", "device": "NIC0", "links": ["NODE", "NODE"]}]


def test_numa_affinity_spanning_nodes_has_no_single_node():
    text = "\tGPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \t0-63\t0-1\n"
    gpu = parse.parse_topo_matrix(text)["gpus"][0]
    assert gpu["numa_nodes"] == [0, 1]
    assert gpu["numa_node"] is None


@pytest.mark.parametrize(
    "links, count, expected",
    [
        ([], 0, "none"),
        ([], 1, "none"),
        ([{"a": 0, "b": 1, "link": "NV4"}], 2, "nvlink"),
        ([{"a": 0, "b": 1, "link": "PIX"}], 2, "pcie"),
        (
            [{"a": 0, "b": 1, "link": "NV4"}, {"a": 0, "b": 2, "link": "SYS"}, {"a": 1, "b": 2, "link": "SYS"}],
            3,
            "mixed",
        ),
        ([{"a": 0, "b": 1, "link": "SOC"}], 2, "pcie"),  # old drivers' name for SYS
    ],
)
def test_classify_interconnect(links, count, expected):
    assert parse.classify_interconnect(links, count) == expected


@pytest.mark.parametrize(
    "link, expected", [("NV1", True), ("NV18", True), ("NV#", False), ("NODE", False), ("X", False)]
)
def test_is_nvlink(link, expected):
    assert parse.is_nvlink(link) is expected


def test_query_csv_without_final_newline_and_other_fields():
    """A real --format=csv,noheader,nounits answer (another host of the same model), no final newline."""
    text = read(SOURCES / "rtx-pro-6000-blackwell-8x" / "query-gpu-other-host.csv")
    assert not text.endswith("\n")
    fields = (
        "index",
        "name",
        "driver_version",
        "pci.bus_id",
        "pcie.link.gen.current",
        "pcie.link.width.current",
        "power.limit",
    )
    gpus = parse.parse_query_gpu(text, fields)
    assert [gpu["index"] for gpu in gpus] == list(range(8))
    assert gpus[7] == {
        "index": 7,
        "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        "driver_version": "595.58.03",
        "pci_bus_id": "00000000:F1:00.0",
        "pcie_link_gen_current": 5,
        "pcie_link_width_current": 16,
        "power.limit": "600.00",
    }


def test_query_na_values_become_none():
    line = "0, NVIDIA H200, GPU-x, 00000000:00:06.0, [N/A], 9.0, 580.159.04, [Not Supported], 5, N/A, 16, Disabled\n"
    gpu = parse.parse_query_gpu(line)[0]
    assert gpu["memory_total_mib"] is None
    assert gpu["pcie_link_gen_current"] is None
    assert gpu["pcie_link_width_current"] is None
    assert gpu["persistence_mode"] is False


def test_query_no_devices_is_an_empty_list():
    assert parse.parse_query_gpu("No devices were found\n") == []
    result = parse.build_topology("No devices were found", "")
    assert result["gpu_count"] == 0
    assert result["interconnect"] == "none"
    assert result["nvlink"] is False
    assert result["driver_version"] is None


def test_query_rows_sorted_by_index():
    rows = query_rows("h200-2x-nvlink").splitlines()
    assert [gpu["index"] for gpu in parse.parse_query_gpu("\n".join(reversed(rows)))] == [0, 1]


@pytest.mark.parametrize(
    "text, message",
    [
        ("0, NVIDIA H200\n", "expected 12 comma-separated values"),
        ("x, NVIDIA H200, GPU-x, 0:0, 1, 9.0, 1, 5, 5, 16, 16, Enabled\n", "expected an integer"),
        ("0, NVIDIA H200, GPU-x, 0:0, 1, 9.0, 1, 5, 5, 16, 16, Maybe\n", "expected Enabled or Disabled"),
        (
            "0, A, GPU-x, 0:0, 1, 9.0, 1, 5, 5, 16, 16, Enabled\n0, B, GPU-y, 0:1, 1, 9.0, 1, 5, 5, 16, 16, Enabled\n",
            "indexes repeat",
        ),
    ],
)
def test_query_errors(text, message):
    with pytest.raises(parse.GpuTopologyParseError, match=message):
        parse.parse_query_gpu(text)


@pytest.mark.parametrize(
    "text, message, offending_line",
    [
        ("", "no topology matrix", ""),
        (DRIVER_DOWN, "no topology matrix", DRIVER_DOWN),
        ("GPU0\t X \tNV1\nGPU1\tNV1\t X \n", "no header row naming the GPU columns", "GPU0\t X \tNV1"),
        ("\tGPU0\tGPU1\nGPU0\t X \tNV1\n", "rows and columns differ: no row for GPU1", "GPU0\tGPU1"),
        ("\tGPU0\tNIC0\nGPU0\t X \tPIX\n", "rows and columns differ: no row for NIC0", "GPU0\tNIC0"),
        ("\tGPU0\nGPU0\t X \nGPU1\t X \n", "row GPU1 is not a column of the header", "GPU1\t X "),
        ("\tGPU0\tGPU1\nGPU0\t X \nGPU1\tNV1\t X \n", "has 1 link cells for 2 columns", "GPU0\t X "),
        ("\tGPU0\tGPU1\nGPU0\tPIX\tNV1\nGPU1\tNV1\t X \n", "GPU0's own cell is 'PIX', not X", "GPU0\tPIX\tNV1"),
        ("\tGPU0\tNIC0\nGPU0\t X \tPIX\nNIC0\tPIX\tSYS\n", "NIC0's own cell is 'SYS', not X", "NIC0\tPIX\tSYS"),
        ("\tGPU1\tGPU0\nGPU1\t X \tNV1\nGPU0\tNV1\t X \n", "GPU columns out of order", "GPU1\tGPU0"),
        ("\tGPU0\nGPU0\t X \nGPU0\t X \n", "appears twice", "GPU0\t X "),
        (
            "\tGPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \t0-31\t0\t7\n",
            "3 cells after the links where the header names 2",
            "GPU0\t X \t0-31\t0\t7",
        ),
        (
            "        GPU0    CPU Affinity    NUMA Affinity   Power Limit\nGPU0     X      0-31    0       600\n",
            "unknown column 'Power Limit' after the affinity columns",
            "        GPU0    CPU Affinity    NUMA Affinity   Power Limit",
        ),
        (  # a paste that lost a tab in the header ("NIC0NIC1"): one link cell more than the header names
            "\tGPU0\tNIC0NIC1\tCPU Affinity\nGPU0\t X \tPIX\tPIX\t0-31\nNIC0NIC1\tPIX\t X \tPIX\n",
            "2 cells after the links where the header names 1",
            "GPU0\t X \tPIX\tPIX\t0-31",
        ),
        (  # hand-aligned, on no tab grid, one of two affinity cells printed
            "GPU0 CPU Affinity NUMA Affinity\nGPU0 X 1\n",
            "cannot tell which of the columns CPU Affinity, NUMA Affinity the 1 affinity cells fill",
            "GPU0 X 1",
        ),
    ],
)
def test_topo_garbage_is_refused_quoting_the_offending_line(text, message, offending_line):
    with pytest.raises(parse.GpuTopologyParseError, match=re.escape(message)) as refused:
        parse.parse_topo_matrix(text)
    assert repr(offending_line) in str(refused.value)


def test_a_column_a_newer_driver_adds_is_read_past():
    """Tab-separated, a column after the affinity ones is a column like any: the known ones keep their cells."""
    text = "\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\tPower Limit\nGPU0\t X \t0-31\t1\t\t4\t600\n"
    gpu = parse.parse_topo_matrix(text)["gpus"][0]
    assert (gpu["cpu_affinity"], gpu["numa_node"], gpu["gpu_numa_id"]) == ("0-31", 1, 4)


def test_space_aligned_matrix_without_affinity_columns():
    """Once refused for want of a tab-separated header: the expanded text reads as its tabs do."""
    tabs = "\tGPU0\tGPU1\nGPU0\t X \tNV1\nGPU1\tNV1\t X \n"
    spaces = "        GPU0    GPU1\nGPU0     X      NV1\nGPU1    NV1      X\n"
    assert parse.parse_topo_matrix(spaces) == parse.parse_topo_matrix(tabs)
    assert parse.parse_topo_matrix(spaces)["links"] == [{"a": 0, "b": 1, "link": "NV1"}]


def test_query_and_topo_disagreeing_on_gpus_is_an_error():
    with pytest.raises(parse.GpuTopologyParseError, match="topo -m lists GPUs"):
        parse.build_topology(query_rows("rtx-pro-6000-8x"), read(CAPTURES / "rtx-pro-6000-7x" / "topo-m.txt"))


@pytest.mark.parametrize(
    "value, expected",
    [
        ("0-63,128-191", list(range(64)) + list(range(128, 192))),
        ("0", [0]),
        ("0-1", [0, 1]),
        ("N/A", []),
        ("", []),
    ],
)
def test_parse_id_list(value, expected):
    assert parse.parse_id_list(value) == expected
