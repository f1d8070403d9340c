"""What a patch says about itself, for production_v2.md (pure functions).

Filters:
  patch_header(text) -> {subject, sections: [{label, text}]} from a patch file's leading text

sglang-canon's patches open with a mail-style header before the first diff: a `Subject:` line,
then paragraphs, each starting with a label (`What:`, `Why:`, `Files:`, or another short phrase
ending in a colon, e.g. `How far the skip goes:`). Lines are re-joined (the header is wrapped
at 80 columns); an unlabelled paragraph continues the section before it. A patch without such a
header gives an empty subject and no sections: the document then says so instead of guessing.
"""

from __future__ import annotations

import re

# Where the diff starts: everything before it is the header (git format-patch's "---" line
# before the diffstat counts too).
_DIFF_START = re.compile(r"^(?:--- |diff --git |Index: |---$)")
# A paragraph's label: a short phrase of words, then a colon and the text.
_LABEL = re.compile(r"^([A-Z][A-Za-z0-9 ,'()/-]{0,40}):\s+(\S.*)$", re.DOTALL)


def _header_lines(text):
    lines = []
    for line in text.splitlines():
        if _DIFF_START.match(line):
            break
        lines.append(line.rstrip())
    return lines


def _join(lines):
    """Wrapped lines back into one: a line break after an opening bracket was no space."""
    text = ""
    for line in lines:
        text += line if not text or text.endswith(("(", "[")) else " " + line
    return text


def _paragraphs(lines):
    paragraph = []
    for line in lines:
        if line.strip():
            paragraph.append(line.strip())
        elif paragraph:
            yield _join(paragraph)
            paragraph = []
    if paragraph:
        yield _join(paragraph)


def patch_header(text):
    """{subject, sections} of a patch's leading text; see the module docstring."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    subject = ""
    sections = []
    for paragraph in _paragraphs(_header_lines(text or "")):
        if paragraph.startswith("Subject:") and not subject and not sections:
            subject = paragraph[len("Subject:"):].strip()
            continue
        match = _LABEL.match(paragraph)
        if match:
            sections.append({"label": match.group(1), "text": match.group(2)})
        elif sections:
            sections[-1]["text"] += " " + paragraph
        else:
            sections.append({"label": "", "text": paragraph})
    return {"subject": subject, "sections": sections}


class FilterModule:
    """production_doc's patch filters."""

    def filters(self):
        return {"patch_header": patch_header}
