"""``kvsim report [NAME ...] [--fast] [--out DIR] [--scenarios DIR] [--data DIR]``: the known-result reports."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvsim.reports import DEFAULT_DATA, DEFAULT_SCENARIOS, REPORTS


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "report", help="known-result reports: out/reports/ (reports/ with --update-reports)",
        description="Run the known-result scenarios and write OUT/<name>.md (claim, simulated vs "
                    "published numbers, verdict, figure) and OUT/README.md. Reports: "
                    + ", ".join(REPORTS) + ".")
    p.add_argument("names", nargs="*", metavar="NAME", help="reports to run (default: all)")
    p.add_argument("--fast", action="store_true", help="shrink workloads (what the tests run)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="output folder (default: out/reports; with --update-reports: reports/)")
    p.add_argument("--update-reports", action="store_true",
                   help="rewrite the tracked reports/ of the repository")
    p.add_argument("--scenarios", default=str(DEFAULT_SCENARIOS), metavar="DIR",
                   help="folder of the reports' scenarios, NAME.yaml each (default: scenarios, "
                        "i.e. run from the repository root)")
    p.add_argument("--data", default=str(DEFAULT_DATA), metavar="DIR",
                   help="data root of the reports on real traces (DIR/traces/...; default: "
                        f"{DEFAULT_DATA}, i.e. the project's shared data seen from the repository root)")
    p.set_defaults(func=_command)


def _command(args: argparse.Namespace) -> int:
    from kvsim.reports import run_reports
    # The tracked reports/ only on request: a plain run leaves the work tree clean.
    out = args.out or ("reports" if args.update_reports else str(Path("out") / "reports"))
    run_reports(args.names, out, fast=args.fast, scenarios=args.scenarios, log=print, data=args.data)
    return 0   # a report that differs is a finding, not a failure of the command
