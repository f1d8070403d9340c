"""Bad input: a wrong inventory stops site.yml before anything on the node changes.

Every role declares its variables in meta/argument_specs.yml (checked at run time). Each
invalid inventory below runs site.yml once against the shared converged node and must fail
with a message naming the variable, report changed=0 for the host, and leave the running
service untouched: same MainPID, and the same fingerprint (sha256, owner and mode of the
unit, /etc/sglang/*.env, the patched files, the patch manifest, ...).
"""

from __future__ import annotations

import types

import expected
import node_state
import pytest
import yaml
from project_modules import REPO

ROLES = sorted(p for p in (REPO / "roles").iterdir() if p.is_dir())
SQUATTER = "sglang-canon-test-port-squatter"
SQUATTED_PORT = 30001


def _server_args(**changes):
    """The test node's sglang_server_args with some fields changed (extra vars replace the whole dict)."""
    args = dict(expected.testnode_vars()["sglang_server_args"])
    args.update(changes)
    return {"sglang_server_args": args}


def _other_version_patch_set(tmp_path):
    """A patch set on the controller made for SGLang 0.5.8 (this deployment runs 0.5.9)."""
    shipped = REPO / "roles" / "sglang_patches" / "files" / "sglang-0.5.9"
    patch = sorted(shipped.glob("*.patch"))[0]
    folder = tmp_path / "sglang-0.5.8"
    folder.mkdir()
    (folder / patch.name).write_text(patch.read_text())
    (folder / "set.yml").write_text(
        yaml.safe_dump({"package": "sglang", "version": "0.5.8", "patches": [patch.name]}, sort_keys=False)
    )
    return {"sglang_patches_sets": [str(folder)]}


# id -> (extra vars, or a function of tmp_path returning them; text the failure must contain)
CASES = {
    "server-args-a-list-not-a-mapping": ({"sglang_server_args": ["--tp-size", "8"]}, "sglang_server_args"),
    "tp-size-a-word": (_server_args(tp_size="eight"), "sglang_server_args.tp_size"),
    "mem-fraction-above-1": (_server_args(mem_fraction_static=1.5), "sglang_server_args.mem_fraction_static"),
    "mem-fraction-zero": (_server_args(mem_fraction_static=0), "sglang_server_args.mem_fraction_static"),
    "tp-size-not-dividing-the-gpus": (_server_args(tp_size=3), "sglang_server_args.tp_size"),
    "model-path-missing-on-the-node": ({"sglang_model_path": "/srv/models/absent"}, "sglang_server_args.model_path"),
    "port-taken-by-another-program": (_server_args(port=SQUATTED_PORT), "sglang_server_args.port"),
    "port-out-of-range": (_server_args(port=70000), "sglang_server_args.port"),
    "unknown-speculative-algorithm": (
        _server_args(speculative_algorithm="MEDUSA"),
        "sglang_server_args.speculative_algorithm",
    ),
    "unknown-flag": (_server_args(not_a_flag=1), "sglang_server_args.not_a_flag"),
    "topk-4-with-spec-v2": (
        _server_args(speculative_eagle_topk=4, speculative_num_draft_tokens=8),
        "sglang_server_args.speculative_eagle_topk",
    ),
    "spec-v2-spelled-on": (
        {"sglang_service_environment": {"SGLANG_ENABLE_SPEC_V2": "on"}},
        "sglang_service_environment.SGLANG_ENABLE_SPEC_V2",
    ),
    "environment-value-not-a-string": (
        {"sglang_service_environment": {"SGLANG_ENABLE_SPEC_V2": 1}},
        "sglang_service_environment",
    ),
    "patch-set-for-another-sglang-version": (_other_version_patch_set, "sglang_patches_sets"),
    "patches-state-not-a-choice": ({"sglang_patches_state": "removed"}, "sglang_patches_state"),
    "invalid-nccl-value": ({"nccl_tuning_settings": {"NCCL_PROTO": "LL129"}}, "nccl_tuning_settings: NCCL_PROTO"),
    "unknown-nccl-name": ({"nccl_tuning_settings": {"NCCL_FOO": "1"}}, "nccl_tuning_settings: NCCL_FOO"),
    "nccl-delivery-not-a-choice": ({"nccl_tuning_delivery": "environment"}, "nccl_tuning_delivery"),
    "gpu-count-expectation-mismatch": ({"gpu_preflight_expected_gpu_count": 4}, "gpu_preflight_expected_gpu_count"),
    "interconnect-expectation-mismatch": (
        {"gpu_preflight_expected_interconnect": "nvlink"},
        "gpu_preflight_expected_interconnect",
    ),
    "health-timeout-not-a-number": ({"sglang_service_health_timeout": "soon"}, "sglang_service_health_timeout"),
}


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_every_role_declares_its_variables_in_argument_specs(role):
    spec_file = role / "meta" / "argument_specs.yml"
    assert spec_file.is_file(), f"{role.name} has no meta/argument_specs.yml"
    specs = yaml.safe_load(spec_file.read_text())["argument_specs"]
    options = specs["main"]["options"]
    assert options, f"{role.name}: argument_specs main declares no options"
    declared = {name: option for spec in specs.values() for name, option in (spec.get("options") or {}).items()}
    defaults_file = role / "defaults" / "main.yml"
    defaults = (yaml.safe_load(defaults_file.read_text()) or {}) if defaults_file.exists() else {}
    assert not set(defaults) - set(declared), f"{role.name}: defaults without an argument spec"
    untyped = [name for name, option in declared.items() if "type" not in option or not option.get("description")]
    assert not untyped, f"{role.name}: options without a type or description: {untyped}"


@pytest.fixture(scope="module")
def node(converged_node):
    """The converged node, with what the running service depends on recorded once."""
    paths = node_state.managed_paths(converged_node.node)
    good = node_state.fingerprint(converged_node.node, paths)
    assert good["unit"]["ActiveState"] == "active"
    return types.SimpleNamespace(
        node=converged_node.node, name=converged_node.name, converge=converged_node.converge, watched=paths, good=good
    )


@pytest.fixture
def port_squatter(node):
    """Another program listening on SQUATTED_PORT of the node's loopback, as its own unit."""
    node_state.ssh(
        node.node,
        f"systemctl stop {SQUATTER}.service 2>/dev/null; systemctl reset-failed {SQUATTER}.service 2>/dev/null; "
        f"systemd-run --unit={SQUATTER} --property=DynamicUser=yes "
        f"/usr/bin/python3 -m http.server --bind 127.0.0.1 {SQUATTED_PORT}"
        f" && for i in $(seq 50); do ss -Htln 'sport = :{SQUATTED_PORT}' | grep -q . && exit 0; sleep 0.2; done; exit 1",
    )
    yield
    node.node.ssh(f"systemctl stop {SQUATTER}.service")


@pytest.mark.parametrize("case", list(CASES))
def test_invalid_inventory_fails_before_any_change(node, case, request, tmp_path):
    extravars, names = CASES[case]
    if callable(extravars):
        extravars = extravars(tmp_path)
    if case == "port-taken-by-another-program":
        request.getfixturevalue("port_squatter")
    pid = node_state.main_pid(node.node)

    result = node.converge(extravars=extravars)

    assert result.rc != 0, f"site.yml accepted {extravars}"
    messages = node_state.failure_messages(result)
    assert any(names in message for message in messages), messages
    assert node_state.host_changed(result, node.name) == 0, result.changed_tasks()
    assert node_state.main_pid(node.node) == pid, "the running server was restarted"
    after = node_state.fingerprint(node.node, node.watched)
    assert after == node.good, node_state.differences(node.good, after)
