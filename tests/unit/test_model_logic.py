"""Pure model logic of the sglang_models role: module_utils/model_manifest.py (manifest, quick vs
full verification, free space) and module_utils/model_checks.py (drafter vs target, weights vs
GPU memory, tokenizer files, safetensors headers), on the synthetic models of
tests/double/make_test_models.py (tests/fixtures/models/)."""

import copy
import hashlib
import io
import json
import sys

import pytest
from project_modules import REPO

FIXTURES = REPO / "tests" / "fixtures" / "models"


@pytest.fixture(scope="module")
def manifest(project_module):
    # The module imports these as ansible.module_utils.* (ansible.cfg's module_utils path at run time).
    return project_module("module_utils/model_manifest.py", as_name="ansible.module_utils.model_manifest")


@pytest.fixture(scope="module")
def checks(project_module):
    return project_module("module_utils/model_checks.py", as_name="ansible.module_utils.model_checks")


@pytest.fixture(scope="module")
def checks_module(project_module, manifest, checks):  # pylint: disable=unused-argument  # registered first
    return project_module("library/sglang_model_checks.py")


TARGET = json.loads((FIXTURES / "target-config.json").read_text())
DRAFT = json.loads((FIXTURES / "draft-config.json").read_text())
SHA_A = "a" * 64
SHA_B = "b" * 64


# --------------------------------------------------------------------------- manifest

def test_manifest_is_normalised_sorted_and_lower_cased(manifest):
    entries = [{"path": "b.safetensors", "size": "10", "sha256": SHA_A.upper()},
               {"path": "a/config.json", "size": 3, "sha256": SHA_B}]
    assert manifest.normalise_manifest(entries) == [
        {"path": "a/config.json", "size": 3, "sha256": SHA_B},
        {"path": "b.safetensors", "size": 10, "sha256": SHA_A}]


@pytest.mark.parametrize("entry, message", [
    ({"path": "/etc/passwd", "size": 1, "sha256": SHA_A}, "plain relative path"),
    ({"path": "../x", "size": 1, "sha256": SHA_A}, "plain relative path"),
    ({"path": "a/../b", "size": 1, "sha256": SHA_A}, "plain relative path"),
    ({"path": ".sglang-model.json", "size": 1, "sha256": SHA_A}, "plain relative path"),
    ({"path": "x", "size": -1, "sha256": SHA_A}, "size -1 is not a byte count"),
    ({"path": "x", "size": 1.5, "sha256": SHA_A}, "size 1.5 is not a byte count"),
    ({"path": "x", "size": 1, "sha256": "abc"}, "sha256 'abc' is not 64 hex digits"),
    ({"path": "x", "size": 1}, "must have exactly path, size and sha256"),
])
def test_manifest_refuses_bad_entries_naming_the_variable(manifest, entry, message):
    with pytest.raises(manifest.ManifestError) as error:
        manifest.normalise_manifest([entry], "sglang_models_target_manifest")
    assert message in str(error.value) and "sglang_models_target_manifest entry 1" in str(error.value)


def test_manifest_refuses_a_path_listed_twice_and_an_empty_list(manifest):
    with pytest.raises(manifest.ManifestError, match="listed twice"):
        manifest.normalise_manifest([{"path": "x", "size": 1, "sha256": SHA_A}] * 2)
    with pytest.raises(manifest.ManifestError, match="non-empty list"):
        manifest.normalise_manifest([])


def test_digest_is_sha256sum_lines_and_changes_with_any_field(manifest):
    entries = manifest.normalise_manifest([{"path": "x", "size": 1, "sha256": SHA_A}])
    expected = hashlib.sha256(("%s  1  x\n" % SHA_A).encode()).hexdigest()
    assert manifest.manifest_digest(entries) == expected
    for field, value in (("size", 2), ("sha256", SHA_B), ("path", "y")):
        other = copy.deepcopy(entries)
        other[0][field] = value
        assert manifest.manifest_digest(other) != expected


ENTRY = {"path": "model.safetensors", "size": 100, "sha256": SHA_A}


@pytest.mark.parametrize("observed, recorded, full, verdict", [
    ({"size": 100, "mtime_ns": 7}, 7, False, "OK"),      # a no-op run: stat only
    ({"size": 100, "mtime_ns": 7}, 7, True, "HASH"),     # sglang_models_verify: full
    ({"size": 100, "mtime_ns": 8}, 7, False, "HASH"),    # touched: only the hash can tell
    ({"size": 100, "mtime_ns": 7}, None, False, "HASH"), # never recorded (adopted folder)
    ({"size": 99, "mtime_ns": 7}, 7, False, "WRONG_SIZE"),
    (None, 7, False, "MISSING"),
])
def test_quick_verdict_hashes_only_when_size_and_mtime_cannot_vouch(manifest, observed, recorded, full, verdict):
    assert manifest.quick_verdict(ENTRY, observed, recorded, full) == getattr(manifest, verdict)  # the constant's name


def test_hashed_verdict_names_both_digests(manifest):
    assert manifest.hashed_verdict(ENTRY, SHA_A) == manifest.OK
    assert manifest.hashed_verdict(ENTRY, SHA_B) == "sha256 %s, manifest says %s" % (SHA_B, SHA_A)


def test_file_sha256_continues_a_partial_hash(manifest):
    data = b"x" * (manifest.HASH_CHUNK + 5)
    start = manifest.file_sha256(io.BytesIO(data[:10]))
    assert manifest.file_sha256(io.BytesIO(data[10:]), start).hexdigest() == hashlib.sha256(data).hexdigest()


def test_record_round_trips_and_a_damaged_record_means_hash_everything(manifest):
    entries = manifest.normalise_manifest([ENTRY])
    text = manifest.record_text(entries, {"type": "http", "url": "http://m/t"}, "r1", {"model.safetensors": 7})
    record = manifest.parse_record(text)
    assert record["manifest"] == entries and record["mtime_ns"] == {"model.safetensors": 7}
    assert record["manifest_digest"] == manifest.manifest_digest(entries) and record["revision"] == "r1"
    assert manifest.parse_record(None) is None
    assert manifest.parse_record("{not json") is None
    assert manifest.parse_record('{"manifest": []}') is None


def test_staging_and_previous_are_hidden_siblings_on_the_same_filesystem(manifest):
    assert manifest.staging_paths("/data/models/target/") == (
        "/data/models/.target.sglang-staging", "/data/models/.target.sglang-previous")


def test_free_space_refusal_names_needed_and_available(manifest):
    assert manifest.free_space_problem("sglang_models_target_source", "/data/models", 10, 10) is None
    message = manifest.free_space_problem("sglang_models_target_source", "/data/models", 3 << 30, 1 << 30)
    assert message == ("not enough free space for sglang_models_target_source: the files still to fetch need "
                       "3221225472 bytes (3.00 GiB) on the filesystem of /data/models, 1073741824 bytes "
                       "(1.00 GiB) are available")


def test_unexpected_entries_are_what_the_folder_holds_beyond_the_manifest(manifest):
    listed = ["config.json", "sub/model.safetensors"]
    listing = [("config.json", False), (manifest.RECORD_NAME, False), ("sub", True), ("sub/model.safetensors", False),
               ("sub/stray.bin", False), ("model-00003-of-00002.safetensors", False), ("junk", True),
               ("junk/deep", True), ("junk/deep/x", False), ("link-to-dir", False)]
    assert manifest.unexpected_entries(listed, listing) == [
        "junk", "link-to-dir", "model-00003-of-00002.safetensors", "sub/stray.bin"]
    assert manifest.unexpected_entries(listed, listing[:4]) == []
    # A file where the manifest needs a folder is unexpected too (the folder's file is then missing).
    assert manifest.unexpected_entries(listed, [("sub", False)]) == ["sub"]


# --------------------------------------------------------------------------- sources

@pytest.fixture(scope="module")
def sources(project_module):
    return project_module("module_utils/model_sources.py", as_name="ansible.module_utils.model_sources")


@pytest.fixture(scope="module")
def source_rule(project_module):
    """The refusal of source URLs: the controller's filter alone (the module does not check again)."""
    return project_module("filter_plugins/model_source_problems.py")


@pytest.mark.parametrize("url, problem", [
    ("https://mirror.internal/models/target", None),
    ("http://10.0.0.5:8080/models", None),
    ("https://user:s3cret-token@mirror.internal/models", "holds a credential"),
    ("https://s3cret-token@mirror.internal/models", "holds a credential"),
    ("https://mirror.internal/models?X-Signature=s3cret-token", "without a query or fragment"),
    ("https://mirror.internal/models#s3cret-token", "without a query or fragment"),
    ("ftp://mirror.internal/models", "expected an http:// or https:// URL with a host"),
    ("https:///models", "expected an http:// or https:// URL with a host"),
    ("https://mirror.internal:99999/models", "does not parse"),
])
def test_a_source_url_holds_no_credential_and_the_refusal_never_quotes_it(source_rule, url, problem):
    problems = source_rule.url_problems(url, "sglang_models_target_source.url", "sglang_models_target_http_headers")
    if problem is None:
        assert problems == []
        return
    assert len(problems) == 1 and problem in problems[0], problems
    assert problems[0].startswith("sglang_models_target_source.url")
    assert "s3cret-token" not in problems[0] and "mirror.internal" not in problems[0]
    if problem == "holds a credential":
        assert "sglang_models_target_http_headers" in problems[0]


def test_source_problems_check_the_http_url_and_the_hub_endpoint(source_rule):
    def problems(spec):
        return source_rule.source_problems(spec, "sglang_models_draft_source", "sglang_models_draft_http_headers",
                                       "sglang_models_hf_token")
    assert problems({"type": "hf", "repo": "o/n", "endpoint": "https://u:t@hub.internal"})[0].startswith(
        "sglang_models_draft_source.endpoint holds a credential")
    assert "sglang_models_hf_token" in problems({"type": "hf", "endpoint": "https://u:t@hub.internal"})[0]
    assert problems({"type": "http", "url": "https://u:t@m"})[0].startswith("sglang_models_draft_source.url holds")
    assert problems({"type": "dir", "path": "/mnt/x"}) == problems({"type": "none"}) == problems(None) == []


def test_the_controller_filter_applies_the_same_rule_to_every_model(project_module):
    filters = project_module("filter_plugins/model_source_problems.py").FilterModule().filters()
    models = [{"source": {"type": "http", "url": "https://u:t@m/target"}, "label": "sglang_models_target_source",
               "headers_var": "sglang_models_target_http_headers"},
              {"source": {"type": "http", "url": "https://m/draft?sig=t"}, "label": "sglang_models_draft_source",
               "headers_var": "sglang_models_draft_http_headers"}]
    found = filters["model_source_problems"](models)
    assert [p.split(" ")[0] for p in found] == ["sglang_models_target_source.url", "sglang_models_draft_source.url:"]


def test_credentials_follow_a_redirect_only_to_the_same_scheme_host_and_port(sources):
    assert sources.same_origin("https://mirror.internal/models/a", "https://mirror.internal:443/blobs/b")
    assert sources.same_origin("http://10.0.0.5:8080/a", "http://10.0.0.5:8080/b")
    assert not sources.same_origin("https://mirror.internal/a", "https://store.internal/a")
    assert not sources.same_origin("https://mirror.internal/a", "http://mirror.internal/a")  # a downgrade
    assert not sources.same_origin("http://10.0.0.5:8080/a", "http://10.0.0.5:8081/a")


def test_links_inside_a_dir_source_are_followed_and_links_out_of_it_are_named(sources, tmp_path):
    root = tmp_path / "source"
    (root / "blobs").mkdir(parents=True)
    (root / "blobs" / "abc").write_bytes(b"weights")
    (root / "snapshot").mkdir()
    (root / "snapshot" / "model.safetensors").symlink_to("../blobs/abc")  # stays inside: followed
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$...")
    (root / "absolute").symlink_to(secret)
    (root / "relative").symlink_to("../shadow")
    (root / "escape").symlink_to("..")  # a folder out of the source, used as a path component
    real = str(root.resolve())
    assert sources.link_leaving(real, "snapshot/model.safetensors") is None
    assert sources.link_leaving(real, "blobs/abc") is None
    assert sources.link_leaving(real, "absolute") == (real + "/absolute", str(secret), str(secret.resolve()))
    assert sources.link_leaving(real, "relative") == (real + "/relative", "../shadow", str(secret.resolve()))
    assert sources.link_leaving(real, "escape/shadow") == (real + "/escape", "..", str(tmp_path.resolve()))

    source = sources.DirectorySource({"path": str(root)}, "sglang_models_target_source")
    stream, _offset = source.open("snapshot/model.safetensors")
    with stream:
        assert stream.read() == b"weights"
    for path, link, target in (("absolute", "absolute", str(secret)), ("relative", "relative", "../shadow"),
                               ("escape/shadow", "escape", "..")):
        with pytest.raises(sources.SourceError) as refused:
            source.open(path)
        assert str(refused.value).startswith(
            "sglang_models_target_source: %s/%s in the dir source %s is a symbolic link to %s, which leads to "
            % (real, link, root, target)), str(refused.value)
        assert "outside the source folder" in str(refused.value)


def test_a_dir_source_gives_only_regular_files(sources, tmp_path):
    import os  # pylint: disable=import-outside-toplevel
    (tmp_path / "sub").mkdir()
    os.mkfifo(str(tmp_path / "pipe"))
    source = sources.DirectorySource({"path": str(tmp_path)}, "sglang_models_target_source")
    for path in ("sub", "pipe"):
        with pytest.raises(sources.SourceError, match="is not a regular file|Is a directory"):
            source.open(path)


# --------------------------------------------------------------------------- drafter vs target

DRAFT_TENSORS = {"d2t": [512], "t2d": [1024]}


def _drafter(checks, target=TARGET, draft=DRAFT, tensors=DRAFT_TENSORS, algorithm="EAGLE3"):
    return checks.drafter_problems(target, draft, algorithm, "sglang_model_path", "sglang_draft_model_path", tensors)


def test_the_synthetic_drafter_belongs_to_its_target(checks):
    assert _drafter(checks) == []


def test_a_drafter_of_another_hidden_size_is_refused_naming_both_values(checks):
    draft = dict(DRAFT, hidden_size=128)
    assert _drafter(checks, draft=draft) == [
        "drafter hidden size 128 (sglang_draft_model_path) does not belong to target hidden size 64 (sglang_model_path)"]


def test_target_hidden_size_of_the_drafter_wins_over_its_own(checks):
    assert _drafter(checks, draft=dict(DRAFT, hidden_size=128, target_hidden_size=64)) == []
    assert "hidden size 32" in _drafter(checks, draft=dict(DRAFT, target_hidden_size=32))[0]


def test_a_drafter_of_another_vocabulary_is_refused(checks):
    assert _drafter(checks, draft=dict(DRAFT, vocab_size=32000)) == [
        "drafter vocab_size 32000 (sglang_draft_model_path) does not belong to target vocab_size 1024 (sglang_model_path)"]


def test_a_reduced_draft_vocabulary_needs_its_mapping_tensor_of_the_right_length(checks):
    assert "hold no d2t tensor" in _drafter(checks, tensors={})[0]
    assert _drafter(checks, tensors={"d2t": [256]}) == [
        "drafter d2t tensor has shape [256], draft_vocab_size 512 needs [512] (sglang_draft_model_path)"]
    full_vocab = dict(DRAFT, draft_vocab_size=1024)
    assert _drafter(checks, draft=full_vocab, tensors={}) == []


def test_a_drafter_that_is_no_eagle3_head_is_refused_and_a_drafter_as_target_too(checks):
    problems = _drafter(checks, draft=dict(DRAFT, architectures=["LlamaForCausalLM"]))
    assert problems == ['drafter architectures ["LlamaForCausalLM"] (sglang_draft_model_path) hold no EAGLE3 head '
                        "(an architecture ending in 'Eagle3'), as speculative_algorithm EAGLE3 needs; "
                        'target architectures ["LlamaForCausalLM"] (sglang_model_path)']
    assert "are a drafter's" in _drafter(checks, target=DRAFT)[0]


def test_multimodal_targets_are_read_from_their_text_config(checks):
    nested = {"architectures": ["Qwen3VLForConditionalGeneration"], "text_config": dict(TARGET)}
    assert _drafter(checks, target=nested) == []


# --------------------------------------------------------------------------- weights vs GPUs

NAMES = {"tp_size": "sglang_server_args.tp_size", "gpu_memory": "gpu_topology (smallest GPU)",
         "mem_fraction_static": "sglang_server_args.mem_fraction_static", "headroom": "sglang_models_kv_cache_min_gib"}


def test_weights_count_only_weight_files(checks):
    files = [{"path": "model-00001-of-00002.safetensors", "size": 5}, {"path": "config.json", "size": 7},
             {"path": "pytorch_model.bin", "size": 11}, {"path": "tokenizer.json", "size": 13}]
    assert checks.weights_bytes(files) == 16


def test_a_model_that_fits_passes(checks):
    # 8 x 97887 MiB (RTX PRO 6000 capture), 0.88: 84.1 GiB per GPU; 600 GiB of weights = 75 GiB per GPU.
    assert checks.fit_problem({"target": 600 << 30}, 8, 97887, 0.88, 4, NAMES) is None


def test_a_model_too_big_is_refused_with_the_numbers(checks):
    message = checks.fit_problem({"target": 640 << 30, "drafter": 2 << 30}, 8, 97887, 0.88, 4, NAMES)
    assert message == (
        "the weights do not fit the GPUs: drafter 2.00 GiB + target 640.00 GiB = 642.00 GiB over "
        "sglang_server_args.tp_size 8 = 80.25 GiB per GPU, plus sglang_models_kv_cache_min_gib 4.00 GiB of KV "
        "cache, is 84.25 GiB; a GPU gives SGLang 84.12 GiB = 97887 MiB (gpu_topology (smallest GPU)) x "
        "sglang_server_args.mem_fraction_static 0.88")


def test_tensor_parallelism_divides_the_weights(checks):
    assert checks.fit_problem({"target": 160 << 30}, 1, 97887, 0.88, 4, NAMES) is not None
    assert checks.fit_problem({"target": 160 << 30}, 2, 97887, 0.88, 4, NAMES) is None


def test_models_on_one_filesystem_share_its_free_space(checks_module):
    target = {"needed_bytes": 600, "available_bytes": 1000, "filesystem": 1, "folder": "/data/models/target"}
    draft = {"needed_bytes": 500, "available_bytes": 1000, "filesystem": 1, "folder": "/data/models/draft"}
    elsewhere = dict(draft, filesystem=2, folder="/scratch/draft")
    assert checks_module.space_problems([("sglang_server_args.model_path", target),
                                         ("sglang_server_args.speculative_draft_model_path", elsewhere)]) == []
    assert checks_module.space_problems([("sglang_server_args.model_path", target),
                                         ("sglang_server_args.speculative_draft_model_path", draft)]) == [
        "not enough free space for sglang_server_args.model_path and sglang_server_args.speculative_draft_model_path: "
        "the files still to fetch need 1100 bytes (0.00 GiB), the filesystem holding /data/models/target has 1000 "
        "bytes (0.00 GiB) available"]


# --------------------------------------------------------------------------- tokenizer, safetensors

@pytest.mark.parametrize("files", [
    ["tokenizer_config.json", "tokenizer.json"],
    ["tokenizer_config.json", "tokenizer.model"],
    ["tokenizer_config.json", "vocab.json", "merges.txt"],
])
def test_tokenizer_sets_that_transformers_loads(checks, files):
    assert checks.tokenizer_problem(files + ["config.json"], "sglang_model_path") is None


def test_missing_tokenizer_files_are_named(checks):
    assert checks.tokenizer_problem(["config.json", "vocab.json"], "sglang_model_path") == (
        "the target model (sglang_model_path) lacks the tokenizer files the server loads: tokenizer_config.json; "
        "tokenizer.json or tokenizer.model or vocab.json+merges.txt or tiktoken.model")


def test_safetensors_header_of_the_real_drafter(checks):
    head = (FIXTURES / "eagle3-draft.safetensors-head").read_bytes()
    tensors = checks.safetensors_header(lambda offset, length: head[offset:offset + length])
    assert tensors == {"d2t": [512], "fc.weight": [64, 192], "lm_head.weight": [512, 64],
                       "midlayer.mlp.up_proj.weight": [128, 64], "t2d": [1024]}


def test_an_implausible_safetensors_header_is_refused(checks):
    junk = b"\xff" * 16
    with pytest.raises(ValueError, match="not plausible"):
        checks.safetensors_header(lambda offset, length: junk[offset:offset + length])


# --------------------------------------------------------------------------- scripts/model-manifest

def test_model_manifest_script_pins_every_file_the_module_accepts(manifest, tmp_path):
    import subprocess  # pylint: disable=import-outside-toplevel
    import yaml  # pylint: disable=import-outside-toplevel
    (tmp_path / "sub").mkdir()
    (tmp_path / ".cache").mkdir()
    files = {"config.json": b"{}", "sub/model.safetensors": b"\x00" * 1000}
    for path, data in files.items():
        (tmp_path / path).write_bytes(data)
    (tmp_path / ".cache" / "lock").write_bytes(b"x")  # tool state, left out
    (tmp_path / manifest.RECORD_NAME).write_text("{}")  # the module's own record, left out
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "model-manifest"), str(tmp_path),
                           "--var", "sglang_models_draft_manifest"], capture_output=True, text=True, check=True)
    pinned = yaml.safe_load(done.stdout)["sglang_models_draft_manifest"]
    assert pinned == [{"path": p, "size": len(d), "sha256": hashlib.sha256(d).hexdigest()}
                      for p, d in sorted(files.items())]
    assert manifest.normalise_manifest(pinned) == pinned
