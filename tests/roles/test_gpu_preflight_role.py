"""The gpu_preflight role for real: ansible-playbook on localhost against the nvidia-smi test double.

One run covers many "nodes": each inventory host is localhost (connection local) with its own
gpu_preflight_nvidia_smi pointing at tests/double/bin/nvidia-smi-<capture>, so the same play shows
that matching hosts pass, mismatching hosts fail with one message naming every mismatch, and one
host's failure does not stop another.
"""

import sys

from ansible_run import run_playbook
import pytest
import yaml
from project_modules import REPO

DOUBLE_BIN = REPO / "tests" / "double" / "bin"

PLAYBOOK = """\
- name: GPU preflight against the nvidia-smi double
  hosts: all
  gather_facts: false
  roles:
    - role: gpu_preflight
  post_tasks:
    - name: Later roles see the topology facts
      ansible.builtin.debug:
        msg: "interconnect={{ gpu_topology.interconnect }} gpus={{ gpu_topology.gpu_count }}"
      tags: [gpu_preflight]
"""

CANONICAL_ARGS = {"model_path": "/srv/models/target", "tp_size": 8}

HOSTS = {
    "canonical": {"capture": "rtx-pro-6000-8x"},
    "missing-gpu": {"capture": "rtx-pro-6000-7x"},
    "gen4-x8": {"capture": "rtx-pro-6000-8x-gen4x8"},
    "nvswitch": {"capture": "h200-8x-nvswitch"},
    "h200-pair": {"capture": "h200-2x-nvlink"},
    "driver-down": {"capture": "driver-down"},
    # The inventory may describe other hardware: an NVLink pair passes when it is what is expected.
    "h200-pair-expected": {
        "capture": "h200-2x-nvlink",
        "gpu_preflight_expected_gpu_count": 2,
        "gpu_preflight_gpu_name_pattern": "^NVIDIA H200$",
        "gpu_preflight_min_compute_capability": "9.0",
        "gpu_preflight_expected_interconnect": "nvlink",
        "gpu_preflight_driver_version_min": "580",
        "gpu_preflight_driver_version_max": "580.159",
        "sglang_server_args": {"model_path": "/srv/models/target", "tp_size": 2},
    },
    "tp-3": {"capture": "rtx-pro-6000-8x", "sglang_server_args": {"model_path": "/srv/models/target", "tp_size": 3}},
    "tp-4": {"capture": "rtx-pro-6000-8x", "sglang_server_args": {"model_path": "/srv/models/target", "tp_size": 4}},
    "tp-4-idle-allowed": {"capture": "rtx-pro-6000-8x", "sglang_allow_idle_gpus": True,
                          "sglang_server_args": {"model_path": "/srv/models/target", "tp_size": 4}},
    "driver-newer-than-max": {"capture": "rtx-pro-6000-8x", "gpu_preflight_driver_version_max": "595.50"},
    "driver-older-than-min": {"capture": "rtx-pro-6000-8x", "gpu_preflight_driver_version_min": "595.100"},
    "no-driver-bounds": {
        "capture": "rtx-pro-6000-8x",
        "gpu_preflight_driver_version_min": "",
        "gpu_preflight_driver_version_max": "",
    },
}


def inventory(tmp_path):
    hosts = {}
    for host, settings in HOSTS.items():
        values = {key: value for key, value in settings.items() if key != "capture"}
        values["gpu_preflight_nvidia_smi"] = str(DOUBLE_BIN / f"nvidia-smi-{settings['capture']}")
        hosts[host] = values
    data = {
        "all": {
            "vars": {
                "ansible_connection": "local",
                "ansible_python_interpreter": sys.executable,
                "sglang_server_args": CANONICAL_ARGS,
            },
            "hosts": hosts,
        }
    }
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


class Outcome:
    """Per-host view of a run: failure messages, the post task's output, stats."""

    def __init__(self, result):
        self.result = result
        self.stdout = result.stdout
        self.failed = {}
        self.later = {}
        for event in result.events:
            data = event.get("event_data", {})
            host = data.get("host")
            if event.get("event") == "runner_on_failed":
                self.failed[host] = str(data.get("res", {}).get("msg", ""))
            if event.get("event") == "runner_on_ok" and data.get("task") == "Later roles see the topology facts":
                self.later[host] = data["res"]["msg"]

    def message(self, host):
        assert host in self.failed, f"{host} did not fail:\n{self.stdout[-4000:]}"
        return self.failed[host]

    def mismatches(self, host):
        """The listed mismatches of a failed host, one per line, without the headline."""
        return [line.strip()[2:] for line in self.message(host).splitlines()[1:]]


@pytest.fixture(name="run", scope="module")
def fixture_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("gpu_preflight")
    playbook = tmp_path / "preflight.yml"
    playbook.write_text(PLAYBOOK, encoding="utf-8")
    path = inventory(tmp_path)

    def run(check=False, **kwargs):
        # one fork per host: every host of the table runs at once
        return Outcome(run_playbook(playbook, path, check=check, testnode_vars=False,
                                    envvars={"ANSIBLE_FORKS": "20"}, **kwargs))

    return run


@pytest.fixture(name="outcome", scope="module")
def fixture_outcome(run):
    return run()


def test_canonical_node_passes_and_leaves_the_facts(outcome):
    assert "canonical" not in outcome.failed
    assert outcome.later["canonical"] == "interconnect=pcie gpus=8"


def test_nothing_changes_on_any_host(outcome):
    assert outcome.result.rc != 0  # some hosts fail
    assert set(outcome.result.stats["ok"]) == set(HOSTS)
    assert not outcome.result.stats.get("changed"), outcome.result.stats["changed"]


def test_only_the_mismatching_hosts_fail(outcome):
    assert set(outcome.failed) == {
        "missing-gpu",
        "gen4-x8",
        "nvswitch",
        "h200-pair",
        "driver-down",
        "tp-3",
        "tp-4",
        "driver-newer-than-max",
        "driver-older-than-min",
    }
    assert set(outcome.later) == {"canonical", "h200-pair-expected", "tp-4-idle-allowed", "no-driver-bounds"}


def test_missing_gpu(outcome):
    assert outcome.message("missing-gpu").startswith(
        "GPU preflight failed on missing-gpu: the node differs from the inventory's expectations in 2 way(s); "
        "nothing was changed:"
    )
    assert outcome.mismatches("missing-gpu") == [
        "gpu_preflight_expected_gpu_count: expected 8 GPUs, found 7",
        "sglang_server_args.tp_size: tp_size 8 = 8 GPU(s) per node, but the node has 7 GPU(s)",
    ]


def test_card_trained_down_to_gen4_x8(outcome):
    assert outcome.mismatches("gen4-x8") == [
        "gpu_preflight_expected_pcie_gen: expected every GPU's max PCIe link at Gen5 or better, "
        "found GPU 5 (00000000:85:00.0) at Gen4",
        "gpu_preflight_expected_pcie_width: expected every GPU's max PCIe link at x16 or wider, "
        "found GPU 5 (00000000:85:00.0) at x8",
    ]


def test_idle_current_link_at_gen1_is_not_a_mismatch(outcome):
    # The canonical capture idles at Gen1 (current) but Gen5 max: judged by max, it passes.
    assert "canonical" not in outcome.failed


def test_nvlink_where_pcie_is_expected(outcome):
    assert outcome.mismatches("nvswitch") == [
        "gpu_preflight_gpu_name_pattern: expected GPU names matching 'RTX PRO 6000 Blackwell', "
        "found 'NVIDIA H200' on GPU 0, 1, 2, 3, 4, 5, 6, 7",
        "gpu_preflight_min_compute_capability: expected compute capability 12.0 or higher on every GPU, "
        "found 9.0 on GPU 0, 1, 2, 3, 4, 5, 6, 7",
        "gpu_preflight_expected_interconnect: expected pcie, found nvlink (NVLink joins 28 of 28 GPU pairs: NV18)",
        "gpu_preflight_driver_version_min: expected NVIDIA driver 595.58.03 or newer, found 580.159.04",
    ]


def test_every_mismatch_in_one_message(outcome):
    assert outcome.mismatches("h200-pair") == [
        "gpu_preflight_expected_gpu_count: expected 8 GPUs, found 2",
        "sglang_server_args.tp_size: tp_size 8 = 8 GPU(s) per node, but the node has 2 GPU(s)",
        "gpu_preflight_gpu_name_pattern: expected GPU names matching 'RTX PRO 6000 Blackwell', "
        "found 'NVIDIA H200' on GPU 0, 1",
        "gpu_preflight_min_compute_capability: expected compute capability 12.0 or higher on every GPU, "
        "found 9.0 on GPU 0, 1",
        "gpu_preflight_expected_interconnect: expected pcie, found nvlink (NVLink joins 1 of 1 GPU pairs: NV18)",
        "gpu_preflight_driver_version_min: expected NVIDIA driver 595.58.03 or newer, found 580.159.04",
    ]


def test_other_hardware_passes_when_the_inventory_expects_it(outcome):
    assert outcome.later["h200-pair-expected"] == "interconnect=nvlink gpus=2"


def test_the_parallel_sizes_must_use_every_gpu_unless_idle_ones_are_allowed(outcome):
    # The server flag check's rule (module_utils/sglang_args_probe.py), here before anything changes.
    idle = "would sit idle; set sglang_allow_idle_gpus: true to deploy it anyway"
    assert outcome.mismatches("tp-3") == [f"sglang_server_args.tp_size: tp_size 3 = 3 GPU(s) per node, so 5 of the "
                                          f"node's 8 GPU(s) {idle}"]
    assert outcome.mismatches("tp-4") == [f"sglang_server_args.tp_size: tp_size 4 = 4 GPU(s) per node, so 4 of the "
                                          f"node's 8 GPU(s) {idle}"]
    assert "tp-4-idle-allowed" not in outcome.failed


def test_driver_range_is_numeric_per_component(outcome):
    # 595.58.03 vs max 595.50: 58 > 50 (a string comparison would say the same, so also check min).
    assert outcome.mismatches("driver-newer-than-max") == [
        "gpu_preflight_driver_version_max: expected NVIDIA driver 595.50 or older (compared on the components given), "
        "found 595.58.03",
    ]
    # 595.58.03 vs min 595.100: 58 < 100 numerically, though "58" > "100" as strings.
    assert outcome.mismatches("driver-older-than-min") == [
        "gpu_preflight_driver_version_min: expected NVIDIA driver 595.100 or newer, found 595.58.03",
    ]
    assert "no-driver-bounds" not in outcome.failed


def test_driver_not_answering_fails_before_any_comparison(outcome):
    message = outcome.message("driver-down")
    assert "exited 9 (the NVIDIA driver is not loaded or does not answer)" in message
    assert "couldn't communicate with the NVIDIA driver" in message


def test_check_mode_reads_and_judges_the_same(run):
    checked = run(check=True, limit="canonical,missing-gpu,gen4-x8")
    assert set(checked.failed) == {"missing-gpu", "gen4-x8"}
    assert checked.later == {"canonical": "interconnect=pcie gpus=8"}
    assert checked.mismatches("missing-gpu")[0] == "gpu_preflight_expected_gpu_count: expected 8 GPUs, found 7"


def test_runs_alone_by_tag(run):
    tagged = run(tags=["gpu_preflight"], limit="canonical,nvswitch")
    assert set(tagged.failed) == {"nvswitch"}
    assert "gpu_preflight_expected_interconnect: expected pcie, found nvlink" in tagged.message("nvswitch")
    assert tagged.later == {"canonical": "interconnect=pcie gpus=8"}
