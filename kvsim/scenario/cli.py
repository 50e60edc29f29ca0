"""``kvsim run``.

Exit status: 0 when the run finished and at least one request completed (or
there were none); 1 when every request failed (the reasons are printed,
grouped) or the simulation stopped on an engine error (swap space exhausted);
2 for bad input or an output that cannot be written (``kvsim.cli`` prints the
message); 130 when interrupted (Ctrl-C or SIGTERM).

Nothing is written under a final name until it is complete: the output
folder and the trace file are checked before the simulation starts, the
trace is written under a temporary name and renamed when the run ends, and
the result files are written atomically (``kvsim.scenario.outputs``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import time
from pathlib import Path

from kvsim.cli import interrupt_behind

INTERRUPTED = 130                       # 128 + SIGINT, what shells report for Ctrl-C


class Interrupted(KeyboardInterrupt):
    """SIGTERM, raised where the run is, so it unwinds (and cleans up) as Ctrl-C does."""


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "run", help="simulate one scenario; write summary.json, requests.csv, steps.csv",
        description="Simulate SCENARIO.yaml and write DIR/summary.json, DIR/requests.csv and "
                    "DIR/steps.csv. Keys are documented in docs/scenarios.md. Exit status: 0 "
                    "done, 1 every request failed or the engine stopped, 2 bad input, "
                    "130 interrupted.")
    p.add_argument("scenario", metavar="SCENARIO.yaml")
    p.add_argument("--out", metavar="DIR", help="output folder (created); omit to only print")
    p.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE",
                   help="override a value, e.g. --set engine.max_num_batched_tokens=512 "
                        "(value read as YAML); repeatable")
    # vLLM command lines (kvsim/scenario/vllm_args); --set still wins over them.
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
    with _sigterm_as_interrupt():
        try:
            return _run(args)
        except BaseException as exc:
            interrupt = interrupt_behind(exc)          # also one wrapped by a lazy import
            if interrupt is None:
                raise
            why = "SIGTERM" if isinstance(interrupt, Interrupted) else "Ctrl-C"
            print(f"kvsim run: interrupted ({why}); no file was left half-written", file=sys.stderr)
            return INTERRUPTED


def _run(args: argparse.Namespace) -> int:
    from kvsim.metrics.summary import format_summary
    from kvsim.scenario.loader import load_scenario
    from kvsim.scenario.outputs import atomic_open, check_output_dir, check_output_file, summary_json
    from kvsim.scenario.run_progress import terminal_progress
    from kvsim.scenario.schema import parse_overrides
    from kvsim.scenario.result import steps_csv_ahead
    from kvsim.scenario.simulate import RUN_FILES, simulate
    from kvsim.sched.errors import EngineError
    from kvsim.vllm_outputs import VLLM_FILES, vllm_outputs_apart

    t0 = time.perf_counter()
    overrides = []
    if args.serve_args is not None or args.bench_args is not None:
        # Only then: the flag tables cost ~40 ms of imports.
        from kvsim.scenario.vllm_args import cli_overrides
        overrides = cli_overrides(args.serve_args, args.bench_args,
                                  log=lambda line: print(line, file=sys.stderr),
                                  ignore_unsupported=args.ignore_unsupported)
    sc = load_scenario(args.scenario, overrides=overrides + parse_overrides(args.overrides))
    # Outputs are checked before the simulation, not found broken after it.
    if args.out:
        check_output_dir(args.out, files=RUN_FILES + VLLM_FILES)
    if args.trace:
        check_output_file(args.trace, option="--trace")
    for note in _notes(sc, args.scenario):
        print(f"kvsim run: note: {note}", file=sys.stderr)
    progress = None if args.json else terminal_progress()
    # steps.csv's rows made text by forked children while the simulation runs.
    ahead = steps_csv_ahead(sc) if args.out else None
    try:
        with contextlib.ExitStack() as stack:
            if ahead is not None:
                stack.callback(ahead.close)
            write = None
            if args.trace:
                trace_file = stack.enter_context(atomic_open(args.trace, option="--trace"))

                def write(rec: dict) -> None:
                    trace_file.write(json.dumps(rec, separators=(",", ":")) + "\n")
            result = simulate(sc, trace=write, progress=progress,
                              watch_steps=ahead.watch if ahead is not None else None)
            if progress is not None:
                progress.close()
            wall = time.perf_counter() - t0
            # Inside the block: if the results cannot be written, the trace is
            # discarded too, and every old file stays as it was.
            written = []
            if args.out:
                # metrics.csv and bench_serve.json are made by a forked child
                # meanwhile, and renamed after the run's own files.
                vllm_files = vllm_outputs_apart(result, args.out, detailed=args.save_detailed,
                                                interval_s=args.scrape_interval)
                stack.callback(vllm_files.close)
                result.write(args.out, steps_ahead=ahead)
                extra, out_notes = vllm_files.join()
                written = [*RUN_FILES, *extra]
                for note in out_notes:
                    print(f"kvsim run: note: {note}", file=sys.stderr)
    except EngineError as exc:
        # The engine stopped (vLLM aborts the same way, e.g. when swap space runs out);
        # the trace's temporary file is gone with the exception.
        print(f"kvsim run: error: the simulation stopped: {exc}; nothing written", file=sys.stderr)
        return 1
    finally:
        if progress is not None:
            progress.close()
    summary = result.summary
    if args.json:
        print(summary_json(summary), end="")
    else:
        print(format_summary(summary))
        num_requests = int(summary.get("completed", 0)) + int(summary.get("failed", 0))
        steps = f", {len(result.steps)} steps"
        if sc.scenario.metrics.streaming:
            steps = " (streaming metrics)"
        simulated = summary.get("duration")
        simulated = f"{simulated:.2f} s" if isinstance(simulated, float) and simulated == simulated else "n/a"
        print(f"simulated time {simulated} ({num_requests} requests{steps}); wall time {wall:.2f} s",
              file=sys.stderr)
        if written:
            print(f"wrote {Path(args.out)}/: {', '.join(written)}", file=sys.stderr)
    return _report_failures(result, streaming=sc.scenario.metrics.streaming)


def _notes(sc, scenario_path: str) -> list[str]:
    """What the run does that the scenario may not say (printed before it starts)."""
    notes = list(sc.notes)
    if sc.scenario.sweep is not None:
        notes.append(f"{scenario_path}: the sweep: section is not run by `kvsim run`, which "
                     f"simulates the base scenario only; run its points with "
                     f"`kvsim sweep {scenario_path} --out DIR`")
    return notes


def _report_failures(result, *, streaming: bool) -> int:
    """Print why requests failed; exit status 1 when none completed."""
    from kvsim.scenario.failures import failure_report

    completed = int(result.summary.get("completed", 0))
    failed = int(result.summary.get("failed", 0))
    if not failed:
        return 0
    total = completed + failed
    if streaming or "fail_reason" not in result.requests:
        lines = [f"{failed} of {total} requests failed:",
                 "  (metrics.streaming keeps no per-request reasons; run without it to see them)"]
    else:
        table = result.requests
        reasons = table.loc[table["status"] == "failed", "fail_reason"].tolist()
        lines = failure_report(reasons, num_requests=total)
    if not completed:
        lines[0] = f"every request failed ({failed} of {total}):"
    for line in lines:
        print(f"kvsim run: {line}", file=sys.stderr)
    return 0 if completed else 1


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """While the run goes, SIGTERM unwinds the stack like Ctrl-C (temporary files are removed)."""
    def handler(signum, frame):
        raise Interrupted()

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:                   # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
