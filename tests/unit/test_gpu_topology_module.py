"""The gpu_topology module's main(), with run_command mocked to answer from recorded captures."""

import json
import re

import pytest
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args
from project_modules import REPO

CAPTURES = REPO / "tests" / "double" / "captures"
DOUBLE_BIN = REPO / "tests" / "double" / "bin"
DRIVER_DOWN = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n\n"
)


# The module imports its parser as ansible.module_utils.gpu_topology_parse (ansible.cfg's
# module_utils path at run time); make that name resolve to the repository's file here.
@pytest.fixture(scope="module")
def parse(project_module):
    return project_module("module_utils/gpu_topology_parse.py", as_name="ansible.module_utils.gpu_topology_parse")


@pytest.fixture(scope="module")
def gpu_topology(project_module, parse):  # pylint: disable=unused-argument  # registered first
    return project_module("library/gpu_topology.py")


class FakeNvidiaSmi:
    """Stands in for AnsibleModule.run_command: answers the module's two commands from a capture."""

    def __init__(self, capture=None, answers=None):
        self.capture = capture
        self.answers = answers or {}
        self.calls = []

    def __call__(self, module, args, **kwargs):  # module: the AnsibleModule whose run_command this replaces
        self.calls.append((list(args), kwargs))
        key = "topo" if args[1:] == ["topo", "-m"] else "query"
        if key in self.answers:
            return self.answers[key]
        if key == "topo":
            return 0, (CAPTURES / self.capture / "topo-m.txt").read_text(encoding="utf-8"), ""
        fields = args[1].split("=", 1)[1].split(",")
        assert args[2] == "--format=csv,noheader,nounits"
        header, _, rows = (CAPTURES / self.capture / "query-gpu.csv").read_text(encoding="utf-8").partition("\n")
        assert fields == [re.sub(r"\s*\[.*\]$", "", cell.strip()) for cell in header.split(",")]
        return 0, rows, ""


def run_main(gpu_topology, monkeypatch, capsys, args, fake):
    def run_command(module, args, **kwargs):
        return fake(module, args, **kwargs)

    monkeypatch.setattr(basic.AnsibleModule, "run_command", run_command)
    with patch_module_args(args):
        with pytest.raises(SystemExit) as exited:
            gpu_topology.main()
    result = json.loads(capsys.readouterr().out)
    result["exit_code"] = exited.value.code
    return result


@pytest.fixture(name="nvidia_smi")
def fixture_nvidia_smi():
    """Path of an executable the module accepts (the test double; never run here, run_command is mocked)."""
    return str(DOUBLE_BIN / "nvidia-smi-rtx-pro-6000-8x")


def test_canonical_node_facts(gpu_topology, monkeypatch, capsys, nvidia_smi):
    fake = FakeNvidiaSmi("rtx-pro-6000-8x")
    result = run_main(gpu_topology, monkeypatch, capsys, {"nvidia_smi": nvidia_smi}, fake)
    assert result["exit_code"] == 0
    assert result["changed"] is False
    assert result["nvidia_smi"] == nvidia_smi
    facts = result["ansible_facts"]["gpu_topology"]
    assert facts["gpu_count"] == 8
    assert facts["interconnect"] == "pcie"
    assert facts["nvlink"] is False
    assert {"a": 0, "b": 1, "link": "PIX"} in facts["links"]
    assert {"a": 3, "b": 4, "link": "SYS"} in facts["links"]
    assert facts["gpus"][7]["pci_bus_id"] == "00000000:F5:00.0"
    assert facts["gpus"][7]["numa_node"] == 1


def test_runs_nvidia_smi_read_only_with_c_locale(parse, gpu_topology, monkeypatch, capsys, nvidia_smi):
    fake = FakeNvidiaSmi("rtx-pro-6000-8x")
    run_main(gpu_topology, monkeypatch, capsys, {"nvidia_smi": nvidia_smi}, fake)
    assert [args[1:] for args, _kwargs in fake.calls] == [
        ["--query-gpu=" + ",".join(parse.QUERY_FIELD_NAMES), "--format=csv,noheader,nounits"],
        ["topo", "-m"],
    ]
    assert all(args[0] == nvidia_smi for args, _kwargs in fake.calls)
    assert all(kwargs.get("environ_update", {}).get("LC_ALL") == "C" for _args, kwargs in fake.calls)


def test_check_mode_returns_the_same_facts(gpu_topology, monkeypatch, capsys, nvidia_smi):
    normal = run_main(gpu_topology, monkeypatch, capsys, {"nvidia_smi": nvidia_smi}, FakeNvidiaSmi("h200-2x-nvlink"))
    checked = run_main(
        gpu_topology, monkeypatch, capsys, {"nvidia_smi": nvidia_smi, "_ansible_check_mode": True}, FakeNvidiaSmi("h200-2x-nvlink")
    )
    assert checked["exit_code"] == 0
    assert checked["changed"] is False
    assert checked["ansible_facts"] == normal["ansible_facts"]
    assert checked["ansible_facts"]["gpu_topology"]["interconnect"] == "nvlink"


def test_found_on_path_when_not_given(gpu_topology, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(REPO / "tests" / "unit" / "no-such-dir"))
    found = "/opt/nvidia/bin/nvidia-smi"
    seen = {}

    def fake_get_bin_path(module, name, required=False, opt_dirs=None):
        seen.update(name=name, opt_dirs=opt_dirs)
        return found

    monkeypatch.setattr(basic.AnsibleModule, "get_bin_path", fake_get_bin_path)
    result = run_main(gpu_topology, monkeypatch, capsys, {}, FakeNvidiaSmi("rtx-pro-6000-8x"))
    assert result["exit_code"] == 0
    assert result["nvidia_smi"] == found
    assert seen["name"] == "nvidia-smi"
    assert "/usr/local/nvidia/bin" in seen["opt_dirs"]


def test_missing_on_path_fails_clearly(gpu_topology, monkeypatch, capsys):
    monkeypatch.setattr(basic.AnsibleModule, "get_bin_path", lambda module, name, required=False, opt_dirs=None: None)
    fake = FakeNvidiaSmi("rtx-pro-6000-8x")
    result = run_main(gpu_topology, monkeypatch, capsys, {"nvidia_smi": ""}, fake)
    assert result["exit_code"] == 1
    assert result["failed"] is True
    assert "nvidia-smi not found on PATH" in result["msg"]
    assert "is the NVIDIA driver installed?" in result["msg"]
    assert fake.calls == []


def test_missing_executable_fails_clearly(gpu_topology, monkeypatch, capsys, tmp_path):
    fake = FakeNvidiaSmi("rtx-pro-6000-8x")
    result = run_main(gpu_topology, monkeypatch, capsys, {"nvidia_smi": str(tmp_path / "nvidia-smi")}, fake)
    assert result["failed"] is True
    assert result["msg"] == "nvidia_smi=%s: no such file; is the NVIDIA driver installed?" % (tmp_path / "nvidia-smi")
    assert fake.calls == []


def test_not_executable_fails_clearly(gpu_topology, monkeypatch, capsys, tmp_path):
    plain = tmp_path / "nvidia-smi"
    plain.write_text("not a program\n", encoding="utf-8")
    plain.chmod(0o644)
    result = run_main(gpu_topology, monkeypatch, capsys, {"nvidia_smi": str(plain)}, FakeNvidiaSmi("rtx-pro-6000-8x"))
    assert result["failed"] is True
    assert "not an executable file" in result["msg"]


def test_driver_not_answering_fails_clearly(gpu_topology, monkeypatch, capsys, nvidia_smi):
    fake = FakeNvidiaSmi(answers={"query": (9, DRIVER_DOWN, "")})
    result = run_main(gpu_topology, monkeypatch, capsys, {"nvidia_smi": nvidia_smi}, fake)
    assert result["exit_code"] == 1
    assert result["failed"] is True
    assert result["rc"] == 9
    assert "exited 9 (the NVIDIA driver is not loaded or does not answer)" in result["msg"]
    assert "couldn't communicate with the NVIDIA driver" in result["msg"]
    assert len(fake.calls) == 1  # stops at the first failure


def test_topo_failure_fails_clearly(gpu_topology, monkeypatch, capsys, nvidia_smi):
    fake = FakeNvidiaSmi(
        "rtx-pro-6000-8x",
        answers={"topo": (15, "", "Unable to determine the device handle for GPU 0000:85:00.0: GPU is lost.")},
    )
    result = run_main(gpu_topology, monkeypatch, capsys, {"nvidia_smi": nvidia_smi}, fake)
    assert result["failed"] is True
    assert "topo -m exited 15 (a GPU has fallen off the bus" in result["msg"]
    assert "GPU is lost" in result["msg"]


def test_driver_too_old_for_a_field_fails_clearly(gpu_topology, monkeypatch, capsys, nvidia_smi):
    fake = FakeNvidiaSmi(answers={"query": (2, 'Field "compute_cap" is not a valid field to query.\n\n', "")})
    result = run_main(gpu_topology, monkeypatch, capsys, {"nvidia_smi": nvidia_smi}, fake)
    assert result["failed"] is True
    assert "exited 2 (an invalid argument or field (a driver too old for a queried field?))" in result["msg"]
    assert 'Field "compute_cap" is not a valid field to query.' in result["msg"]


def test_no_devices_is_zero_gpus_not_a_failure(gpu_topology, monkeypatch, capsys, nvidia_smi):
    fake = FakeNvidiaSmi(answers={"query": (6, "No devices were found\n", "")})
    result = run_main(gpu_topology, monkeypatch, capsys, {"nvidia_smi": nvidia_smi}, fake)
    assert result["exit_code"] == 0
    facts = result["ansible_facts"]["gpu_topology"]
    assert (facts["gpu_count"], facts["gpus"], facts["links"], facts["interconnect"]) == (0, [], [], "none")
    assert len(fake.calls) == 1  # no topo -m without GPUs


def test_unreadable_output_fails_with_what_was_printed(gpu_topology, monkeypatch, capsys, nvidia_smi):
    fake = FakeNvidiaSmi("rtx-pro-6000-8x", answers={"topo": (0, "something else entirely\n", "")})
    result = run_main(gpu_topology, monkeypatch, capsys, {"nvidia_smi": nvidia_smi}, fake)
    assert result["failed"] is True
    assert result["msg"].startswith("cannot read the output of %s: no topology matrix" % nvidia_smi)
    assert result["topo_m"] == "something else entirely\n"


CANONICAL_TOPO = (CAPTURES / "rtx-pro-6000-8x" / "topo-m.txt").read_text(encoding="utf-8")
# The canonical capture as other drivers, terminals and pastes print it (issue 20); the parser's
# tests try every shape on every capture, these check the module's facts end to end.
TOPO_SHAPES = {
    "tabs expanded to spaces": CANONICAL_TOPO.expandtabs(8),
    "ESC bytes lost, header's leading tab stripped": CANONICAL_TOPO.replace("\x1b", "").lstrip(),
    "rows ending in a tab": re.sub(r"\tN/A$", "\tN/A\t", CANONICAL_TOPO, flags=re.M),
    "no GPU NUMA ID column, expanded": re.sub(r"\t(GPU NUMA ID|\tN/A$)", "", CANONICAL_TOPO, flags=re.M).expandtabs(8),
}


@pytest.mark.parametrize("shape", sorted(TOPO_SHAPES))
def test_every_shape_of_topo_m_gives_the_same_facts(gpu_topology, monkeypatch, capsys, nvidia_smi, shape):
    assert TOPO_SHAPES[shape] != CANONICAL_TOPO
    clean = run_main(gpu_topology, monkeypatch, capsys, {"nvidia_smi": nvidia_smi}, FakeNvidiaSmi("rtx-pro-6000-8x"))
    fake = FakeNvidiaSmi("rtx-pro-6000-8x", answers={"topo": (0, TOPO_SHAPES[shape], "")})
    shaped = run_main(gpu_topology, monkeypatch, capsys, {"nvidia_smi": nvidia_smi}, fake)
    assert shaped["exit_code"] == 0
    assert shaped["ansible_facts"] == clean["ansible_facts"]


def test_matrix_missing_a_row_fails_quoting_the_header(gpu_topology, monkeypatch, capsys, nvidia_smi):
    without_gpu7 = re.sub(r"^GPU7\t.*\n", "", CANONICAL_TOPO, flags=re.M)
    fake = FakeNvidiaSmi("rtx-pro-6000-8x", answers={"topo": (0, without_gpu7, "")})
    result = run_main(gpu_topology, monkeypatch, capsys, {"nvidia_smi": nvidia_smi}, fake)
    assert result["failed"] is True
    assert "rows and columns differ: no row for GPU7" in result["msg"]
    assert "GPU6\\tGPU7\\tCPU Affinity\\tNUMA Affinity\\tGPU NUMA ID" in result["msg"]
    assert result["topo_m"] == without_gpu7


def test_documentation_is_complete(parse, gpu_topology):
    import yaml  # pylint: disable=import-outside-toplevel

    doc = yaml.safe_load(gpu_topology.DOCUMENTATION)
    assert doc["module"] == "gpu_topology"
    assert set(doc["options"]) == {"nvidia_smi"}
    assert doc["attributes"]["check_mode"]["support"] == "full"
    returned = yaml.safe_load(gpu_topology.RETURN)["ansible_facts"]["contains"]["gpu_topology"]["contains"]
    assert {"gpu_count", "gpus", "links", "nvlink", "interconnect"} <= set(returned)
    per_gpu = set(returned["gpus"]["contains"])
    keys = {key for _field, key, _convert in parse.QUERY_FIELDS}
    assert keys <= per_gpu
    assert {"cpu_affinity", "numa_affinity", "numa_node", "numa_nodes", "gpu_numa_id"} <= per_gpu
    assert yaml.safe_load(gpu_topology.EXAMPLES)
