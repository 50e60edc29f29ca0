"""``kvsim run``."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "run", help="simulate one scenario; write summary.json, requests.csv, steps.csv",
        description="Simulate SCENARIO.yaml and write DIR/summary.json, DIR/requests.csv and "
                    "DIR/steps.csv. Keys are documented in docs/scenarios.md.")
    p.add_argument("scenario", metavar="SCENARIO.yaml")
    p.add_argument("--out", metavar="DIR", help="output folder (created); omit to only print")
    p.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE",
                   help="override a value, e.g. --set engine.max_num_batched_tokens=512 "
                        "(value read as YAML); repeatable")
    # vLLM command lines (kvsim/vllm_args); --set still wins over them.
    p.add_argument("--serve-args", metavar="'FLAGS'",
                   help="`vllm serve` flags, e.g. '--max-num-seqs 128 -tp 2' (docs/vllm.md)")
    p.add_argument("--bench-args", metavar="'FLAGS'",
                   help="`vllm bench serve` flags: replace the workload (docs/vllm.md)")
    p.add_argument("--ignore-unsupported", action="store_true",
                   help="with --serve-args/--bench-args: skip (and list) flags kvsim does not model")
    p.add_argument("--trace", metavar="FILE.jsonl",
                   help="write the step trace (one JSON object per engine step)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--save-detailed", action="store_true",
                   help="bench_serve.json with per-request lists, as vllm bench serve --save-detailed")
    p.add_argument("--scrape-interval", type=float, default=1.0, metavar="S",
                   help="metrics.csv: simulated seconds between Prometheus scrapes (default 1)")
    # Everything is written and closed when run_command returns: skip the
    # interpreter's teardown when run as a program (kvsim/cli.py).
    p.set_defaults(func=run_command, exit_without_cleanup=True)


def run_command(args: argparse.Namespace) -> int:
    from kvsim.metrics.summary import format_summary
    from kvsim.scenario.loader import load_scenario
    from kvsim.scenario.schema import parse_overrides
    from kvsim.scenario.simulate import simulate
    from kvsim.vllm_args import cli_overrides

    t0 = time.perf_counter()
    overrides = cli_overrides(args.serve_args, args.bench_args, log=lambda line: print(line, file=sys.stderr),
                              ignore_unsupported=args.ignore_unsupported)
    sc = load_scenario(args.scenario, overrides=overrides + parse_overrides(args.overrides))
    trace_file = open(args.trace, "w") if args.trace else None
    try:
        write = None
        if trace_file is not None:
            def write(rec: dict) -> None:
                trace_file.write(json.dumps(rec, separators=(",", ":")) + "\n")
        result = simulate(sc, trace=write)
    finally:
        if trace_file is not None:
            trace_file.close()
    written = []
    if args.out:
        from kvsim.vllm_outputs import write_vllm_outputs   # metrics.csv, bench_serve.json
        result.write(args.out)
        extra, notes = write_vllm_outputs(result, args.out, detailed=args.save_detailed,
                                          interval_s=args.scrape_interval)
        written = ["summary.json", "requests.csv", "steps.csv", *extra]
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
    wall = time.perf_counter() - t0
    if args.json:
        print(json.dumps(result.summary, indent=2))
    else:
        print(format_summary(result.summary))
        num_requests = int(result.summary.get("completed", 0)) + int(result.summary.get("failed", 0))
        steps = f", {len(result.steps)} steps" if len(result.steps) else " (streaming metrics)"
        simulated = result.summary.get("duration")
        simulated = f"{simulated:.2f} s" if isinstance(simulated, float) and simulated == simulated else "n/a"
        print(f"simulated time {simulated} ({num_requests} requests{steps}); wall time {wall:.2f} s",
              file=sys.stderr)
        if written:
            print(f"wrote {Path(args.out)}/: {', '.join(written)}", file=sys.stderr)
    return 0
