"""``kvsim bench``: speed of the simulator on fixed reference workloads.

Each workload is a scenario in ``scenarios/bench/`` (W1-W7, see
docs/bench.md; ``--scenarios DIR`` when not run from the repository root).
Every measurement runs in a fresh child process, so imports and peak memory
belong to that workload alone. The package:

    workloads.py    W1-W7, the targets, judge()        measure.py  child processes, timings
    child.py        what runs inside a child           render.py   reports/performance.md
    attribution.py  cProfile time by component         imports.py  -X importtime by package
    compare.py      --compare REF (A/B of two trees)   cli.py      the command

Targets come from the speed issues; the met / not-met column is computed from
the numbers by :func:`judge`, never written by hand. The machine is shared, so
the load average is recorded: above 1 per core the numbers are pessimistic.

The names below are imported when first used, so that a child process
(``python -m kvsim.bench _child``) starts without the harness's own imports.
"""

import importlib

_WHERE = {
    "add_parser": "cli", "bench_command": "cli", "main": "cli",
    "Measurement": "measure", "same_summary": "measure",
    "render_report": "render",
    "REPORT_COLUMNS": "workloads", "TARGETS": "workloads", "WORKLOADS": "workloads",
    "Target": "workloads", "Workload": "workloads", "judge": "workloads",
}

__all__ = sorted(_WHERE)


def __getattr__(name):
    if name in _WHERE:
        return getattr(importlib.import_module(f"kvsim.bench.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'kvsim.bench' has no attribute {name!r}")
