"""The reference workloads W1-W7 (``scenarios/bench/``), the speed targets and how they are judged.

Targets come from the speed issues (#19 for one engine; the sweep's from the
first one); the met / not-met column is computed from the numbers by
:func:`judge`, never written by hand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

# Where the workload scenarios and the report are unless told (--scenarios,
# --out): the repository's folders, seen from the repository root.
DEFAULT_SCENARIOS = Path("scenarios") / "bench"
DEFAULT_OUT = Path("reports") / "performance.md"

# The best-known peer (a Python simulator stepping every iteration) on W1's
# workload, 10,000 Azure conversation requests on a 2-core machine: 37 s of
# event loop, 110 s wall with its output writing, 60-75 us per event (issue).
PEER_EVENT_LOOP_S = 37.0
PEER_WALL_S = 110.0

REPORT_COLUMNS = ("metric", "median", "min", "max", "target", "met")


@dataclass(frozen=True)
class Workload:
    """One reference workload: a scenario file and how to shrink it."""

    name: str
    scenario: str                 # file name in scenarios/bench/
    kind: str                     # "run" (kvsim run) or "sweep" (kvsim sweep)
    title: str
    size_key: str                 # the scenario key that sets the number of requests
    ratio_requests: int | None    # prefix for the step-path ratio with --quick (None: no ratio)
    ratio_always_prefix: bool = False   # the full step path would take far too long
    heavy: bool = False           # minutes per run: repeated --heavy-reps times, not --reps
    default: bool = True          # in the default set (False: only when named, e.g. `kvsim bench W5`)
    attribution_requests: int | None = None   # cut for the cProfile run (None: the whole workload)
    # --set overrides of the cProfile run: cProfile sees one process, so a fleet's
    # replicas are profiled in it (cluster.workers=1: the same work, docs/fleet.md).
    attribution_overrides: tuple[str, ...] = ()


WORKLOADS: dict[str, Workload] = {w.name: w for w in (
    Workload("W1", "w1.yaml", "run",
             "Azure 2023 conversation trace, first 10,000 requests; Llama-3.1-8B, 1x H100, "
             "chunked, budget 2048, prefix caching, roofline",
             "workload.trace.max_requests", 2000),
    Workload("W2", "w2.yaml", "run",
             "Mooncake conversation trace, all 12,031 requests with hash_ids prefix sharing; "
             "Llama-3.1-70B, TP4 on H100, chunked, roofline",
             "workload.trace.max_requests", 1000, heavy=True, attribution_requests=3000),
    Workload("W3", "w3.yaml", "sweep",
             "100-point sweep of W1's first 2,000 requests: 10 budgets x 5 block sizes x "
             "prefix caching on/off, on all cores",
             "workload.trace.max_requests", None, heavy=True),
    Workload("W4", "w4.yaml", "run",
             "1,000,000 synthetic requests, streaming metrics; Qwen3-1.7B, 1x H100, "
             "Poisson 1000 req/s, 4 output tokens",
             "workload.num_requests", 10000, ratio_always_prefix=True, heavy=True,
             attribution_requests=100_000),
    # W4 scaled x10: about ten times W4's minutes, so only when asked for.
    Workload("W5", "w5.yaml", "run",
             "10,000,000 synthetic requests, streaming metrics (W4 x10); Qwen3-1.7B, 1x H100, "
             "Poisson 1000 req/s, 4 output tokens",
             "workload.num_requests", 10000, ratio_always_prefix=True, heavy=True, default=False,
             attribution_requests=100_000),
    Workload("W6", "w6.yaml", "run",
             "W1's 10,000 Azure conversation requests on the `continuous` scheduler (vLLM V0, "
             "no chunked prefill: budget = max_model_len 16,384); Llama-3.1-8B, 1x H100, roofline",
             "workload.trace.max_requests", 2000),
    # Issue 14's fleet benchmark: 16 of W1's engines; the step-path ratio on a
    # 2,000-request prefix (the 16 replicas step by step take minutes).
    Workload("W7", "w7.yaml", "run",
             "a fleet: 16 W1 replicas behind round robin, 160,000 requests with the Azure "
             "conversation trace's lengths at 16x its rate (Poisson)",
             "workload.num_requests", 2000, ratio_always_prefix=True, heavy=True,
             attribution_requests=20_000, attribution_overrides=("cluster.workers=1",)),
)}

DEFAULT_WORKLOADS = tuple(name for name, w in WORKLOADS.items() if w.default)


@dataclass(frozen=True)
class Target:
    """A goal from the issue: ``metric`` of ``workload`` must be below ``limit``."""

    workload: str
    metric: str
    limit: float
    unit: str
    text: str
    relative_to: str | None = None   # judged on metric(workload) / metric(relative_to)


TARGETS = (
    # Issue 19: <= 0.5 s is >= 20,000 simulated requests/s and >= 3,500x real
    # time on W1's 10,000 requests and 1,790 simulated seconds.
    Target("W1", "sim_s", 0.5, "s",
           "simulated in 0.5 s (20,000 requests/s, 3,500x real time) on one core"),
    Target("W1", "process_wall_s", 1.5, "s",
           "whole `kvsim run` process (imports, output writing) in 1.5 s"),
    # The same two targets in CPU time: on a shared machine wall time includes
    # waiting for the CPU; CPU time does not (equal to wall on an idle core).
    Target("W1", "sim_cpu_s", 0.5, "s", "simulation in 0.5 s of CPU time (load-independent view)"),
    Target("W1", "process_cpu_s", 1.5, "s", "whole process in 1.5 s of CPU time (load-independent view)"),
    Target("W3", "process_wall_s", 30.0, "s", "100-point sweep under 30 s on two cores"),
    Target("W3", "cpu_per_worker_s", 30.0, "s",
           "sweep CPU time / workers under 30 s (load-independent view)"),
    Target("W4", "peak_rss_mib", 1024.0, "MiB", "peak memory under 1 GiB"),
    Target("W5", "peak_rss_mib", 1024.0, "MiB", "10 million streamed requests in under 1 GiB"),
    Target("W6", "sim_cpu_s", 1.5, "x",
           "`continuous` within 1.5x of `chunked` (W1), CPU time in simulate()", relative_to="W1"),
    # Issue 14: cost grows with requests, not replicas x requests; issue 19: the fleet in 10 s.
    Target("W7", "sim_cpu_s", 20.0, "x", "fleet within 20x W1's CPU time in simulate()",
           relative_to="W1"),
    Target("W7", "sim_s", 10.0, "s", "16 replicas, 160,000 requests in 10 s"),
)

# metric key -> (label, unit, format)
METRICS = {
    "sim_s": ("time inside simulate()", "s", "{:.3f}"),
    "sim_cpu_s": ("CPU time inside simulate()", "s", "{:.3f}"),
    "process_wall_s": ("whole process wall time", "s", "{:.2f}"),
    "process_cpu_s": ("whole process CPU time (user + system)", "s", "{:.2f}"),
    "requests_per_s": ("simulated requests per wall second (W3: of the sweep, else in simulate)",
                       "req/s", "{:,.0f}"),
    "steps_per_s": ("engine steps per wall second (in simulate)", "steps/s", "{:,.0f}"),
    "us_per_step": ("wall time per engine step", "us", "{:.1f}"),
    "num_events": ("events (arrivals + finishes + single steps + decode runs)", "", "{:,.0f}"),
    "us_per_event": ("wall time per event", "us", "{:.1f}"),
    "x_real_time": ("simulated time / time in simulate() (x real time)", "x", "{:,.0f}"),
    "num_steps": ("engine steps", "", "{:,.0f}"),
    "fast_step_share": ("steps taken by the fast path", "%", "{:.1f}"),
    "num_requests": ("simulated requests", "", "{:,.0f}"),
    "peak_rss_mib": ("peak memory (RSS of the process; W3: its largest process)", "MiB", "{:,.0f}"),
    "points_sim_s_sum": ("sum of the points' own wall times", "s", "{:.2f}"),
    "cpu_per_worker_s": ("CPU time (user + system, workers included) / workers", "s", "{:.2f}"),
}


def target_value(t: Target, measurements: dict) -> float | None:
    """The median ``t`` is judged on: of ``t.workload``, or its ratio to ``t.relative_to``'s."""
    m = measurements.get(t.workload)
    value = m.median(t.metric) if m is not None else None
    if value is None or t.relative_to is None:
        return value
    ref = measurements.get(t.relative_to)
    base = ref.median(t.metric) if ref is not None else None
    return value / base if base else None


def target_range(t: Target, measurements: dict) -> tuple[float, float] | None:
    """For a relative target, the lowest and highest ratio the repetitions allow
    (the fastest of ``t.workload`` over the slowest of its reference, and the
    reverse); None for an absolute target or with one repetition on each side.

    A median ratio near its limit can fall on either side from run to run (W7
    against W1 did: 19.8-21.1x in three runs); the range says how near it is.
    """
    if t.relative_to is None or t.workload not in measurements or t.relative_to not in measurements:
        return None
    values = measurements[t.workload].values(t.metric)
    base = [b for b in measurements[t.relative_to].values(t.metric) if b]
    if not values or not base or len(values) * len(base) == 1:
        return None
    return min(values) / max(base), max(values) / min(base)


def judge(value: float | None, limit: float) -> str:
    """Met / not-met cell for ``value < limit``; how far off when not met."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a (not measured)"
    if value < limit:
        return "met"
    return f"NOT met ({value / limit:.2f}x the target)"
