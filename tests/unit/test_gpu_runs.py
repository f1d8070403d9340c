"""The real-GPU tier's recorded runs (tests/fixtures/gpu-runs/), re-checked without a GPU.

Each folder is what tests/gpu/run-gpu-tier wrote on an H200 device machine (see its README.md):
the gpu_topology and sglang_stack facts, the raw nvidia-smi output the module read, torch's own
report, the NCCL tables and choices, and the failure of a planted wrong expectation. Here they are
parsed again with the project's own code: the module's parser, the NCCL choice rule, the stack
expectation filter and the tier's comparison helper.
"""

import json
import re

import pytest
import yaml
from project_modules import load_at_collection
from project_modules import REPO

RUNS = REPO / "tests" / "fixtures" / "gpu-runs"

# ROUND_RUNS below, a parametrize list, reads the recorded tables with the choice rule's own reader.
nc = load_at_collection("roles/nccl_measure/files/nccl_choice.py")


@pytest.fixture(scope="module")
def checks_mod(project_module):
    return project_module("tests/gpu/gpu_tier_checks.py")


@pytest.fixture(scope="module")
def gpu_topology_parse(project_module):
    return project_module("module_utils/gpu_topology_parse.py", as_name="ansible.module_utils.gpu_topology_parse")


@pytest.fixture(scope="module")
def stack_expectations(project_module):
    return project_module("filter_plugins/stack_expectations.py")

ALL_RUNS = sorted(p for p in RUNS.iterdir() if p.is_dir())
X2_RUNS = [p for p in ALL_RUNS if re.search(r"-h200x2\b", p.name)]
X1_RUNS = [p for p in ALL_RUNS if re.search(r"-h200x1\b", p.name)]
KiB, MiB = 1 << 10, 1 << 20


def gpus_of(run):
    return int(re.search(r"-h200x(\d+)", run.name).group(1))


def read_json(run, name):
    return json.loads((run / name).read_text())


def records(run, label):
    return nc.load_records((run / f"nccl-{label}.jsonl").read_text().splitlines())


def ids(runs):
    return [p.name for p in runs]


def in_rounds(table):
    """Tables written since the probe measures in rounds carry "round" on every run."""
    return all("round" in record for record in table)


def group_names(table):
    return [name for name, _, _ in nc.group_rounds(table)]


def test_the_recorded_runs_exist():
    assert X2_RUNS and X1_RUNS, f"expected h200x2 and h200x1 runs in {RUNS}"


@pytest.mark.parametrize("run", ALL_RUNS, ids=ids(ALL_RUNS))
def test_run_is_complete_documented_and_passed_on_the_device(run):
    for name in (
        "README.md",
        "gpu_topology.json",
        "sglang_stack.json",
        "torch_report.json",
        "nvidia-smi-topo-m.txt",
        "nvidia-smi-query-gpu.csv",
        "nccl-defaults.jsonl",
        "nccl-defaults-choice.json",
        "wrong-expectation.txt",
        "checks.json",
        "summary.txt",
        "run-info.txt",
    ):
        assert (run / name).is_file(), name
    readme = (run / "README.md").read_text()
    assert f"bash tests/gpu/run-gpu-tier --gpus {gpus_of(run)}" in readme
    assert run.name[:10] in readme  # the date
    info = dict(line.split(": ", 1) for line in (run / "run-info.txt").read_text().splitlines() if ": " in line)
    assert info["gpus"] == str(gpus_of(run))
    assert info["main_rc"] == "0" and info["checks_rc"] == "0" and info["wrong_expectation_rc"] != "0"
    failed = [c for c in read_json(run, "checks.json") if not c["ok"]]
    assert not failed


# --------------------------------------------------------------------------- gpu_topology


@pytest.mark.parametrize("run", ALL_RUNS, ids=ids(ALL_RUNS))
def test_gpu_topology_facts_describe_an_h200_node(run):
    topo = read_json(run, "gpu_topology.json")
    gpus = gpus_of(run)
    assert topo["gpu_count"] == gpus == len(topo["gpus"])
    for gpu in topo["gpus"]:
        assert gpu["name"] == "NVIDIA H200"
        assert gpu["compute_capability"] == "9.0"
        assert (gpu["pcie_link_gen_max"], gpu["pcie_link_width_max"]) == (5, 16)
        assert gpu["memory_total_mib"] > 140000
        assert gpu["driver_version"].startswith("580.")
    assert topo["driver_version"].startswith("580.")
    if gpus >= 2:
        assert topo["interconnect"] == "nvlink" and topo["nvlink"] is True
        assert len(topo["links"]) == gpus * (gpus - 1) // 2
        assert {link["link"] for link in topo["links"]} == {"NV18"}
    else:
        assert topo["interconnect"] == "none" and topo["links"] == [] and topo["nvlink"] is False


@pytest.mark.parametrize("run", ALL_RUNS, ids=ids(ALL_RUNS))
def test_raw_nvidia_smi_output_parses_to_the_same_facts(checks_mod, gpu_topology_parse, run):
    topo_m = (run / "nvidia-smi-topo-m.txt").read_text()
    query = (run / "nvidia-smi-query-gpu.csv").read_text()
    assert "\x1b[" in topo_m  # the real header's ANSI underline, which the parser must strip
    parsed = gpu_topology_parse.build_topology(query, topo_m)
    recorded = read_json(run, "gpu_topology.json")
    # Read a moment apart: only the *current* PCIe link (trains down when idle) may differ.
    assert checks_mod.without_volatile(parsed) == checks_mod.without_volatile(recorded)


# --------------------------------------------------------------------------- stack


@pytest.mark.parametrize("run", ALL_RUNS, ids=ids(ALL_RUNS))
def test_stack_facts_agree_with_torch_asked_directly(checks_mod, run):
    stack, report, topo = (read_json(run, n) for n in ("sglang_stack.json", "torch_report.json", "gpu_topology.json"))
    checks = checks_mod.Checks()
    checks_mod.check_stack(checks, stack, report, topo, gpus_of(run))
    assert not checks.failed
    assert stack["torch"]["version"] == report["torch"]["version"] == "2.11.0+cu130"
    assert stack["nccl"]["version"] == report["nccl"]
    assert stack["driver"]["driver_version"] == report["nvml"]["driver_version"] == topo["driver_version"]
    assert stack["sglang"]["version"] is None


@pytest.mark.parametrize("run", ALL_RUNS, ids=ids(ALL_RUNS))
def test_stack_facts_meet_the_device_inventory_and_miss_the_canonical_one(stack_expectations, run):
    group_vars = yaml.safe_load((REPO / "inventory" / "device-h200" / "group_vars" / "sglang_nodes.yml").read_text())
    prefix = "stack_verify_expected_"
    expectations = {key[len(prefix) :]: value for key, value in group_vars.items() if key.startswith(prefix)}
    assert expectations["device_count"] == "{{ gpu_tier_gpu_count | int }}"
    expectations["device_count"] = gpus_of(run)  # what the play templates it to
    stack = read_json(run, "sglang_stack.json")
    assert stack_expectations.sglang_stack_mismatches(stack, expectations) == []
    # The canonical node's expectations (role defaults) must not pass on an H200 with torch 2.11.
    canonical = dict(expectations, torch_version="2.9.1", compute_capability_min="12.0", device_count=8)
    lines = stack_expectations.sglang_stack_mismatches(stack, canonical)
    assert any(line.startswith("stack_verify_expected_torch_version:") for line in lines)
    assert any(line.startswith("stack_verify_expected_compute_capability_min:") for line in lines)
    assert any(line.startswith("stack_verify_expected_device_count:") for line in lines)


# --------------------------------------------------------------------------- wrong expectation


@pytest.mark.parametrize("run", ALL_RUNS, ids=ids(ALL_RUNS))
def test_wrong_gpu_count_failed_with_the_right_message(checks_mod, run):
    text = (run / "wrong-expectation.txt").read_text()
    assert "GPU preflight failed on localhost" in text
    assert (
        f"gpu_preflight_expected_gpu_count: expected {checks_mod.wrong_count(gpus_of(run))} GPUs, found {gpus_of(run)}"
        in text
    )
    assert "in 1 way(s)" in text  # nothing else about the node was wrong
    log = (run / "play-wrong-expectation.log").read_text()
    assert checks_mod.wrong_expectation_message(log) == text.strip()
    assert re.search(r"localhost\s*: ok=\d+ .*failed=1", log)


# --------------------------------------------------------------------------- NCCL


@pytest.mark.parametrize("run", X2_RUNS, ids=ids(X2_RUNS))
def test_recorded_nccl_choice_is_the_rule_applied_to_the_recorded_table(run):
    for label in ("defaults", "p2p-off"):
        table = records(run, label)
        recorded = read_json(run, f"nccl-{label}-choice.json")
        again = nc.choose(table)
        assert again["sizes"] == [16 * KiB * 2**i for i in range(9)]  # hidden 8192 x batch 1..256 x 2 B
        if in_rounds(table):
            assert (again["chosen"], again["settings"]) == (recorded["chosen"], recorded["settings"])
            assert again["rule"] == recorded["rule"] == nc.RULE
        else:
            # Recorded under the one-run rule. The rule of rounds, given one round, is that rule
            # (same per-size test, same gain threshold), except that it never leaves NCCL's
            # defaults on one measurement of them.
            old = nc.choose(table, min_default_rounds=1)
            assert (old["chosen"], old["settings"]) == (recorded["chosen"], recorded["settings"])
            assert again["chosen"] == "defaults" and again["settings"] == {} and again["defaults_rounds"] == 1
        for record in table:
            assert record["world"] == 2 and record["correct"] is True and record["nccl_version"] == "2.28.9"
            assert record["env"]["NCCL_NVLS_ENABLE"] == "0" and record["env"]["NCCL_CONF_FILE"] == "/dev/null"
            assert record["injected_env"] == {}
    assert group_names(records(run, "defaults")) == ["defaults", "seed-pcie", "proto-ll"]


def test_the_two_one_round_runs_together_keep_nccl_defaults():
    """2026-11-29-h200x2 chose seed-pcie (20.3% faster), -run2 two minutes later kept the defaults.
    Read as two rounds of one measurement, the defaults' geometric mean moved 11.3% between launches
    (45.6 -> 36.4 us), more than seed-pcie's 5.1% gain over their median: the rule keeps the defaults."""
    run1, run2 = (RUNS / name for name in ("2026-11-29-h200x2", "2026-11-29-h200x2-run2"))
    assert read_json(run1, "nccl-defaults-choice.json")["chosen"] == "seed-pcie"
    assert read_json(run2, "nccl-defaults-choice.json")["chosen"] == "defaults"
    choice = nc.choose(records(run1, "defaults") + records(run2, "defaults"))
    assert choice["defaults_rounds"] == 2
    assert choice["chosen"] == "defaults" and choice["settings"] == {}
    rows = {row["candidate"]: row for row in choice["candidates"]}
    assert rows["defaults"]["round_geomeans_us"] == [pytest.approx(45.6, abs=0.05), pytest.approx(36.4, abs=0.05)]
    assert choice["defaults_geomean_noise"] == pytest.approx(0.113, abs=0.001)
    assert 1 - rows["seed-pcie"]["vs_defaults"] == pytest.approx(0.051, abs=0.001)
    assert "'seed-pcie' is only 5.1% faster" in choice["decision"]
    assert "11.3% (the defaults' geometric mean moved that much between rounds)" in choice["decision"]
    # proto-ll: at 16 KiB its median (40.1 us) is above the defaults' best launch (26.0 us) beyond noise
    assert not rows["proto-ll"]["eligible"] and "16384 B: 40.1 us vs 26.0 us" in rows["proto-ll"]["why"]
    # the other order of the same evidence, and the p2p-off runs' own defaults as two more rounds
    assert nc.choose(records(run2, "defaults") + records(run1, "defaults"))["chosen"] == "defaults"
    four = [
        r
        for run in (run1, run2)
        for label in ("defaults", "p2p-off")
        for r in records(run, label)
        if label == "defaults" or not nc.settings_of(r)
    ]
    assert nc.choose(four)["defaults_rounds"] == 4 and nc.choose(four)["chosen"] == "defaults"


@pytest.mark.parametrize("run", X2_RUNS, ids=ids(X2_RUNS))
def test_p2p_off_run_carried_the_variable_and_the_rebased_choice_holds(checks_mod, run):
    table = records(run, "p2p-off")
    assert group_names(table) == ["defaults", "p2p-off", "p2p-off+seed-pcie", "p2p-off+proto-ll"]
    for record in table:
        if nc.settings_of(record):
            assert record["env"]["NCCL_P2P_DISABLE"] == "1"
        else:
            assert "NCCL_P2P_DISABLE" not in record["env"]
    # It took effect: through host memory, 4 MiB takes far longer than over NVLink in the same run.
    us = checks_mod.latency_table(table)
    assert us["p2p-off"][4 * MiB] > 2 * us["defaults"][4 * MiB]
    # Against NCCL's true defaults no p2p-off candidate can win.
    assert read_json(run, "nccl-p2p-off-choice.json")["chosen"] == "defaults"
    recorded = read_json(run, "nccl-p2p-off-rebased-choice.json")
    again = checks_mod.rebased_choice(table)
    if not in_rounds(table):  # recorded under the one-run rule (see above)
        again = nc.choose(checks_mod.rebase_p2p(table), min_default_rounds=1)
    assert (again["chosen"], again["settings"]) == (recorded["chosen"], recorded["settings"])
    assert recorded["baseline_env"] == {"NCCL_P2P_DISABLE": "1"}
    # rows as the rule names them now (run 3's file, written just before, calls its p2p-off baseline "defaults")
    rows = {row["candidate"]: row for row in checks_mod.rebased_choice(table)["candidates"]}
    assert rows["p2p-off"]["baseline"] is True and rows["p2p-off+seed-pcie"]["settings"] == {
        "NCCL_PROTO": "LL",
        "NCCL_ALGO": "Ring",
    }


@pytest.mark.parametrize("run", X1_RUNS, ids=ids(X1_RUNS))
def test_one_gpu_measures_nothing_and_says_so(run):
    choice = read_json(run, "nccl-defaults-choice.json")
    assert choice["chosen"] is None and choice["settings"] is None and choice["world"] == 1
    assert "nothing was measured" in choice["skipped"]
    assert records(run, "defaults") == []
    assert not (run / "nccl-p2p-off.jsonl").exists()


def test_rebase_refuses_a_candidate_without_p2p_off(checks_mod):
    table = [
        {"candidate": "defaults", "settings": {}, "us_per_allreduce": {"16384": 10.0}, "correct": True},
        {"candidate": "ll", "settings": {"NCCL_PROTO": "LL"}, "us_per_allreduce": {"16384": 9.0}, "correct": True},
    ]
    with pytest.raises(ValueError, match="does not carry"):
        checks_mod.rebase_p2p(table)


# --------------------------------------------------------------------------- NCCL in rounds (run 3 on)

ROUND_RUNS = [p for p in X2_RUNS if in_rounds(records(p, "defaults"))]


def test_a_run_in_rounds_is_recorded():
    assert [p.name for p in ROUND_RUNS] == ["2026-11-29-h200x2-run3"]


@pytest.mark.parametrize("run", ROUND_RUNS, ids=ids(ROUND_RUNS))
def test_defaults_ran_before_between_and_after_the_candidates_rounds(checks_mod, run):
    for label, rounds, candidates in (
        ("defaults", 3, ["seed-pcie", "proto-ll"]),
        ("p2p-off", 2, ["p2p-off", "p2p-off+seed-pcie", "p2p-off+proto-ll"]),
    ):
        table = records(run, label)
        expected = []
        for round_no in range(1, rounds + 1):
            expected += [("defaults", round_no)] + [(name, round_no) for name in candidates]
        expected.append(("defaults", rounds + 1))
        assert [(r["candidate"], r["round"]) for r in table] == expected
        assert [r["seq"] for r in table] == list(range(1, len(expected) + 1))
        assert checks_mod.interleaved_rounds([r["candidate"] for r in table])
        for record in table:  # every repetition kept, each a fresh process group on both GPUs
            assert all(len(times) == record["reps"] == 7 for times in record["times_us"].values())
            assert record["world"] == 2 and record["correct"] is True and record["elapsed_s"] < 15
        choice = read_json(run, f"nccl-{label}-choice.json")
        assert choice["probe_rounds"] == rounds and choice["defaults_rounds"] == rounds + 1
        again = nc.choose(table)
        assert choice["rounds_md"] == nc.rounds_table(again) and choice["table_md"] == nc.markdown_table(again)


def test_run3_keeps_nccl_defaults_and_says_why():
    run = RUNS / "2026-11-29-h200x2-run3"
    choice = read_json(run, "nccl-defaults-choice.json")
    assert (choice["chosen"], choice["settings"]) == ("defaults", {})
    assert choice["decision"] == "no candidate was eligible: keep NCCL's defaults"
    rows = {row["candidate"]: row for row in choice["candidates"]}
    base = rows["defaults"]
    # the first launch of the defaults was fast, the three later ones were not
    assert [round(g, 1) for g in base["round_geomeans_us"]] == [33.9, 42.4, 42.0, 43.8]
    assert round(base["geomean_us"], 1) == 41.7 and base["best_us"]["16384"] == pytest.approx(31.9, abs=0.05)
    assert choice["defaults_geomean_noise"] == pytest.approx(0.117, abs=0.001) == choice["needed_gain"]
    for name, size_text in (
        ("seed-pcie", "16384 B: 43.1 us vs 31.9 us (+35%, noise 32%, limit 42.1 us)"),
        ("proto-ll", "16384 B: 45.1 us vs 31.9 us (+41%, noise 33%, limit 42.5 us)"),
    ):
        row = rows[name]
        assert row["rounds"] == 3 and not row["eligible"] and size_text in row["why"]
        assert row["vs_defaults"] > 1.0  # not faster in geometric mean either
    readme = (run / "README.md").read_text()
    assert choice["rounds_md"] in readme and choice["table_md"] in readme
    # with P2P off the rule keeps NCCL's defaults against both baselines, as in runs 1 and 2
    assert read_json(run, "nccl-p2p-off-choice.json")["chosen"] == "defaults"
    assert read_json(run, "nccl-p2p-off-rebased-choice.json")["chosen"] == "defaults"


# --------------------------------------------------------------------------- the tier's size check


def test_the_tier_expects_the_sizes_the_device_inventory_and_its_gpus_make(checks_mod):
    """tests/gpu/gpu_tier_checks.py recomputes the plan from the recorded gpu_topology facts: on H200s
    (141 GB: SGLang's 8192-token chunk) with the device inventory's EAGLE3 args and hidden 8192."""
    topo = read_json(X2_RUNS[0], "gpu_topology.json")
    phases = checks_mod.expected_phases(topo)
    assert phases == {
        "decode": [t * 16 * KiB for t in (1, 2, 4, 8, 16, 32, 64, 128, 192)],
        "prefill": [16 * MiB, 32 * MiB, 64 * MiB, 128 * MiB],
    }
    sizes = phases["decode"] + phases["prefill"]
    run = {"us_per_allreduce": {str(s): 1.0 for s in sizes}, "phases": phases}
    checks = checks_mod.Checks()
    checks_mod.check_phases(checks, [run, run], {"phases": phases}, "defaults", phases)
    assert not checks.failed
    # a probe that got decode sizes only (the role before prefill sizes) fails both checks
    decode_only = {"decode": phases["decode"], "prefill": []}
    short = {"us_per_allreduce": {str(s): 1.0 for s in phases["decode"]}, "phases": decode_only}
    checks = checks_mod.Checks()
    checks_mod.check_phases(checks, [short], {"phases": decode_only}, "defaults", phases)
    assert [c["check"] for c in checks.failed] == [
        "nccl defaults: decode and prefill sizes follow the server arguments and GPU memory",
        "nccl defaults: every run measured every decode and prefill size",
    ]
