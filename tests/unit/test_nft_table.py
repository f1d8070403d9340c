"""module_utils/nft_table.py and library/sglang_nft_table.py on real nft 1.0.6 listings: the live table and the
rules file's table compared, whose a table is, and which names may reach nft at all."""

import json

import pytest
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args
from project_modules import REPO

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


RULESET = (FIXTURES / "ruleset-terse.txt").read_text()
MARK = "managed by sglang-canon"
INJECTED = "sglang_canon; insert rule inet sglang_canon input tcp dport 30000 accept; table inet sglang_canon"


def test_the_table_comment_tells_ours_from_another_owners(nft_table):
    assert nft_table.table_comments(RULESET) == {
        ("inet", "sglang_canon"): MARK, ("inet", "sglang_old"): MARK, ("inet", "someone_else"): None,
        ("ip", "filter"): "managed by someone", ("ip6", "mine"): None,
    }
    assert nft_table.ownership(RULESET, "inet", "sglang_canon", MARK) == ("ours", [("inet", "sglang_old")])
    assert nft_table.ownership(RULESET, "inet", "someone_else", MARK)[0] == "foreign"
    assert nft_table.ownership(RULESET, "ip", "filter", MARK)[0] == "foreign"
    # Same name, other family: another table.
    assert nft_table.ownership(RULESET, "inet", "mine", MARK)[0] == "missing"
    # Renamed: both earlier tables are ours, to be removed.
    assert nft_table.ownership(RULESET, "inet", "sglang_new", MARK) == (
        "missing", [("inet", "sglang_canon"), ("inet", "sglang_old")])
    assert nft_table.ownership("", "inet", "sglang_canon", MARK) == ("missing", [])


@pytest.mark.parametrize("name", ["sglang_canon", "t", "A" * 64, "fw_2"])
def test_identifiers_are_table_names(nft_table, name):
    assert nft_table.identifier_error(name, "sglang_firewall_table") is None


@pytest.mark.parametrize("name", [INJECTED, "", "a b", "1abc", "_x", "a-b", "a" * 65, "x\n", '"x"', None, 5])
def test_anything_else_is_refused_naming_the_variable(nft_table, name):
    assert nft_table.identifier_error(name, "sglang_firewall_table") == (
        "sglang_firewall_table: expected an nft identifier: a letter, then letters, digits or _, "
        f"at most 64 characters, got {name!r}")


# --- the module's main(), with nft answered from the fixtures --------------------------------

@pytest.fixture(scope="module")
def module_under_test(project_module, nft_table):  # pylint: disable=unused-argument  # registered first
    return project_module("library/sglang_nft_table.py")


class FakeNft:
    """nft on a node whose ruleset is `ruleset`; `nft -f` loads `loaded` (the ruleset after it)."""

    def __init__(self, ruleset, loaded=None):
        self.ruleset, self.loaded, self.calls = ruleset, loaded, []

    def run_command(self, argv):
        self.calls.append(argv[1:] if argv[0] == "nft" else argv[:2])
        if argv[:2] == ["unshare", "--net"]:
            return 0, SCRATCH, ""
        if argv[1:] == ["-t", "list", "ruleset"]:
            return 0, self.ruleset, ""
        if argv[1:3] == ["-j", "list"]:
            return 0, LIVE, ""
        if argv[1] == "-f":
            self.ruleset = self.loaded
        return 0, "", ""


@pytest.fixture(name="run")
def fixture_run(monkeypatch, capsys, module_under_test, tmp_path):
    rules = tmp_path / "sglang-canon.nft"
    rules.write_text("table inet sglang_canon {}\n")

    def run(nft, check_mode=False, **args):
        monkeypatch.setattr(basic.AnsibleModule, "run_command", lambda self, argv, **kw: nft.run_command(argv))
        monkeypatch.setattr(basic.AnsibleModule, "get_bin_path", lambda self, name, **kw: name)
        params = {"table": "sglang_canon", "path": str(rules), "owner_comment": MARK,
                  "name": "sglang_firewall_table", "_ansible_check_mode": check_mode, **args}
        with patch_module_args(params), pytest.raises(SystemExit) as exited:
            module_under_test.main()
        return exited.value.code, json.loads(capsys.readouterr().out)

    run.rules = str(rules)
    return run


@pytest.mark.parametrize("check_mode", [True, False])
def test_a_name_nft_would_split_into_commands_is_refused_before_nft_runs(run, check_mode):
    nft = FakeNft(RULESET)
    code, result = run(nft, check_mode=check_mode, table=INJECTED)
    assert code == 1 and result["failed"] is True
    assert result["msg"].startswith("sglang_firewall_table: expected an nft identifier")
    assert nft.calls == []


@pytest.mark.parametrize("check_mode", [True, False])
@pytest.mark.parametrize("state", ["present", "absent"])
def test_a_table_of_another_owner_is_neither_replaced_nor_deleted(run, check_mode, state):
    nft = FakeNft(RULESET)
    code, result = run(nft, check_mode=check_mode, table="someone_else", state=state)
    assert nft.calls[0] == ["-t", "list", "ruleset"]
    assert [call for call in nft.calls if "someone_else" in call] == []
    if state == "present":
        assert code == 1
        assert result["msg"] == (
            "sglang_firewall_table: the node already has a table inet someone_else that is not ours (its comment is "
            'not "managed by sglang-canon"); loading the rules file would replace it. Choose another name, or delete '
            "that table first if nothing needs it.")
    else:  # off: ours (under earlier names) go, the other owner's table of that name stays
        assert code == 0 and result["changed"] is True
        assert result["drifted"] == ["table inet sglang_canon present", "table inet sglang_old present"]
        deleted = [] if check_mode else [["delete", "table", "inet", "sglang_canon"], ["delete", "table", "inet", "sglang_old"]]
        assert nft.calls[1:] == deleted


def test_a_rename_loads_the_new_table_then_removes_ours_under_the_old_names(run):
    renamed = RULESET.replace("sglang_canon", "sglang_new").replace("table inet sglang_old", "table inet z_old")
    nft = FakeNft(RULESET, loaded=renamed)
    code, result = run(nft, table="sglang_new")
    assert code == 0 and result["changed"] is True
    assert result["drifted"] == [
        "table missing",
        "table inet sglang_canon still loaded (marked as ours, under another name)",
        "table inet sglang_old still loaded (marked as ours, under another name)",
    ]
    assert nft.calls == [
        ["-t", "list", "ruleset"], ["unshare", "--net"],
        ["-f", run.rules], ["-j", "list", "table", "inet", "sglang_new"], ["-t", "list", "ruleset"],
        ["delete", "table", "inet", "sglang_canon"], ["delete", "table", "inet", "sglang_old"],
    ]


def test_the_scan_reports_the_old_tables_and_changes_nothing(run):
    nft = FakeNft(RULESET)
    code, result = run(nft, check_mode=True)
    assert code == 0 and result["changed"] is True
    assert result["drifted"] == ["table inet sglang_old still loaded (marked as ours, under another name)"]
    assert [call for call in nft.calls if call[0] in ("-f", "delete")] == []


def test_a_rules_file_without_the_mark_fails_after_loading(run):
    nft = FakeNft("", loaded=RULESET.replace(f'\tcomment "{MARK}"\n', ""))
    code, result = run(nft)
    assert code == 1
    assert result["msg"] == f'{run.rules} does not give table inet sglang_canon the comment "{MARK}"'


@pytest.mark.parametrize("check_mode", [True, False])
def test_the_owner_check_before_the_rules_file_is_written_refuses_and_reads_nothing_else(run, check_mode):
    nft = FakeNft(RULESET)
    code, result = run(nft, check_mode=check_mode, table="someone_else", path=None, only_check_owner=True)
    assert code == 1 and result["msg"].startswith("sglang_firewall_table: the node already has a table inet someone_else")
    assert nft.calls == [["-t", "list", "ruleset"]]
    code, result = run(nft, check_mode=check_mode, table="sglang_new", path=None, only_check_owner=True)
    assert code == 0 and result["changed"] is False  # ours under another name is the load's business
    assert nft.calls == [["-t", "list", "ruleset"]] * 2


def test_an_earlier_releases_unmarked_table_is_recognised_by_our_rules_file(nft_table):
    header = "#!/usr/sbin/nft -f\n# Ansible managed (roles/sglang_firewall)\n"
    ours = header + "table inet sglang_canon {}\ndelete table inet sglang_canon\n\ntable inet sglang_canon {\n}\n"
    assert nft_table.defines_table(ours, "inet", "sglang_canon", "(roles/sglang_firewall)")
    assert not nft_table.defines_table(ours, "inet", "someone_else", "(roles/sglang_firewall)")
    assert not nft_table.defines_table(ours.replace("roles/sglang_firewall", "roles/other"), "inet", "sglang_canon",
                                       "(roles/sglang_firewall)")
    assert not nft_table.defines_table("", "inet", "sglang_canon", "(roles/sglang_firewall)")


@pytest.mark.parametrize("state", ["present", "absent"])
def test_a_table_an_earlier_release_left_without_the_mark_is_taken_over(run, nft_table, tmp_path, state):
    unmarked = RULESET.replace(f'\tcomment "{MARK}"\n', "", 1)
    assert nft_table.ownership(unmarked, "inet", "sglang_canon", MARK)[0] == "foreign"  # refused without the file
    earlier = tmp_path / "earlier.nft"
    earlier.write_text("# Ansible managed (roles/sglang_firewall)\ntable inet sglang_canon {\n}\n")
    nft = FakeNft(unmarked, loaded=RULESET)
    code, result = run(nft, state=state, earlier_rules_path=str(earlier))
    assert code == 0 and result["changed"] is True
    if state == "present":
        assert result["drifted"][0] == "table without the mark (made by an earlier release)"
        assert ["-f", run.rules] in nft.calls
    else:
        assert ["delete", "table", "inet", "sglang_canon"] in nft.calls


def test_a_file_of_another_owner_at_that_path_does_not_make_their_table_ours(run, tmp_path):
    unmarked = RULESET.replace(f'\tcomment "{MARK}"\n', "", 1)
    theirs = tmp_path / "theirs.nft"
    theirs.write_text("table inet sglang_canon {\n}\n")
    code, result = run(FakeNft(unmarked), earlier_rules_path=str(theirs))
    assert code == 1 and "is not ours" in result["msg"]

