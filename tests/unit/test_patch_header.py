"""What a patch says about itself (roles/production_doc/filter_plugins/patch_header.py), on the
patches sglang-canon ships and on the shapes a header may take."""


import pytest
from project_modules import REPO

PATCH_SET = REPO / "roles" / "sglang_patches" / "files" / "sglang-0.5.9"


@pytest.fixture(scope="module")
def header(project_module):
    return project_module("roles/production_doc/filter_plugins/patch_header.py")


def _sections(parsed):
    return {section["label"]: section["text"] for section in parsed["sections"]}


def test_every_shipped_patch_says_what_it_changes_and_why(header):
    patches = sorted(PATCH_SET.glob("*.patch"))
    assert len(patches) == 2
    for patch in patches:
        parsed = header.patch_header(patch.read_text())
        assert parsed["subject"], patch.name
        sections = _sections(parsed)
        assert {"What", "Why", "Files"} <= set(sections), (patch.name, list(sections))
        for text in sections.values():
            assert "@@" not in text and "+++" not in text  # nothing of the diff


def test_strict_spec_v2_patch(header):
    parsed = header.patch_header((PATCH_SET / "0001-strict-sglang-enable-spec-v2.patch").read_text())
    assert parsed["subject"] == "Refuse a misspelt SGLANG_ENABLE_SPEC_V2 at start-up"
    sections = _sections(parsed)
    assert sections["What"].startswith("SGLANG_ENABLE_SPEC_V2 becomes an EnvStrictBool. Accepted spellings stay")
    assert sections["Why"].startswith("stock 0.5.9 only warns")
    assert sections["Why"].endswith("the slower v1 speculative path that the benchmarks rejected, with nothing failing.")


def test_drafter_switch_patch_keeps_its_sections_in_order(header):
    parsed = header.patch_header((PATCH_SET / "0002-spec-v2-skip-drafting-at-running-requests.patch").read_text())
    assert parsed["subject"] == "Spec v2: skip the drafter at or above N running requests"
    assert [s["label"] for s in parsed["sections"]] == ["What", "How far the skip goes", "Why", "Files"]
    sections = _sections(parsed)
    # a line broken after "(" is joined without a space
    assert "should_skip_speculation(running, threshold) decides" in sections["What"]
    assert sections["Why"].startswith("the seed prepared this switch (left at 0, inactive)")


def test_an_unlabelled_paragraph_continues_the_section_before_it(header):
    text = "Subject: One\n\nWhat: first\nline.\n\nsecond paragraph.\n\nWhy: because.\n--- a/x\n+++ b/x\n"
    parsed = header.patch_header(text)
    assert parsed == {"subject": "One", "sections": [{"label": "What", "text": "first line. second paragraph."},
                                                     {"label": "Why", "text": "because."}]}


def test_format_patch_diffstat_separator_ends_the_header(header):
    text = "Subject: [PATCH] Two\n\nWhy: reasons.\n---\n x.py | 2 +-\n\ndiff --git a/x.py b/x.py\n"
    assert header.patch_header(text) == {"subject": "[PATCH] Two", "sections": [{"label": "Why", "text": "reasons."}]}


def test_a_bare_diff_has_no_header(header):
    assert header.patch_header("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n") == {"subject": "", "sections": []}
    assert header.patch_header(b"") == {"subject": "", "sections": []}
