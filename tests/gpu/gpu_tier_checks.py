#!/usr/bin/env python3
"""Checks of the real-GPU tier (tests/gpu/run-gpu-tier), stdlib only except `torch-report`.

  gpu_tier_checks.py torch-report OUT.json        ask torch (and NVML) directly, in their own process
  gpu_tier_checks.py rebase-p2p TABLE.jsonl OUT.json
                                                  the choice rule with "p2p-off" as the baseline
  gpu_tier_checks.py check RESULTS_DIR --gpus N [--main-rc RC] [--wrong-rc RC --wrong-log LOG]
                                                  compare everything, write checks.json and summary.txt

The functions are also imported by tests/unit/test_gpu_runs.py, which re-checks the recorded runs
under tests/fixtures/gpu-runs/ without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "roles", "nccl_measure", "files"))
sys.path.insert(0, os.path.join(REPO, "filter_plugins"))

# What the device's nodes must be (the inventory inventory/device-h200 says the same). The GPU
# name is the device's H200 unless run-gpu-tier is told another (GPU_TIER_GPU_NAME_PATTERN: the
# device lends H100s too, which differ from H200s here only in name and memory).
NAME_PATTERN = "H200"
COMPUTE_CAPABILITY = "9.0"
PCIE_GEN_MAX = 5
PCIE_WIDTH_MAX = 16
# The wrong expectation the tier plants (-e gpu_preflight_expected_gpu_count=8, 16 on an 8-GPU node).


def wrong_count(gpus):
    return 16 if gpus == 8 else 8


P2P_OFF = {"NCCL_P2P_DISABLE": "1"}
# What inventory/device-h200 gives nccl_measure: the server arguments the message sizes follow
# (EAGLE3 with 4 draft tokens, no max_running_requests, no chunked_prefill_size) and, with no model
# on the device, hidden size 8192. The sizes the probe got must be what these and the GPUs' memory
# make (decode 1 .. 192 tokens, prefill 1024 .. 8192 tokens on 141 GB H200s).
DEVICE_SERVER_ARGS = {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 3, "speculative_num_draft_tokens": 4}
DEVICE_HIDDEN_SIZE = 8192
# Fields of the gpu_topology facts that change with load (an idle GPU trains its link down), so two
# readings taken at different moments may differ there and nowhere else.
VOLATILE_GPU_FIELDS = ("pcie_link_gen_current", "pcie_link_width_current")


# --------------------------------------------------------------------------- torch, asked directly


def torch_report():
    """What torch, CUDA, NCCL and NVML say in this process (not through Ansible)."""
    import torch

    report = {
        "python": {"executable": sys.executable, "version": platform.python_version()},
        "torch": {
            "version": torch.__version__,
            "cuda": torch.version.cuda,
            "cuda_available": torch.cuda.is_available(),
            "device_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
            "devices": [],
        },
        "nccl": None,
        "nvml": None,
    }
    for index in range(report["torch"]["device_count"]):
        major, minor = torch.cuda.get_device_capability(index)
        report["torch"]["devices"].append(
            {"index": index, "name": torch.cuda.get_device_name(index), "compute_capability": f"{major}.{minor}"}
        )
    try:
        version = torch.cuda.nccl.version()
        report["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    except Exception as exc:  # pylint: disable=broad-except
        report["nccl_error"] = f"{type(exc).__name__}: {exc}"
    try:
        import pynvml

        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        count = pynvml.nvmlDeviceGetCount()
        names = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)]
        report["nvml"] = {
            "driver_version": driver.decode() if isinstance(driver, bytes) else driver,
            "cuda_driver_version": f"{cuda // 1000}.{cuda % 1000 // 10}",
            "gpu_count": count,
            "names": [n.decode() if isinstance(n, bytes) else n for n in names],
        }
        pynvml.nvmlShutdown()
    except Exception as exc:  # pylint: disable=broad-except
        report["nvml_error"] = f"{type(exc).__name__}: {exc}"
    return report


# --------------------------------------------------------------------------- NCCL tables


def load_jsonl(path):
    import nccl_choice

    with open(path, encoding="utf-8") as fh:
        return nccl_choice.load_records(fh)


def rebase_p2p(records):
    """Records of a run whose candidates all carry NCCL_P2P_DISABLE=1, with that variable taken out
    of each candidate's settings, so that "p2p-off" alone is the baseline of the choice rule (the
    probe always measures NCCL's true defaults first; that run is dropped here)."""
    import nccl_choice

    out = []
    for record in records:
        settings = nccl_choice.settings_of(record)
        if not settings:
            continue  # NCCL's defaults with P2P on: not this comparison's baseline
        if any(settings.get(k) != v for k, v in P2P_OFF.items()):
            raise ValueError(f"candidate {nccl_choice.name_of(record)} does not carry {P2P_OFF}")
        rebased = dict(record)
        rebased["settings"] = {k: v for k, v in settings.items() if k not in P2P_OFF}
        out.append(rebased)
    return out


def rebased_choice(records):
    import nccl_choice

    choice = nccl_choice.choose(rebase_p2p(records))
    choice["table_md"] = nccl_choice.markdown_table(choice)
    choice["rounds_md"] = nccl_choice.rounds_table(choice)
    choice["baseline_env"] = dict(P2P_OFF)
    choice["note"] = (
        "every run had NCCL_P2P_DISABLE=1 (a stand-in for a node without P2P); the rule's baseline is "
        "p2p-off alone and the settings are what each candidate adds to it"
    )
    return choice


def latency_table(records):
    """{candidate: {size: median us over its rounds}} of the runs that measured."""
    import nccl_choice

    out = {}
    for name, _, runs in nccl_choice.group_rounds(records):
        ran = [r for r in runs if "us_per_allreduce" in r]
        if ran:
            out[name] = nccl_choice.median_series(ran)
    return out


# --------------------------------------------------------------------------- checks


def topology_from_captures(query_csv, topo_text):
    """The gpu_topology facts that the module's parser makes of the raw nvidia-smi captures."""
    sys.path.insert(0, os.path.join(REPO, "module_utils"))
    import gpu_topology_parse  # pylint: disable=import-outside-toplevel

    return gpu_topology_parse.build_topology(query_csv, topo_text)


def without_volatile(topology):
    out = json.loads(json.dumps(topology))
    for gpu in out.get("gpus", []):
        for field in VOLATILE_GPU_FIELDS:
            gpu.pop(field, None)
    return out


def wrong_expectation_message(log_text):
    """The preflight failure message in an ansible-playbook log (yaml result format), or ''."""
    lines = log_text.splitlines()
    for number, line in enumerate(lines):
        if "GPU preflight failed on" in line:
            block = [line.strip()]
            for following in lines[number + 1 :]:
                if not following.strip() or not following.startswith(" "):
                    break
                block.append(following.strip())
            return "\n".join(block)
    return ""


class Checks:
    def __init__(self):
        self.items = []

    def add(self, name, ok, expected=None, found=None):
        self.items.append({"check": name, "ok": bool(ok), "expected": expected, "found": found})

    def equal(self, name, expected, found):
        self.add(name, expected == found, expected, found)

    @property
    def failed(self):
        return [c for c in self.items if not c["ok"]]


def check_topology(checks, topo, gpus, name_pattern=NAME_PATTERN):
    checks.equal("gpu_topology: GPU count", gpus, topo.get("gpu_count"))
    names = [g.get("name") for g in topo.get("gpus", [])]
    checks.add(
        f"gpu_topology: every name matches {name_pattern!r}",
        names and all(re.search(name_pattern, n or "") for n in names),
        name_pattern,
        names,
    )
    ccs = [g.get("compute_capability") for g in topo.get("gpus", [])]
    checks.add(
        "gpu_topology: compute capability 9.0", ccs and set(ccs) == {COMPUTE_CAPABILITY}, COMPUTE_CAPABILITY, ccs
    )
    gens = [(g.get("pcie_link_gen_max"), g.get("pcie_link_width_max")) for g in topo.get("gpus", [])]
    checks.add(
        "gpu_topology: PCIe max Gen5 x16",
        gens and set(gens) == {(PCIE_GEN_MAX, PCIE_WIDTH_MAX)},
        [PCIE_GEN_MAX, PCIE_WIDTH_MAX],
        gens,
    )
    links = sorted({link["link"] for link in topo.get("links", [])})
    if gpus >= 2:
        checks.equal("gpu_topology: interconnect", "nvlink", topo.get("interconnect"))
        checks.add(
            "gpu_topology: every GPU pair is NV#",
            links
            and all(re.fullmatch(r"NV\d+", l) for l in links)
            and len(topo.get("links", [])) == gpus * (gpus - 1) // 2,
            "NV# on all pairs",
            links,
        )
    else:
        checks.equal("gpu_topology: interconnect", "none", topo.get("interconnect"))


def check_stack(checks, stack, report, topo, gpus):
    torch_r = report["torch"]
    torch_f = stack.get("torch") or {}
    checks.equal("stack vs torch: torch.__version__", torch_r["version"], torch_f.get("version"))
    checks.equal("stack vs torch: torch.version.cuda", torch_r["cuda"], torch_f.get("cuda"))
    checks.equal("stack vs torch: cuda available", torch_r["cuda_available"], torch_f.get("cuda_available"))
    checks.equal("stack vs torch: device count", torch_r["device_count"], torch_f.get("device_count"))
    checks.equal("torch: device count is the GPU count", gpus, torch_r["device_count"])
    checks.equal(
        "stack vs torch: compute capabilities",
        [d["compute_capability"] for d in torch_r["devices"]],
        torch_f.get("compute_capabilities"),
    )
    checks.equal("stack vs torch: NCCL version", report.get("nccl"), (stack.get("nccl") or {}).get("version"))
    checks.equal("stack vs python: version", report["python"]["version"], (stack.get("python") or {}).get("version"))
    checks.equal("stack: sglang not installed on the device", None, (stack.get("sglang") or {}).get("version"))
    checks.equal(
        "torch vs gpu_topology: GPU names (sorted)",
        sorted(d["name"] for d in torch_r["devices"]),
        sorted(g.get("name") for g in topo.get("gpus", [])),
    )
    checks.equal(
        "torch vs gpu_topology: compute capabilities (sorted)",
        sorted(d["compute_capability"] for d in torch_r["devices"]),
        sorted(g.get("compute_capability") for g in topo.get("gpus", [])),
    )
    driver = stack.get("driver") or {}
    nvml = report.get("nvml")
    if nvml:
        checks.equal("stack vs NVML: driver version", nvml["driver_version"], driver.get("driver_version"))
        checks.equal("stack vs NVML: driver's CUDA version", nvml["cuda_driver_version"], driver.get("cuda_version"))
        checks.equal("stack vs NVML: GPU count", nvml["gpu_count"], driver.get("gpu_count"))
    else:
        checks.add("NVML readable (nvidia-ml-py)", False, "pynvml", report.get("nvml_error"))
    checks.equal("stack vs gpu_topology: driver version", topo.get("driver_version"), driver.get("driver_version"))
    nvcc = stack.get("nvcc") or {}
    if nvcc.get("release"):
        checks.equal("stack: nvcc release is torch's CUDA", torch_r["cuda"], nvcc["release"])


def interleaved_rounds(names):
    """True for defaults, c1..cn, defaults, c1..cn, ..., defaults: 2+ defaults runs, the same candidates
    in every round between them."""
    rounds, current = [], None
    for name in names:
        if name == "defaults":
            if current is not None:
                rounds.append(current)
            current = []
        elif current is None:
            return False
        else:
            current.append(name)
    return bool(rounds) and current == [] and all(r == rounds[0] and r for r in rounds)


def expected_phases(topo):
    """The decode and prefill sizes nccl_measure must derive on this node (from its gpu_topology facts)."""
    import nccl_message_sizes

    memory = min((g["memory_total_mib"] for g in topo.get("gpus", []) if g.get("memory_total_mib")), default=None)
    plan = nccl_message_sizes.message_plan(DEVICE_SERVER_ARGS, DEVICE_HIDDEN_SIZE, memory)
    return {"decode": plan["decode"], "prefill": plan["prefill"]}


def check_phases(checks, records, choice, label, phases):
    """The probe got the sizes of both phases the node's plan makes, and every run measured all of them."""
    checks.equal(f"nccl {label}: decode and prefill sizes follow the server arguments and GPU memory", phases,
                 choice.get("phases"))
    measured = [r for r in records if "us_per_allreduce" in r]
    wanted = sorted({s for sizes in phases.values() for s in sizes})
    checks.add(
        f"nccl {label}: every run measured every decode and prefill size",
        all(sorted(int(s) for s in r["us_per_allreduce"]) == wanted and r.get("phases") == phases for r in measured),
        wanted,
        sorted({tuple(sorted(int(s) for s in r["us_per_allreduce"])) for r in measured}),
    )


def check_nccl(checks, records, choice, gpus, label, settings_all=None):
    if gpus < 2:
        checks.add(
            f"nccl {label}: skipped with fewer than 2 GPUs",
            bool(choice.get("skipped")) and not records,
            "skipped",
            choice.get("skipped"),
        )
        return
    measured = [r for r in records if "us_per_allreduce" in r]
    checks.add(
        f"nccl {label}: measured (not skipped)",
        not choice.get("skipped") and len(records) >= 3,
        "3+ runs",
        choice.get("skipped") or len(records),
    )
    checks.equal(f"nccl {label}: every run measured", len(records), len(measured))
    checks.add(
        f"nccl {label}: correct sums in every run",
        measured and all(r.get("correct") for r in measured),
        True,
        {r.get("candidate"): r.get("correct") for r in measured},
    )
    checks.add(
        f"nccl {label}: world size = GPU count",
        all(r.get("world") == gpus for r in records),
        gpus,
        sorted({r.get("world") for r in records}),
    )
    checks.add(
        f"nccl {label}: multicast off in every run",
        all((r.get("env") or {}).get("NCCL_NVLS_ENABLE") == "0" for r in measured),
        "NCCL_NVLS_ENABLE=0",
        [(r.get("env") or {}).get("NCCL_NVLS_ENABLE") for r in measured],
    )
    if settings_all:
        carrying = [r for r in measured if r.get("settings")]
        checks.add(
            f"nccl {label}: every candidate carries {settings_all}",
            carrying and all(all(r["env"].get(k) == v for k, v in settings_all.items()) for r in carrying),
            settings_all,
            [r.get("candidate") for r in carrying],
        )
    if any("round" in r for r in records):  # tables from before rounds have one run per setting
        names = [r.get("candidate") for r in sorted(records, key=lambda r: r.get("seq", 0))]
        checks.add(
            f"nccl {label}: NCCL's defaults first, between the candidates' rounds and last (2+ rounds)",
            interleaved_rounds(names),
            "defaults, candidates, defaults, candidates, ..., defaults",
            names,
        )
    checks.add(
        f"nccl {label}: a choice was made",
        "chosen" in choice and "error" not in choice,
        "a choice",
        choice.get("chosen", choice.get("error")),
    )


def run_checks(results, gpus, main_rc=None, wrong_rc=None, wrong_log=None, name_pattern=NAME_PATTERN):
    import nccl_choice

    def read_json(name):
        path = os.path.join(results, name)
        if not os.path.exists(path):
            return None
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)

    checks = Checks()
    if main_rc is not None:
        checks.equal("play: gpu_tier.yml with the node's own expectations exits 0", 0, main_rc)
    topo = read_json("gpu_topology.json")
    stack = read_json("sglang_stack.json")
    report = read_json("torch_report.json")
    checks.add("gpu_topology facts recorded", topo is not None)
    checks.add("sglang_stack facts recorded", stack is not None)
    checks.add("torch report recorded", report is not None)
    if topo is not None:
        check_topology(checks, topo, gpus, name_pattern)
        query = os.path.join(results, "nvidia-smi-query-gpu.csv")
        topo_m = os.path.join(results, "nvidia-smi-topo-m.txt")
        if os.path.exists(query) and os.path.exists(topo_m):
            with open(query, encoding="utf-8") as fq, open(topo_m, encoding="utf-8") as ft:
                reparsed = topology_from_captures(fq.read(), ft.read())
            checks.add(
                "raw topo -m + query-gpu parse to the module's facts (current link fields aside)",
                without_volatile(reparsed) == without_volatile(topo),
            )
    if stack is not None and report is not None and topo is not None:
        check_stack(checks, stack, report, topo, gpus)

    for label, settings_all in (("defaults", None), ("p2p-off", P2P_OFF)):
        table = os.path.join(results, f"nccl-{label}.jsonl")
        choice = read_json(f"nccl-{label}-choice.json")
        if label == "p2p-off" and gpus < 2:
            continue
        if choice is None or not os.path.exists(table):
            checks.add(f"nccl {label}: table and choice recorded", False)
            continue
        records = load_jsonl(table)
        check_nccl(checks, records, choice, gpus, label, settings_all)
        if topo is not None:
            check_phases(checks, records, choice, label, expected_phases(topo))
        if "error" not in choice and "skipped" not in choice:
            again = nccl_choice.choose(records, weights=choice.get("weights"))
            checks.equal(
                f"nccl {label}: recorded choice = the rule applied to the recorded table",
                choice.get("chosen"),
                again.get("chosen"),
            )

    if wrong_rc is not None:
        checks.add(f"wrong expectation ({wrong_count(gpus)} GPUs): the play fails", wrong_rc != 0, "rc != 0", wrong_rc)
        text = ""
        if wrong_log and os.path.exists(wrong_log):
            with open(wrong_log, encoding="utf-8", errors="replace") as fh:
                text = wrong_expectation_message(fh.read())
        wanted = f"gpu_preflight_expected_gpu_count: expected {wrong_count(gpus)} GPUs, found {gpus}"
        checks.add(
            "wrong expectation: the message names the variable and the count found", wanted in text, wanted, text
        )
        with open(os.path.join(results, "wrong-expectation.txt"), "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    return checks


def summary_text(results, checks, gpus):
    def read_json(name):
        path = os.path.join(results, name)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as fh:
                return json.load(fh)
        return None

    lines = [f"real-GPU tier: {gpus} GPU(s)"]
    stack = read_json("sglang_stack.json") or {}
    topo = read_json("gpu_topology.json") or {}
    lines.append(
        "node: {} x {}, interconnect {}, links {}, driver {} (CUDA {}), torch {} (CUDA {}), NCCL {}, python {}".format(
            topo.get("gpu_count"),
            ", ".join(sorted({g.get("name") for g in topo.get("gpus", [])})),
            topo.get("interconnect"),
            sorted({link["link"] for link in topo.get("links", [])}),
            (stack.get("driver") or {}).get("driver_version"),
            (stack.get("driver") or {}).get("cuda_version"),
            (stack.get("torch") or {}).get("version"),
            (stack.get("torch") or {}).get("cuda"),
            (stack.get("nccl") or {}).get("version"),
            (stack.get("python") or {}).get("version"),
        )
    )
    lines.append("")
    lines += [
        f"{'PASS' if c['ok'] else 'FAIL'}  {c['check']}"
        + ("" if c["ok"] else f"  (expected {c['expected']!r}, found {c['found']!r})")
        for c in checks.items
    ]
    lines.append("")
    lines.append(f"{len(checks.items) - len(checks.failed)} passed, {len(checks.failed)} failed")
    for label, name in (
        ("NCCL defaults vs candidates", "nccl-defaults-choice.json"),
        ("NCCL_P2P_DISABLE=1 in every run (rule vs NCCL's true defaults)", "nccl-p2p-off-choice.json"),
        ("NCCL_P2P_DISABLE=1 in every run (rule with p2p-off as the baseline)", "nccl-p2p-off-rebased-choice.json"),
    ):
        choice = read_json(name)
        if choice is None:
            continue
        lines += ["", f"## {label}"]
        phases = choice.get("phases") or {}
        lines.append(f"sizes (bytes): decode {phases.get('decode')}, prefill {phases.get('prefill')}")
        if choice.get("skipped"):
            lines.append(choice["skipped"])
            continue
        lines.append(f"chosen: {choice.get('chosen')!r} {json.dumps(choice.get('settings'))}")
        lines.append(str(choice.get("decision", choice.get("error", ""))))
        lines += (choice.get("table_md") or "").splitlines()
        if choice.get("rounds_md"):
            lines += ["", "every run, in launch order (us per all-reduce):"]
            lines += choice["rounds_md"].splitlines()
    wrong = os.path.join(results, "wrong-expectation.txt")
    if os.path.exists(wrong):
        with open(wrong, encoding="utf-8") as fh:
            lines += [
                "",
                f"## wrong expectation (-e gpu_preflight_expected_gpu_count={wrong_count(gpus)})",
                fh.read().rstrip(),
            ]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("torch-report")
    p.add_argument("out")
    p = sub.add_parser("rebase-p2p")
    p.add_argument("table")
    p.add_argument("out")
    p = sub.add_parser("check")
    p.add_argument("results")
    p.add_argument("--gpus", type=int, required=True)
    p.add_argument("--main-rc", type=int)
    p.add_argument("--wrong-rc", type=int)
    p.add_argument("--wrong-log")
    p.add_argument("--gpu-name-pattern", default=NAME_PATTERN, help="what every GPU's name must match")
    args = parser.parse_args(argv)

    if args.command == "torch-report":
        report = torch_report()
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=1, sort_keys=True)
        print(json.dumps(report, sort_keys=True))
        return 0
    if args.command == "rebase-p2p":
        choice = rebased_choice(load_jsonl(args.table))
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(choice, fh, indent=1, sort_keys=True)
        print(f"p2p-off baseline: chosen {choice.get('chosen')!r}: {choice.get('decision')}")
        return 0
    checks = run_checks(args.results, args.gpus, args.main_rc, args.wrong_rc, args.wrong_log, args.gpu_name_pattern)
    with open(os.path.join(args.results, "checks.json"), "w", encoding="utf-8") as fh:
        json.dump(checks.items, fh, indent=1)
    text = summary_text(args.results, checks, args.gpus)
    with open(os.path.join(args.results, "summary.txt"), "w", encoding="utf-8") as fh:
        fh.write(text)
    print(text)
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
