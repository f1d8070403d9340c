"""sglang_stack_facts and the stack_verify role for real, against the parser venv's CPU torch stack.

The module's main() probes .cache/parser-venv (the session fixture `parser_python`: SGLang 0.5.9 +
CPU torch 2.13.0 from the wheelhouse), and the stack_verify role runs through ansible-runner on
localhost against the nvidia-smi test double. The parsers and the expectation check alone are
tested in tests/unit/test_stack_facts_parse.py.
"""

import json
import os
import sys

import pytest
import yaml
from ansible.module_utils.testing import patch_module_args
from ansible_run import run_playbook
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


# --------------------------------------------------------------------------- the module's main(), on the CPU stack

def _script(path, text):
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def fake_tools(tmp_path):
    """nvidia-smi that answers like the test double (no -q, banner of the H200 node), and nvcc of CUDA 13.0.88."""
    banner = FIXTURES / "h200x2-nvidia-smi.txt"
    nvidia_smi = _script(tmp_path / "nvidia-smi", "#!/bin/sh\n"
                         "if [ $# -gt 0 ]; then echo \"Invalid combination of input arguments.\"; exit 2; fi\n"
                         "cat '%s'\n" % banner)
    nvcc = _script(tmp_path / "nvcc", "#!/bin/sh\ncat '%s'\n" % (FIXTURES / "h200x2-nvcc-version.txt"))
    return nvidia_smi, nvcc


def run_facts(facts_module, capsys, **args):
    with patch_module_args(args):
        with pytest.raises(SystemExit) as exit_info:
            facts_module.main()
    result = json.loads(capsys.readouterr().out)
    assert exit_info.value.code == 0, result
    return result


def test_module_reads_the_cpu_test_stack_and_reuses_it(facts_module, capsys, fake_tools, parser_python):
    nvidia_smi, nvcc = fake_tools
    result = run_facts(facts_module, capsys, python=parser_python, nvidia_smi=nvidia_smi, nvcc=nvcc, _ansible_check_mode=True)
    assert result["changed"] is False and result["reused"] is False
    stack = result["ansible_facts"]["sglang_stack"]
    assert stack["driver"] == {"nvidia_smi": nvidia_smi, "source": "nvidia-smi", "driver_version": "580.159.04",
                               "cuda_version": "13.0", "gpu_count": 2}
    assert stack["nvcc"] == {"path": nvcc, "release": "13.0", "version": "13.0.88"}
    assert stack["torch"]["version"] == "2.13.0+cpu" and stack["torch"]["cuda"] is None
    assert stack["torch"]["cuda_available"] is False and stack["torch"]["device_count"] == 0
    assert stack["sglang"]["version"] == "0.5.9"
    assert stack["sglang"]["location"].endswith(os.path.join("site-packages", "sglang"))
    assert stack["python"]["version"].startswith("3.11.") and stack["python"]["requested"] == parser_python
    assert stack["nccl"]["version"] is None and "nccl" in stack["errors"]  # CPU torch has no NCCL

    # Gathered once per run: the same Python, unchanged, is not probed again...
    again = run_facts(facts_module, capsys, python=parser_python, nvidia_smi=nvidia_smi, nvcc=nvcc, cache=stack)
    assert again["reused"] is True
    assert again["ansible_facts"]["sglang_stack"] == stack
    # ...but a changed fingerprint (an install since) is.
    stale = dict(stack, fingerprint="0" * 64, torch=dict(stack["torch"], version="stale"))
    fresh = run_facts(facts_module, capsys, python=parser_python, nvidia_smi=nvidia_smi, nvcc=nvcc, cache=stale)
    assert fresh["reused"] is False and fresh["ansible_facts"]["sglang_stack"]["torch"]["version"] == "2.13.0+cpu"


# --------------------------------------------------------------------------- the stack_verify role, for real

ROLE_PLAYBOOK = """\
- name: stack_verify against CPU torch and the nvidia-smi double
  hosts: all
  gather_facts: false
  tasks:
    - name: First stack_verify of the run
      ansible.builtin.include_role:
        name: stack_verify
    - name: Second stack_verify of the run (after an install, say)
      ansible.builtin.include_role:
        name: stack_verify
    - name: Later roles see the facts
      ansible.builtin.debug:
        msg: "torch={{ sglang_stack.torch.version }} sglang={{ sglang_stack.sglang.version }}"
"""

# What inventory/testnode sets for a node with CPU torch 2.13.0, no GPU, and the nvidia-smi double's
# rtx-pro-6000-8x capture (whose banner has a driver version but no "CUDA Version").
TEST_NODE_EXPECTATIONS = {
    "stack_verify_expected_driver_cuda_min": None,
    "stack_verify_expected_torch_version": "2.13.0",
    "stack_verify_expected_torch_cuda": None,
    "stack_verify_expected_cuda_available": False,
    "stack_verify_expected_device_count": 0,
    "stack_verify_expected_compute_capability_min": None,
    "stack_verify_expected_nvcc_release": None,
}
DOUBLE_BIN = REPO / "tests" / "double" / "bin"


@pytest.fixture(name="role_run", scope="module")
def fixture_role_run(tmp_path_factory, parser_python):
    tmp_path = tmp_path_factory.mktemp("stack_verify")
    playbook = tmp_path / "stack_verify.yml"
    playbook.write_text(ROLE_PLAYBOOK, encoding="utf-8")
    hosts = {
        "test-node": dict(TEST_NODE_EXPECTATIONS, stack_verify_nvidia_smi=str(DOUBLE_BIN / "nvidia-smi-rtx-pro-6000-8x")),
        "canonical-on-cpu": {"stack_verify_nvidia_smi": str(DOUBLE_BIN / "nvidia-smi-h200-2x-nvlink"),
                             "stack_verify_nvcc": str(tmp_path / "no-nvcc")},
        "driver-down": dict(TEST_NODE_EXPECTATIONS, stack_verify_expected_driver_cuda_min="13.0",
                            stack_verify_nvidia_smi=str(DOUBLE_BIN / "nvidia-smi-driver-down")),
        "no-python": dict(TEST_NODE_EXPECTATIONS, stack_verify_python=str(tmp_path / "venv" / "bin" / "python"),
                          stack_verify_nvidia_smi=str(DOUBLE_BIN / "nvidia-smi-h200-2x-nvlink")),
    }
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"vars": {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "sglang_python": parser_python,
        "sglang_server_args": {"model_path": "/srv/models/target", "tp_size": 8},
    }, "hosts": hosts}}), encoding="utf-8")
    def run(check=False):
        result = run_playbook(playbook, inventory, check=check, testnode_vars=False)
        failed, gathered, later = {}, {}, {}
        for event in result.events:
            data = event.get("event_data", {})
            host, res = data.get("host"), data.get("res", {})
            if event.get("event") == "runner_on_failed":
                failed[host] = str(res.get("msg", ""))
            if event.get("event") == "runner_on_ok" and data.get("task", "").startswith("Read driver, CUDA"):
                gathered.setdefault(host, []).append(res)
            if event.get("event") == "runner_on_ok" and data.get("task") == "Later roles see the facts":
                later[host] = res["msg"]
        return {"rc": result.rc, "stats": result.stats, "failed": failed, "gathered": gathered,
                "later": later, "stdout": result.stdout}

    return run


@pytest.fixture(name="role_outcome", scope="module")
def fixture_role_outcome(role_run):
    return role_run()


def listed(message):
    return [line.strip()[2:] for line in message.splitlines()[1:]]


def test_role_passes_on_the_test_node_and_gathers_once(role_outcome):
    assert "test-node" not in role_outcome["failed"], role_outcome["stdout"][-3000:]
    assert role_outcome["later"]["test-node"] == "torch=2.13.0+cpu sglang=0.5.9"
    first, second = role_outcome["gathered"]["test-node"]
    assert first["reused"] is False and second["reused"] is True
    driver = first["ansible_facts"]["sglang_stack"]["driver"]
    assert driver["driver_version"] == "595.58.03" and driver["cuda_version"] is None  # the double's banner
    assert driver["source"] == "nvidia-smi"  # the double answers no -q


def test_role_changes_nothing(role_outcome):
    assert not role_outcome["stats"].get("changed"), role_outcome["stats"]


def test_role_fails_once_listing_every_mismatch(role_outcome):
    message = role_outcome["failed"]["canonical-on-cpu"]
    assert message.startswith("Stack check failed on canonical-on-cpu: the software stack differs from the "
                              "inventory's expectations in 5 way(s)")
    # The driver check passed on the H200 double's banner (CUDA 13.0 >= 13.0); nvcc is absent, so not checked.
    assert listed(message) == [
        "stack_verify_expected_torch_version: expected 2.9.1, found 2.13.0+cpu",
        "stack_verify_expected_torch_cuda: expected 13.0 (torch.version.cuda, the CUDA torch was built for), "
        "found none (torch 2.13.0+cpu is not a CUDA build)",
        "stack_verify_expected_cuda_available: expected true, found false",
        "stack_verify_expected_device_count: expected 8 CUDA device(s), found 0",
        "stack_verify_expected_compute_capability_min: expected every CUDA device >= 12.0, "
        "found no CUDA device visible to torch",
    ]


def test_role_names_a_driver_that_does_not_answer(role_outcome):
    (line,) = listed(role_outcome["failed"]["driver-down"])
    assert line.startswith("stack_verify_expected_driver_cuda_min: expected >= 13.0 (CUDA version the driver "
                           "supports), found none (nvidia-smi -q: rc=9 NVIDIA-SMI has failed")


def test_role_names_a_missing_python(role_outcome):
    lines = listed(role_outcome["failed"]["no-python"])
    assert "stack_verify_expected_torch_version: expected 2.13.0, found none (%s does not exist)" % (
        role_outcome["gathered"]["no-python"][0]["ansible_facts"]["sglang_stack"]["python"]["requested"]) in lines
    assert any(line.startswith("stack_verify_expected_sglang_version: expected 0.5.9, found none") for line in lines)


def test_role_in_check_mode_reads_and_judges_the_same(role_run):
    outcome = role_run(check=True)
    assert set(outcome["failed"]) == {"canonical-on-cpu", "driver-down", "no-python"}
    assert outcome["later"]["test-node"] == "torch=2.13.0+cpu sglang=0.5.9"
