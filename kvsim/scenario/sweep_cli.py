"""``kvsim sweep SCENARIO.yaml --out DIR``: run a scenario's sweep section.

Exit status: 0 when every point ran ok, else the number of points that failed
in this run (capped at 100); 2 for bad input (``kvsim.cli`` prints the
message); 130 after Ctrl-C and 143 after SIGTERM, which stop the workers and
keep every finished point. A rerun with the same ``--out`` skips finished points.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from kvsim.scenario.executor import signals_as_interrupts
from kvsim.scenario.sweep import RESULTS_JSONL, run_sweep


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "sweep",
        help="run every point of a scenario's sweep section; write DIR/results.csv",
        description="Run every point of SCENARIO.yaml's `sweep:` section (grid, zip, repeat) "
                    "and write one row per point to DIR/results.csv. Rerunning with the same "
                    "--out skips points that already finished. See docs/sweeps.md.",
    )
    parser.add_argument("scenario", metavar="SCENARIO.yaml", help="scenario with a sweep: section")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder for results.csv (created)")
    parser.add_argument("--workers", type=int, default=None, metavar="N",
                        help="points run at once (default: all cores)")
    parser.add_argument("--executor", choices=["local", "ray"], default="local",
                        help="local process pool (default) or Ray (needs the ray extra)")
    parser.add_argument("--address", default=None, metavar="ADDR",
                        help="Ray cluster to join (default: start a local Ray)")
    parser.add_argument("--keep-points", action="store_true",
                        help="also write each point's scenario.yaml, summary.json, requests.csv, "
                             "steps.csv to DIR/points/<id>/")
    parser.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE",
                        help="override a scenario value before the sweep, e.g. "
                             "--set engine.max_num_seqs=64 (value read as YAML); repeatable")
    parser.set_defaults(func=sweep_command)
    return parser


def sweep_command(args: argparse.Namespace) -> int:
    from kvsim.scenario.schema import parse_overrides, read_scenario_dict

    # Read and --set exactly as `kvsim run` does, so the two commands agree.
    scenario, base_dir = read_scenario_dict(args.scenario, overrides=parse_overrides(args.overrides))
    try:
        with signals_as_interrupts():
            outcome = run_sweep(scenario, args.out, workers=args.workers, executor=args.executor,
                                address=args.address, keep_points=args.keep_points,
                                base_dir=base_dir)
    except KeyboardInterrupt as exc:   # Ctrl-C, or SIGTERM as executor.Interrupted
        signum = getattr(exc, "signum", signal.SIGINT)
        print(f"\nkvsim sweep: stopped by {signal.Signals(signum).name}; the workers are stopped and "
              f"every finished point is in {Path(args.out) / RESULTS_JSONL}; rerun the same command "
              f"to resume", file=sys.stderr)
        return 128 + signum
    ran = outcome.num_done + outcome.num_failed
    print(f"sweep: {outcome.num_points} points: {outcome.num_done} ok, {outcome.num_failed} failed, "
          f"{outcome.num_skipped} already done; ran {ran} in {outcome.wall_time_s:.2f} s "
          f"({args.executor}, {outcome.workers or 'cluster'} workers) -> {outcome.results_csv}")
    if outcome.num_failed:
        print(f"kvsim sweep: {outcome.num_failed} point(s) failed; see the error column of "
              f"{outcome.results_csv} (tracebacks in results.jsonl); rerun to retry them",
              file=sys.stderr)
    return outcome.exit_status
