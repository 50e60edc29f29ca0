"""``kvsim report [NAME ...] [--fast] [--out DIR] [--scenarios DIR]``: the known-result reports."""

from __future__ import annotations

import argparse

from kvsim.reports import DEFAULT_SCENARIOS, REPORTS


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "report", help="regenerate the known-result reports in reports/",
        description="Run the known-result scenarios and write OUT/<name>.md (claim, simulated vs "
                    "published numbers, verdict, figure) and OUT/README.md. Reports: "
                    + ", ".join(REPORTS) + ".")
    p.add_argument("names", nargs="*", metavar="NAME", help="reports to run (default: all)")
    p.add_argument("--fast", action="store_true", help="shrink workloads (what the tests run)")
    p.add_argument("--out", default="reports", metavar="DIR", help="output folder (default: reports)")
    p.add_argument("--scenarios", default=str(DEFAULT_SCENARIOS), metavar="DIR",
                   help="folder of the reports' scenarios, NAME.yaml each (default: scenarios, "
                        "i.e. run from the repository root)")
    p.set_defaults(func=_command)


def _command(args: argparse.Namespace) -> int:
    from kvsim.reports import run_reports
    run_reports(args.names, args.out, fast=args.fast, scenarios=args.scenarios, log=print)
    return 0   # a report that differs is a finding, not a failure of the command
