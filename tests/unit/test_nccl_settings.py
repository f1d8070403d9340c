"""filter_plugins/nccl_settings.py: what NCCL accepts, which settings a node gets, how they are rendered."""

import ast

import pytest


@pytest.fixture(scope="module")
def ns(project_module):
    return project_module("filter_plugins/nccl_settings.py")


@pytest.fixture(scope="module")
def errors(ns):
    return ns.nccl_settings_errors


# --------------------------------------------------------------------------- valid values


@pytest.mark.parametrize(
    "settings",
    [
        {},
        None,
        {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"},  # the seed's PCIe pair
        {"NCCL_PROTO": "ll,simple"},  # case-insensitive like strcasecmp
        {"NCCL_PROTO": "^LL128"},
        {"NCCL_PROTO": "LL,Simple;allreduce:^LL"},  # NCCL's own parseList examples
        {"NCCL_PROTO": "^LL128;allreduce:LL128"},
        {"NCCL_ALGO": "ring,collnetdirect;allreduce:tree,collnetdirect;broadcast:ring"},
        {"NCCL_ALGO": "allreduce:tree,ring;broadcast:ring"},
        {"NCCL_ALGO": "allreduce:^tree"},
        {"NCCL_ALGO": "NVLS,NVLSTree,PAT,CollnetChain"},
        {"NCCL_P2P_DISABLE": "1", "NCCL_IB_DISABLE": 0, "NCCL_CUMEM_ENABLE": "0", "NCCL_NVLS_ENABLE": "0"},
        {"NCCL_P2P_LEVEL": "SYS"},
        {"NCCL_P2P_LEVEL": "NVL"},
        {"NCCL_P2P_LEVEL": 5},
        {"NCCL_NET_GDR_LEVEL": "PHB"},
        {"NCCL_MIN_NCHANNELS": 4, "NCCL_MAX_NCHANNELS": "16"},
        {"NCCL_MIN_CTAS": "8", "NCCL_MAX_CTAS": 8},
        {"NCCL_BUFFSIZE": 4194304},
        {"NCCL_NTHREADS": 256},
        {"NCCL_DEBUG": "INFO"},
        {"NCCL_DEBUG": "warn"},
        {"NCCL_DEBUG_SUBSYS": "INIT,ENV"},
        {"NCCL_DEBUG_SUBSYS": "^COLL"},
        {"NCCL_DEBUG_FILE": "/tmp/nccl.%h.%p.log"},
        {"NCCL_SOCKET_IFNAME": "eth0"},
        {"NCCL_SOCKET_IFNAME": "^docker,lo"},
        {"NCCL_SOCKET_IFNAME": "=ens1f0"},
    ],
)
def test_accepts_what_nccl_accepts(errors, settings):
    assert errors(settings) == []


# --------------------------------------------------------------------------- invalid values, each named


@pytest.mark.parametrize(
    "settings, needle",
    [
        ({"NCCL_PROTO": "LL129"}, "unknown protocol 'LL129'"),
        ({"NCCL_PROTO": "LL, Simple"}, "NCCL_PROTO"),  # NCCL would fail on ' Simple'
        ({"NCCL_PROTO": "LL,"}, "empty protocol"),
        ({"NCCL_PROTO": "^"}, "empty protocol"),
        ({"NCCL_ALGO": "Rings"}, "unknown algorithm 'Rings'"),
        ({"NCCL_ALGO": "allgatherv:ring"}, "unknown collective 'allgatherv'"),
        ({"NCCL_ALGO": "allreduce:tree;ring"}, "needs a collective prefix"),  # NCCL: only the first may lack one
        ({"NCCL_ALGO": "allreduce:tree:ring"}, "more than one ':'"),
        ({"NCCL_ALGO": "ring;"}, "empty ';' entry"),
        ({"NCCL_P2P_DISABLE": "2"}, "must be 0 or 1"),
        ({"NCCL_P2P_DISABLE": True}, "is a boolean"),
        ({"NCCL_IB_DISABLE": "yes"}, "must be 0 or 1"),
        ({"NCCL_P2P_LEVEL": "NODE"}, "NCCL_P2P_LEVEL='NODE'"),
        ({"NCCL_P2P_LEVEL": "sys"}, "NCCL_P2P_LEVEL"),  # path levels are exact
        ({"NCCL_P2P_LEVEL": 9}, "legacy integer 0-5"),
        ({"NCCL_MIN_NCHANNELS": "four"}, "must be an integer"),
        ({"NCCL_MAX_NCHANNELS": 0}, "between 1 and 64"),
        ({"NCCL_MIN_CTAS": 16, "NCCL_MAX_CTAS": 8}, "NCCL_MIN_CTAS=16 is greater than NCCL_MAX_CTAS=8"),
        ({"NCCL_NTHREADS": 100}, "multiple of 32"),
        ({"NCCL_NTHREADS": 1024}, "between 64 and 512"),
        ({"NCCL_BUFFSIZE": -1}, "must be >= 1"),
        ({"NCCL_DEBUG": "VERBOSE"}, "must be one of VERSION"),
        ({"NCCL_DEBUG_SUBSYS": "INIT,FOO"}, "unknown subsystem 'FOO'"),
        ({"NCCL_DEBUG_FILE": "nccl.log"}, "absolute path"),
        ({"NCCL_SOCKET_IFNAME": "eth0 eth1"}, "NCCL_SOCKET_IFNAME"),
        ({"NCCL_ALGOS": "Ring"}, "NCCL_ALGOS is not an NCCL variable sglang-canon knows"),  # NCCL ignores typos
        ({"CUDA_VISIBLE_DEVICES": "0"}, "not an NCCL_* variable"),
        ({"NCCL_PROTO": None}, "is null"),
        ({"NCCL_PROTO": ["LL"]}, "has type list"),
        ({"NCCL_PROTO": 'LL"'}, "quotes"),
        ({"NCCL_PROTO": "LL\nNCCL_ALGO=Tree"}, "NCCL_PROTO"),
        ({"NCCL_PROTO": " LL"}, "spaces"),
        ({"NCCL_PROTO": ""}, "empty"),
    ],
)
def test_refuses_and_names_the_variable(errors, settings, needle):
    found = errors(settings, "nccl_tuning_settings")
    assert len(found) == 1, found
    assert found[0].startswith("nccl_tuning_settings: ")
    assert needle in found[0]


def test_reports_every_problem_at_once(errors):
    found = errors({"NCCL_PROTO": "XX", "NCCL_ALGO": "YY", "NCCL_FOO": "1"})
    assert len(found) == 3
    assert [e.split(":")[1].split()[0].split("=")[0] for e in found] == ["NCCL_ALGO", "NCCL_FOO", "NCCL_PROTO"]


def test_not_a_mapping(errors):
    assert "must be a mapping" in errors(["NCCL_PROTO=LL"], "x")[0]


def test_candidate_errors_refuse_multicast_and_empty_candidates(ns):
    assert ns.nccl_candidate_errors({"key": "a", "value": {"NCCL_PROTO": "LL"}}) == []
    assert "non-empty" in ns.nccl_candidate_errors({"key": "a", "value": {}})[0]
    msg = ns.nccl_candidate_errors({"key": "nvls", "value": {"NCCL_NVLS_ENABLE": "1"}})
    assert msg == [
        "nccl_measure_candidates.nvls: NCCL_NVLS_ENABLE must stay 0 while measuring "
        "(NVLink multicast stays off)"
    ]


# --------------------------------------------------------------------------- normalize and render


def test_normalize_makes_sorted_strings(ns):
    assert ns.nccl_settings_normalize({"NCCL_PROTO": "LL", "NCCL_BUFFSIZE": 4194304}) == {
        "NCCL_BUFFSIZE": "4194304",
        "NCCL_PROTO": "LL",
    }
    assert list(ns.nccl_settings_normalize({"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"})) == ["NCCL_ALGO", "NCCL_PROTO"]
    assert ns.nccl_settings_normalize(None) == {}


def test_nccl_conf_block_is_plain_name_value_lines(ns):
    assert (
        ns.nccl_conf_block({"NCCL_PROTO": "LL", "NCCL_ALGO": "allreduce:tree;broadcast:ring"})
        == "NCCL_ALGO=allreduce:tree;broadcast:ring\nNCCL_PROTO=LL"
    )


def test_sitecustomize_block_is_python_that_only_sets_defaults(ns, monkeypatch):
    block = ns.nccl_sitecustomize_block({"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"})
    ast.parse(block)
    assert 'environ.setdefault("NCCL_ALGO", "Ring")' in block
    monkeypatch.setenv("NCCL_ALGO", "Tree")  # an explicit environment wins
    monkeypatch.delenv("NCCL_PROTO", raising=False)
    namespace = {}
    exec(compile(block, "sitecustomize.py", "exec"), namespace)  # noqa: S102 - our own rendered block
    import os

    assert os.environ["NCCL_ALGO"] == "Tree" and os.environ["NCCL_PROTO"] == "LL"
    assert "_sglang_canon_os" not in namespace  # leaves nothing behind in sitecustomize's namespace


def test_setting_reasons_flag_a_missing_reason(ns):
    got = ns.nccl_setting_reasons({"NCCL_PROTO": "LL", "NCCL_DEBUG": "INFO"}, {"NCCL_PROTO": "low latency"})
    assert got == {
        "NCCL_DEBUG": "No reason recorded (add one to nccl_tuning_setting_reasons).",
        "NCCL_PROTO": "low latency",
    }


# --------------------------------------------------------------------------- selection

PCIE = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}
BY = {"pcie": PCIE, "nvlink": {}, "mixed": {}}


def topo(interconnect, count=8):
    return {"gpu_count": count, "interconnect": interconnect, "gpus": [], "links": [], "nvlink": interconnect != "pcie"}


def test_pcie_node_gets_the_seed_set(ns):
    got = ns.select_settings(topo("pcie"), None, BY)
    assert got["settings"] == {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL"}
    assert got["source"] == "pcie default" and got["interconnect"] == "pcie"


@pytest.mark.parametrize("kind", ["nvlink", "mixed"])
def test_nvlink_and_mixed_nodes_keep_nccl_defaults(ns, kind):
    got = ns.select_settings(topo(kind), None, BY)
    assert got["settings"] == {} and got["source"] == f"{kind} default"


def test_explicit_settings_always_win_even_empty(ns):
    got = ns.select_settings(topo("pcie"), {}, BY)
    assert got["settings"] == {} and got["source"] == "inventory"
    got = ns.select_settings(
        topo("nvlink"), {"NCCL_DEBUG": "INFO"}, BY, measurement={"settings": {"NCCL_PROTO": "LL"}}, use_measurement=True
    )
    assert got["settings"] == {"NCCL_DEBUG": "INFO"} and got["source"] == "inventory"


def test_inventory_mapping_per_interconnect_is_used(ns):
    got = ns.select_settings(topo("nvlink"), None, dict(BY, nvlink={"NCCL_DEBUG": "WARN"}))
    assert got["settings"] == {"NCCL_DEBUG": "WARN"}


def test_interconnect_override_beats_the_facts(ns):
    assert ns.select_settings(topo("nvlink"), None, BY, interconnect="pcie")["settings"] == {
        "NCCL_ALGO": "Ring",
        "NCCL_PROTO": "LL",
    }
    assert ns.select_settings({}, None, BY, interconnect="pcie")["source"] == "pcie default"


def test_single_gpu_keeps_defaults(ns):
    got = ns.select_settings(topo("pcie", count=1), None, BY)
    assert got["settings"] == {} and got["source"] == "single gpu"


def test_measurement_is_used_only_when_asked(ns):
    measured = {"chosen": "seed-pcie", "settings": {"NCCL_PROTO": "LL"}, "rule": "r"}
    assert ns.select_settings(topo("nvlink"), None, BY, measurement=measured)["settings"] == {}
    got = ns.select_settings(topo("nvlink"), None, BY, measurement=measured, use_measurement=True)
    assert got["settings"] == {"NCCL_PROTO": "LL"} and got["source"] == "measurement"
    with pytest.raises(ValueError, match="nccl_measure"):
        ns.select_settings(
            topo("nvlink"), None, BY, measurement={"skipped": "1 GPU", "settings": None}, use_measurement=True
        )


def test_unknown_topology_is_an_error(ns):
    with pytest.raises(ValueError, match="gpu_preflight"):
        ns.select_settings({}, None, BY)
    with pytest.raises(ValueError, match="'infiniband' is not one of"):
        ns.select_settings(topo("infiniband"), None, BY)
