"""sglang_stack_facts: its parsers on real captures, its probe and main() for real, and the expectation check.

main() runs here only against Pythons without torch; its run on the parser venv's CPU torch stack and
the stack_verify role through ansible are in tests/roles/test_stack_verify_role.py.
Real captures in tests/fixtures/stack/ (see its README.md): nvidia-smi -q of 8 x RTX PRO 6000 Blackwell
(driver 595.58.03, CUDA 13.2) and of 1 x H200 (580.159.04, CUDA 13.0), the plain nvidia-smi banner of
2 x H200, nvcc 13.0.88, and the sglang_stack fact the module returned on a real H200 machine.
"""

import json
import sys

import pytest
from ansible.errors import AnsibleFilterError
from ansible.module_utils.testing import patch_module_args
from project_modules import REPO

FIXTURES = REPO / "tests" / "fixtures" / "stack"


# The module imports its parser as ansible.module_utils.stack_facts_parse (ansible.cfg's module_utils
# path at run time); make that name resolve to the repository's file here.
@pytest.fixture(scope="module")
def parse(project_module):
    return project_module("module_utils/stack_facts_parse.py", as_name="ansible.module_utils.stack_facts_parse")


@pytest.fixture(scope="module")
def facts_module(project_module, parse):  # pylint: disable=unused-argument  # registered first
    return project_module("library/sglang_stack_facts.py")


@pytest.fixture(scope="module")
def expectations(project_module):
    return project_module("filter_plugins/stack_expectations.py")


def fixture(name):
    return (FIXTURES / name).read_text(encoding="utf-8")


# --------------------------------------------------------------------------- nvidia-smi

def test_nvidia_smi_q_header_of_the_canonical_node(parse):
    assert parse.parse_nvidia_smi_q(fixture("rtx6000x8-nvidia-smi-q.txt")) == {
        "driver_version": "595.58.03", "cuda_version": "13.2", "gpu_count": 8}


def test_nvidia_smi_q_header_of_an_h200(parse):
    assert parse.parse_nvidia_smi_q(fixture("h200x1-nvidia-smi-q.txt")) == {
        "driver_version": "580.159.04", "cuda_version": "13.0", "gpu_count": 1}


def test_nvidia_smi_q_reads_only_the_header(parse):
    text = fixture("rtx6000x8-nvidia-smi-q.txt")
    header, _, gpus = text.partition("GPU 00000000:06:00.0")
    # A GPU section saying something else must not change what the header says.
    tampered = header.replace("Driver Version", "Driver Versions") + "GPU 00000000:06:00.0" + gpus
    tampered += "    Driver Version                                         : 1.2.3\n"
    assert parse.parse_nvidia_smi_q(tampered)["driver_version"] is None


def test_nvidia_smi_banner_of_the_h200_node(parse):
    assert parse.parse_nvidia_smi_banner(fixture("h200x2-nvidia-smi.txt")) == {
        "driver_version": "580.159.04", "cuda_version": "13.0", "gpu_count": 2}


def test_nvidia_smi_banner_is_not_a_q_header(parse):
    # The module tries -q first; the banner must then still be read by the banner parser.
    assert parse.parse_nvidia_smi_q(fixture("h200x2-nvidia-smi.txt"))["driver_version"] == "580.159.04"
    assert parse.parse_nvidia_smi_banner(fixture("rtx6000x8-nvidia-smi-q.txt"))["driver_version"] == "595.58.03"


@pytest.mark.parametrize("parser_name", ["parse_nvidia_smi_q", "parse_nvidia_smi_banner", "parse_nvidia_smi_query_driver"])
def test_nvidia_smi_without_driver_or_devices(parse, parser_name):
    parser = getattr(parse, parser_name)
    down = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running.\n")
    assert parser(down) == {"driver_version": None, "cuda_version": None, "gpu_count": None}
    assert parser("No devices were found\n")["gpu_count"] == 0
    assert parser("") == {"driver_version": None, "cuda_version": None, "gpu_count": None}


def test_nvidia_smi_query_driver(parse):
    assert parse.parse_nvidia_smi_query_driver(fixture("h200x1-query-gpu-driver-version.csv")) == {
        "driver_version": "580.159.04", "cuda_version": None, "gpu_count": 1}
    assert parse.parse_nvidia_smi_query_driver("580.159.04\n580.159.04")["gpu_count"] == 2


# --------------------------------------------------------------------------- nvcc and versions

def test_nvcc_version_of_cuda_13_0(parse):
    assert parse.parse_nvcc_version(fixture("h200x2-nvcc-version.txt")) == {"release": "13.0", "version": "13.0.88"}


@pytest.mark.parametrize("text", ["", None, "bash: nvcc: command not found\n", "Cuda compilation tools\n"])
def test_nvcc_version_unrecognised(parse, text):
    assert parse.parse_nvcc_version(text) is None


@pytest.mark.parametrize("value, expected", [
    ((2, 28, 9), "2.28.9"), ([2, 27, 3], "2.27.3"), (22809, "2.28.9"), (2708, "2.7.8"), ("2.21.5", "2.21.5"), (None, None),
])
def test_nccl_version_string(parse, value, expected):
    assert parse.nccl_version_string(value) == expected


@pytest.mark.parametrize("value, expected", [
    ("13.0.88", (13, 0, 88)), ("2.9.1+cu130", (2, 9, 1)), ("v12.8", (12, 8)), ((9, 0), (9, 0)), (None, None), ("N/A", None),
])
def test_version_tuple(parse, value, expected):
    assert parse.version_tuple(value) == expected


# --------------------------------------------------------------------------- the Python probe

def test_probe_output_with_noise_before_the_json(parse):
    payload = {"python": {"executable": "/opt/sglang/venv/bin/python", "version": "3.12.3", "prefix": "/opt/sglang/venv"},
               "torch": {"version": "2.11.0+cu130", "cuda": "13.0", "cuda_available": True, "device_count": 2,
                         "devices": [{"index": 0, "name": "NVIDIA H200", "compute_capability": "9.0"},
                                     {"index": 1, "name": "NVIDIA H200", "compute_capability": "9.0"}]},
               "nccl": {"version": [2, 28, 9], "source": "torch.cuda.nccl.version()"},
               "sglang": {"version": None, "location": None}, "errors": {}, "fingerprint": "abc"}
    stdout = "UserWarning: something\n" + parse.PROBE_MARKER + json.dumps(payload) + "\n"
    facts = parse.parse_probe_output(stdout)
    assert facts["torch"]["version_public"] == "2.11.0" and facts["torch"]["version_local"] == "cu130"
    assert facts["torch"]["compute_capabilities"] == ["9.0", "9.0"]
    assert facts["nccl"]["version"] == "2.28.9"
    assert facts["fingerprint"] == "abc"


@pytest.mark.parametrize("stdout", ["", "Traceback (most recent call last):\n", "{marker}{not json\n",
                                    "{marker}[1, 2]\n"])
def test_probe_output_unusable(parse, stdout):
    stdout = stdout.replace("{marker}", parse.PROBE_MARKER)
    with pytest.raises(parse.ProbeOutputError):
        parse.parse_probe_output(stdout)


def test_probe_in_a_python_without_torch_or_sglang_is_data_not_a_crash(parse, tmp_path):
    import subprocess

    proc = subprocess.run([sys.executable, "-I", "-c", parse.PROBE_SOURCE], capture_output=True, text=True,
                          check=True, cwd=tmp_path)
    facts = parse.parse_probe_output(proc.stdout)
    assert facts["python"]["executable"] == sys.executable
    assert facts["torch"]["version"] is None and "ModuleNotFoundError" in facts["errors"]["torch"]
    assert facts["sglang"]["version"] is None and facts["errors"]["sglang"]
    assert len(facts["fingerprint"]) == 64


# --------------------------------------------------------------------------- the module's main(), for real

def _script(path, text):
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def run_facts(facts_module, capsys, **args):
    with patch_module_args(args):
        with pytest.raises(SystemExit) as exit_info:
            facts_module.main()
    result = json.loads(capsys.readouterr().out)
    assert exit_info.value.code == 0, result
    return result


def test_module_without_nvidia_smi_nvcc_or_python_reports_nulls(facts_module, capsys, tmp_path):
    result = run_facts(facts_module, capsys, python=str(tmp_path / "nope" / "python"), nvidia_smi=str(tmp_path / "nvidia-smi"),
                       nvcc=str(tmp_path / "nvcc"))
    stack = result["ansible_facts"]["sglang_stack"]
    assert stack["driver"]["driver_version"] is None and "not found" in stack["errors"]["nvidia_smi"]
    assert stack["nvcc"] == {"path": None, "release": None, "version": None}
    assert stack["torch"]["version"] is None and "does not exist" in stack["errors"]["python"]


def test_module_with_a_driver_that_does_not_answer(facts_module, capsys, tmp_path):
    down = _script(tmp_path / "nvidia-smi", "#!/bin/sh\necho \"NVIDIA-SMI has failed because it couldn't communicate "
                                            "with the NVIDIA driver.\"\nexit 9\n")
    result = run_facts(facts_module, capsys, python=sys.executable, nvidia_smi=down, nvcc=str(tmp_path / "nvcc"))
    stack = result["ansible_facts"]["sglang_stack"]
    assert stack["driver"]["driver_version"] is None
    assert "rc=9" in stack["errors"]["nvidia_smi"] and "couldn't communicate" in stack["errors"]["nvidia_smi"]


# --------------------------------------------------------------------------- expectations

CANONICAL = {
    "driver_cuda_min": "13.0", "torch_version": "2.9.1", "torch_cuda": "13.0", "sglang_version": "0.5.9",
    "cuda_available": True, "device_count": 8, "compute_capability_min": "12.0", "nccl_version": None,
    "nvcc_release": "13.0", "python_version": None,
}


def stack_of(**sections):
    stack = {
        "driver": {"driver_version": "595.58.03", "cuda_version": "13.2", "gpu_count": 8},
        "nvcc": {"path": "/usr/local/cuda/bin/nvcc", "release": "13.0", "version": "13.0.88"},
        "python": {"executable": "/opt/sglang/venv/bin/python", "version": "3.12.3"},
        "torch": {"version": "2.9.1+cu130", "version_local": "cu130", "cuda": "13.0", "cuda_available": True,
                  "device_count": 8, "compute_capabilities": ["12.0"] * 8},
        "nccl": {"version": "2.27.7", "source": "torch.cuda.nccl.version()"},
        "sglang": {"version": "0.5.9", "location": "/opt/sglang/venv/lib/python3.12/site-packages/sglang"},
        "errors": {},
    }
    for name, values in sections.items():
        stack[name] = dict(stack[name], **values)
    return stack


def test_the_canonical_stack_meets_the_canonical_expectations(expectations):
    assert expectations.sglang_stack_mismatches(stack_of(), CANONICAL) == []


def test_a_real_h200_stack_against_canonical_and_h200_expectations(expectations):
    """The fact gathered on a real H200 machine (torch 2.11.0+cu130, no SGLang)."""
    stack = json.loads(fixture("h200x1-sglang-stack.json"))
    assert expectations.sglang_stack_mismatches(stack, CANONICAL) == [
        "stack_verify_expected_torch_version: expected 2.9.1, found 2.11.0+cu130",
        "stack_verify_expected_sglang_version: expected 0.5.9, found none "
        "(PackageNotFoundError: No package metadata was found for sglang)",
        "stack_verify_expected_device_count: expected 8 CUDA device(s), found 1",
        "stack_verify_expected_compute_capability_min: expected every CUDA device >= 12.0, found 9.0",
    ]
    h200 = dict(CANONICAL, torch_version="2.11.0", sglang_version=None, device_count=1, compute_capability_min="9.0",
                nccl_version="2.28", python_version="3.12")
    assert expectations.sglang_stack_mismatches(stack, h200) == []


def test_every_mismatch_is_listed_naming_its_variable_and_the_value_found(expectations):
    """The CPU-only test node against the canonical expectations: one line per check, all of them."""
    stack = stack_of(
        driver={"driver_version": None, "cuda_version": None, "gpu_count": None},
        torch={"version": "2.13.0+cpu", "version_local": "cpu", "cuda": None, "cuda_available": False,
               "device_count": 0, "compute_capabilities": []},
        nccl={"version": None, "source": None},
        sglang={"version": "0.5.8"},
        errors={"nvidia_smi": "nvidia-smi not found"},
    )
    lines = expectations.sglang_stack_mismatches(stack, dict(CANONICAL, nccl_version="2.27"))
    assert lines == [
        "stack_verify_expected_driver_cuda_min: expected >= 13.0 (CUDA version the driver supports), "
        "found none (nvidia-smi not found)",
        "stack_verify_expected_torch_version: expected 2.9.1, found 2.13.0+cpu",
        "stack_verify_expected_torch_cuda: expected 13.0 (torch.version.cuda, the CUDA torch was built for), "
        "found none (torch 2.13.0+cpu is not a CUDA build)",
        "stack_verify_expected_sglang_version: expected 0.5.9, found 0.5.8",
        "stack_verify_expected_cuda_available: expected true, found false",
        "stack_verify_expected_device_count: expected 8 CUDA device(s), found 0",
        "stack_verify_expected_compute_capability_min: expected every CUDA device >= 12.0, "
        "found no CUDA device visible to torch",
        "stack_verify_expected_nccl_version: expected 2.27, found none",
    ]


def test_the_test_nodes_expectations_pass_on_cpu_torch(expectations):
    """What inventory/testnode sets: the checks that cannot hold without a GPU are skipped (null or "")."""
    stack = stack_of(
        driver={"driver_version": "595.58.03", "cuda_version": None, "gpu_count": 8},
        nvcc={"path": None, "release": None, "version": None},
        torch={"version": "2.13.0+cpu", "version_local": "cpu", "cuda": None, "cuda_available": False,
               "device_count": 0, "compute_capabilities": []},
        nccl={"version": None, "source": None},
        python={"version": "3.11.2"},
    )
    test_node = dict(CANONICAL, driver_cuda_min=None, torch_version="2.13.0", torch_cuda=None,
                     cuda_available=False, device_count=0, compute_capability_min="", python_version="3.11")
    assert expectations.sglang_stack_mismatches(stack, test_node) == []


@pytest.mark.parametrize("expected, found, ok", [
    ("13.0", "13.0", True), ("13.0", "13.2", True), ("13.0", "12.8", False), ("13", "13.0", True), ("13.1", "13", False),
])
def test_driver_cuda_is_a_minimum(expectations, expected, found, ok):
    stack = stack_of(driver={"cuda_version": found})
    assert (expectations.sglang_stack_mismatches(stack, {"driver_cuda_min": expected}) == []) is ok


@pytest.mark.parametrize("torch, want_version, want_cuda, bad", [
    ({"version": "2.9.1+cu130", "version_local": "cu130", "cuda": "13.0"}, "2.9.1", "13.0", []),
    ({"version": "2.9.1", "version_local": None, "cuda": "13.0"}, "2.9.1", "13.0", []),        # no tag, CUDA build
    # The label is only the wheel's name: a build whose torch.version.cuda is not 13.0 (a CPU build
    # relabelled, a stand-in) fails the CUDA check however it is labelled.
    ({"version": "2.9.1+cu130", "version_local": "cu130", "cuda": None}, "2.9.1", "13.0", ["torch_cuda"]),
    ({"version": "2.9.1+cu130", "version_local": "cu130", "cuda": "12.8"}, "2.9.1", "13.0", ["torch_cuda"]),
    # PEP 440 local labels: case and separators do not matter; a wanted label must be there.
    ({"version": "2.9.1+CU130", "version_local": "CU130", "cuda": "13.0"}, "2.9.1+cu130", "13.0", []),
    ({"version": "2.9.1", "version_local": None, "cuda": "13.0"}, "2.9.1+cu130", "13.0", ["torch_version"]),
    ({"version": "2.9.1+cu128", "version_local": "cu128", "cuda": "12.8"}, "2.9.1", "13.0", ["torch_cuda"]),
    ({"version": "2.9.10+cu130", "version_local": "cu130", "cuda": "13.0"}, "2.9.1", "13.0", ["torch_version"]),
    ({"version": "2.9.1+cu128", "version_local": "cu128", "cuda": "12.8"}, "2.9.1+cu130", None, ["torch_version"]),
    ({"version": "2.11.0+cu130", "version_local": "cu130", "cuda": "13.0"}, "2.9", "13.0", ["torch_version"]),
])
def test_torch_version_and_cuda(expectations, torch, want_version, want_cuda, bad):
    lines = expectations.sglang_stack_mismatches(stack_of(torch=torch), {"torch_version": want_version, "torch_cuda": want_cuda})
    assert [line.split(":")[0] for line in lines] == ["stack_verify_expected_" + b for b in bad]


def test_torch_cuda_names_the_variable_and_what_torch_reports(expectations):
    lines = expectations.sglang_stack_mismatches(stack_of(torch={"version": "2.9.1+cu128", "cuda": "12.8"}), {"torch_cuda": "13.0"})
    assert lines == ["stack_verify_expected_torch_cuda: expected 13.0 (torch.version.cuda, the CUDA torch was built "
                     "for), found 12.8 (torch 2.9.1+cu128)"]


@pytest.mark.parametrize("want, found, ok", [
    ("0.5.9", "0.5.9", True), ("0.5.9", "0.5.9+canon.patched", True), ("0.5.9", "0.5.9.0", True),
    ("0.5.9+canon", "0.5.9+CANON", True), ("0.5.9+canon", "0.5.9", False),
    ("0.5.9", "0.5.9.post1", False), ("0.5.9", "0.5.90", False), ("0.5.9", "0.5.10", False), ("0.5.9", "0.5", False),
])
def test_sglang_version_is_pep440_equality(expectations, want, found, ok):
    assert (expectations.sglang_stack_mismatches(stack_of(sglang={"version": found}), {"sglang_version": want}) == []) is ok


def test_compute_capability_minimum_names_the_devices_found(expectations):
    stack = stack_of(torch={"compute_capabilities": ["9.0", "9.0"], "device_count": 2})
    assert expectations.sglang_stack_mismatches(stack, {"compute_capability_min": "12.0"}) == [
        "stack_verify_expected_compute_capability_min: expected every CUDA device >= 12.0, found 9.0, 9.0"]
    assert expectations.sglang_stack_mismatches(stack, {"compute_capability_min": "9.0"}) == []


def test_nvcc_is_checked_only_where_installed(expectations):
    assert expectations.sglang_stack_mismatches(stack_of(nvcc={"path": None, "release": None, "version": None}), {"nvcc_release": "13.0"}) == []
    assert expectations.sglang_stack_mismatches(stack_of(nvcc={"release": "12.8", "version": "12.8.93"}), {"nvcc_release": "13.0"}) == [
        "stack_verify_expected_nvcc_release: expected 13.0 (nvcc at /usr/local/cuda/bin/nvcc), found 12.8.93"]


def test_missing_python_is_named_in_every_check_it_breaks(parse, expectations):
    stack = facts_stack_for_missing_python(parse)
    lines = expectations.sglang_stack_mismatches(stack, {"sglang_version": "0.5.9", "torch_version": "2.9.1"})
    assert lines == [
        "stack_verify_expected_torch_version: expected 2.9.1, found none (/opt/sglang/venv/bin/python does not exist)",
        "stack_verify_expected_sglang_version: expected 0.5.9, found none (/opt/sglang/venv/bin/python does not exist)",
    ]


def facts_stack_for_missing_python(parse, ):
    stack = parse.empty_python_facts("/opt/sglang/venv/bin/python", "/opt/sglang/venv/bin/python does not exist")
    stack["driver"] = {"driver_version": "595.58.03", "cuda_version": "13.2", "gpu_count": 8}
    stack["nvcc"] = {"path": None, "release": None, "version": None}
    return stack


@pytest.mark.parametrize("key, value", [("device_count", "eight"), ("cuda_available", "maybe"),
                                        ("torch_version", "latest"), ("device_count", True)])
def test_a_malformed_expectation_names_its_variable(expectations, key, value):
    with pytest.raises(AnsibleFilterError, match="stack_verify_expected_" + key):
        expectations.sglang_stack_mismatches(stack_of(), {key: value})


def test_unknown_expectation_is_refused(expectations):
    with pytest.raises(AnsibleFilterError, match="unknown expectation"):
        expectations.sglang_stack_mismatches(stack_of(), {"torch_cuda_version": "13.0"})


@pytest.mark.parametrize("value", [None, "", "  "])
def test_null_or_empty_skips(expectations, value):
    assert expectations.sglang_stack_mismatches({}, {key: value for key in expectations.KNOWN_KEYS}) == []


def test_string_numbers_from_templating_are_accepted(expectations):
    # "{{ sglang_server_args.tp_size }}" may arrive as "8"; cuda_available as "true".
    assert expectations.sglang_stack_mismatches(stack_of(), {"device_count": "8", "cuda_available": "true"}) == []
