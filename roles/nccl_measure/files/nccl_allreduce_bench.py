#!/usr/bin/env python3
"""All-reduce latency under NCCL's defaults and candidate NCCL settings, on this node's GPUs.

Standalone (stdlib + torch), also run by playbooks/nccl_measure.yml:

  python3 nccl_allreduce_bench.py --candidates '{"seed-pcie": {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}}' \
      --rounds 3 --reps 7 --out nccl.jsonl --choice-out choice.json

How it measures
  * One process per GPU (world = all visible GPUs, or --nproc), launched here with subprocess (no
    torchrun), rendezvous over tcp://127.0.0.1, torch.distributed with the NCCL backend.
  * Every run is a fresh process group (NCCL reads its environment once per process, at communicator
    creation), in --rounds rounds, NCCL's defaults before each round and after the last:
      defaults, cand1, cand2, defaults, cand1, cand2, ..., defaults
    so NCCL's defaults are measured rounds + 1 times, interleaved with the candidates. Latency moves
    between launches far more than between repetitions of one launch (41.8 us, then 26.0 us at
    16 KiB for the defaults, two minutes apart on one H200 pair), and the choice rule needs that
    between-run noise. A first defaults run that fails stops the measurement.
  * Each process gets exactly the intended NCCL_* variables: inherited NCCL_* are dropped,
    NCCL_CONF_FILE=/dev/null keeps /etc/nccl.conf and ~/.nccl.conf out, and anything a
    sitecustomize.py injects is removed again (and reported as "injected_env").
  * NVLink multicast stays off in every process: NCCL_NVLS_ENABLE=0,
    TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1 (a multicast program can put shared
    GPUs out of service). A candidate that tries to change them is refused.
  * Per size (bf16 tensors): a correctness check (sum of rank+1 over ranks), warm-up all-reduces,
    then --reps repetitions of --iters back-to-back all-reduces timed with CUDA events; a
    repetition's time is the slowest rank's. Reported: median, spread = (max - min) / 2, min, max,
    in microseconds per all-reduce; times_us holds every repetition.
  * Sizes come in two phases. Decode (--decode-sizes, alias --sizes; default hidden size x batch
    sizes x 2 bytes (bf16): hidden 8192 and batch 1..256 give 16 KiB .. 4 MiB) and prefill
    (--prefill-sizes; default none: chunked prefill size x hidden x 2 bytes and shorter prefills,
    tens of MiB, as roles/nccl_measure derives them from the model and the server arguments). Both
    are measured in every run; each run records them ("phases"), and the choice rule refuses a
    candidate that loses at any of them and weighs the phases by --decode-weight/--prefill-weight.

Output: one JSON line per run, in launch order, with "round" (1..rounds, rounds + 1 for the last
defaults run) and "seq" (launch order), then one {"choice": ...} line made by nccl_choice.choose()
(rule in nccl_choice.RULE). Exit codes: 0 measured, 1 a run failed for every
candidate including the defaults, 2 bad arguments, 3 nothing to measure (fewer than 2 GPUs).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# Kept in every process this script starts, whatever the candidate says.
SAFETY_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
# Keep NCCL's config files out of the measurement (NCCL reads only NCCL_CONF_FILE when it is set).
ISOLATION_ENV = {"NCCL_CONF_FILE": "/dev/null"}

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOTHING_TO_MEASURE = 3

DEFAULT_CANDIDATES = {
    "seed-pcie": {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"},
    "proto-ll": {"NCCL_PROTO": "LL"},
}
DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DEFAULT_ROUNDS = 3


# --------------------------------------------------------------------------- arguments (no torch)


def parse_size(text):
    """'16384', '16K', '16KiB', '4M', '4MiB' -> bytes."""
    m = re.fullmatch(r"\s*([0-9]+)\s*([KkMmGg]?)(i?[Bb])?\s*", text)
    if not m:
        raise ValueError(f"not a size: {text!r}")
    factor = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m.group(2).lower()]
    return int(m.group(1)) * factor


def parse_sizes(text):
    sizes = sorted({parse_size(part) for part in text.split(",") if part.strip()})
    if not sizes:
        raise ValueError("no sizes given")
    for size in sizes:
        if size < 2 or size % 2:
            raise ValueError(f"size {size} is not a whole number of bf16 elements (even, >= 2)")
    return sizes


def default_sizes(hidden_size, batch_sizes, dtype_bytes=2):
    return sorted({hidden_size * b * dtype_bytes for b in batch_sizes})


def parse_candidates(text):
    """JSON mapping name -> {NCCL_*: value}; refuses anything that would turn NVLink multicast on."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"--candidates is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError("--candidates must be a JSON object: name -> {NCCL_*: value}")
    out = {}
    for name, env in data.items():
        if not re.fullmatch(r"[A-Za-z0-9_.+-]+", str(name)) or name == "defaults":
            raise ValueError(f"candidate name {name!r}: use letters, digits, _ . + - (and not 'defaults')")
        if not isinstance(env, dict) or not env:
            raise ValueError(f"candidate {name!r} must be a non-empty mapping of NCCL_* variables")
        clean = {}
        for key, value in env.items():
            if not str(key).startswith("NCCL_"):
                raise ValueError(f"candidate {name!r}: {key} is not an NCCL_* variable")
            if isinstance(value, bool) or not isinstance(value, (str, int)):
                raise ValueError(f"candidate {name!r}: {key} must be a string or an integer")
            if key in SAFETY_ENV and str(value) != SAFETY_ENV[key]:
                raise ValueError(
                    f"candidate {name!r}: {key}={value} is refused; NVLink multicast stays off "
                    f"({key}={SAFETY_ENV[key]})"
                )
            if key in ISOLATION_ENV:
                raise ValueError(f"candidate {name!r}: {key} is set by the benchmark itself")
            clean[str(key)] = str(value)
        out[str(name)] = clean
    return out


def child_env(base, candidate):
    """Environment of a benchmark process: base without NCCL_*, plus safety, isolation, candidate."""
    env = {k: v for k, v in base.items() if not k.startswith("NCCL_")}
    env.update(SAFETY_ENV)
    env.update(ISOLATION_ENV)
    env.update(candidate)
    return env


def intended_nccl_env(candidate):
    env = {k: v for k, v in SAFETY_ENV.items() if k.startswith("NCCL_")}
    env.update(ISOLATION_ENV)
    env.update(candidate)
    return env


def build_parser():
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--decode-sizes",
        "--sizes",
        dest="sizes",
        help="comma list of decode message sizes in bytes (16K, 4MiB ... accepted); "
        "default: hidden size x batch sizes x 2 bytes",
    )
    p.add_argument(
        "--prefill-sizes",
        help="comma list of prefill message sizes in bytes (chunked prefill size x hidden x 2 and shorter); "
        "default: none",
    )
    p.add_argument("--decode-weight", type=float, default=None, help="weight of the decode sizes in the choice (1)")
    p.add_argument("--prefill-weight", type=float, default=None, help="weight of the prefill sizes in the choice (1)")
    p.add_argument("--hidden-size", type=int, default=8192, help="model hidden size for default sizes (8192)")
    p.add_argument(
        "--batch-sizes",
        default=",".join(map(str, DEFAULT_BATCH_SIZES)),
        help="decode batch sizes for default sizes (1,2,...,256)",
    )
    p.add_argument(
        "--candidates", help="JSON object name -> {NCCL_*: value}; default: " + json.dumps(DEFAULT_CANDIDATES)
    )
    p.add_argument("--candidates-file", help="read --candidates JSON from this file")
    p.add_argument(
        "--rounds",
        type=int,
        default=DEFAULT_ROUNDS,
        help=f"rounds of every candidate, NCCL's defaults before each and after the last ({DEFAULT_ROUNDS})",
    )
    p.add_argument("--reps", type=int, default=7, help="timed repetitions per size (7)")
    p.add_argument("--iters", type=int, default=50, help="all-reduces per repetition (50)")
    p.add_argument("--warmup", type=int, default=20, help="warm-up all-reduces per size (20)")
    p.add_argument("--nproc", type=int, help="processes / GPUs to use (default: all visible)")
    p.add_argument(
        "--cuda-graph",
        action="store_true",
        help="time CUDA-graph replays of the all-reduces (as SGLang's decode does) instead of eager calls",
    )
    p.add_argument("--timeout", type=float, default=300.0, help="seconds allowed per run (300)")
    p.add_argument(
        "--noise-mult",
        type=float,
        default=None,
        help="noise = max(floor, spread of the defaults' rounds, M x within-run spread), relative",
    )
    p.add_argument("--noise-floor", type=float, default=None)
    p.add_argument("--min-gain", type=float, default=None, help="geometric-mean gain needed to leave defaults")
    p.add_argument("--out", help="write JSON lines here (default: stdout)")
    p.add_argument("--choice-out", help="also write the choice as one JSON document here")
    p.add_argument(
        "--backend",
        choices=["nccl", "gloo"],
        default="nccl",
        help="gloo: CPU self-test of the launcher (needs no GPU, measures nothing about NCCL)",
    )
    p.add_argument("--worker", help=argparse.SUPPRESS)
    return p


def resolve_args(args):
    """Phases ({'decode': sizes, 'prefill': sizes}) and candidates from parsed args; raises ValueError on bad input."""
    if args.sizes:
        decode = parse_sizes(args.sizes)
    else:
        batch = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
        if args.hidden_size < 1 or not batch or min(batch) < 1:
            raise ValueError("--hidden-size and --batch-sizes must be positive")
        decode = default_sizes(args.hidden_size, batch)
    phases = {"decode": decode, "prefill": parse_sizes(args.prefill_sizes) if args.prefill_sizes else []}
    if args.candidates_file:
        with open(args.candidates_file, encoding="utf-8") as fh:
            candidates = parse_candidates(fh.read())
    elif args.candidates:
        candidates = parse_candidates(args.candidates)
    else:
        candidates = dict(DEFAULT_CANDIDATES)
    for name in ("rounds", "reps", "iters"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be >= 1")
    if args.warmup < 0:
        raise ValueError("--warmup must be >= 0")
    for name in ("decode_weight", "prefill_weight"):
        if getattr(args, name) is not None and getattr(args, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0")
    if args.decode_weight == 0 and (args.prefill_weight == 0 or not phases["prefill"]):
        raise ValueError("--decode-weight 0 leaves nothing to weigh (no prefill sizes, or their weight is 0 too)")
    return phases, candidates


def all_sizes(phases):
    return sorted({s for sizes in phases.values() for s in sizes})


# --------------------------------------------------------------------------- worker (one per GPU)


def worker(config_path):
    with open(config_path, encoding="utf-8") as fh:
        cfg = json.load(fh)
    rank, world = int(os.environ["SGLANG_CANON_RANK"]), cfg["world"]
    intended = cfg["nccl_env"]
    # A sitecustomize.py (the seed's way) may have set NCCL_* after the environment was built.
    injected = {k: v for k, v in os.environ.items() if k.startswith("NCCL_") and os.environ.get(k) != intended.get(k)}
    for key in list(os.environ):
        if key.startswith("NCCL_") and key not in intended:
            del os.environ[key]
    os.environ.update(intended)
    os.environ.update(SAFETY_ENV)

    import torch
    import torch.distributed as dist

    gloo = cfg.get("backend") == "gloo"  # CPU self-test of the plumbing: no GPU, no NCCL
    if gloo:
        device, dtype = torch.device("cpu"), torch.float32
    else:
        torch.cuda.set_device(rank)
        device, dtype = torch.device("cuda", rank), torch.bfloat16
    dist.init_process_group(
        "gloo" if gloo else "nccl", init_method=f"tcp://127.0.0.1:{cfg['port']}", rank=rank, world_size=world
    )

    def sync():
        if not gloo:
            torch.cuda.synchronize()

    expected = world * (world + 1) / 2
    correct = True
    results = {}
    for size in cfg["sizes"]:
        buf = torch.empty(size // 2, dtype=dtype, device=device)
        buf.fill_(rank + 1)
        dist.all_reduce(buf)
        sync()
        if not bool(torch.all(buf == expected).item()):
            correct = False
        buf.zero_()
        for _ in range(cfg["warmup"]):
            dist.all_reduce(buf)
        sync()
        graph = None
        if cfg["cuda_graph"] and not gloo:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    dist.all_reduce(buf)
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(cfg["iters"]):
                    dist.all_reduce(buf)
            torch.cuda.synchronize()
        times = []
        for _ in range(cfg["reps"]):
            dist.all_reduce(buf)  # line the ranks up before the clock starts
            sync()
            if gloo:
                t0 = time.perf_counter()
                for _ in range(cfg["iters"]):
                    dist.all_reduce(buf)
                times.append((time.perf_counter() - t0) * 1e6 / cfg["iters"])
                continue
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            if graph is not None:
                graph.replay()
            else:
                for _ in range(cfg["iters"]):
                    dist.all_reduce(buf)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000.0 / cfg["iters"])
        # a repetition takes as long as its slowest rank
        slowest = torch.tensor(times, dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        results[str(size)] = [float(x) for x in slowest.cpu().tolist()]
        del graph, buf
    ok = torch.tensor([1 if correct else 0], dtype=torch.int32, device=device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    correct = bool(ok.item())
    if rank == 0:
        version = "none (gloo)" if gloo else torch.cuda.nccl.version()
        version = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        out = {
            "times_us": results,
            "correct": correct,
            "injected_env": injected,
            "nccl_version": version,
            "torch": torch.__version__,
            "gpus": [] if gloo else [torch.cuda.get_device_name(i) for i in range(world)],
        }
        with open(cfg["result_path"], "w", encoding="utf-8") as fh:
            json.dump(out, fh)
    dist.destroy_process_group()
    return 0


# --------------------------------------------------------------------------- launcher


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def summarize(times_by_size):
    us, spread, lo, hi = {}, {}, {}, {}
    for size, times in times_by_size.items():
        us[size] = statistics.median(times)
        lo[size], hi[size] = min(times), max(times)
        spread[size] = (hi[size] - lo[size]) / 2
    return us, spread, lo, hi


def run_candidate(name, candidate, sizes, world, args, tmpdir, python=sys.executable):
    """Run one candidate in `world` fresh processes; return its JSON record."""
    cfg_path = os.path.join(tmpdir, f"{name}.config.json")
    result_path = os.path.join(tmpdir, f"{name}.result.json")
    nccl_env = intended_nccl_env(candidate)
    cfg = {
        "world": world,
        "port": free_port(),
        "sizes": sizes,
        "reps": args.reps,
        "iters": args.iters,
        "warmup": args.warmup,
        "cuda_graph": bool(args.cuda_graph),
        "nccl_env": nccl_env,
        "backend": args.backend,
        "result_path": result_path,
    }
    with open(cfg_path, "w", encoding="utf-8") as fh:
        json.dump(cfg, fh)
    record = {
        "candidate": name,
        "settings": dict(candidate),
        "env": nccl_env,
        "world": world,
        "mode": "cuda-graph" if args.cuda_graph else "eager",
        "dtype": "float32" if args.backend == "gloo" else "bfloat16",
        "backend": args.backend,
        "reps": args.reps,
        "iters": args.iters,
        "warmup": args.warmup,
    }
    env = child_env(os.environ, candidate)
    procs, logs = [], []
    started = time.monotonic()
    for rank in range(world):
        log = open(os.path.join(tmpdir, f"{name}.rank{rank}.log"), "w+", encoding="utf-8")
        logs.append(log)
        penv = dict(env, SGLANG_CANON_RANK=str(rank))
        procs.append(
            subprocess.Popen(
                [python, os.path.abspath(__file__), "--worker", cfg_path],
                env=penv,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    error = None
    deadline = started + args.timeout
    # Poll all ranks: one that dies leaves the others waiting in NCCL, so stop them at once.
    while error is None and any(proc.poll() is None for proc in procs):
        for rank, proc in enumerate(procs):
            if proc.poll() not in (None, 0):
                error = f"rank {rank} exited with {proc.returncode}"
                break
        else:
            if time.monotonic() > deadline:
                error = f"timed out after {args.timeout:g} s"
            else:
                time.sleep(0.1)
    if error is None:
        failed = [(rank, proc.returncode) for rank, proc in enumerate(procs) if proc.returncode != 0]
        if failed:
            error = f"rank {failed[0][0]} exited with {failed[0][1]}"
    if error:
        for proc in procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
    record["elapsed_s"] = round(time.monotonic() - started, 2)
    if error is None and not os.path.exists(result_path):
        error = "rank 0 wrote no result"
    if error:
        tail = []
        for log in logs:
            log.seek(0)
            tail.append(log.read()[-1500:])
        record["error"] = error
        record["log_tail"] = "\n".join(t for t in tail if t)
    else:
        with open(result_path, encoding="utf-8") as fh:
            res = json.load(fh)
        us, spread, lo, hi = summarize(res["times_us"])
        record.update(
            us_per_allreduce=us,
            spread_us=spread,
            min_us=lo,
            max_us=hi,
            times_us=res["times_us"],
            correct=res["correct"],
            injected_env=res["injected_env"],
            nccl_version=res["nccl_version"],
            torch=res["torch"],
            gpus=res["gpus"],
        )
    for log in logs:
        log.close()
    return record


def visible_gpus():
    import torch  # imported here so argument handling and tests need no torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def main(argv=None, gpu_count=visible_gpus, runner=run_candidate):
    args = build_parser().parse_args(argv)
    if args.worker:
        return worker(args.worker)
    try:
        phases, candidates = resolve_args(args)
    except (ValueError, OSError) as exc:
        print(f"nccl_allreduce_bench: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return _measure(args, phases, candidates, gpu_count, runner)


def _emit(out, obj):
    out.write(json.dumps(obj, sort_keys=True) + "\n")
    out.flush()


class _Output:
    """JSON lines to stdout, or to OUT.partial renamed to OUT when done (an earlier table stays intact
    until this run has something to replace it with)."""

    def __init__(self, path):
        self.path = path
        self.fh = open(path + ".partial", "w", encoding="utf-8") if path else sys.stdout

    def __enter__(self):
        return self.fh

    def __exit__(self, *exc):
        if self.path:
            self.fh.close()
            os.replace(self.path + ".partial", self.path)


def _write_json(path, obj):
    with open(path + ".partial", "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=1, sort_keys=True)
    os.replace(path + ".partial", path)


def _measure(args, phases, candidates, gpu_count, runner):
    try:
        count = (args.nproc or 2) if args.backend == "gloo" else gpu_count()
    except ImportError as exc:
        print(
            f"nccl_allreduce_bench: {sys.executable} cannot import torch ({exc}); run this with the "
            "interpreter that holds SGLang's torch",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if args.nproc and args.nproc > count:
        print(
            f"nccl_allreduce_bench: --nproc {args.nproc} but only {count} CUDA device(s) are visible", file=sys.stderr
        )
        return EXIT_USAGE
    with _Output(args.out) as out:
        return _measure_into(args, phases, candidates, count, runner, out)


def run_plan(candidates, rounds):
    """[(round, name, settings)] in launch order: NCCL's defaults before each round and after the last."""
    plan = []
    for round_no in range(1, rounds + 1):
        plan.append((round_no, "defaults", {}))
        plan += [(round_no, name, candidate) for name, candidate in candidates.items()]
    plan.append((rounds + 1, "defaults", {}))
    return plan


def _measure_into(args, phases, candidates, count, runner, out):
    world = args.nproc or count
    sizes = all_sizes(phases)
    if world < 2:
        msg = (
            f"{count} CUDA device(s) visible: "
            + ("an all-reduce over world size 1 is a no-op" if world == 1 else "no GPU to run on")
            + ", so nothing was measured (needs at least 2 GPUs)"
        )
        print(f"nccl_allreduce_bench: {msg}", file=sys.stderr)
        _emit(out, {"skipped": msg, "world": world, "gpus": count, "phases": phases})
        if args.choice_out:
            _write_json(
                args.choice_out,
                {"skipped": msg, "world": world, "chosen": None, "settings": None, "phases": phases},
            )
        return EXIT_NOTHING_TO_MEASURE

    sys.path.insert(0, HERE)
    import nccl_choice

    records = []
    plan = run_plan(candidates, args.rounds)
    print(
        f"nccl_allreduce_bench: {len(plan)} runs ({args.rounds} round(s) of {', '.join(candidates)}, NCCL's defaults "
        f"around them) on {world} ranks, at decode sizes {phases['decode']} and prefill sizes {phases['prefill']} (bytes)",
        file=sys.stderr,
    )
    with tempfile.TemporaryDirectory(prefix="nccl-bench-") as tmpdir:
        for seq, (round_no, name, candidate) in enumerate(plan, 1):
            if records and records[0].get("error"):
                record = {
                    "candidate": name,
                    "settings": dict(candidate),
                    "world": world,
                    "round": round_no,
                    "seq": seq,
                    "error": "not run: the run under NCCL's defaults failed",
                }
                records.append(record)
                _emit(out, record)
                continue
            print(
                f"nccl_allreduce_bench: [{seq}/{len(plan)}] round {round_no}: {name} {json.dumps(candidate)} "
                f"on {world} ranks ...",
                file=sys.stderr,
            )
            rundir = os.path.join(tmpdir, f"{seq:02d}")
            os.mkdir(rundir)
            record = runner(name, candidate, sizes, world, args, rundir)
            record.update(round=round_no, seq=seq, phases=phases)
            if record.get("injected_env"):
                print(
                    f"nccl_allreduce_bench: warning: the interpreter injected {record['injected_env']} "
                    "(sitecustomize?); removed for this run",
                    file=sys.stderr,
                )
            if record.get("error"):
                print(f"nccl_allreduce_bench: {name} failed: {record['error']}", file=sys.stderr)
            records.append(record)
            _emit(out, record)
    params = {
        k: v
        for k, v in (("noise_mult", args.noise_mult), ("noise_floor", args.noise_floor), ("min_gain", args.min_gain))
        if v is not None
    }
    weights = {k: v for k, v in (("decode", args.decode_weight), ("prefill", args.prefill_weight)) if v is not None}
    try:
        choice = nccl_choice.choose(records, weights=weights, phases=phases, **params)
    except ValueError as exc:
        choice = {
            "error": str(exc),
            "chosen": None,
            "settings": None,
            "rule": nccl_choice.rule_text(**params, weights=weights if phases["prefill"] else None),
        }
    if "error" not in choice:
        choice["table_md"] = nccl_choice.markdown_table(choice)
        choice["rounds_md"] = nccl_choice.rounds_table(choice)
    choice["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    choice["mode"] = "cuda-graph" if args.cuda_graph else "eager"
    choice["probe_rounds"] = args.rounds
    _emit(out, {"choice": choice})
    if args.choice_out:
        _write_json(args.choice_out, choice)
    print(
        f"nccl_allreduce_bench: chosen {choice.get('chosen')!r}: {choice.get('decision', choice.get('error'))}",
        file=sys.stderr,
    )
    return 0 if "error" not in choice else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
