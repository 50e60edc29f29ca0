"""``kvsim bench``: the command, its options and the run of every workload."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from kvsim.bench.measure import measure_workload, profile_w1
from kvsim.bench.render import git_commit, machine_info, reference_loop_ms, render_report
from kvsim.bench.workloads import (DEFAULT_OUT, DEFAULT_SCENARIOS, DEFAULT_WORKLOADS, TARGETS, WORKLOADS,
                                   judge, target_range, target_value)
from kvsim.scenario.outputs import atomic_open, check_output_file


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "bench", help="speed benchmarks: out/performance.md (reports/ with --update-reports)",
        description="Run the reference workloads of scenarios/bench/ (W1: Azure conversation 10k; "
                    "W2: Mooncake 12k, 70B TP4; W3: 100-point sweep; W4: 1M synthetic, streaming; "
                    "W5: 10M synthetic, streaming, only when named; W6: W1 on the continuous "
                    "scheduler; W7: a 16-replica fleet, 160k requests), each in fresh processes, and write the timings, the time by phase "
                    "and by component, peak memory, the ratio to the step-by-step path and the "
                    "targets to a Markdown report. --compare REF instead alternates this tree and "
                    "another version on one workload. See docs/bench.md.")
    _add_arguments(p)
    p.set_defaults(func=bench_command)
    return p


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("workloads", nargs="*", metavar="W",
                   help=f"{' '.join(WORKLOADS)} (default: {' '.join(DEFAULT_WORKLOADS)}; with --compare: W1)")
    p.add_argument("--reps", type=int, default=None, metavar="N",
                   help="repetitions of W1 and W6 (default 3; see --heavy-reps for the others); "
                        "with --compare: pairs of runs (default 5)")
    p.add_argument("--heavy-reps", type=int, default=1, metavar="N",
                   help="repetitions of the workloads that take minutes each (W2, W3, W4, W5; default 1)")
    p.add_argument("--quick", action="store_true",
                   help="step-path ratio on a prefix of each trace (W1: 2,000 requests, W2: 1,000) "
                        "instead of the whole workload")
    p.add_argument("--no-ratio", action="store_true", help="skip the step-by-step path ratio")
    p.add_argument("--profile", action="store_true", help="profile W1's simulation with pyinstrument")
    p.add_argument("--no-attribution", action="store_true",
                   help="skip the cProfile run that splits each workload's time by component")
    p.add_argument("--compare", metavar="REF", default=None,
                   help="A/B: alternate runs of this tree and REF (a git commit or a worktree "
                        "path) on one workload; CPU times, and instruction counts where valgrind "
                        "exists (docs/bench.md)")
    p.add_argument("--ir-requests", type=int, default=2000, metavar="N",
                   help="with --compare: requests of the callgrind runs (default 2000, W1's first)")
    p.add_argument("--no-instructions", action="store_true",
                   help="with --compare: CPU times only, no callgrind runs")
    p.add_argument("--requests", type=int, default=None, metavar="N",
                   help="cut every workload to its first N requests (smoke tests; targets then do not apply)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="sweep workers for W3 (default: every core this process may use)")
    p.add_argument("--out", default=None, metavar="FILE.md",
                   help="report to write (default out/performance.md; with --update-reports: "
                        "reports/performance.md)")
    p.add_argument("--update-reports", action="store_true",
                   help="rewrite the tracked reports/performance.md of the repository")
    p.add_argument("--scenarios", default=str(DEFAULT_SCENARIOS), metavar="DIR",
                   help="folder of the workload scenarios w1.yaml .. w7.yaml (default "
                        "scenarios/bench, i.e. run from the repository root)")


def bench_command(args: argparse.Namespace, *, log=print) -> int:
    if getattr(args, "compare", None):
        from kvsim.bench.compare import compare_command
        return compare_command(args, log=log)
    if args.reps is None:
        args.reps = 3
    if args.out is None:     # the tracked report only on request: a plain run leaves the tree clean
        args.out = str(DEFAULT_OUT if args.update_reports else Path("out") / "performance.md")
    names = [n.upper() for n in args.workloads] or list(DEFAULT_WORKLOADS)
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        raise ValueError(f"workload {unknown[0]!r}: not a bench workload; allowed: {', '.join(WORKLOADS)}")
    for flag, value in (("--reps", args.reps), ("--heavy-reps", args.heavy_reps)):
        if value < 1:
            raise ValueError(f"{flag}: expected an integer >= 1, got {value}")
    if args.requests is not None and args.requests < 1:
        raise ValueError(f"--requests: expected an integer >= 1, got {args.requests}")
    workers = args.workers or len(os.sched_getaffinity(0))
    if workers < 1:
        raise ValueError(f"--workers: expected an integer >= 1, got {workers}")
    scenarios = Path(getattr(args, "scenarios", DEFAULT_SCENARIOS))
    missing = [WORKLOADS[n].scenario for n in names if not (scenarios / WORKLOADS[n].scenario).is_file()]
    if missing:
        raise ValueError(f"--scenarios {scenarios}: no {missing[0]} there; give the folder of the "
                         f"bench scenarios (the repository's scenarios/bench/) with --scenarios DIR")
    # The report's path is checked before minutes of measuring, and written atomically.
    check_output_file(args.out, option="--out")
    command = " ".join(["kvsim bench", *_argv_text(args)])
    machine = machine_info()
    started = time.strftime("%Y-%m-%d %H:%M %Z")
    log(f"kvsim bench: load average {machine['loadavg'][0]:.2f} on {machine['cores']} cores; "
        f"reference loop {machine['reference_loop_ms']:.1f} ms")
    measurements = []
    with tempfile.TemporaryDirectory(prefix="kvsim-bench-") as tmp:
        workdir = Path(tmp)
        for name in names:
            log(f"{name}: {WORKLOADS[name].title}")
            measurements.append(measure_workload(
                WORKLOADS[name], workdir, reps=args.heavy_reps if WORKLOADS[name].heavy else args.reps,
                quick=args.quick, requests=args.requests,
                workers=workers, ratio=not args.no_ratio, scenarios=scenarios.resolve(),
                attribution=not getattr(args, "no_attribution", False), log=log))
        profile = (profile_w1(workdir, requests=args.requests, scenarios=scenarios.resolve())
                   if args.profile else None)
    text = render_report(measurements, machine=machine, load_end=os.getloadavg(), command=command,
                         reps=args.reps, heavy_reps=args.heavy_reps, quick=args.quick, requests=args.requests,
                         commit=git_commit(), profile=profile, started=started,
                         reference_end_ms=reference_loop_ms())
    out = Path(args.out)
    with atomic_open(out, option="--out") as f:
        f.write(text)
    by_name = {m.workload.name: m for m in measurements}
    for t in TARGETS:
        if t.workload in by_name:
            value = target_value(t, by_name)
            shown = "—" if value is None else f"{value:.3g}"
            if (spread := target_range(t, by_name)) is not None:
                shown += f" ({spread[0]:.3g}-{spread[1]:.3g} from the repetitions' extremes)"
            log(f"{t.workload} {t.text}: {shown} {t.unit} -> "
                f"{'n/a (scaled)' if args.requests else judge(value, t.limit)}")
    log(f"wrote {out}")
    return 0


def _argv_text(args: argparse.Namespace) -> list[str]:
    parts = list(args.workloads)
    if args.reps != 3:
        parts += ["--reps", str(args.reps)]
    if args.heavy_reps != 1:
        parts += ["--heavy-reps", str(args.heavy_reps)]
    for flag in ("quick", "no_ratio", "profile", "no_attribution"):
        if getattr(args, flag, False):
            parts.append("--" + flag.replace("_", "-"))
    if args.requests is not None:
        parts += ["--requests", str(args.requests)]
    if args.workers is not None:
        parts += ["--workers", str(args.workers)]
    if Path(args.out).resolve() == DEFAULT_OUT.resolve():
        parts.append("--update-reports")
    elif Path(args.out) != Path("out") / "performance.md":
        parts += ["--out", args.out]
    scenarios = getattr(args, "scenarios", str(DEFAULT_SCENARIOS))
    if Path(scenarios).resolve() != DEFAULT_SCENARIOS.resolve():
        parts += ["--scenarios", scenarios]
    return parts


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("_child", "_attribute", "_profile"):
        from kvsim.bench.child import CHILDREN
        return CHILDREN[argv[0]](argv[1:])
    from kvsim.cli import main as cli_main
    return cli_main(["bench", *argv])
