"""production_v2.md rendered by the production_doc role itself (Ansible, real filters), over a
local connection, from the recorded facts and node files in tests/fixtures/doc/."""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import sys
from pathlib import Path

import jinja2
import jinja2.meta
import jinja2.nativetypes
import pytest
import yaml
from project_modules import REPO

FIXTURES = REPO / "tests" / "fixtures" / "doc"
PATCH_SET = REPO / "roles" / "sglang_patches" / "files" / "sglang-0.5.9"
sys.path.insert(0, str(REPO / "tests"))

from ansible_run import run_playbook  # noqa: E402  pylint: disable=wrong-import-position

PLAYBOOK = """\
- name: Render production_v2.md on this machine
  hosts: docs
  gather_facts: false
  roles:
    - role: production_doc
"""


def _facts(*names):
    merged = {}
    for name in names:
        merged.update(json.loads((FIXTURES / name).read_text()))
    return merged


def _shared(name):
    """One variable of roles/sglang/defaults/main.yml, rendered (the canonical node).

    Only the variables it refers to are rendered, so defaults elsewhere in the file that use
    Ansible-only filters do not matter."""
    data = yaml.safe_load((REPO / "roles" / "sglang" / "defaults" / "main.yml").read_text())
    # Native types, as Ansible renders "{{ sglang_worker_port }}": an integer stays one.
    env = jinja2.nativetypes.NativeEnvironment(undefined=jinja2.StrictUndefined)

    def render(value):
        if isinstance(value, str) and "{{" in value:
            names = jinja2.meta.find_undeclared_variables(env.parse(value))
            return render(env.from_string(value).render({n: render(data[n]) for n in names if n in data}))
        if isinstance(value, dict):
            return {k: render(v) for k, v in value.items()}
        if isinstance(value, list):
            return [render(v) for v in value]
        return value

    return render(data[name])


@pytest.fixture(scope="module")
def sglang_argv(project_module):
    return project_module("filter_plugins/sglang_argv.py").sglang_argv


class Node:
    """A directory standing in for the node: the document and the files the role reads."""

    def __init__(self, root):
        self.root = root
        self.state = root / "state"
        (self.state / "benchmark").mkdir(parents=True)
        self.doc = root / "production_v2.md"
        self.inventory = root / "hosts.ini"
        self.inventory.write_text(f"[docs]\ndoc-node ansible_connection=local ansible_python_interpreter={sys.executable}\n")
        (root / "playbook.yml").write_text(PLAYBOOK)

    def put(self, fixture, relative):
        target = self.state / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(FIXTURES / fixture, target)
        return target

    def put_patches(self):
        """The copies sglang_patches keeps beside the manifest: the shipped set itself."""
        target = self.state / "patches" / PATCH_SET.name
        target.mkdir(parents=True, exist_ok=True)
        for patch in PATCH_SET.glob("*.patch"):
            shutil.copy(patch, target / patch.name)
        return target

    def render(self, **extravars):
        variables = {
            "production_doc_path": str(self.doc),
            "production_doc_owner": pwd.getpwuid(os.getuid()).pw_name,
            "production_doc_group": grp.getgrgid(os.getgid()).gr_name,
            "sglang_state_dir": str(self.state),
            "production_doc_patches_manifest": str(self.state / "patches" / "sglang.manifest.json"),
            "production_doc_patches_dir": str(self.state / "patches"),
        }
        variables.update(extravars)
        # ansible-runner looks ansible-playbook up on PATH: the venv's, also when pytest runs unactivated.
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        result = run_playbook(str(self.root / "playbook.yml"), self.inventory, extravars=variables,
                              envvars={"PATH": path})
        assert result.rc == 0, result.stdout[-6000:]
        return result

    def text(self):
        return self.doc.read_text()


@pytest.fixture
def node(tmp_path):
    return Node(tmp_path)


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """The canonical node with every fact and file, plus one flag that has no reason yet."""
    node = Node(tmp_path_factory.mktemp("doc-full"))
    node.put("sglang.manifest.json", "patches/sglang.manifest.json")
    node.put("summary.json", "benchmark/summary.json")
    node.put_patches()
    args = dict(_shared("sglang_server_args"), cuda_graph_max_bs=64)
    # what sglang_patches hands to the service for patch 0002 (its default threshold)
    facts = dict(_facts("gpu_topology.json", "stack.json", "nccl.json"),
                 sglang_patches_service_environment={"SGLANG_SPEC_DISABLE_AT_RUNNING_REQUESTS": "0"})
    first = node.render(sglang_server_args=args, **facts)
    first_bytes = node.doc.read_bytes()
    second = node.render(sglang_server_args=args, **facts)
    return {"node": node, "args": args, "first": first, "first_bytes": first_bytes, "second": second}


def _section(text, title):
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


def test_document_is_written_root_style_0644(full):
    mode = full["node"].doc.stat().st_mode & 0o777
    assert mode == 0o644
    assert full["first"].changed >= 1


def test_second_render_is_byte_identical_and_unchanged(full):
    assert full["node"].doc.read_bytes() == full["first_bytes"]
    assert full["second"].changed == 0, full["second"].changed_tasks()


def test_every_flag_has_its_reason_from_the_defaults(full):
    reasons = _shared("sglang_server_arg_reasons")
    flags = _section(full["node"].text(), "Server flags")
    for name, reason in reasons.items():
        line = next(line for line in flags.splitlines() if line.startswith(f"| `--{name.replace('_', '-')}` |"))
        assert line.endswith(f"| {reason.replace('|', '|')} |"), line
    assert "| `--tp-size` | 8 | One tensor-parallel rank per GPU; all 8 cards serve one model. |" in flags
    assert "| `--cuda-graph-max-bs` | 64 | no reason recorded |" in flags


def test_flags_are_sorted(full):
    flags = [line.split("`")[1] for line in _section(full["node"].text(), "Server flags").splitlines()
             if line.startswith("| `--")]
    assert flags == sorted(flags) and len(flags) == len(full["args"])


def test_command_line_is_the_argv_filters(full, sglang_argv):
    text = full["node"].text()
    block = text.split("```sh\n", 1)[1].split("```", 1)[0]
    expected = sglang_argv(full["args"])
    # one flag per line, joined back it is exactly launcher + argv
    words = block.replace(" \\\n  ", " ").split()
    assert words == ["/opt/sglang/venvs/0.5.9/bin/python", "-m", "sglang.launch_server"] + expected
    assert "  --speculative-eagle-topk 1 \\\n" in block


def test_environment_spec_v2_and_nccl_delivery(full):
    text = full["node"].text()
    env = _section(text, "Environment")
    assert "| `SGLANG_ENABLE_SPEC_V2` | `1` | sglang_service_environment | Turns on spec v2" in env
    assert "| `NCCL_PROTO` | `LL` | nccl_tuning | LL is NCCL's lowest-latency protocol" in env
    assert "Spec v2 is **on**" in env
    nccl = _section(text, "NCCL")
    assert "- Delivered by: the unit's EnvironmentFile `/etc/sglang/sglang.env`" in nccl
    assert "| `NCCL_ALGO` | `Ring` | Ring, which the seed paired with LL" in nccl
    assert "- Source: pcie default; interconnect pcie." in nccl


def test_patches_with_their_sha256(full):
    manifest = json.loads((FIXTURES / "sglang.manifest.json").read_text())
    patches = _section(full["node"].text(), "Patches")
    for index, patch in enumerate(manifest["patches"], start=1):
        assert f"| {index} | `{patch['name']}` | `{patch['sha256']}` |" in patches
    for path, sums in manifest["files"].items():
        assert f"| `{path}` | `{sums['sha256']}` | `{sums['pristine_sha256']}` |" in patches


def test_hardware_and_stack(full):
    text = full["node"].text()
    assert "- Hardware: 8 x NVIDIA RTX PRO 6000 Blackwell Server Edition, interconnect pcie." in text
    hardware = _section(text, "Hardware")
    assert "| 0 | NVIDIA RTX PRO 6000 Blackwell Server Edition | 97887 | 12.0 | 5 (1) | x16 (x16) | 00000000:06:00.0 |" in hardware
    assert "NODE x 8, PIX x 4, SYS x 16" in hardware
    assert "driver 595.58.03" in hardware
    stack = _section(text, "Software stack")
    assert "| PyTorch | 2.9.1+cu130 | CUDA 13.0; cuDNN 91300; CUDA available: yes, 8 device(s), compute capability 12.0 |" in stack
    assert "| NCCL | 2.27.7 | read from torch.cuda.nccl.version() |" in stack
    assert "| SGLang | 0.5.9 |" in stack


def test_models_and_operations(full):
    text = full["node"].text()
    assert "| Draft model (EAGLE-3) | `/data/eagle3/output_100k_sglang/4` |" in text
    ops = _section(text, "Operating the service")
    assert "systemctl status sglang.service" in ops and "journalctl -u sglang.service -f" in ops
    assert "cp /etc/sglang/last-good/sglang.service /etc/systemd/system/sglang.service" in ops
    assert "systemctl daemon-reload\nsystemctl restart sglang.service" in ops
    assert "site.yml" in ops and "playbooks/benchmark.yml" in ops


def test_benchmark_table_side_by_side_with_winners(full):
    bench = _section(full["node"].text(), "Benchmark")
    assert "started 2026-03-02T14:05:11Z" in bench
    assert "| Concurrency | production | baseline | Winner | Production vs winner |" in bench
    assert "| 1 | 86.8 | **92.7** | baseline | -6.4% |" in bench
    assert "| 128 | **5920.8** | 5480.1 | production | best |" in bench
    assert "Levels won: production 5, baseline 3." in bench
    baseline = next(line for line in bench.splitlines() if line.startswith("- `baseline`: production with "))
    for removed in ("SGLANG_ENABLE_SPEC_V2", "speculative_algorithm", "speculative_draft_model_path", "mem_fraction_static"):
        assert f"{removed} removed" in baseline
    assert "- `production`: as deployed." in bench
    assert "Accept length:" in bench


def test_secret_flags_are_hidden(node):
    args = dict(_shared("sglang_server_args"), api_key="s3cr3t-value")
    node.render(sglang_server_args=args)
    text = node.text()
    assert "s3cr3t-value" not in text
    assert "| `--api-key` | (hidden) |" in text
    assert "  --api-key (hidden)" in text


def _seed_reference():
    return yaml.safe_load((REPO / "roles" / "production_doc" / "vars" / "main.yml").read_text())["production_doc_seed_reference"]


def test_seed_reference_holds_the_seeds_numbers():
    """The seed's record: topk 1 + spec v2 86.8 tok/s vs no speculation 92.7 at C=1, matching or
    beating it above C=30, 54.1 tok/s on the earlier CUDA 12.8 stack (about 14x less than the peak)."""
    seed = _seed_reference()
    assert seed["single_stream"]["concurrency"] == 1
    assert seed["single_stream"]["production_tok_s"] == 86.8
    assert seed["single_stream"]["baseline_tok_s"] == 92.7
    assert seed["crossover_concurrency"] == 30
    assert seed["concurrency_level_count"] == 8
    assert seed["earlier_stack"] == {"stack": "CUDA 12.8", "tok_s": 54.1, "improvement_at_peak": 14}
    assert "CUDA 13.0.1, PyTorch 2.9.1, SGLang 0.5.9" in seed["stack"]
    assert "RTX PRO 6000 Blackwell" in seed["where"] and "no date" in seed["when"]
    # the configurations it compared are the benchmark's presets, production first, baseline second
    presets = yaml.safe_load((REPO / "roles" / "sglang_benchmark" / "defaults" / "main.yml").read_text())
    names = [c["name"] for c in seed["configurations"]]
    assert names[:2] == ["topk1-spec-v2", "baseline"]
    assert sorted(names) == sorted(presets["sglang_benchmark_presets"])


def test_seed_reference_is_rendered_and_marked_as_the_seeds(full):
    reference = _section(full["node"].text(), "Reference: the seed's measured comparison")
    assert "Measured by the seed deployment, not on this node: the seed's container: 8 x NVIDIA RTX PRO 6000" in reference
    assert "(the seed records no date); stack CUDA 13.0.1, PyTorch 2.9.1, SGLang 0.5.9" in reference
    assert ("- Concurrency 1: the seed's production (`topk1-spec-v2`) made 86.8 tok/s, `baseline` 92.7 tok/s (-6.4 %): "
            "the topk 1 chain") in reference
    assert "- Above concurrency 30: the seed's production matched or beat `baseline` at every level." in reference
    assert "earlier CUDA 12.8 stack managed 54.1 tok/s; the seed puts the CUDA 13.0.1 stack's peak at 14x that." in reference
    assert "The seed compared these 4 configurations (presets of `playbooks/benchmark.yml`) over 8 concurrency levels:" in reference
    for name in ("topk1-spec-v2", "baseline", "topk4-spec-v1", "topk1-spec-v1"):
        assert f"| `{name}` |" in reference
    # with a benchmark of its own, the node's table comes first and is not called the reference
    assert "Until then the reference is the seed's" not in full["node"].text()


def test_environment_has_every_reason_including_the_patches_switch(full):
    env = _section(full["node"].text(), "Environment")
    assert "no reason recorded" not in env
    reason = _shared("sglang_service_environment_reasons")["SGLANG_SPEC_DISABLE_AT_RUNNING_REQUESTS"]
    assert reason.startswith("Patch 0002's switch:")
    assert f"| `SGLANG_SPEC_DISABLE_AT_RUNNING_REQUESTS` | `0` | sglang_patches | {reason} |" in env


def test_every_patch_says_what_it_changes_and_why(full):
    patches = _section(full["node"].text(), "Patches")
    state = full["node"].state
    assert "### 1. Refuse a misspelt SGLANG_ENABLE_SPEC_V2 at start-up\n" in patches
    assert "### 2. Spec v2: skip the drafter at or above N running requests\n" in patches
    assert f"`{state}/patches/sglang-0.5.9/0002-spec-v2-skip-drafting-at-running-requests.patch`" in patches
    assert "- **What:** SGLANG_ENABLE_SPEC_V2 becomes an EnvStrictBool." in patches
    assert "- **Why:** stock 0.5.9 only warns" in patches
    assert "- **How far the skip goes:** spec v2's data path has fixed shapes" in patches
    assert "- **Why:** the seed prepared this switch (left at 0, inactive)" in patches
    assert "- **Files:** sglang/srt/speculative/eagle_worker_v2.py." in patches
    assert "not read" not in patches and "not shown" not in patches


def test_a_patch_copy_missing_or_changed_on_the_node_is_not_explained(node):
    node.put("sglang.manifest.json", "patches/sglang.manifest.json")
    copies = node.put_patches()
    (copies / "0001-strict-sglang-enable-spec-v2.patch").unlink()
    changed = copies / "0002-spec-v2-skip-drafting-at-running-requests.patch"
    changed.write_text(changed.read_text().replace("Why: the seed", "Why: someone"))
    node.render()
    patches = _section(node.text(), "Patches")
    assert "### 1. `sglang-0.5.9/0001-strict-sglang-enable-spec-v2.patch`" in patches
    assert "- What and why: not read; the copy is missing on the node" in patches
    assert "- What and why: not shown; the copy on the node (sha256 `" in patches
    assert "someone" not in patches


def test_without_facts_or_files_it_says_not_gathered(node):
    node.render(production_doc_nccl_record=str(node.state / "nccl" / "missing.json"))
    text = node.text()
    assert "- Hardware: not gathered." in text
    assert "Not gathered: gpu_preflight did not run in this play" in text
    assert "Not gathered: stack_verify did not run in this play" in text
    assert "Not gathered: nccl_tuning did not run in this play" in text
    assert "None recorded: no patch manifest at" in text
    assert "None recorded on this node yet" in text
    assert "Until then the reference is the seed's measured comparison below, which was not measured on this node." in text
    assert "86.8 tok/s" in _section(text, "Reference: the seed's measured comparison")
    assert "WARNING" not in text


def test_nccl_record_on_the_node_is_used_without_the_fact(node):
    record = json.loads((FIXTURES / "nccl.json").read_text())["nccl_tuning_applied"]
    del record["measurement"]  # applied.json is written without it
    (node.state / "nccl").mkdir()
    (node.state / "nccl" / "applied.json").write_text(json.dumps(record))
    node.render()
    assert "- Delivered by: the unit's EnvironmentFile" in _section(node.text(), "NCCL")


def test_leftover_benchmark_marker_warns_when_the_role_runs_alone(node):
    marker = node.state / "benchmark" / "temporary-configuration.json"
    marker.write_text(json.dumps({"configuration": "baseline", "since": "2026-03-02T15:00:00Z"}))
    node.render()
    assert "**WARNING: a temporary benchmark configuration may be live.**" in node.text()
    assert "`baseline` replaced production" in node.text()
    assert marker.exists()  # only a play that redeployed production (sglang_service) clears it


def test_unreadable_summary_does_not_fail_the_render(node):
    (node.state / "benchmark" / "summary.json").write_text("{not json")
    node.render()
    assert "summary.json` is unreadable: not JSON" in node.text()


def test_monitoring_lists_where_metrics_and_alerts_live_and_the_thresholds_in_force(node):
    node.render()
    alone = _section(node.text(), "Monitoring")
    assert "No monitor in the inventory" in alone and "/metrics" in alone
    assert "on each run that probes `/health_generate`, `sglang_watchdog_health_ok`" in alone

    # A monitor with one threshold of its own: the document shows it, and the role's defaults for the rest.
    node.inventory.write_text(node.inventory.read_text()
                              + "[sglang_monitors]\nmon-1 sglang_monitoring_alert_token_usage_threshold=0.9\n")
    node.render(sglang_server_args={**_shared("sglang_server_args"), "host": "0.0.0.0"})
    text = _section(node.text(), "Monitoring")
    assert "Prometheus on `mon-1`" in text and "`127.0.0.1:9090`" in text
    assert "/etc/prometheus/rules/sglang.rules.yml" in text
    assert "| `SGLangKVCacheNearlyFull` | `sglang:token_usage` above the threshold | > 0.9 for 5m |" in text
    assert "| `SGLangServerDown` | the server cannot be scraped (`up == 0`) | for 1m |" in text
    assert "no value while the server is not active or a deploy holds the lock) | for 2m |" in text
    assert "`http://doc-node:30000/metrics`\n(on: `enable_metrics`)" in text
