"""What sglang_gateway_worker makes of sglang-router 0.3.2's worker listing and SGLang's /v1/loads
(module_utils/gateway_workers.py), and the load client's percentiles (benchmarks/gateway_load.py)."""

import pytest

# GET /workers of sglang-router 0.3.2 with two workers, as it answered (one line, wrapped here).
LISTING = {
    "workers": [
        {"id": "c6274662-dbac-40b8-8795-f6b0b42b4675", "url": "http://10.213.0.202:30000", "model_id": "unknown",
         "priority": 50, "cost": 1.0, "worker_type": "regular", "is_healthy": True, "load": 0,
         "connection_mode": "HTTP", "disable_health_check": False},
        {"id": "6e807740-4a2e-4ea0-96c5-6d045a547c90", "url": "http://10.213.0.206:30000", "model_id": "unknown",
         "priority": 50, "cost": 1.0, "worker_type": "regular", "is_healthy": False, "load": 3,
         "connection_mode": "HTTP", "disable_health_check": False},
    ],
    "total": 2,
    "stats": {"prefill_count": 0, "decode_count": 0, "regular_count": 2},
}


@pytest.fixture(scope="module")
def gw(project_module):
    return project_module("module_utils/gateway_workers.py")


def test_a_worker_is_found_by_its_url_however_it_is_spelled(gw):
    for spelling in ("http://10.213.0.202:30000", "http://10.213.0.202:30000/", "HTTP://10.213.0.202:30000"):
        (entry,) = gw.matching(LISTING, spelling)
        assert gw.worker_id(entry) == "c6274662-dbac-40b8-8795-f6b0b42b4675"
    assert gw.matching(LISTING, "http://10.213.0.202:30001") == []
    assert gw.matching(LISTING, "http://10.213.0.20:30000") == []
    assert gw.normalize_url("https://[::1]/") == "https://[::1]:443"


def test_plan_follows_membership_and_health(gw):
    healthy = gw.matching(LISTING, "http://10.213.0.202:30000")
    unhealthy = gw.matching(LISTING, "http://10.213.0.206:30000")
    assert gw.plan("absent", healthy) == "remove"
    assert gw.plan("absent", []) == "none"
    assert gw.plan("present", []) == "add"
    assert gw.plan("present", healthy) == "none"
    assert gw.plan("present", unhealthy) == "wait_healthy"


def test_a_listing_that_is_not_one_is_refused(gw):
    with pytest.raises(ValueError, match="GET /workers"):
        gw.matching({"workers": "nope"}, "http://a:1")
    assert gw.matching([LISTING["workers"][0]], "http://10.213.0.202:30000")  # a bare list is read too


def test_in_flight_from_v1_loads_and_older_shapes(gw):
    # SGLang 0.5.9's /v1/loads: aggregate first
    assert gw.in_flight({"loads": [{"num_running_reqs": 5, "num_waiting_reqs": 1, "num_total_reqs": 6}],
                         "aggregate": {"total_reqs": 6}}) == 6
    # without aggregate: per DP rank
    assert gw.in_flight({"loads": [{"num_running_reqs": 2, "num_waiting_reqs": 1}, {"num_total_reqs": 4}]}) == 7
    # /get_load's list
    assert gw.in_flight([{"dp_rank": 0, "num_reqs": 3, "num_waiting_reqs": 0}]) == 3
    with pytest.raises(ValueError, match="v1/loads"):
        gw.in_flight({"error": "x"})


def test_load_client_percentiles(project_module):
    load = project_module("benchmarks/gateway_load.py")
    values = [i / 100 for i in range(1, 101)]
    assert load.percentile(values, 50) == pytest.approx(0.50, abs=0.011)
    assert load.percentile(values, 99) == pytest.approx(0.99, abs=0.011)
    assert load.percentile([], 50) is None
    assert load.request_body("/v1/chat/completions", 8, True)["messages"][0]["role"] == "user"
