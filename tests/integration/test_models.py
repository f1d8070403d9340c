"""Models on a fresh test node: the target and its EAGLE-3 drafter provisioned by site.yml from the
HTTP mirror double on the host (tests/double/model_mirror.py, reached at the node's host_ip),
verified by hash, repaired on drift, refused when wrong; the running service is left alone
whenever a run is refused. The synthetic models are written with the safetensors package
(tests/double/make_test_models.py). One node set for the whole file; the tests run in order."""

from __future__ import annotations

import base64
import json
import shutil
import sys
from pathlib import Path

import node_state
import pytest
from ansible_run import run_playbook
from project_modules import REPO

sys.path.insert(0, str(REPO / "tests"))

from model_fixtures import MirrorProcess, make_models  # noqa: E402  pylint: disable=wrong-import-position

TARGET, DRAFT = "/var/lib/models/target", "/var/lib/models/draft"
# The drafter comes from the Hub double at this commit, with this token (as from ansible-vault).
COMMIT = "9b1c3e5a7d9f1b3c5e7a9d1f3b5c7e9a1d3f5b7c"
TOKEN = "hf_integration_token_not_a_secret"
SHARD = "model-00002-of-00002.safetensors"


class Models:
    """The node, its sources on the host, and site.yml runs with the model variables as extra vars."""

    def __init__(self, node, tmp: Path, manifests, other_manifests):
        self.node = node
        self.tmp = tmp
        self.manifests = manifests
        self.other_manifests = other_manifests
        self.mirror = self.hub = None
        self.serve()

    def serve(self, cuts=()):
        """(Re)start the mirror and Hub doubles on the node's host address; each start has its own logs."""
        if self.mirror:
            self.stop()
        count = len(list(self.tmp.glob("mirror-*.log")))
        self.mirror = MirrorProcess(self.tmp / "sources", self.tmp / ("mirror-%d.log" % count),
                                    bind=self.node.host_ip, cuts=cuts)
        self.hub = MirrorProcess.hub(self.tmp / "sources" / "good" / "draft", self.tmp / ("hub-%d.log" % count),
                                     "example/draft", COMMIT, TOKEN, bind=self.node.host_ip)

    def stop(self):
        self.mirror.stop()
        self.hub.stop()

    def variables(self, **changes):
        values = {
            "sglang_model_path": TARGET,
            "sglang_draft_model_path": DRAFT,
            "sglang_models_target_source": {"type": "http", "url": self.mirror.url + "/good/target"},
            "sglang_models_target_manifest": self.manifests["target"],
            "sglang_models_target_revision": "synthetic-seed-16",
            # No manifest: the pinned commit's is read from the Hub on the first fetch.
            "sglang_models_draft_source": {"type": "hf", "repo": "example/draft", "revision": COMMIT,
                                           "endpoint": self.hub.url},
            "sglang_models_hf_token": TOKEN,
        }
        values.update(changes)
        return values

    def run(self, playbook="site.yml", **changes):
        return run_playbook(playbook, self.node.inventory, extravars=self.variables(**changes))

    def refused_untouched(self, result, *texts):
        """A refused run: rc != 0, nothing changed on the node, the message names each text."""
        messages = " | ".join(node_state.failure_messages(result))
        assert result.rc != 0, result.stdout[-3000:]
        for text in texts:
            assert text in messages, messages
        assert node_state.host_changed(result, self.node.name) == 0, result.changed_tasks()


@pytest.fixture(scope="module")
def models(node_sets, parser_python, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("models")
    manifests = make_models(parser_python, tmp / "sources" / "good")
    other = make_models(parser_python, tmp / "sources" / "other", variant="other-target")
    node = node_sets("models").nodes()[0]
    world = Models(node, tmp, manifests, other)
    yield world
    world.stop()


@pytest.fixture(scope="module")
def first_run(models):
    return models.run()


def _files(node, folder):
    """path -> [size, inode, sha256, owner, mode] of every file in a folder on the node."""
    program = (
        "import hashlib, json, os, sys\n"
        "out = {}\n"
        "for root, _d, names in os.walk(sys.argv[1]):\n"
        "    for name in names:\n"
        "        p = os.path.join(root, name); st = os.stat(p)\n"
        "        out[os.path.relpath(p, sys.argv[1])] = [st.st_size, st.st_ino,\n"
        "            hashlib.sha256(open(p, 'rb').read()).hexdigest(), st.st_uid, oct(st.st_mode & 0o777)]\n"
        "print(json.dumps(out))\n")
    return json.loads(node_state._remote_python(node, program, folder))  # pylint: disable=protected-access


def test_a_fresh_node_gets_its_models_and_serves(models, first_run):
    assert first_run.rc == 0, " | ".join(node_state.failure_messages(first_run)) or first_run.stdout[-4000:]
    for folder, name in ((TARGET, "target"), (DRAFT, "draft")):
        files = _files(models.node, folder)
        assert sorted(files) == sorted([e["path"] for e in models.manifests[name]] + [".sglang-model.json"])
        for entry in models.manifests[name]:
            size, _inode, sha, uid, mode = files[entry["path"]]
            assert (size, sha, uid, mode) == (entry["size"], entry["sha256"], 0, "0o644")
    # The service user reads the weights (and cannot write them).
    assert models.node.ssh(f"runuser -u sglang -- head -c 8 {TARGET}/{SHARD} >/dev/null").returncode == 0
    assert models.node.ssh(f"runuser -u sglang -- touch {TARGET}/{SHARD}").returncode != 0
    node_state.wait_healthy(models.node, 60)
    assert TARGET in node_state.ssh(models.node, "systemctl show --property=ExecStart sglang")
    draft_record = json.loads(node_state.ssh(models.node, f"cat {DRAFT}/.sglang-model.json"))
    assert draft_record["manifest"] == sorted(models.manifests["draft"], key=lambda e: e["path"])
    assert draft_record["source"]["repo"] == "example/draft" and draft_record["source"]["revision"] == COMMIT
    hub_requests = models.hub.requests()
    assert any(r["method"] == "HEAD" and r["path"].startswith(f"/example/draft/resolve/{COMMIT}/")
               for r in hub_requests)  # hf_hub_download on the node
    assert all(r["token"] is True for r in hub_requests)
    assert TOKEN not in first_run.stdout
    doc = node_state.ssh(models.node, f"cat {node_state.DOC}")
    digest = json.loads(node_state.ssh(models.node, f"cat {TARGET}/.sglang-model.json"))["manifest_digest"]
    assert "synthetic-seed-16" in doc and digest in doc


def test_a_second_run_fetches_nothing_and_changes_nothing(models, first_run):
    assert first_run.rc == 0
    before, hub_before = len(models.mirror.requests()), len(models.hub.requests())
    second = models.run()
    assert second.rc == 0 and node_state.host_changed(second, models.node.name) == 0, second.changed_tasks()
    assert models.mirror.requests()[before:] == [] and models.hub.requests()[hub_before:] == []


def test_a_shard_corrupted_by_hand_is_found_by_full_drift_scan_and_repaired(models, first_run):
    assert first_run.rc == 0
    pid = node_state.main_pid(models.node)
    node_state.ssh(models.node, f"printf 'XXXXXXXX' | dd of={TARGET}/{SHARD} bs=1 seek=4096 conv=notrunc status=none")
    drift = models.run("playbooks/drift.yml", sglang_models_verify="full")
    assert drift.rc != 0
    assert SHARD in drift.stdout and "sglang_models" in drift.stdout, drift.stdout[-3000:]

    before = len(models.mirror.requests())
    repair = models.run()
    assert repair.rc == 0, node_state.failure_messages(repair)
    assert [r["path"] for r in models.mirror.requests()[before:]] == ["good/target/" + SHARD]
    assert _files(models.node, TARGET)[SHARD][2] == next(
        e["sha256"] for e in models.manifests["target"] if e["path"] == SHARD)
    assert node_state.wait_healthy(models.node, 60)[0] == pid
    assert models.run("playbooks/drift.yml", sglang_models_verify="full").rc == 0


def test_a_source_that_does_not_match_the_pinned_manifest_is_refused(models, first_run):
    assert first_run.rc == 0
    pid, before = node_state.main_pid(models.node), _files(models.node, TARGET)
    # The inventory pins a new revision of the shard; the mirror still serves the old bytes.
    pinned = [dict(e, sha256="0" * 64) if e["path"] == SHARD else e for e in models.manifests["target"]]
    result = models.run(sglang_models_target_manifest=pinned)
    messages = " | ".join(node_state.failure_messages(result))
    assert result.rc != 0 and "does not match the pinned manifest: %s" % SHARD in messages, messages
    assert "the manifest says" in messages and "0" * 64 in messages
    assert _files(models.node, TARGET) == before  # nothing replaced
    assert node_state.main_pid(models.node) == pid and node_state.health_code(models.node) == "200"


def test_a_fetch_interrupted_mid_file_is_completed_by_the_next_run(models, first_run):
    assert first_run.rc == 0
    node_state.ssh(models.node, f"rm -rf /var/lib/models/.target.sglang-staging && rm {TARGET}/{SHARD}")
    models.serve(cuts=[("good/target/" + SHARD, 200000)])
    cut = models.run()
    assert cut.rc != 0
    assert "after 200000 of" in " | ".join(node_state.failure_messages(cut))
    part = f"/var/lib/models/.target.sglang-staging/{SHARD}.part"
    assert node_state.ssh(models.node, f"stat -c %s {part}").strip() == "200000"

    models.serve()
    done = models.run()
    assert done.rc == 0, node_state.failure_messages(done)
    assert ("good/target/" + SHARD, "bytes=200000-") in [(r["path"], r["range"]) for r in models.mirror.requests()]
    assert _files(models.node, TARGET)[SHARD][2] == next(
        e["sha256"] for e in models.manifests["target"] if e["path"] == SHARD)
    assert node_state.ssh(models.node, "ls -A /var/lib/models").split() == ["draft", "target"]


def test_a_drafter_of_another_target_is_refused_before_any_change(models, first_run):
    assert first_run.rc == 0
    pid, before = node_state.main_pid(models.node), _files(models.node, DRAFT)
    result = models.run(sglang_models_draft_source={"type": "http", "url": models.mirror.url + "/other/draft"},
                        sglang_models_draft_manifest=models.other_manifests["draft"])
    models.refused_untouched(result, "drafter hidden size 128 (sglang_server_args.speculative_draft_model_path) "
                                     "does not belong to target hidden size 64 (sglang_server_args.model_path)")
    assert _files(models.node, DRAFT) == before and node_state.main_pid(models.node) == pid


def test_weights_too_big_for_the_gpus_are_refused_before_any_change(models, first_run):
    assert first_run.rc == 0
    pid = node_state.main_pid(models.node)
    # The synthetic weights are a few MB: ask for more KV cache than the GPUs of the capture have.
    result = models.run(sglang_models_kv_cache_min_gib=90)
    models.refused_untouched(result, "the weights do not fit the GPUs", "sglang_server_args.tp_size 8",
                             "sglang_models_kv_cache_min_gib 90.00 GiB", "97887 MiB",
                             "sglang_server_args.mem_fraction_static 0.88")
    assert node_state.main_pid(models.node) == pid


def test_not_enough_disk_is_refused_with_needed_and_available(models, first_run):
    assert first_run.rc == 0
    small = "/mnt/small-disk"
    node_state.ssh(models.node, f"mkdir -p {small} && mount -t tmpfs -o size=256k tmpfs {small}")
    try:
        result = models.run(sglang_model_path=small + "/target")
        models.refused_untouched(result, "not enough free space for sglang_server_args.model_path",
                                 "the filesystem holding %s/target has" % small)
        assert node_state.ssh(models.node, f"ls -A {small}").strip() == ""
    finally:
        models.node.ssh(f"umount {small}")
    shutil.rmtree(models.tmp / "sources" / "other", ignore_errors=True)


def _grep_node(node, text):
    """Where ``text`` is written on the node: files under the model folders, /root (production_v2.md),
    /etc and /var/log, and the journal (modules log their arguments there as they start)."""
    return node.ssh(f"grep -rlF -- '{text}' /var/lib/models /root /etc /var/log 2>/dev/null; "
                    f"journalctl --no-pager -o cat | grep -cF -- '{text}'").stdout.split()


def test_a_file_not_in_the_manifest_is_reported_by_drift_and_removed_by_a_run(models, first_run):
    assert first_run.rc == 0
    pid, before = node_state.main_pid(models.node), _files(models.node, TARGET)
    stray = f"{TARGET}/model-00003-of-00002.safetensors"  # SGLang would load it as weights
    node_state.ssh(models.node, f"head -c 4096 /dev/urandom > {stray}")
    drift = models.run("playbooks/drift.yml")  # a routine scan notices it: one listing of the folder
    assert drift.rc != 0 and f"{stray}: not in the manifest" in drift.stdout, drift.stdout[-3000:]

    mirrored = len(models.mirror.requests())
    repair = models.run()
    assert repair.rc == 0, node_state.failure_messages(repair)
    after = _files(models.node, TARGET)
    assert sorted(after) == sorted(before)  # the stray file is gone, swapped out with the old folder
    assert all(after[p][1] == before[p][1] for p in before if p != ".sglang-model.json")  # same inodes: linked
    assert models.mirror.requests()[mirrored:] == []
    assert node_state.main_pid(models.node) == pid and node_state.health_code(models.node) == "200"
    assert models.run("playbooks/drift.yml", sglang_models_verify="full").rc == 0


def test_a_link_out_of_a_dir_source_is_refused_and_nothing_is_copied(models, first_run):
    assert first_run.rc == 0
    # A source folder someone else can write to, one of its files a link to /etc/shadow, and a
    # manifest made from that folder (scripts/model-manifest follows links): pinned, yet refused.
    source = "/srv/model-source"
    node_state.ssh(models.node, f"rm -rf {source} && cp -r {TARGET} {source} && rm {source}/.sglang-model.json "
                                f"&& rm {source}/tokenizer.json && ln -s /etc/shadow {source}/tokenizer.json "
                                f"&& rm {TARGET}/tokenizer.json")
    shadow = node_state.ssh(models.node, "stat -c %s /etc/shadow; sha256sum /etc/shadow").split()
    manifest = [dict(e, size=int(shadow[0]), sha256=shadow[1]) if e["path"] == "tokenizer.json" else e
                for e in models.manifests["target"]]
    before = _files(models.node, TARGET)
    result = models.run(sglang_models_target_source={"type": "dir", "path": source},
                        sglang_models_target_manifest=manifest)
    models.refused_untouched(result, f"sglang_models_target_source: {source}/tokenizer.json in the dir source "
                                     f"{source} is a symbolic link to /etc/shadow, which leads to /etc/shadow "
                                     "outside the source folder")
    assert _files(models.node, TARGET) == before
    assert models.node.ssh("ls -A /var/lib/models").stdout.split() == ["draft", "target"]  # no staging folder
    node_state.ssh(models.node, f"rm -rf {source}")
    assert models.run().rc == 0  # the tokenizer back from the mirror


def test_a_credential_of_a_source_url_is_never_written_on_the_node(models, first_run):
    assert first_run.rc == 0
    token = "mirror_integration_token_not_a_secret"
    pid = node_state.main_pid(models.node)
    guarded = MirrorProcess(models.tmp / "sources", models.tmp / "guarded.log", bind=models.node.host_ip,
                            options=("--basic-auth", "reader:" + token))
    try:
        in_url = {"type": "http", "url": guarded.url.replace("http://", f"http://reader:{token}@") + "/good/target"}
        result = models.run(sglang_models_target_source=in_url)
        models.refused_untouched(result, "sglang_models_target_source.url holds a credential",
                                 "sglang_models_target_http_headers")
        assert token not in result.stdout and guarded.requests() == []

        node_state.ssh(models.node, f"rm {TARGET}/{SHARD}")
        encoded = base64.b64encode(("reader:" + token).encode()).decode()
        fetched = models.run(sglang_models_target_source={"type": "http", "url": guarded.url + "/good/target"},
                             sglang_models_target_http_headers={"Authorization": "Basic " + encoded})
        assert fetched.rc == 0, node_state.failure_messages(fetched)
        requests = guarded.requests()
        assert ("good/target/" + SHARD) in [r["path"] for r in requests] and all(r["auth"] for r in requests)
    finally:
        guarded.stop()
    assert _files(models.node, TARGET)[SHARD][2] == next(
        e["sha256"] for e in models.manifests["target"] if e["path"] == SHARD)
    assert guarded.url + "/good/target" in node_state.ssh(models.node, f"cat {node_state.DOC}")
    for text in (token, encoded):
        assert text not in fetched.stdout
        assert _grep_node(models.node, text) == ["0"], text  # no file, no journal line
    assert node_state.main_pid(models.node) == pid
