"""Compare one nftables table as the kernel holds it with the table a rules file would load.

Pure logic for library/sglang_nft_table.py (unit-tested in tests/unit/test_nft_table.py).
Both sides are `nft -j list table FAMILY NAME` output: the live one from the node's ruleset, the
expected one from the same file loaded into a scratch network namespace, so both are in the
kernel's own canonical form and only what differs in meaning remains after normalize().
Whose a table is comes from the text listing (`nft -t list ruleset`): the table comment that marks
ours (ownership()); and no name reaches nft unless it is an identifier (identifier_error()).
"""

from __future__ import annotations

import json
import re

# Keys the kernel assigns or counts, not part of what a rules file says.
_VOLATILE = {"handle", "packets", "bytes"}


def _strip(value):
    if isinstance(value, dict):
        return {key: _strip(item) for key, item in value.items() if key not in _VOLATILE}
    if isinstance(value, list):
        return [_strip(item) for item in value]
    return value


def normalize(listing):
    """The objects of an `nft -j` listing (text or parsed), without metainfo, handles and counters.

    Returns a list of {kind: body} dicts in listing order; an empty or missing listing gives [].
    """
    if isinstance(listing, str):
        listing = json.loads(listing) if listing.strip() else {}
    objects = (listing or {}).get("nftables", [])
    return [_strip(item) for item in objects if "metainfo" not in item]


def differences(live, expected):
    """Human-readable lines saying how the live table differs from the expected one ([] when equal)."""
    live_objects, expected_objects = normalize(live), normalize(expected)
    if live_objects == expected_objects:
        return []
    if not live_objects:
        return ["table missing"]
    lines = []
    for kind in ("table", "chain", "set", "rule"):
        have = [json.dumps(o[kind], sort_keys=True) for o in live_objects if kind in o]
        want = [json.dumps(o[kind], sort_keys=True) for o in expected_objects if kind in o]
        if have == want:
            continue
        missing = [w for w in want if w not in have]
        extra = [h for h in have if h not in want]
        if missing:
            lines.append(f"{len(missing)} {kind}(s) missing")
        if extra:
            lines.append(f"{len(extra)} {kind}(s) not in the rules file")
        if not missing and not extra:
            lines.append(f"{kind}s in another order")
    return lines or ["objects differ"]


# What nft's grammar takes as a table name without quoting, bounded: nft joins its arguments
# into one command line and runs each ';'-separated command of it, so a name is checked before
# it is passed (a name with ';' or a space would run commands of its own).
IDENTIFIER = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")  # whole value: fullmatch, so no "name\n"
IDENTIFIER_TEXT = "an nft identifier: a letter, then letters, digits or _, at most 64 characters"

# `nft list` prints each table at column 0, its comment (if any) on the next line. nft 1.0.6's
# JSON listing leaves table comments out, so the owner's mark is read from the text listing.
_TABLE_HEADER = re.compile(r'^table (ip|ip6|inet|arp|bridge|netdev) (\S+) \{\n(?:\tcomment "(.*)"\n)?', re.MULTILINE)


def identifier_error(value, name):
    """Why `value` cannot be given to nft as a table name (None when it can); `name` says what it is."""
    if isinstance(value, str) and IDENTIFIER.fullmatch(value):
        return None
    return f"{name}: expected {IDENTIFIER_TEXT}, got {value!r}"


def table_comments(ruleset_text):
    """{(family, name): comment or None} of every table in an `nft [-t] list ruleset` text listing.

    A table whose name is no identifier (made by hand with a quoted name) is left out: it is not
    ours, and its name could not be passed back to nft as it is.
    """
    return {(family, name): comment or None for family, name, comment in _TABLE_HEADER.findall(ruleset_text or "")
            if IDENTIFIER.fullmatch(name)}


def ownership(ruleset_text, family, table, mark):
    """Who holds the table family/table and which other tables carry our mark.

    Returns (state, others): state is "missing", "ours" (its comment is `mark`) or "foreign";
    others are the (family, name) of the other tables whose comment is `mark`, in listing order
    (ours under an earlier name: removed, or they would be left guarding ports nobody manages).
    """
    tables = table_comments(ruleset_text)
    if (family, table) not in tables:
        state = "missing"
    else:
        state = "ours" if tables[(family, table)] == mark else "foreign"
    others = [key for key, comment in tables.items() if comment == mark and key != (family, table)]
    return state, others


def defines_table(rules_text, family, table, signature):
    """Whether a rules file (its text) carrying `signature` defines the table family/table.

    Releases before the table comment wrote the same rules file: a table without the mark that the
    caller's own rules file defines is the caller's (the boot unit loads that file and would replace
    the table at the next boot anyway), so it is taken over rather than refused as another owner's.
    """
    if signature not in (rules_text or ""):
        return False
    header = re.compile(rf"^\s*table\s+{re.escape(family)}\s+{re.escape(table)}\s*\{{", re.MULTILINE)
    return bool(header.search(rules_text))

