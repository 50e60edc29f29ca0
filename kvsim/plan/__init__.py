"""``kvsim plan``: the highest request rate each GPU candidate serves within the SLOs.

For every candidate (GPU x TP x KV dtype x engine knobs) and every seed, the
rate is found by **bisection over simulations**, not by a formula::

    bracket:  probe start; x2 while the SLOs hold, /2 while they do not
    bisect:   probe sqrt(lo * hi) until hi / lo <= 1 + tolerance
    answer:   lo, the highest rate that met every SLO (hi is the lowest that missed)

Each probe is one ``kvsim run`` of the plan's base scenario with the
candidate's hardware and knobs and ``workload.arrival.rate`` set to the probed
rate. Probes of different candidates and seeds are independent and run at the
same time on the executor ``kvsim sweep`` uses (``kvsim.scenario.executor``:
local processes or Ray); the probes of one search follow each other, since
each depends on the last. With ``--out`` every probe is logged and a rerun
resumes.

From the searches come, per candidate: mean and spread of the max rate over
seeds, goodput per GPU (max rate / tp), replicas and GPUs for a target total
rate, and the binding constraint read from the probe just above the max rate
(see :func:`binding_constraint`). The plan-file format is in ``docs/plan.md``.

    spec.py    the plan file -> Plan (candidates, SLOs, seeds, rate bounds)
    search.py  RateSearch, the probe simulation, the SLO and binding rules
    run.py     run_plan: the searches on the shared executor, the probe log, the rows
    output.py  the table, plan.csv, plan.png, runs/*.yaml
    cli.py     the command
"""

from kvsim.plan.cli import add_parser, plan_command, plan_from_args
from kvsim.plan.output import CSV_COLUMNS, format_table, write_outputs
from kvsim.plan.run import run_plan
from kvsim.plan.search import (BUDGET_SATURATED, KV_FULL_USAGE, RateSearch, binding_constraint,
                               bisect_max_rate, probe_point, slo_violations)
from kvsim.plan.spec import (LATENCY_METRICS, LATENCY_STATS, Candidate, Plan, PlanError, RateBounds,
                             normalize_slo_key, parse_plan, with_rate)

__all__ = ["BUDGET_SATURATED", "CSV_COLUMNS", "KV_FULL_USAGE", "LATENCY_METRICS", "LATENCY_STATS",
           "Candidate", "Plan", "PlanError", "RateBounds", "RateSearch", "add_parser",
           "binding_constraint", "bisect_max_rate", "format_table", "normalize_slo_key",
           "parse_plan", "plan_command", "plan_from_args", "probe_point", "run_plan",
           "slo_violations", "with_rate", "write_outputs"]
