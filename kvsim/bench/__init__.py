"""``kvsim bench``: speed of the simulator on fixed reference workloads.

Each workload is a scenario in ``scenarios/bench/`` (W1-W4, see
docs/bench.md; ``--scenarios DIR`` when not run from the repository root).
Every measurement runs in a fresh child process, so imports and peak memory
belong to that workload alone. The package:

    workloads.py  W1-W4, the targets, judge()          measure.py  child processes, timings
    child.py      what runs inside a child             render.py   reports/performance.md
    cli.py        the command

Targets come from the speed issue; the met / not-met column is computed from
the numbers by :func:`judge`, never written by hand. The machine is shared, so
the load average is recorded: above 1 per core the numbers are pessimistic.
"""

from kvsim.bench.cli import add_parser, bench_command, main
from kvsim.bench.measure import Measurement, same_summary
from kvsim.bench.render import render_report
from kvsim.bench.workloads import REPORT_COLUMNS, TARGETS, WORKLOADS, Target, Workload, judge

__all__ = ["REPORT_COLUMNS", "TARGETS", "WORKLOADS", "Measurement", "Target", "Workload",
           "add_parser", "bench_command", "judge", "main", "render_report", "same_summary"]
