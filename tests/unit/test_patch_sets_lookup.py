"""The sglang_patch_sets lookup: patch sets resolved on the controller, with every refusal named."""


import pytest
from project_modules import REPO

ROLE = REPO / "roles" / "sglang_patches"


@pytest.fixture(scope="module")
def lookup(project_module):
    return project_module("lookup_plugins/sglang_patch_sets.py")


def _set(root, name, patches, meta=None):
    folder = root / name
    folder.mkdir()
    for patch in patches:
        (folder / patch).write_text(f"--- {patch}\r\n", encoding="utf-8", newline="")
    if meta is not None:
        (folder / "set.yml").write_text(meta, encoding="utf-8")
    return folder


def test_the_shipped_set_resolves_in_set_yml_order_with_text(lookup):
    sets = [lookup.resolve_set("sglang-0.5.9", str(ROLE), "/nowhere")]
    assert sets[0]["dir"] == f"{ROLE}/files/sglang-0.5.9"
    assert (sets[0]["exists"], sets[0]["package"], sets[0]["version"]) == (True, "sglang", "0.5.9")
    assert sets[0]["patches"] == ["0001-strict-sglang-enable-spec-v2.patch", "0002-spec-v2-skip-drafting-at-running-requests.patch"]
    assert lookup.set_errors(sets, "sglang", "0.5.9") == []
    patches = lookup.patches_in_order(sets)
    assert [patch["name"] for patch in patches] == [f"sglang-0.5.9/{name}" for name in sets[0]["patches"]]
    assert patches[0]["content"] == (ROLE / "files" / "sglang-0.5.9" / sets[0]["patches"][0]).read_text(encoding="utf-8")


def test_a_set_without_set_yml_is_named_package_version_and_applies_patches_sorted(lookup, tmp_path):
    _set(tmp_path, "sglang-0.5.9", ["b.patch", "a.patch", "notes.txt"])
    (tmp_path / "plays").mkdir()
    one = lookup.resolve_set("../sglang-0.5.9", "/role", str(tmp_path / "plays"))
    assert one["dir"] == f"{tmp_path}/plays/../sglang-0.5.9"
    assert (one["name"], one["package"], one["version"], one["patches"]) == ("sglang-0.5.9", "sglang", "0.5.9", ["a.patch", "b.patch"])
    assert lookup.patches_in_order([one])[0]["content"] == "--- a.patch\r\n"  # bytes as they are: CRLF kept


def test_every_refusal_is_named_with_the_set_and_its_folder(lookup, tmp_path):
    other = _set(tmp_path, "other", ["x.patch"], "package: sglang\nversion: 0.5.8\n")
    short = _set(tmp_path, "short", ["x.patch"], "package: sglang\nversion: '0.5.9'\npatches: [x.patch, y.patch]\n")
    empty = _set(tmp_path, "sglang-0.5.9", [])
    sets = [lookup.resolve_set(str(path), "/role", "/plays") for path in (other, short, empty, tmp_path / "gone")]
    assert lookup.set_errors(sets, "sglang", "0.5.9") == [
        f"sglang_patches_sets: patch set other ({other}) was made for sglang 0.5.8 but this deployment runs sglang 0.5.9;"
        " nothing was changed.",
        f"Patch set short lists y.patch, which is not in {short}.",
        f"sglang_patches_sets: patch set sglang-0.5.9 ({empty}) has no patches; nothing was changed.",
        f"sglang_patches_sets: patch set gone ({tmp_path}/gone) does not exist; nothing was changed.",
    ]


def test_two_sets_of_one_name_are_refused(lookup, tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    sets = [lookup.resolve_set(str(_set(tmp_path / side, "sglang-0.5.9", ["x.patch"])), "/role", "/plays") for side in "ab"]
    assert lookup.set_errors(sets, "sglang", "0.5.9") == ["Patch set names must be unique: sglang-0.5.9, sglang-0.5.9"]


def test_a_trailing_slash_does_not_empty_the_name(lookup, tmp_path):
    folder = _set(tmp_path, "sglang-0.5.9", ["x.patch"])
    assert lookup.resolve_set(f"{folder}/", "/role", "/plays")["name"] == "sglang-0.5.9"


def test_set_yml_obsolete_rules_pass_through_for_the_upgrade_report(lookup, tmp_path):
    rule = {"file": "sglang/srt/environ.py", "contains": "class EnvStrictBool", "why": "upstream does it"}
    meta = "package: sglang\nversion: '0.5.99'\nobsolete:\n  0001-a.patch:\n" + "".join(
        f"    {key}: {value}\n" for key, value in rule.items())
    _set(tmp_path, "mine", ["0002-b.patch"], meta)
    assert lookup.resolve_set(str(tmp_path / "mine"), "/nowhere", "/nowhere")["obsolete"] == {"0001-a.patch": rule}
    assert lookup.resolve_set("sglang-0.5.9", str(ROLE), "/nowhere")["obsolete"] == {}
