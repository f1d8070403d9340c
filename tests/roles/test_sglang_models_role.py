"""The sglang_models role for real: ansible-playbook on localhost, one inventory host per case
(connection local), models served by the HTTP mirror double from synthetic models written with
the safetensors package (tests/double/make_test_models.py). The module alone is tested in
tests/roles/test_sglang_model_module.py, the pure checks in tests/unit/test_model_logic.py."""

import base64
import json
import shutil
import sys

import pytest
import yaml
from ansible_run import run_playbook
from project_modules import REPO

sys.path.insert(0, str(REPO / "tests"))

from model_fixtures import MirrorProcess, make_models  # noqa: E402  pylint: disable=wrong-import-position

PLAYBOOK = """\
- name: Models from the mirror double
  hosts: all
  gather_facts: false
  roles:
    - role: sglang_models
"""

HUB_COMMIT = "0123456789abcdef0123456789abcdef01234567"
HUB_TOKEN = "hf_role_test_token_not_a_secret"
MIRROR_TOKEN = "mirror_role_test_token_not_a_secret"

# The canonical node's GPUs as gpu_preflight reads them from the nvidia-smi capture (8 x 97887 MiB).
GPU_TOPOLOGY = {"gpus": [{"index": i, "memory_total_mib": 97887} for i in range(8)]}


def _server_args(root):
    return {"model_path": str(root / "target"), "speculative_algorithm": "EAGLE3",
            "speculative_draft_model_path": str(root / "draft"), "speculative_num_steps": 3,
            "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4, "tp_size": 8,
            "mem_fraction_static": 0.88}


@pytest.fixture(name="world", scope="module")
def fixture_world(tmp_path_factory, parser_python):
    """Sources (good, a drafter of another target, a target without tokenizer), the mirror, the inventory."""
    tmp = tmp_path_factory.mktemp("sglang_models")
    sources = tmp / "mirror"
    good = make_models(parser_python, sources / "good")
    other = make_models(parser_python, sources / "other", variant="other-target")
    no_tokenizer = [e for e in good["target"] if not e["path"].startswith("tokenizer")]
    (sources / "fresh").symlink_to("good")  # the fresh host's own URLs, to tell its requests apart
    mirror = MirrorProcess(sources, tmp / "mirror.log")
    hub = MirrorProcess.hub(sources / "good" / "target", tmp / "hub.log", "example/target", HUB_COMMIT, HUB_TOKEN)
    guarded = MirrorProcess(sources, tmp / "guarded.log", options=("--basic-auth", "reader:" + MIRROR_TOKEN))

    def host(name, target_manifest=None, draft_source="good", draft_manifest=None, **extra):
        root = tmp / "nodes" / name
        draft_source = "fresh" if name == "fresh" else draft_source
        values = {
            "sglang_server_args": _server_args(root),
            "sglang_models_target_source": {"type": "http", "url": "%s/%s/target" % (
                mirror.url, "fresh" if name == "fresh" else "good")},
            "sglang_models_target_manifest": target_manifest or good["target"],
            "sglang_models_target_revision": "synthetic-1",
            "sglang_models_draft_source": {"type": "http", "url": "%s/%s/draft" % (mirror.url, draft_source)},
            "sglang_models_draft_manifest": draft_manifest or good["draft"],
        }
        values.update(extra)
        return name, values

    hosts = dict([
        host("fresh"),
        host("other-target", draft_source="other", draft_manifest=other["draft"]),
        host("too-big", sglang_models_kv_cache_min_gib=90),
        host("no-tokenizer", target_manifest=no_tokenizer),
        # The target from the Hub double at a pinned commit, its manifest read from the Hub.
        host("hub", sglang_models_target_source={"type": "hf", "repo": "example/target", "revision": HUB_COMMIT,
                                                 "endpoint": hub.url},
             sglang_models_target_manifest=[], sglang_models_hf_token=HUB_TOKEN, sglang_python=str(parser_python)),
        # The mirror's credential in the URL (refused) and in the vaulted headers (used, never shown).
        host("credential-url", sglang_models_target_source={"type": "http", "url": mirror.url.replace(
            "http://", "http://reader:%s@" % MIRROR_TOKEN) + "/good/target"}),
        host("guarded", sglang_models_target_source={"type": "http", "url": guarded.url + "/good/target"},
             sglang_models_target_http_headers={"Authorization": "Basic " + base64.b64encode(
                 ("reader:" + MIRROR_TOKEN).encode()).decode()}),
    ])
    inventory = tmp / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"vars": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
        "gpu_topology": GPU_TOPOLOGY}, "hosts": hosts}}))
    playbook = tmp / "models.yml"
    playbook.write_text(PLAYBOOK)
    yield {"tmp": tmp, "inventory": inventory, "playbook": playbook, "mirror": mirror, "good": good, "hub": hub,
           "guarded": guarded}
    mirror.stop()
    hub.stop()
    guarded.stop()


def run(world, check=False):
    result = run_playbook(world["playbook"], world["inventory"], check=check, testnode_vars=False,
                          envvars={"ANSIBLE_CACHE_PLUGIN_CONNECTION": str(world["tmp"] / "facts")})
    failed = dict((e["event_data"]["host"], str(e["event_data"]["res"].get("msg", "")))
                  for e in result.events if e.get("event") == "runner_on_failed")
    return {"stats": result.stats, "failed": failed, "stdout": result.stdout, "events": result.events}


@pytest.fixture(name="first", scope="module")
def fixture_first(world):
    return run(world)


def test_a_fresh_node_gets_both_models_verified_and_recorded(world, first):
    assert "fresh" not in first["failed"], first["failed"]
    root = world["tmp"] / "nodes" / "fresh"
    for name in ("target", "draft"):
        for entry in world["good"][name]:
            assert (root / name / entry["path"]).stat().st_size == entry["size"]
        record = json.loads((root / name / ".sglang-model.json").read_text())
        assert record["manifest"] == sorted(world["good"][name], key=lambda e: e["path"])
    assert first["stats"]["changed"]["fresh"] == 2  # one place task per model
    facts = [e["event_data"]["res"]["ansible_facts"]["sglang_models_record"] for e in first["events"]
             if e.get("event") == "runner_on_ok" and e["event_data"]["host"] == "fresh"
             and "sglang_models_record" in e["event_data"]["res"].get("ansible_facts", {})][0]
    assert [(r["label"], r["source"]["type"], r["files"]) for r in facts] == [
        ("sglang_models_target_source", "http", len(world["good"]["target"])),
        ("sglang_models_draft_source", "http", len(world["good"]["draft"]))]
    assert facts[0]["revision"] == "synthetic-1" and len(facts[0]["manifest_digest"]) == 64


def test_a_hub_target_is_fetched_with_the_vaulted_token_which_is_never_printed(world, first):
    assert "hub" not in first["failed"], first["failed"]
    target = world["tmp"] / "nodes" / "hub" / "target"
    record = json.loads((target / ".sglang-model.json").read_text())
    assert record["manifest"] == sorted(world["good"]["target"], key=lambda e: e["path"])
    assert record["source"]["revision"] == HUB_COMMIT
    assert all(r["token"] is True for r in world["hub"].requests())
    assert HUB_TOKEN not in first["stdout"] and HUB_TOKEN not in json.dumps(first["events"])


def test_a_credential_in_a_source_url_is_refused_before_any_module_is_given_it(world, first):
    message = first["failed"]["credential-url"]
    assert message.startswith("sglang_models_target_source.url holds a credential"), message
    assert "sglang_models_target_http_headers" in message
    # No module ran for the host (a module's arguments reach the node's journal), nothing was fetched.
    assert not [e for e in first["events"] if e["event_data"].get("host") == "credential-url"
                and e["event_data"].get("task_action") == "sglang_model"]
    assert not (world["tmp"] / "nodes" / "credential-url").exists()
    assert MIRROR_TOKEN not in first["stdout"] and MIRROR_TOKEN not in json.dumps(first["events"])


def test_a_mirror_asking_for_a_password_gets_the_vaulted_headers_which_are_never_recorded(world, first):
    assert "guarded" not in first["failed"], first["failed"]
    target = world["tmp"] / "nodes" / "guarded" / "target"
    requests = world["guarded"].requests()
    assert requests and all(r["auth"] for r in requests)
    encoded = base64.b64encode(("reader:" + MIRROR_TOKEN).encode()).decode()
    for text in (first["stdout"], json.dumps(first["events"]), (target / ".sglang-model.json").read_text()):
        assert MIRROR_TOKEN not in text and encoded not in text


def test_a_drafter_of_another_target_is_refused_before_anything_is_fetched(world, first):
    message = first["failed"]["other-target"]
    assert message.startswith("the models were refused, nothing on the node changed: ")
    assert ("drafter hidden size 128 (sglang_server_args.speculative_draft_model_path) does not belong to "
            "target hidden size 64 (sglang_server_args.model_path)") in message
    assert not (world["tmp"] / "nodes" / "other-target").exists()


def test_weights_too_big_for_the_gpus_are_refused_with_the_numbers(world, first):
    message = first["failed"]["too-big"]
    assert "the weights do not fit the GPUs: " in message
    assert "sglang_models_kv_cache_min_gib 90.00 GiB of KV cache" in message
    assert "a GPU gives SGLang 84.12 GiB = 97887 MiB (smallest GPU, gpu_topology) x " \
           "sglang_server_args.mem_fraction_static 0.88" in message
    assert not (world["tmp"] / "nodes" / "too-big").exists()


def test_a_target_without_tokenizer_is_refused(world, first):
    assert ("the target model (sglang_server_args.model_path) lacks the tokenizer files the server loads: "
            "tokenizer_config.json; tokenizer.json or") in first["failed"]["no-tokenizer"]
    assert not (world["tmp"] / "nodes" / "no-tokenizer").exists()


def test_a_second_run_changes_nothing_and_fetches_nothing(world, first):
    assert "fresh" not in first["failed"]
    before = len(world["mirror"].requests())
    second = run(world)
    assert second["stats"]["changed"].get("fresh", 0) == 0, second["stdout"][-3000:]
    assert second["stats"]["changed"].get("hub", 0) == 0, second["stdout"][-3000:]
    assert [r for r in world["mirror"].requests()[before:] if r["path"].startswith("fresh/")] == []


def test_check_mode_after_a_lost_shard_reports_it_and_a_run_repairs_it(world, first):
    assert "fresh" not in first["failed"]
    shard = world["tmp"] / "nodes" / "fresh" / "target" / "model-00002-of-00002.safetensors"
    shard.unlink()
    scan = run(world, check=True)
    assert scan["stats"]["changed"].get("fresh", 0) == 1 and not shard.exists()
    repair = run(world)
    assert repair["stats"]["changed"].get("fresh", 0) == 1 and shard.exists()
    assert run(world)["stats"]["changed"].get("fresh", 0) == 0
    shutil.rmtree(world["tmp"] / "facts", ignore_errors=True)
