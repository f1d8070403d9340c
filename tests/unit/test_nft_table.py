"""module_utils/nft_table.py: the live table and the rules file's table compared on real nft 1.0.6 listings."""

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "nft"


@pytest.fixture(scope="module")
def nft_table(project_module):
    # the name library/sglang_nft_table.py imports it by
    return project_module("module_utils/nft_table.py", as_name="ansible.module_utils.nft_table")


LIVE = (FIXTURES / "sglang-canon-live.json").read_text()
SCRATCH = (FIXTURES / "sglang-canon-scratch.json").read_text()
DRIFTED = (FIXTURES / "sglang-canon-drifted.json").read_text()


def test_the_same_table_loaded_twice_differs_only_in_handles(nft_table):
    assert LIVE != SCRATCH  # the kernel numbered the tables differently
    assert nft_table.differences(LIVE, SCRATCH) == []


def test_normalize_drops_metainfo_handles_and_counters(nft_table):
    listing = {"nftables": [
        {"metainfo": {"version": "1.0.6"}},
        {"rule": {"family": "inet", "table": "t", "chain": "c", "handle": 4,
                  "expr": [{"counter": {"packets": 12, "bytes": 720}}, {"accept": None}]}},
    ]}
    assert nft_table.normalize(json.dumps(listing)) == [
        {"rule": {"family": "inet", "table": "t", "chain": "c", "expr": [{"counter": {}}, {"accept": None}]}},
    ]


def test_a_deleted_rule_and_an_added_element_are_named(nft_table):
    assert nft_table.differences(DRIFTED, SCRATCH) == [
        "1 set(s) missing", "1 set(s) not in the rules file", "1 rule(s) missing",
    ]


def test_a_missing_table_is_named(nft_table):
    assert nft_table.differences("", SCRATCH) == ["table missing"]


def test_rules_in_another_order_are_drift(nft_table):
    objects = json.loads(SCRATCH)
    rules = [o for o in objects["nftables"] if "rule" in o]
    others = [o for o in objects["nftables"] if "rule" not in o]
    swapped = {"nftables": others + rules[::-1]}
    assert nft_table.differences(json.dumps(swapped), SCRATCH) == ["rules in another order"]
