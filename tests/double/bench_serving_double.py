#!/usr/bin/env python3
"""TEST DOUBLE of `python -m sglang.bench_serving` (SGLang 0.5.9), for GPU-less test nodes.

playbooks/benchmark.yml runs `benchmark_command` + bench_serving's arguments. Tests that do not
have the real bench_serving on the node (it needs `datasets`, pandas, pyarrow and a tokenizer)
point benchmark_command at this file. It takes the same arguments the playbook passes, asks the
server what bench_serving asks (GET /v1/models, GET /get_server_info for the accept length), and
appends ONE line to --output-file with exactly the keys bench_serving 0.5.9's benchmark() writes
(see RESULT_KEYS), in the same order. The metrics are synthetic: a deterministic model per
configuration the server reports (see CONFIGURATIONS), so a sweep of the seed's presets has a
winner per level. It does not send /generate requests: it is a stand-in for the client, not a
load generator.

Stdlib only. Knobs (environment), for the control-flow tests:
  BENCH_SERVING_DOUBLE_FAIL_AT=C          exit 1 without a result at concurrency C
  BENCH_SERVING_DOUBLE_FAIL_WITHOUT_SPECULATION=1
                                          exit 1 when the server runs without speculative decoding
                                          (i.e. during a baseline alternative)
  BENCH_SERVING_DOUBLE_SLEEP=S            sleep S seconds before answering (interruption tests)
  BENCH_SERVING_DOUBLE_SLEEP_WITHOUT_SPECULATION=S
                                          the same, only against a server without speculative decoding
"""

import argparse
import json
import math
import os
import sys
import time
import urllib.request

# The keys of the `result` dict in bench_serving.py (SGLang 0.5.9, benchmark()), in order.
RESULT_KEYS = (
    "tag", "backend", "dataset_name", "request_rate", "max_concurrency", "sharegpt_output_len",
    "random_input_len", "random_output_len", "random_range_ratio", "server_info", "duration", "completed",
    "total_input_tokens", "total_input_text_tokens", "total_input_vision_tokens", "total_output_tokens",
    "total_output_tokens_retokenized", "request_throughput", "input_throughput", "output_throughput",
    "total_throughput", "mean_e2e_latency_ms", "median_e2e_latency_ms", "std_e2e_latency_ms",
    "p90_e2e_latency_ms", "p99_e2e_latency_ms", "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms",
    "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "std_tpot_ms", "p99_tpot_ms", "mean_itl_ms",
    "median_itl_ms", "std_itl_ms", "p95_itl_ms", "p99_itl_ms", "concurrency", "accept_length",
    "max_output_tokens_per_s", "max_concurrent_requests",
)


def parse_args(argv):
    parser = argparse.ArgumentParser(description="TEST DOUBLE of sglang.bench_serving")
    parser.add_argument("--backend", default="sglang")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--dataset-name", default="sharegpt")
    parser.add_argument("--random-input-len", type=int, default=1024)
    parser.add_argument("--random-output-len", type=int, default=1024)
    parser.add_argument("--random-range-ratio", type=float, default=0.0)
    parser.add_argument("--num-prompts", type=int, default=1000)
    parser.add_argument("--max-concurrency", type=int, default=None)
    parser.add_argument("--output-file")
    parser.add_argument("--tokenizer")
    parser.add_argument("--model")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--disable-tqdm", action="store_true")
    parser.add_argument("--tag")
    return parser.parse_args(argv)


def get_json(url):
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


# Output throughput = tok/s at concurrency 1 x concurrency ** exponent, per configuration.
# The seed's figures: production (topk 1 + spec v2) 86.8 tok/s and no speculation 92.7 at C=1,
# equal at C=30 and ahead above (the exponent is solved for that crossover). The v1-scheduler
# configurations' numbers are made up in the spirit of the seed's account: the topk 4 tree
# accepts more (ahead at C=1) but falls behind as concurrency grows; topk 1 without the overlap
# scheduler pays the drafter's cost at every level.
BASELINE = (92.7, 0.84)
SEED_CROSSOVER = 30
CONFIGURATIONS = {
    "baseline": BASELINE,
    "topk1-spec-v2": (86.8, BASELINE[1] + math.log(BASELINE[0] / 86.8) / math.log(SEED_CROSSOVER)),
    "topk1-spec-v1": (84.0, 0.83),
    "topk4-spec-v1": (95.5, 0.78),
}


def configuration(server_info):
    """Which of CONFIGURATIONS the server runs, from its /get_server_info answer."""
    args = server_info.get("server_args") or {}
    if args.get("speculative_algorithm") is None:
        return "baseline"
    topk = "topk1" if (args.get("speculative_eagle_topk") or 1) == 1 else "topk4"
    return f"{topk}-spec-{'v2' if server_info.get('spec_v2') else 'v1'}"


def metrics(concurrency, kind, accept_length, input_len, output_len, num_prompts):
    """Deterministic stand-in numbers of one run against a server running `kind`."""
    per_stream, exponent = CONFIGURATIONS[kind]
    output_throughput = per_stream * concurrency ** exponent
    duration = num_prompts * output_len / output_throughput
    itl = 1000.0 * concurrency / output_throughput
    ttft = 40.0 + 2.5 * concurrency
    e2e = ttft + itl * (output_len - 1)
    return {
        "duration": duration,
        "completed": num_prompts,
        "total_input_tokens": num_prompts * input_len,
        "total_input_text_tokens": num_prompts * input_len,
        "total_input_vision_tokens": 0,
        "total_output_tokens": num_prompts * output_len,
        "total_output_tokens_retokenized": num_prompts * output_len,
        "request_throughput": num_prompts / duration,
        "input_throughput": num_prompts * input_len / duration,
        "output_throughput": output_throughput,
        "total_throughput": num_prompts * (input_len + output_len) / duration,
        "mean_e2e_latency_ms": e2e,
        "median_e2e_latency_ms": e2e,
        "std_e2e_latency_ms": 0.0,
        "p90_e2e_latency_ms": e2e * 1.05,
        "p99_e2e_latency_ms": e2e * 1.1,
        "mean_ttft_ms": ttft,
        "median_ttft_ms": ttft,
        "std_ttft_ms": 0.0,
        "p99_ttft_ms": ttft * 1.5,
        "mean_tpot_ms": itl,
        "median_tpot_ms": itl,
        "std_tpot_ms": 0.0,
        "p99_tpot_ms": itl * 1.2,
        "mean_itl_ms": itl,
        "median_itl_ms": itl,
        "std_itl_ms": 0.0,
        "p95_itl_ms": itl * 1.1,
        "p99_itl_ms": itl * 1.3,
        "concurrency": float(concurrency),
        "accept_length": accept_length,
        "max_output_tokens_per_s": output_throughput * 1.2,
        "max_concurrent_requests": concurrency,
    }


def main(argv):
    args = parse_args(argv)
    print(f"bench_serving TEST DOUBLE: benchmark_args={vars(args)}", flush=True)
    time.sleep(float(os.environ.get("BENCH_SERVING_DOUBLE_SLEEP", "0")))
    base = f"http://{args.host}:{args.port}"
    models = get_json(base + "/v1/models")
    if not models.get("data"):
        print("No model specified or found.", file=sys.stderr)
        return 1
    server_info = get_json(base + "/get_server_info")
    states = server_info.get("internal_states") or [{}]
    accept_length = states[0].get("avg_spec_accept_length")
    kind = configuration(server_info)
    speculative = kind != "baseline"
    if not speculative:
        time.sleep(float(os.environ.get("BENCH_SERVING_DOUBLE_SLEEP_WITHOUT_SPECULATION", "0")))
    if os.environ.get("BENCH_SERVING_DOUBLE_FAIL_AT") == str(args.max_concurrency):
        print(f"TEST DOUBLE told to fail at concurrency {args.max_concurrency}", file=sys.stderr)
        return 1
    if os.environ.get("BENCH_SERVING_DOUBLE_FAIL_WITHOUT_SPECULATION") == "1" and not speculative:
        print("TEST DOUBLE told to fail against a server without speculative decoding", file=sys.stderr)
        return 1
    result = {
        "tag": args.tag,
        "backend": args.backend,
        "dataset_name": args.dataset_name,
        "request_rate": float("inf"),
        "max_concurrency": args.max_concurrency,
        "sharegpt_output_len": None,
        "random_input_len": args.random_input_len,
        "random_output_len": args.random_output_len,
        "random_range_ratio": args.random_range_ratio,
        "server_info": server_info,
    }
    result.update(metrics(args.max_concurrency or args.num_prompts, kind, accept_length,
                          args.random_input_len, args.random_output_len, args.num_prompts))
    result = {key: result[key] for key in RESULT_KEYS}
    print("============ Serving Benchmark Result (TEST DOUBLE) ============")
    print("{:<40} {:<10}".format("Successful requests:", result["completed"]))
    print("{:<40} {:<10.2f}".format("Output token throughput (tok/s):", result["output_throughput"]))
    if accept_length:
        print("{:<40} {:<10.2f}".format("Accept length:", accept_length))
    with open(args.output_file, "a", encoding="utf-8") as handle:  # bench_serving appends too
        handle.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
