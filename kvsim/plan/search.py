"""The rate search of one (candidate, seed), what a probe simulates, and the SLO rules.

``RateSearch`` brackets then bisects; ``probe_point`` is the simulation of one
probe (run by a worker); ``slo_violations`` and ``binding_constraint`` read a
probe's summary.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from kvsim.plan.spec import RateBounds

# A probe at or above this KV usage had requests waiting for blocks (the pool
# is never exactly full: the last partial blocks of running requests stay free).
KV_FULL_USAGE = 0.95
# The GPU is out of compute when at least this share of the loaded steps fill
# the token budget (vLLM then defers waiting prefills to the next step).
BUDGET_SATURATED = 0.5


@dataclass
class RateSearch:
    """Bracket-then-bisect over the rate; asks for one probe at a time.

    ``next_rate()`` is the next rate to simulate (None when done) and
    ``record(rate, ok)`` tells it whether the SLOs held there. The search is
    correct for any outcome that is monotone in the rate (met below a
    threshold, missed above); ``lo`` is then within ``tolerance`` of it.
    """

    bounds: RateBounds
    lo: float | None = None      # highest rate that met the SLOs
    hi: float | None = None      # lowest rate that missed them
    probes: list[tuple[float, bool]] = field(default_factory=list)

    def next_rate(self) -> float | None:
        b = self.bounds
        if self.lo is None and self.hi is None:
            return b.start_req_s
        if self.lo is None:                       # only misses so far: go down
            rate = self.hi / b.growth
            if rate < b.min_req_s * (1 - 1e-9):
                return b.min_req_s if self.hi > b.min_req_s * (1 + 1e-9) else None
            return rate
        if self.hi is None:                       # only hits so far: go up
            if self.lo >= b.max_req_s * (1 - 1e-9):
                return None
            return min(self.lo * b.growth, b.max_req_s)
        if self.hi <= self.lo * (1 + b.tolerance) * (1 + 1e-9):   # 1e-9: rounding of lo x growth
            return None
        return math.sqrt(self.lo * self.hi)       # bisect in log space: relative tolerance

    def record(self, rate: float, ok: bool) -> None:
        self.probes.append((rate, ok))
        if ok:
            self.lo = rate if self.lo is None else max(self.lo, rate)
        else:
            self.hi = rate if self.hi is None else min(self.hi, rate)

    @property
    def status(self) -> str:
        if self.lo is None:
            return "unreachable"
        return "capped" if self.hi is None else "ok"


def bisect_max_rate(meets: Callable[[float], bool], bounds: RateBounds) -> RateSearch:
    """Run a search to the end with ``meets(rate) -> bool`` (in this process)."""
    search = RateSearch(bounds)
    while (rate := search.next_rate()) is not None:
        search.record(rate, bool(meets(rate)))
    return search


def slo_violations(summary: Mapping, slo_ms: Mapping[str, float]) -> list[str]:
    """The SLOs a run missed, as ``p99_tpot_ms = 131.2 > 100``; failed requests miss too."""
    missed = []
    for key, limit in slo_ms.items():
        value = summary.get(key)
        if value is None or not math.isfinite(float(value)) or float(value) > limit:
            missed.append(f"{key} = {float('nan') if value is None else float(value):.1f} > {limit:g}")
    failed = summary.get("failed") or 0
    if failed:
        missed.append(f"{int(failed)} request(s) failed")
    return missed


def binding_constraint(summary: Mapping, missed: list[str]) -> tuple[str, str]:
    """What stops a higher rate, read from the probe just above the max rate.

    In this order:

    * ``kv_capacity``: requests were preempted, or the KV pool ran full
      (usage >= 95%), so requests waited for blocks;
    * ``compute``: a per-token SLO (TPOT, ITL) was missed: the steps are too
      long for the batch the arrivals make; or TTFT/E2EL was missed while
      most steps (>= half) filled the token budget: prefills wait because
      the GPU has no tokens to spare;
    * ``ttft_queueing``: TTFT/E2EL was missed with KV and compute to spare:
      arrivals queue behind a full ``max_num_seqs`` (said in the detail), or
      bursts and long prefills queue while the budget still has room.
    """
    preempted = int(summary.get("num_preemptions") or 0)
    kv_max = float(summary.get("kv_cache_usage_max") or 0.0)
    budget = float(summary.get("plan_budget_full_fraction") or 0.0)
    seqs = float(summary.get("plan_seqs_full_fraction") or 0.0)
    missed_text = "; ".join(missed)
    if preempted or kv_max >= KV_FULL_USAGE:
        return "kv_capacity", f"{missed_text}; {preempted} preemptions, KV usage max {100 * kv_max:.0f}%"
    if any("tpot" in m or "itl" in m for m in missed):
        return "compute", f"{missed_text}; token budget full in {100 * budget:.0f}% of steps"
    if budget >= BUDGET_SATURATED:
        return "compute", f"{missed_text}; token budget full in {100 * budget:.0f}% of steps"
    why = (f"max_num_seqs full in {100 * seqs:.0f}% of steps" if seqs >= BUDGET_SATURATED else
           f"token budget full in only {100 * budget:.0f}% of steps, KV usage max {100 * kv_max:.0f}%")
    return "ttft_queueing", f"{missed_text}; {why}"


# ----------------------------------------------------------------------------
# One probe (runs in a worker process)
# ----------------------------------------------------------------------------

def probe_point(scenario: dict, point_dir: str | None = None, *,
                base_dir: str | os.PathLike | None = None) -> dict:
    """Simulate one probe: the run's summary plus the step facts the binding rule reads.

    Over the steps that start before the last arrival (the drain afterwards is
    lighter than the offered load): ``plan_budget_full_fraction``, the share
    of steps whose tokens fill >= 95% of ``max_num_batched_tokens``, and
    ``plan_seqs_full_fraction``, the share that end with ``max_num_seqs``
    requests running.
    """
    import numpy as np

    from kvsim.scenario import load_scenario, simulate

    sc = load_scenario(scenario, base_dir=base_dir)
    result = simulate(sc)
    summary = dict(result.summary)
    steps, requests = result.steps, result.requests
    last_arrival_s = float(requests["arrival_time_s"].max()) if len(requests) else 0.0
    loaded = steps[steps["start_time_s"] < last_arrival_s] if last_arrival_s > 0 else steps
    if len(loaded):
        tokens = (loaded["num_prefill_tokens"] + loaded["num_decode_tokens"]).to_numpy(dtype=float)
        budget = sc.sched_config.max_num_batched_tokens
        summary["plan_budget_full_fraction"] = float(np.mean(tokens >= 0.95 * budget))
        running = loaded["num_running"].to_numpy(dtype=float)
        summary["plan_seqs_full_fraction"] = float(np.mean(running >= sc.sched_config.max_num_seqs))
    else:
        summary["plan_budget_full_fraction"] = summary["plan_seqs_full_fraction"] = 0.0
    if point_dir is not None:
        result.write(point_dir)
    return summary
