"""Compare one nftables table as the kernel holds it with the table a rules file would load.

Pure logic for library/sglang_nft_table.py (unit-tested in tests/unit/test_nft_table.py).
Both sides are `nft -j list table FAMILY NAME` output: the live one from the node's ruleset, the
expected one from the same file loaded into a scratch network namespace, so both are in the
kernel's own canonical form and only what differs in meaning remains after normalize().
"""

from __future__ import annotations

import json

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
