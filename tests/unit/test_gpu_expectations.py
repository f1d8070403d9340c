"""gpu_topology_mismatches: the gpu_preflight comparison, on topologies parsed from real nvidia-smi captures.

The captures are the ones the nvidia-smi test double replays (tests/double/captures/), parsed by the
gpu_topology module's own parser, and the facts recorded on real H200 nodes (tests/fixtures/gpu-runs/).
tests/roles/test_gpu_preflight_role.py runs the same comparison through the role.
"""

import copy
import json
import re

import pytest
from ansible.errors import AnsibleFilterError
from project_modules import REPO

CAPTURES = REPO / "tests" / "double" / "captures"
GPU_RUNS = REPO / "tests" / "fixtures" / "gpu-runs"

CANONICAL = {
    "expected_gpu_count": 8,
    "gpu_name_pattern": "RTX PRO 6000 Blackwell",
    "min_compute_capability": "12.0",
    "expected_pcie_gen": 5,
    "expected_pcie_width": 16,
    "expected_interconnect": "pcie",
    "driver_version_min": "595.58.03",
    "driver_version_max": "595",
}
H200_PAIR = {**CANONICAL, "expected_gpu_count": 2, "gpu_name_pattern": "^NVIDIA H200$", "min_compute_capability": "9.0",
             "expected_interconnect": "nvlink", "driver_version_min": "580", "driver_version_max": "580.159"}


@pytest.fixture(scope="module")
def mismatches(project_module):
    return project_module("filter_plugins/gpu_expectations.py").gpu_topology_mismatches


@pytest.fixture(scope="module")
def topology(project_module):
    parse = project_module("module_utils/gpu_topology_parse.py")

    def build(capture):
        header, _, rows = (CAPTURES / capture / "query-gpu.csv").read_text().partition("\n")
        fields = tuple(re.sub(r"\s*\[.*\]$", "", cell.strip()) for cell in header.split(","))
        assert fields == parse.QUERY_FIELD_NAMES
        return parse.build_topology(rows, (CAPTURES / capture / "topo-m.txt").read_text())

    return build


def test_canonical_node_matches(mismatches, topology):
    assert mismatches(topology("rtx-pro-6000-8x"), CANONICAL, server_args={"tp_size": 8}) == []


def test_missing_gpu_and_the_tp_size_it_breaks(mismatches, topology):
    assert mismatches(topology("rtx-pro-6000-7x"), CANONICAL, server_args={"tp_size": 8}) == [
        "gpu_preflight_expected_gpu_count: expected 8 GPUs, found 7",
        "sglang_server_args.tp_size: tp_size 8 = 8 GPU(s) per node, but the node has 7 GPU(s)",
    ]


def test_card_trained_down_is_named_by_bus_id(mismatches, topology):
    assert mismatches(topology("rtx-pro-6000-8x-gen4x8"), CANONICAL, server_args={"tp_size": 8}) == [
        "gpu_preflight_expected_pcie_gen: expected every GPU's max PCIe link at Gen5 or better, "
        "found GPU 5 (00000000:85:00.0) at Gen4",
        "gpu_preflight_expected_pcie_width: expected every GPU's max PCIe link at x16 or wider, "
        "found GPU 5 (00000000:85:00.0) at x8",
    ]


def test_nvswitch_node_where_the_canonical_node_is_expected(mismatches, topology):
    assert mismatches(topology("h200-8x-nvswitch"), CANONICAL, server_args={"tp_size": 8}) == [
        "gpu_preflight_gpu_name_pattern: expected GPU names matching 'RTX PRO 6000 Blackwell', "
        "found 'NVIDIA H200' on GPU 0, 1, 2, 3, 4, 5, 6, 7",
        "gpu_preflight_min_compute_capability: expected compute capability 12.0 or higher on every GPU, "
        "found 9.0 on GPU 0, 1, 2, 3, 4, 5, 6, 7",
        "gpu_preflight_expected_interconnect: expected pcie, found nvlink (NVLink joins 28 of 28 GPU pairs: NV18)",
        "gpu_preflight_driver_version_min: expected NVIDIA driver 595.58.03 or newer, found 580.159.04",
    ]


@pytest.mark.parametrize("run", sorted(p.name for p in GPU_RUNS.iterdir() if (p / "gpu_topology.json").is_file()))
def test_facts_recorded_on_real_h200_nodes(mismatches, run):
    facts = json.loads((GPU_RUNS / run / "gpu_topology.json").read_text())
    count = facts["gpu_count"]
    expected = {**H200_PAIR, "expected_gpu_count": count, "expected_interconnect": "nvlink" if count > 1 else "none"}
    assert mismatches(facts, expected, server_args={"tp_size": count}) == []
    assert mismatches(facts, {**expected, "expected_gpu_count": 8}, server_args={"tp_size": count}) == [
        f"gpu_preflight_expected_gpu_count: expected 8 GPUs, found {count}"]


IDLE = "; set sglang_allow_idle_gpus: true to deploy it anyway"


@pytest.mark.parametrize(("server_args", "message"), [
    ({"tp_size": 3}, "sglang_server_args.tp_size: tp_size 3 = 3 GPU(s) per node, so 5 of the node's 8 GPU(s) would sit "
                     "idle" + IDLE),
    ({"tp_size": 16}, "sglang_server_args.tp_size: tp_size 16 = 16 GPU(s) per node, but the node has 8 GPU(s)"),
    ({"tp_size": 4, "pp_size": 4}, "sglang_server_args.tp_size, sglang_server_args.pp_size: tp_size 4 x pp_size 4 = "
                                   "16 GPU(s) per node, but the node has 8 GPU(s)"),
    ({"tp_size": 4, "base_gpu_id": 6}, "sglang_server_args.tp_size, sglang_server_args.base_gpu_id: tp_size 4, GPU ids "
                                       "from 6 step 1 = 4 GPU(s) per node, but the node has 8 GPU(s)"),
])
def test_the_parallel_sizes_must_fit_the_gpus(mismatches, topology, server_args, message):
    assert mismatches(topology("rtx-pro-6000-8x"), CANONICAL, server_args=server_args) == [message]


def test_the_same_rule_judges_the_values_sglang_resolved(mismatches, topology, project_module):
    # One rule, applied early to the inventory and later, by sglang_service's flag check, to the
    # ServerArgs fields SGLang resolved from it, naming the fields the inventory set.
    layout_mismatches = project_module("filter_plugins/gpu_expectations.py").gpu_layout_mismatches
    resolved_defaults = {"tp_size": 1, "pp_size": 1, "dp_size": 1, "nnodes": 1, "base_gpu_id": 0, "gpu_id_step": 1,
                         "enable_dp_attention": False, "mem_fraction_static": 0.8}
    for layout in ({"tp_size": 3}, {"tp_size": 2, "dp_size": 4}, {"tp_size": 4, "pp_size": 4}, {"tp_size": 8}):
        found = mismatches(topology("rtx-pro-6000-8x"), CANONICAL, server_args=layout)
        resolved = {**resolved_defaults, **layout}
        assert layout_mismatches(resolved, 8, False, [*layout, "model_path"]) == found
    assert layout_mismatches({**resolved_defaults, "tp_size": 4}, 8, True, ["tp_size"]) == []


@pytest.mark.parametrize("resolved, gpus, explanation", [
    ({"tp_size": 8}, 8, "tp_size 8 = 8 GPU(s) per node"),
    ({"tp_size": 4, "pp_size": 2}, 8, "tp_size 4 x pp_size 2 = 8 GPU(s) per node"),
    ({"tp_size": 2, "dp_size": 4}, 8, "tp_size 2 x dp_size 4 = 8 GPU(s) per node"),
    ({"tp_size": 8, "dp_size": 8, "enable_dp_attention": True}, 8,
     "tp_size 8 x dp_size 8 (dp attention: inside tp) = 8 GPU(s) per node"),
    ({"tp_size": 16, "nnodes": 2}, 8, "tp_size 16 over 2 nodes = 8 GPU(s) per node"),
    ({"tp_size": 2, "base_gpu_id": 6}, 8, "tp_size 2, GPU ids from 6 step 1 = 2 GPU(s) per node"),
    ({"tp_size": 2, "base_gpu_id": 7}, 9, "tp_size 2, GPU ids from 7 step 1 = 2 GPU(s) per node"),
])
def test_gpus_needed(resolved, gpus, explanation, project_module):
    assert project_module("filter_plugins/gpu_expectations.py").gpus_needed(resolved) == (gpus, explanation)


@pytest.mark.parametrize("server_args", [{"tp_size": 8}, {"tp_size": "8"}, {"tp_size": 2, "dp_size": 4},
                                         {"tp_size": 8, "dp_size": 8, "enable_dp_attention": True},
                                         {"tp_size": "eight"}, None])
def test_layouts_that_fit_or_cannot_be_read_here(mismatches, topology, server_args):
    # A tp_size that is not an integer is the sglang role's type check's to name (before this role).
    assert mismatches(topology("rtx-pro-6000-8x"), CANONICAL, server_args=server_args) == []


def test_idle_gpus_only_when_allowed(mismatches, topology):
    assert mismatches(topology("rtx-pro-6000-8x"), CANONICAL, server_args={"tp_size": 4}, allow_idle_gpus=True) == []
    assert mismatches(topology("rtx-pro-6000-8x"), CANONICAL, server_args={"tp_size": 4}) == [
        "sglang_server_args.tp_size: tp_size 4 = 4 GPU(s) per node, so 4 of the node's 8 GPU(s) would sit idle" + IDLE]


def test_driver_bounds_compare_numbers_per_component(mismatches, topology):
    node = topology("rtx-pro-6000-8x")  # driver 595.58.03
    assert mismatches(node, {**CANONICAL, "driver_version_max": "595.50"}) == [
        "gpu_preflight_driver_version_max: expected NVIDIA driver 595.50 or older (compared on the components given), "
        "found 595.58.03"]
    # 58 < 100 numerically, though "58" > "100" as strings.
    assert mismatches(node, {**CANONICAL, "driver_version_min": "595.100"}) == [
        "gpu_preflight_driver_version_min: expected NVIDIA driver 595.100 or newer, found 595.58.03"]
    assert mismatches(node, {**CANONICAL, "driver_version_min": "", "driver_version_max": None}) == []
    assert mismatches(node, {**CANONICAL, "driver_version_max": "595.58.03"}) == []


def test_unreadable_values_count_as_mismatches(mismatches, topology):
    node = copy.deepcopy(topology("rtx-pro-6000-8x"))
    node["gpus"][2]["compute_capability"] = None
    node["gpus"][3]["pcie_link_gen_max"] = None
    node["gpus"][3]["name"] = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    node["gpus"][4]["name"] = None
    got = mismatches(node, CANONICAL)
    assert got[0] == "gpu_preflight_gpu_name_pattern: expected GPU names matching 'RTX PRO 6000 Blackwell', found 'N/A' on GPU 4"
    assert got[1] == ("gpu_preflight_min_compute_capability: expected compute capability 12.0 or higher on every GPU, "
                      "found N/A on GPU 2")
    assert got[2].endswith(f"found GPU 3 ({node['gpus'][3]['pci_bus_id']}) at GenN/A")
    assert len(got) == 3


def test_names_are_grouped_by_name_in_name_order(mismatches, topology):
    node = copy.deepcopy(topology("rtx-pro-6000-8x"))
    for index, name in ((1, "Tesla T4"), (6, "NVIDIA A100"), (7, "Tesla T4")):
        node["gpus"][index]["name"] = name
    assert mismatches(node, CANONICAL)[0] == ("gpu_preflight_gpu_name_pattern: expected GPU names matching "
                                              "'RTX PRO 6000 Blackwell', found 'NVIDIA A100' on GPU 6; 'Tesla T4' on GPU 1, 7")


@pytest.mark.parametrize("expectations", [{k: v for k, v in CANONICAL.items() if k != "expected_pcie_gen"},
                                          {**CANONICAL, "expected_gpu_cuont": 8}, ["expected_gpu_count"]])
def test_expectations_must_have_exactly_the_known_keys(mismatches, topology, expectations):
    with pytest.raises(AnsibleFilterError, match="expectations must have exactly the keys"):
        mismatches(topology("rtx-pro-6000-8x"), expectations)
