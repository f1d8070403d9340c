"""Pick NCCL settings from an all-reduce latency table (stdlib only, no GPU needed).

The table is JSON lines, one per run (one run = one setting in fresh processes), as written by
nccl_allreduce_bench.py:

  {"candidate": "seed-pcie", "settings": {"NCCL_PROTO": "LL", ...}, "world": 2, "round": 1, "seq": 2,
   "us_per_allreduce": {"16384": 39.4, ...}, "spread_us": {"16384": 0.8, ...}, "correct": true}

The probe measures in rounds: NCCL's defaults, each candidate, NCCL's defaults, each candidate, ...,
NCCL's defaults, every run in fresh processes. All runs of one setting are its rounds, in table
order. Older tables (one run per setting, no "round") are read as one round each. Lines without
"candidate"/"settings" (tests/fixtures/nccl/h200x2-nvlink-nccl.txt) are understood too: the settings
are then the line's "env" minus bookkeeping names (NCCL_VERSION, and the variables every run carries).

Why rounds: NCCL's defaults measured 41.8 us at 16 KiB in one run and 26.0 us in the next, two
minutes later on the same H200 pair (tests/fixtures/gpu-runs/2026-11-29-h200x2{,-run2}), far more
than the spread of repetitions inside one run. The noise the rule uses is therefore the spread
between launches of NCCL's defaults, not only the spread within one.

Phases: the probe measures the sizes of both phases of the server (decode: one step's tokens;
prefill: a chunk of chunked prefill and shorter prefills) and records them with each run
("phases": {"decode": [...], "prefill": [...]}). A setting that wins at decode sizes can lose
badly at prefill sizes: on an H200 NVLink pair NCCL_PROTO=LL cost 1.7-2.5x from 16 MiB up, 3.0-3.4x
with P2P off (tests/fixtures/nccl/h200x2-nvlink-prefill-sizes.jsonl). Tables without phases are all
decode.

The rule (rule_text() below, stored next to the choice):
  1. The baseline is NCCL's own defaults (runs with no settings), measured in every round. Per
     size: median over its rounds, best = its fastest round, and between-round noise =
     (max - min) / 2 over its rounds, relative to the median.
  2. Per size, a candidate's latency is the median over its rounds, and
     noise = max(noise_floor, between-round noise of the defaults,
                 noise_mult x within-run spread / defaults' median),
     within-run spread = the larger of the defaults' and the candidate's spread ((max - min) / 2 of
     the repetitions of one run), each the median over rounds.
  3. A candidate is eligible only if every round ran, gave correct sums and covered every size,
     and at every size its latency <= the defaults' best round x (1 + noise): never slower than
     the most favourable measurement of NCCL's defaults, beyond measured noise. Every size counts
     here, decode and prefill alike: a loss at any of them refuses the candidate.
  4. Among eligible candidates the lowest geometric-mean latency wins, but only if its gain over
     the defaults' geometric mean (of the per-size medians) exceeds both min_gain and the
     geometric-mean noise of the defaults (half the range of the defaults' per-round geometric
     means, relative to their median), and only if the defaults were measured in at least
     min_default_rounds rounds (with one, the between-run noise is unknown). Otherwise NCCL's
     defaults are kept (an empty mapping). Ties go to fewer variables, then to the name.
     Geometric means are weighted by phase: each phase's weight (PHASE_WEIGHTS, or the weights
     given) is shared equally by its sizes, so a phase counts as a whole however many sizes
     measure it.
"""

from __future__ import annotations

import json
import math
import statistics

# Names present in every run's environment (safety and isolation) or pure bookkeeping: never
# part of what a candidate *is*.
BOOKKEEPING = frozenset({"NCCL_VERSION", "NCCL_NVLS_ENABLE", "NCCL_CONF_FILE"})

NOISE_MULT = 3.0
NOISE_FLOOR = 0.05
MIN_GAIN = 0.03
MIN_DEFAULT_ROUNDS = 2
# How much each phase weighs in the geometric mean, as a whole however many sizes measure it.
PHASE_WEIGHTS = {"decode": 1.0, "prefill": 1.0}


def phase_weights(weights=None):
    """The phases' weights, checked: {'decode': w, 'prefill': w}, none negative, not both 0."""
    out = dict(PHASE_WEIGHTS)
    for phase, value in (weights or {}).items():
        if phase not in out:
            raise ValueError(f"unknown phase {phase!r} in the weights (decode, prefill)")
        if value is None or float(value) < 0:
            raise ValueError(f"the {phase} weight must be a number >= 0, got {value!r}")
        out[phase] = float(value)
    if not any(out.values()):
        raise ValueError("the decode and prefill weights are both 0: nothing would count")
    return out


def rule_text(
    noise_mult=NOISE_MULT,
    noise_floor=NOISE_FLOOR,
    min_gain=MIN_GAIN,
    min_default_rounds=MIN_DEFAULT_ROUNDS,
    weights=None,
):
    """The rule in words. weights (decode and prefill phase weights) only where the table has prefill
    sizes: over decode sizes alone the weighted geometric mean is the plain one, and the text the
    same as before phases existed."""
    phased = ("", "")
    if weights is not None:
        weights = phase_weights(weights)
        phased = (
            ", decode and prefill sizes alike,",
            "; geometric means are weighted by phase (decode sizes "
            f"{weights['decode']:g} in all, prefill sizes {weights['prefill']:g} in all)",
        )
    return (
        "each setting's latency per size is the median over its rounds (fresh processes; NCCL's defaults "
        "run before, between and after the candidates' rounds); per size "
        f"noise = max({noise_floor:.0%}, half the range of the defaults' rounds / their median, "
        f"{noise_mult:g} x within-run spread / the defaults' median); a candidate is eligible only if every "
        f"round gave correct sums and at every size{phased[0]} its latency <= the defaults' "
        f"best round x (1 + noise){phased[1]}; "
        "the eligible candidate with the lowest geometric mean is chosen only if its gain over the defaults' "
        f"geometric mean exceeds both {min_gain:.0%} and the defaults' geometric-mean noise (half the range "
        f"of their per-round geometric means / their median), with the defaults measured in at least "
        f"{min_default_rounds} rounds; otherwise NCCL's defaults (no settings)"
    )


RULE = rule_text()


def load_records(lines):
    """Table records from JSON lines; other lines (NCCL INFO logs, '---', choice/skip lines) are skipped."""
    records = []
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and ("us_per_allreduce" in obj or "error" in obj) and "choice" not in obj:
            records.append(obj)
    return records


def settings_of(record):
    if isinstance(record.get("settings"), dict):
        return {k: str(v) for k, v in record["settings"].items()}
    env = record.get("env") or {}
    return {k: str(v) for k, v in env.items() if k.startswith("NCCL_") and k not in BOOKKEEPING}


def name_of(record):
    if record.get("candidate"):
        return str(record["candidate"])
    settings = settings_of(record)
    if not settings:
        return "defaults"
    return " ".join(f"{k}={v}" for k, v in sorted(settings.items()))


def _series(record, key):
    return {int(size): float(v) for size, v in (record.get(key) or {}).items()}


def geomean(values):
    values = [v for v in values if v > 0]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def phases_of(records):
    """{'decode': [sizes], 'prefill': [sizes]} as the probe recorded them with each run, or None
    (tables from before phases: every size is then a decode size)."""
    for record in records:
        if isinstance(record.get("phases"), dict):
            return {phase: sorted(int(s) for s in sizes) for phase, sizes in record["phases"].items()}
    return None


def phase_members(sizes, phases=None):
    """{'decode': [...], 'prefill': [...]}: the given sizes of each phase; a size in no phase
    (every size of a table from before phases) is a decode size."""
    members = {phase: [s for s in sizes if s in (phases or {}).get(phase, [])] for phase in PHASE_WEIGHTS}
    members["decode"] += [s for s in sizes if not any(s in m for m in members.values())]
    members["decode"].sort()
    return members


def size_weights(sizes, phases=None, weights=None):
    """Per size, its weight in the geometric mean: each phase's weight shared equally among that
    phase's sizes (a size in both phases gets both shares); a size in no phase counts as decode."""
    weights = phase_weights(weights)
    out = {s: 0.0 for s in sizes}
    for phase, members in phase_members(sizes, phases).items():
        for s in members:
            out[s] += weights[phase] / len(members)
    return out


def weighted_geomean(us, weights):
    """exp(sum w log us / sum w) over the sizes with a weight and a positive latency."""
    pairs = [(weights[s], us[s]) for s in weights if weights[s] > 0 and us.get(s, 0) > 0]
    total = sum(w for w, _ in pairs)
    if not total:
        return None
    return math.exp(sum(w * math.log(v) for w, v in pairs) / total)


def phase_of(size, phases):
    names = [phase for phase in ("decode", "prefill") if size in (phases or {}).get(phase, [])]
    return "+".join(names) or "decode"


def half_range(values):
    """(max - min) / 2: the spread of a few measurements of one thing."""
    values = list(values)
    return (max(values) - min(values)) / 2 if values else 0.0


def group_rounds(records):
    """[(name, settings, [records in table order])], NCCL's defaults first, then in order of appearance.

    Every run with no settings is a round of NCCL's defaults, named as the first of them ("defaults",
    or "p2p-off" where tests/gpu/gpu_tier_checks.py makes p2p-off the baseline)."""
    groups = {}
    for record in records:
        settings = settings_of(record)
        key = "" if not settings else name_of(record)
        if key not in groups:
            groups[key] = (name_of(record), settings, [])
        groups[key][2].append(record)
    ordered = [groups.pop("")] if "" in groups else []
    return ordered + list(groups.values())


def median_series(records, key="us_per_allreduce", sizes=None):
    """Per size, the median over the records (rounds) of one series; sizes missing in a round are skipped."""
    series = [_series(r, key) for r in records]
    sizes = sizes if sizes is not None else sorted({s for one in series for s in one})
    out = {}
    for s in sizes:
        values = [one[s] for one in series if s in one]
        if values:
            out[s] = statistics.median(values)
    return out


def _round_label(record, index):
    return record.get("round", index + 1)


def choose(
    records,
    noise_mult=NOISE_MULT,
    noise_floor=NOISE_FLOOR,
    min_gain=MIN_GAIN,
    sizes=None,
    min_default_rounds=MIN_DEFAULT_ROUNDS,
    weights=None,
    phases=None,
):
    """The choice and the evidence, as a JSON-ready dict. Raises ValueError without a defaults run.

    phases: {'decode': [sizes], 'prefill': [sizes]}; default: what the table's runs recorded.
    weights: {'decode': w, 'prefill': w} (PHASE_WEIGHTS where not given)."""
    weights = phase_weights(weights)
    phases = phases if phases is not None else phases_of(records)
    groups = group_rounds(records)
    if not groups or groups[0][1]:
        raise ValueError("no run under NCCL's defaults (a line with no NCCL settings) in the table")
    base_all = groups[0][2]
    base_runs = [r for r in base_all if "error" not in r]
    if not base_runs:
        raise ValueError("no run under NCCL's defaults (a line with no NCCL settings) in the table")
    base_rounds = [_series(r, "us_per_allreduce") for r in base_runs]
    if sizes:
        missing = sorted({s for s in sizes for one in base_rounds if s not in one})
        if missing:
            raise ValueError(f"sizes {missing} were not measured under NCCL's defaults")
        size_list = sorted(set(sizes))
    else:
        size_list = sorted(set.intersection(*(set(one) for one in base_rounds)))
    base_med = median_series(base_runs, sizes=size_list)
    base_best = {s: min(one[s] for one in base_rounds) for s in size_list}
    between = {s: half_range(one[s] for one in base_rounds) / base_med[s] for s in size_list}
    base_within = median_series(base_runs, "spread_us", size_list)
    size_weight = size_weights(size_list, phases, weights)
    by_phase = phase_members(size_list, phases)

    def geo(us):
        return weighted_geomean(us, size_weight)

    def vs_by_phase(us):
        return {
            phase: geomean(us[s] for s in members) / geomean(base_med[s] for s in members)
            for phase, members in by_phase.items()
            if members and all(s in us for s in members)
        }

    base_geo = geo(base_med)
    round_geos = [geo(one) for one in base_rounds]
    geo_noise = half_range(round_geos) / statistics.median(round_geos)
    needed_gain = max(min_gain, geo_noise)

    def noise_at(s, cand_within):
        within = max(base_within.get(s, 0.0), cand_within.get(s, 0.0))
        return max(noise_floor, between[s], noise_mult * within / base_med[s])

    rows = [
        {
            "candidate": groups[0][0],
            "settings": {},
            "baseline": True,
            "eligible": True,
            "rounds": len(base_runs),
            "geomean_us": base_geo,
            "vs_defaults": 1.0,
            "vs_defaults_by_phase": vs_by_phase(base_med),
            "why": f"NCCL's defaults (the baseline), measured in {len(base_runs)} round(s)"
            + (f"; {len(base_all) - len(base_runs)} more failed" if len(base_all) > len(base_runs) else ""),
            "us_per_allreduce": {str(s): base_med[s] for s in size_list},
            "best_us": {str(s): base_best[s] for s in size_list},
            "rounds_us": [{str(s): one[s] for s in size_list} for one in base_rounds],
            "round_geomeans_us": round_geos,
            "noise": {str(s): noise_at(s, {}) for s in size_list},
        }
    ]
    for name, settings, runs in groups[1:]:
        row = {"candidate": name, "settings": settings, "baseline": False, "rounds": len(runs)}
        rows.append(row)
        ran = [r for r in runs if "error" not in r]
        failed = [(_round_label(r, i), r["error"]) for i, r in enumerate(runs) if "error" in r]
        series = [_series(r, "us_per_allreduce") for r in ran]
        row["rounds_us"] = [{str(s): one[s] for s in size_list if s in one} for one in series]
        if not ran:
            errors = sorted({error for _, error in failed})
            row.update(eligible=False, geomean_us=None, vs_defaults=None, why=f"did not run: {'; '.join(errors)}")
            continue
        us = median_series(ran, sizes=size_list)
        row["us_per_allreduce"] = {str(s): us[s] for s in size_list if s in us}
        missing = sorted({s for s in size_list for one in series if s not in one})
        if missing:
            row.update(eligible=False, geomean_us=None, vs_defaults=None, why=f"not measured at sizes {missing}")
            continue
        mean = geo(us)
        row.update(
            geomean_us=mean,
            vs_defaults=mean / base_geo if base_geo else None,
            vs_defaults_by_phase=vs_by_phase(us),
        )
        if any(r.get("correct") is False for r in ran):
            row.update(eligible=False, why="wrong all-reduce sums (data corruption): never use")
            continue
        if failed:
            row.update(
                eligible=False,
                why="did not run in every round: " + "; ".join(f"round {k}: {error}" for k, error in failed),
            )
            continue
        cand_within = median_series(ran, "spread_us", size_list)
        noise = {s: noise_at(s, cand_within) for s in size_list}
        limit = {s: base_best[s] * (1 + noise[s]) for s in size_list}
        row.update(noise={str(s): noise[s] for s in size_list}, limit_us={str(s): limit[s] for s in size_list})
        slower = [
            f"{s} B{f' ({phase_of(s, phases)})' if phases else ''}: {us[s]:.1f} us vs {base_best[s]:.1f} us "
            f"(+{us[s] / base_best[s] - 1:.0%}, noise {noise[s]:.0%}, limit {limit[s]:.1f} us)"
            for s in size_list
            if us[s] > limit[s]
        ]
        if slower:
            row.update(
                eligible=False,
                why="slower than NCCL's defaults (best round) beyond noise at " + "; ".join(slower),
            )
        else:
            row.update(eligible=True, why="never slower than NCCL's defaults (best round) beyond noise")

    contenders = [r for r in rows if r["eligible"] and not r["baseline"]]
    contenders.sort(key=lambda r: (r["geomean_us"], len(r["settings"]), r["candidate"]))
    chosen = rows[0]
    decision = "no candidate was eligible: keep NCCL's defaults"
    if contenders:
        best = contenders[0]
        gain = 1.0 - best["vs_defaults"]
        need = (
            f"{min_gain:.0%} (min_gain)"
            if min_gain >= geo_noise
            else f"{geo_noise:.1%} (the defaults' geometric mean moved that much between rounds)"
        )
        if gain <= 0:
            decision = (
                f"best eligible candidate {best['candidate']!r} is {-gain:.1%} slower in geometric mean: "
                "keep NCCL's defaults"
            )
        elif gain <= needed_gain:
            decision = (
                f"best eligible candidate {best['candidate']!r} is only {gain:.1%} faster in geometric mean, "
                f"not more than {need}: keep NCCL's defaults"
            )
        elif len(base_runs) < min_default_rounds:
            decision = (
                f"best eligible candidate {best['candidate']!r} is {gain:.1%} faster in geometric mean, but "
                f"NCCL's defaults were measured in {len(base_runs)} round(s), fewer than {min_default_rounds}: "
                "the between-run noise is unknown, keep NCCL's defaults"
            )
        else:
            chosen = best
            decision = (
                f"{best['candidate']!r} is {gain:.1%} faster than NCCL's defaults in geometric mean "
                f"(more than {need})"
            )
    return {
        "rule": rule_text(
            noise_mult, noise_floor, min_gain, min_default_rounds, weights if by_phase["prefill"] else None
        ),
        "sizes": size_list,
        "phases": by_phase,
        "weights": weights,
        "size_weights": {str(s): size_weight[s] for s in size_list},
        "world": base_runs[0].get("world"),
        "chosen": chosen["candidate"] if not chosen["baseline"] else "defaults",
        "settings": dict(chosen["settings"]),
        "decision": decision,
        "defaults_rounds": len(base_runs),
        "defaults_geomean_noise": geo_noise,
        "needed_gain": needed_gain,
        "candidates": rows,
        "runs": [_run_summary(r, i, size_list, geo) for i, r in enumerate(records)],
    }


def _run_summary(record, index, sizes, geo):
    us = _series(record, "us_per_allreduce")
    out = {
        "seq": record.get("seq", index + 1),
        "candidate": name_of(record),
        "round": record.get("round"),
    }
    if "error" in record:
        out["error"] = record["error"]
    else:
        out["us_per_allreduce"] = {str(s): us[s] for s in sizes if s in us}
        out["geomean_us"] = geo({s: us[s] for s in sizes if s in us})
    return out


def markdown_table(choice):
    """A small Markdown table of the evidence (median us per size over rounds), for production docs.
    With prefill sizes, those are marked "prefill" and each phase's geometric mean vs NCCL's defaults
    gets a column."""
    sizes = choice["sizes"]
    prefill = set((choice.get("phases") or {}).get("prefill") or [])
    phased = ["decode", "prefill"] if prefill else []
    labels = [("prefill " if s in prefill else "") + _size_label(s) for s in sizes]
    head = (
        "| candidate | "
        + " | ".join(labels + [f"{phase} vs defaults" for phase in phased])
        + " | geomean | eligible |"
    )
    sep = "|" + " --- |" * (len(sizes) + len(phased) + 3)
    lines = [head, sep]
    for row in choice["candidates"]:
        us = row.get("us_per_allreduce") or {}
        cells = [f"{us[str(s)]:.1f}" if str(s) in us else "-" for s in sizes]
        ratios = row.get("vs_defaults_by_phase") or {}
        cells += [f"{ratios[phase]:.2f}x" if phase in ratios else "-" for phase in phased]
        geo = f"{row['geomean_us']:.1f}" if row.get("geomean_us") else "-"
        lines.append(
            f"| {row['candidate']} | " + " | ".join(cells) + f" | {geo} | {'yes' if row['eligible'] else 'no'} |"
        )
    return "\n".join(lines)


def rounds_table(choice):
    """Every run in launch order (us per size), then the defaults' best round and per-size noise."""
    sizes = choice["sizes"]
    head = "| run | candidate | round | " + " | ".join(_size_label(s) for s in sizes) + " | geomean |"
    lines = [head, "|" + " --- |" * (len(sizes) + 4)]
    for run in choice.get("runs") or []:
        us = run.get("us_per_allreduce") or {}
        cells = [f"{us[str(s)]:.1f}" if str(s) in us else "-" for s in sizes]
        geo = f"{run['geomean_us']:.1f}" if run.get("geomean_us") else run.get("error", "-")
        rnd = "-" if run.get("round") is None else str(run["round"])
        lines.append(f"| {run['seq']} | {run['candidate']} | {rnd} | " + " | ".join(cells) + f" | {geo} |")
    base = choice["candidates"][0]
    best = base.get("best_us") or {}
    noise = base.get("noise") or {}
    lines.append(
        f"| | {base['candidate']}, best round | | " + " | ".join(f"{best[str(s)]:.1f}" for s in sizes) + " | |"
    )
    lines.append(
        f"| | noise ({base['candidate']}) | | "
        + " | ".join(f"{noise[str(s)]:.0%}" for s in sizes)
        + f" | {choice.get('defaults_geomean_noise', 0.0):.1%} |"
    )
    return "\n".join(lines)


def _size_label(size):
    for unit, factor in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor and size % factor == 0:
            return f"{size // factor} {unit}"
    return f"{size} B"
