"""Reports: known results reproduced by simulation, and the cost-model calibration report.

``kvsim report`` runs the known-result reports, one module per report (its
experiment, its published numbers and tolerances)::

    static_vs_continuous.py  paged_vs_contiguous.py  chunk_size_itl.py  prefix_caching.py
    kv_pressure.py           sharing.py              quickstart.py      schedulers_azure.py
    hybrid_kv_capacity.py    radix_vs_hash.py         fleet_routing.py   kv_offload.py
    pd_goodput.py
    kv_offload_mooncake.py

on the framework of ``framework.py`` (checks, verdict, Markdown, the index),
and writes ``reports/<name>.md``. ``kvsim calibrate report`` writes
``reports/calibration.md`` (``calibration.py``, with the serving replay of
``replay.py``). This package sits at the top of kvsim's layers: it may import
anything below (scenario, metrics, ...) and nothing below imports it.

    kvsim report                     # every report, full size, into reports/
    kvsim report sharing --fast --out /tmp/r

Docs: docs/reports.md.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from pathlib import Path

from kvsim.reports.framework import DEFAULT_DATA, Check, Report, ReportContext, render

# The known-result reports, in the order of the index (reports/README.md);
# each name is the module kvsim/reports/<name>.py and the scenario <name>.yaml.
REPORTS = ("static_vs_continuous", "paged_vs_contiguous", "chunk_size_itl", "prefix_caching",
           "kv_pressure", "sharing", "quickstart", "schedulers_azure", "hybrid_kv_capacity",
           "radix_vs_hash", "fleet_routing", "kv_offload",   # kv_offload*: kvtiers, issue 15
           "kv_offload_mooncake",
           "pd_goodput")                                      # pd_goodput: fleet, issue 14 (b)
# Where the reports find their scenarios unless told (--scenarios): the
# repository's scenarios/ folder, seen from the repository root.
DEFAULT_SCENARIOS = Path("scenarios")

__all__ = ["DEFAULT_DATA", "REPORTS", "Check", "Report", "ReportContext", "render", "run_reports", "run_report"]


def run_report(name: str, ctx: ReportContext) -> Report:
    """Run one known-result report (``kvsim.reports.<name>.run``)."""
    return importlib.import_module(f"kvsim.reports.{name}").run(ctx)


def run_reports(names: Sequence[str] | None = None, out: str | Path = "reports", *,
                fast: bool = False, scenarios: str | Path = DEFAULT_SCENARIOS,
                log: Callable[[str], None] | None = None,
                data: str | Path = DEFAULT_DATA) -> list[Report]:
    """Run the named reports (all by default); write OUT/<name>.md and OUT/README.md.

    ``scenarios`` is the folder holding ``<name>.yaml`` of each report (the
    repository's ``scenarios/``); ``fast`` shrinks every workload (the tests);
    ``data`` is the data root of the reports on real traces (``kv_offload_mooncake``
    reads ``DATA/traces/mooncake_conversation_trace.jsonl``; default ``../shared/data``).
    """
    from kvsim.reports.framework import run_reports as run_all
    names = list(names or REPORTS)
    unknown = [n for n in names if n not in REPORTS]
    if unknown:
        raise ValueError(f"report {unknown[0]!r} does not exist; allowed: {', '.join(REPORTS)}")
    scenarios = Path(scenarios)
    missing = [n for n in names if not (scenarios / f"{n}.yaml").is_file()]
    if missing:
        raise ValueError(f"--scenarios {scenarios}: no {missing[0]}.yaml there; give the folder of "
                         f"the report scenarios (the repository's scenarios/) with --scenarios DIR")
    return run_all(names, Path(out), run_report, fast=fast, scenarios=scenarios, order=REPORTS,
                   log=log, data=Path(data))
