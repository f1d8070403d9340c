"""Pure logic of library/sglang_gateway_worker.py: what sglang-router 0.3.2's worker API and
SGLang's /v1/loads answer, and what to do about it. No I/O here, so it is unit-tested as is.

sglang-router 0.3.2 (tried): GET /workers answers {"workers": [{"id", "url", "is_healthy",
"load", ...}], "total", "stats"}; POST /workers {"url"} answers 202 and adds the worker in the
background (after its /health, /server_info, /model_info answered); DELETE /workers/{id}
answers 202 and removes it in the background. The id is an opaque string the router made up;
only the listing maps a URL to it. With --api-key set, these routes want the same
"Authorization: Bearer KEY" as client requests.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def normalize_url(url):
    """Scheme and host lower-cased, default port made explicit, no trailing slash."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower() or "http"
    host = (parts.hostname or "").lower()
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    port = parts.port or (443 if scheme == "https" else 80)
    path = parts.path.rstrip("/")
    return urlunsplit((scheme, f"{host}:{port}", path, "", ""))


def workers_of(listing):
    """The worker entries of a GET /workers answer (0.3.2 wraps them; a bare list is accepted too)."""
    if isinstance(listing, dict):
        listing = listing.get("workers", [])
    if not isinstance(listing, list):
        raise ValueError(f"GET /workers answered neither a list nor {{'workers': [...]}}: {listing!r:.200}")
    return [w for w in listing if isinstance(w, dict)]


def matching(listing, worker_url):
    """The entries of a listing that are this worker, by normalized URL."""
    want = normalize_url(worker_url)
    return [w for w in workers_of(listing) if isinstance(w.get("url"), str) and normalize_url(w["url"]) == want]


def worker_id(entry):
    """The id DELETE /workers/{id} takes: the entry's id, else its URL (older routers)."""
    return str(entry.get("id") or entry.get("worker_id") or entry["url"])


def healthy(entries):
    """True when the worker is listed and every entry of it is healthy."""
    return bool(entries) and all(e.get("is_healthy") is True for e in entries)


def in_flight(loads):
    """Requests running or waiting on a SGLang server, from its GET /v1/loads answer
    (aggregate.total_reqs; else the sum over loads[] of num_total_reqs or running + waiting)."""
    if isinstance(loads, dict):
        aggregate = loads.get("aggregate")
        if isinstance(aggregate, dict) and isinstance(aggregate.get("total_reqs"), int):
            return aggregate["total_reqs"]
        loads = loads.get("loads")
    if not isinstance(loads, list):
        raise ValueError(f"/v1/loads answered no load list: {loads!r:.200}")
    total = 0
    for rank in loads:
        if "num_total_reqs" in rank:
            total += int(rank["num_total_reqs"])
        elif "num_reqs" in rank:  # /get_load's older shape
            total += int(rank["num_reqs"])
        else:
            total += int(rank.get("num_running_reqs", 0)) + int(rank.get("num_waiting_reqs", 0))
    return total


def plan(state, entries):
    """What to do for the wanted state given this worker's current entries:
    'add', 'remove', 'wait_healthy' (listed, not healthy yet) or 'none'."""
    if state == "absent":
        return "remove" if entries else "none"
    if not entries:
        return "add"
    return "none" if healthy(entries) else "wait_healthy"
