"""``kvsim plan``: the highest request rate each GPU candidate serves within the SLOs.

For every candidate (GPU x TP x KV dtype x engine knobs) and every seed, the
rate is found by **bisection over simulations**, not by a formula::

    bracket:  probe start; x2 while the SLOs hold, /2 while they do not
    bisect:   probe sqrt(lo * hi) until hi / lo <= 1 + tolerance
    answer:   lo, the highest rate that met every SLO (hi is the lowest that missed)

Each probe is one ``kvsim run`` of the plan's base scenario with the
candidate's hardware and knobs and ``workload.arrival.rate`` set to the probed
rate. Probes of different candidates and seeds are independent and run at the
same time on the sweep executor's process pool (``kvsim.scenario.sweep.run_task``);
the probes of one search follow each other, since each depends on the last.

From the searches come, per candidate: mean and spread of the max rate over
seeds, goodput per GPU (max rate / tp), replicas and GPUs for a target total
rate, and the binding constraint read from the probe just above the max rate
(see :func:`binding_constraint`). The plan-file format is in ``docs/plan.md``.
"""

from __future__ import annotations

import argparse
import copy
import functools
import itertools
import math
import os
import sys
import time
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

PLAN_KEYS = ("gpus", "tp", "kv_cache_dtype", "max_num_batched_tokens", "max_num_seqs", "slo",
             "target_rate", "seeds", "rate", "tolerance", "workers")
RATE_KEYS = ("start", "min", "max")
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
LATENCY_STATS = ("mean", "median", "p90", "p99")
# A probe at or above this KV usage had requests waiting for blocks (the pool
# is never exactly full: the last partial blocks of running requests stay free).
KV_FULL_USAGE = 0.95
# The GPU is out of compute when at least this share of the loaded steps fill
# the token budget (vLLM then defers waiting prefills to the next step).
BUDGET_SATURATED = 0.5

CSV_COLUMNS = ["candidate", "gpu", "tp", "kv_cache_dtype", "max_num_batched_tokens",
               "max_num_seqs", "status", "max_rate_req_s", "max_rate_std", "max_rate_min",
               "max_rate_max", "num_seeds", "goodput_req_s_per_gpu",
               "target_rate_req_s", "replicas", "num_gpus", "binding", "detail", "num_probes",
               "seed0_max_rate_req_s", "seed0_fails_at_rate_req_s"]


class PlanError(ValueError):
    """Bad plan input; the message names the YAML path or flag, the value and what is allowed."""


# ----------------------------------------------------------------------------
# The plan file
# ----------------------------------------------------------------------------

@dataclass(frozen=True)
class RateBounds:
    """The search range in req/s and the relative tolerance of the answer."""

    start_req_s: float = 1.0
    min_req_s: float = 0.05
    max_req_s: float = 1024.0
    tolerance: float = 0.05
    growth: float = 2.0


@dataclass(frozen=True)
class Candidate:
    gpu: str
    tp: int
    kv_cache_dtype: str
    max_num_batched_tokens: int | None
    max_num_seqs: int | None
    label: str = ""          # names the GPU, TP and whatever else the plan varies

    def apply(self, scenario: dict) -> dict:
        """The base scenario with this candidate's hardware and knobs (a new dict)."""
        sc = copy.deepcopy(scenario)
        sc["hardware"] = {**(sc.get("hardware") or {}), "gpu": self.gpu, "tp": self.tp}
        engine = dict(sc.get("engine") or {})
        engine["kv_cache_dtype"] = self.kv_cache_dtype
        if self.max_num_batched_tokens is not None:
            engine["max_num_batched_tokens"] = self.max_num_batched_tokens
        if self.max_num_seqs is not None:
            engine["max_num_seqs"] = self.max_num_seqs
        sc["engine"] = engine
        return sc


@dataclass(frozen=True)
class Plan:
    base: dict                       # the scenario without its plan section
    base_dir: Path
    candidates: tuple[Candidate, ...]
    slo_ms: dict[str, float]         # summary key (p99_ttft_ms) -> limit
    seeds: tuple[int, ...]
    bounds: RateBounds
    target_rate_req_s: float | None
    workers: int | None


def normalize_slo_key(key: str) -> str:
    """``p99_ttft_ms``, ``ttft_p99_ms`` or ``ttft_p99`` -> the summary key ``p99_ttft_ms``."""
    parts = key.strip().removesuffix("_ms").split("_")
    if len(parts) == 2:
        a, b = parts
        stat, metric = (a, b) if a in LATENCY_STATS else (b, a)
        if stat in LATENCY_STATS and metric in LATENCY_METRICS:
            return f"{stat}_{metric}_ms"
    allowed = ", ".join(f"{s}_{m}_ms" for m in ("ttft", "tpot") for s in ("p90", "p99"))
    raise PlanError(f"plan.slo.{key}: not a latency percentile; allowed: "
                    f"{{mean,median,p90,p99}}_{{ttft,tpot,itl,e2el}}_ms, e.g. {allowed}")


def _label(combo: tuple, dtypes: list, knobs: dict) -> str:
    gpu, tp, dtype, mnbt, seqs = combo
    parts = [gpu, f"tp{tp}"]
    if len(dtypes) > 1 or dtype != "auto":
        parts.append(f"kv {dtype}")
    if len(knobs["max_num_batched_tokens"]) > 1:
        parts.append(f"mnbt {mnbt}")
    if len(knobs["max_num_seqs"]) > 1:
        parts.append(f"seqs {seqs}")
    return " ".join(parts)


def _as_list(where: str, value: Any, kind: type, allowed: str) -> list:
    items = value if isinstance(value, list) else [value]
    if not items:
        raise PlanError(f"{where}: empty list; give at least one value ({allowed})")
    for item in items:
        ok = item is None if kind is type(None) else (
            isinstance(item, kind) and not isinstance(item, bool))
        if not ok:
            raise PlanError(f"{where}: got {item!r}; expected {allowed}")
    return items


def _positive(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise PlanError(f"{where}: got {value!r}; expected a number > 0")
    return float(value)


def parse_plan(data: Mapping, base_dir: str | os.PathLike = ".") -> Plan:
    """A plan from a mapping: a scenario plus a ``plan:`` section (docs/plan.md)."""
    if not isinstance(data, Mapping):
        raise PlanError(f"plan file: expected a mapping (a scenario with a plan: section), "
                        f"got {type(data).__name__}")
    section = data.get("plan") or {}
    if not isinstance(section, Mapping):
        raise PlanError(f"plan: expected a mapping with keys {', '.join(PLAN_KEYS)}, got {section!r}")
    for key in section:
        if key not in PLAN_KEYS:
            raise PlanError(f"plan.{key}: unknown key; allowed: {', '.join(PLAN_KEYS)}")
    base = {k: copy.deepcopy(v) for k, v in data.items() if k not in ("plan", "sweep")}
    hardware = base.get("hardware") or {}
    engine = base.get("engine") or {}

    gpus = _as_list("plan.gpus", section.get("gpus", hardware.get("gpu", "h100-sxm")), str,
                    "GPU catalog names (kvsim capacity --list)")
    tps = _as_list("plan.tp", section.get("tp", hardware.get("tp", 1)), int, "integers >= 1")
    if any(tp < 1 for tp in tps):
        raise PlanError(f"plan.tp: got {tps}; every degree must be >= 1")
    dtypes = _as_list("plan.kv_cache_dtype", section.get("kv_cache_dtype",
                                                         engine.get("kv_cache_dtype", "auto")),
                      str, "auto, fp16, bf16, fp8, fp8_e4m3, fp8_e5m2 or int8")
    knobs = {}
    for knob in ("max_num_batched_tokens", "max_num_seqs"):
        values = section.get(knob, engine.get(knob))
        knobs[knob] = [None] if values is None else _as_list(f"plan.{knob}", values, int,
                                                             "integers >= 1")
    combos = list(itertools.product(gpus, tps, dtypes, knobs["max_num_batched_tokens"],
                                    knobs["max_num_seqs"]))
    candidates = tuple(Candidate(*combo, label=_label(combo, dtypes, knobs)) for combo in combos)

    slo_raw = section.get("slo")
    if slo_raw is None:  # fall back on the scenario's slo section (p99 of each)
        slo_raw = {f"p99_{k}": v for k, v in (base.get("slo") or {}).items() if v is not None}
    if not isinstance(slo_raw, Mapping) or not slo_raw:
        raise PlanError("plan.slo: give at least one SLO, e.g. {p99_ttft_ms: 2000, p99_tpot_ms: 100}")
    slo_ms = {normalize_slo_key(str(k)): _positive(f"plan.slo.{k}", v) for k, v in slo_raw.items()}

    seeds_raw = section.get("seeds", 3)
    if isinstance(seeds_raw, list):
        seeds = tuple(_as_list("plan.seeds", seeds_raw, int, "integers >= 0"))
    elif isinstance(seeds_raw, int) and not isinstance(seeds_raw, bool) and seeds_raw >= 1:
        first = base.get("seed", 0)
        seeds = tuple(range(first, first + seeds_raw))
    else:
        raise PlanError(f"plan.seeds: got {seeds_raw!r}; expected a count >= 1 or a list of seeds")

    rate = section.get("rate") or {}
    if not isinstance(rate, Mapping):
        raise PlanError(f"plan.rate: got {rate!r}; expected a mapping with {', '.join(RATE_KEYS)}")
    for key in rate:
        if key not in RATE_KEYS:
            raise PlanError(f"plan.rate.{key}: unknown key; allowed: {', '.join(RATE_KEYS)}")
    defaults = RateBounds()
    bounds = RateBounds(
        start_req_s=_positive("plan.rate.start", rate.get("start", defaults.start_req_s)),
        min_req_s=_positive("plan.rate.min", rate.get("min", defaults.min_req_s)),
        max_req_s=_positive("plan.rate.max", rate.get("max", defaults.max_req_s)),
        tolerance=_positive("plan.tolerance", section.get("tolerance", defaults.tolerance)))
    if not bounds.min_req_s <= bounds.start_req_s <= bounds.max_req_s:
        raise PlanError(f"plan.rate: need min <= start <= max, got min={bounds.min_req_s}, "
                        f"start={bounds.start_req_s}, max={bounds.max_req_s}")
    target = section.get("target_rate")
    target = None if target is None else _positive("plan.target_rate", target)
    workers = section.get("workers")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise PlanError(f"plan.workers: got {workers!r}; expected an integer >= 1")
    _check_rate_settable(base.get("workload") or {})
    return Plan(base, Path(base_dir).resolve(), candidates, slo_ms, seeds, bounds, target, workers)


def _check_rate_settable(workload: Mapping) -> None:
    arrival = workload.get("arrival")
    if arrival is None:
        return  # synthetic default (poisson) or a trace replayed at a Poisson rate
    kind = arrival.get("type") if isinstance(arrival, Mapping) else None
    if kind not in ("poisson", "gamma", "constant"):
        raise PlanError(f"workload.arrival.type: got {kind!r}; kvsim plan varies the request "
                        f"rate, so the arrival must be poisson, gamma or constant")
    if "requests_file" in workload:
        raise PlanError("workload.requests_file: fixed arrival times cannot be re-rated; "
                        "use a synthetic workload or a trace")


def with_rate(scenario: dict, rate_req_s: float, seed: int) -> dict:
    """The scenario with the arrival rate (and seed) of one probe (a new dict)."""
    sc = copy.deepcopy(scenario)
    sc["seed"] = seed
    workload = sc.setdefault("workload", {})
    arrival = dict(workload.get("arrival") or {"type": "poisson"})
    if arrival.get("type") == "constant":
        arrival["interval_s"] = 1.0 / rate_req_s
    else:
        arrival["rate"] = rate_req_s
    workload["arrival"] = arrival
    return sc


# ----------------------------------------------------------------------------
# The search
# ----------------------------------------------------------------------------

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


# ----------------------------------------------------------------------------
# Running a plan
# ----------------------------------------------------------------------------

@dataclass
class _Job:
    candidate: int
    seed: int
    search: RateSearch
    summaries: dict[float, dict] = field(default_factory=dict)
    error: str = ""          # a probe that raised: the search stops, the row says why

    def next_rate(self) -> float | None:
        return None if self.error else self.search.next_rate()


def _check_candidate(plan: Plan, cand: Candidate) -> str | None:
    """None if the candidate loads, else a one-line reason (does not fit, bad name, ...)."""
    from kvsim.scenario import load_scenario
    try:
        load_scenario(with_rate(cand.apply(plan.base), plan.bounds.start_req_s, plan.seeds[0]),
                      base_dir=plan.base_dir)
    except ValueError as exc:
        return " ".join(str(exc).split())
    return None


def run_plan(plan: Plan, *, workers: int | None = None,
             progress: Callable[[int], None] | None = None) -> list[dict]:
    """Search every (candidate, seed); return one row per candidate (``CSV_COLUMNS``).

    The first seed of a candidate searches from ``plan.rate.start``; the
    other seeds then start at its answer and bracket with steps of
    ``1 + tolerance`` (two or three probes instead of a whole search), so the
    spread over seeds costs little. Searches of different candidates, and the
    later seeds of one, run at the same time on the process pool.
    """
    from kvsim.scenario.sweep import default_workers, run_task

    rows: list[dict | None] = [None] * len(plan.candidates)
    jobs: list[_Job] = []
    for i, cand in enumerate(plan.candidates):
        problem = _check_candidate(plan, cand)
        if problem:
            rows[i] = _row(plan, cand, status="does not fit" if "model/hardware" in problem
                           else "invalid", detail=problem)
            continue
        jobs.append(_Job(i, plan.seeds[0], RateSearch(plan.bounds)))

    runner = functools.partial(probe_point, base_dir=plan.base_dir)
    workers = workers or plan.workers or default_workers()
    num_probes = 0

    def task(job: _Job, rate: float):
        scenario = with_rate(plan.candidates[job.candidate].apply(plan.base), rate, job.seed)
        return (runner, scenario, None)

    def record(job: _Job, rate: float, result: dict) -> None:
        nonlocal num_probes
        num_probes += 1
        if result.get("summary") is None:   # an engine error, not an SLO miss
            job.error = f"the probe at {rate:.3g} req/s (seed {job.seed}) raised {result.get('error')}"
            return
        job.summaries[rate] = result["summary"]
        job.search.record(rate, not slo_violations(result["summary"], plan.slo_ms))
        if progress:
            progress(num_probes)

    def followers(job: _Job) -> list[_Job]:
        """The other seeds' searches, once the first seed's is done."""
        if job.seed != plan.seeds[0] or job.search.lo is None or job.error:
            return []
        near = RateBounds(start_req_s=job.search.lo, min_req_s=plan.bounds.min_req_s,
                          max_req_s=plan.bounds.max_req_s, tolerance=plan.bounds.tolerance,
                          growth=1 + plan.bounds.tolerance)
        new = [_Job(job.candidate, seed, RateSearch(near)) for seed in plan.seeds[1:]]
        jobs.extend(new)
        return new

    ready = list(jobs)
    if workers <= 1:
        while ready:
            job = ready.pop(0)
            while (rate := job.next_rate()) is not None:
                record(job, rate, run_task(*task(job, rate)))
            ready.extend(followers(job))
    else:
        # Each search has one probe in flight at most; when it returns, that
        # search's next probe (or the next seeds' searches) go in at once.
        with ProcessPoolExecutor(max_workers=workers) as pool:
            in_flight: dict = {}
            while ready or in_flight:
                while ready:
                    job = ready.pop(0)
                    rate = job.next_rate()
                    if rate is None:
                        ready.extend(followers(job))
                    else:
                        in_flight[pool.submit(run_task, *task(job, rate))] = (job, rate)
                if not in_flight:
                    break
                done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                for future in done:
                    job, rate = in_flight.pop(future)
                    record(job, rate, future.result())
                    ready.append(job)

    for i, cand in enumerate(plan.candidates):
        if rows[i] is None:
            rows[i] = _aggregate(plan, cand, [j for j in jobs if j.candidate == i])
    return rows


def _row(plan: Plan, cand: Candidate, **values) -> dict:
    row = {c: None for c in CSV_COLUMNS}
    row.update(candidate=cand.label, gpu=cand.gpu, tp=cand.tp, kv_cache_dtype=cand.kv_cache_dtype,
               max_num_batched_tokens=cand.max_num_batched_tokens, max_num_seqs=cand.max_num_seqs,
               num_seeds=len(plan.seeds), target_rate_req_s=plan.target_rate_req_s)
    row.update(values)
    return row


def _aggregate(plan: Plan, cand: Candidate, jobs: list[_Job]) -> dict:
    import numpy as np

    num_probes = sum(len(j.search.probes) for j in jobs)
    errors = [j.error for j in jobs if j.error]
    if errors:
        return _row(plan, cand, status="error", num_probes=num_probes, detail=errors[0])
    statuses = {j.search.status for j in jobs}
    if "unreachable" in statuses:
        job = next(j for j in jobs if j.search.status == "unreachable")
        lowest = min(job.summaries)
        missed = slo_violations(job.summaries[lowest], plan.slo_ms)
        return _row(plan, cand, status="unreachable", num_probes=num_probes,
                    detail=f"SLO missed even at {lowest:.3g} req/s (seed {job.seed}): "
                           f"{'; '.join(missed)}")
    rates = np.array([j.search.lo for j in jobs])
    mean = float(rates.mean())
    # Binding constraint: from each seed's first missed probe above its max
    # rate; the most common answer wins (ties: the first seed's).
    bindings, details = [], []
    for job in jobs:
        if job.search.hi is None:
            bindings.append("rate cap")
            details.append(f"SLOs still met at plan.rate.max = {plan.bounds.max_req_s:g} req/s")
            continue
        summary = job.summaries[job.search.hi]
        kind, why = binding_constraint(summary, slo_violations(summary, plan.slo_ms))
        bindings.append(kind)
        details.append(f"at {job.search.hi:.3g} req/s: {why}")
    binding = max(bindings, key=lambda b: (bindings.count(b), -bindings.index(b)))
    # Replicas: conservative, sized by the slowest seed's max rate.
    replicas = num_gpus = None
    if plan.target_rate_req_s is not None and rates.min() > 0:
        replicas = math.ceil(plan.target_rate_req_s / float(rates.min()) - 1e-9)
        num_gpus = replicas * cand.tp
    return _row(plan, cand, status="capped" if "capped" in statuses else "ok",
                max_rate_req_s=mean, max_rate_std=float(rates.std()),
                max_rate_min=float(rates.min()), max_rate_max=float(rates.max()),
                goodput_req_s_per_gpu=mean / cand.tp, replicas=replicas, num_gpus=num_gpus,
                binding=binding, detail=details[bindings.index(binding)], num_probes=num_probes,
                seed0_max_rate_req_s=jobs[0].search.lo, seed0_fails_at_rate_req_s=jobs[0].search.hi)


# ----------------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------------

def format_table(rows: list[dict], plan: Plan) -> str:
    slo = ", ".join(f"{k} <= {v:g}" for k, v in plan.slo_ms.items())
    lines = [f"SLOs: {slo}; {len(plan.seeds)} seed(s); tolerance {100 * plan.bounds.tolerance:g}%"
             + (f"; target {plan.target_rate_req_s:g} req/s" if plan.target_rate_req_s else "")]
    header = (f"{'candidate':<28} {'max rate (req/s)':>18} {'req/s/GPU':>10} "
              f"{'replicas':>8} {'GPUs':>5}  binding")
    lines += [header, "-" * len(header)]
    for r in rows:
        if r["status"] in ("ok", "capped"):
            rate = f"{r['max_rate_req_s']:.2f} ± {r['max_rate_std']:.2f}"
            per_gpu = f"{r['goodput_req_s_per_gpu']:.2f}"
            reps = "-" if r["replicas"] is None else str(r["replicas"])
            gpus = "-" if r["num_gpus"] is None else str(r["num_gpus"])
            lines.append(f"{r['candidate']:<28} {rate:>18} {per_gpu:>10} {reps:>8} {gpus:>5}  "
                         f"{r['binding']}: {r['detail']}")
        else:
            lines.append(f"{r['candidate']:<28} {r['status'].upper()}: {r['detail']}")
    return "\n".join(lines)


def write_outputs(rows: list[dict], plan: Plan, out_dir: str | os.PathLike) -> Path:
    """``DIR/plan.csv``, ``DIR/plan.png``, and ``DIR/runs/<candidate>.yaml``: each
    candidate's scenario at its max rate (first seed), for ``kvsim run``."""
    import pandas as pd

    from kvsim import plots

    out = Path(out_dir)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    table = pd.DataFrame(rows, columns=CSV_COLUMNS)
    table.to_csv(out / "plan.csv", index=False)
    plots.plan_goodput(table, title=plan.base.get("name")).savefig(out / "plan.png", dpi=110)
    for cand, row in zip(plan.candidates, rows):
        if row["status"] not in ("ok", "capped"):
            continue
        scenario = with_rate(cand.apply(plan.base), row["seed0_max_rate_req_s"], plan.seeds[0])
        scenario["name"] = f"{plan.base.get('name', 'plan')} {cand.label}"
        if "workload" in scenario:  # relative paths in it must still resolve from runs/
            scenario["workload"] = _absolute_paths(scenario["workload"], plan.base_dir)
        with open(out / "runs" / f"{_file_name(cand.label)}.yaml", "w", encoding="utf-8") as f:
            f.write(f"# kvsim plan: {cand.label} at its max rate for seed {plan.seeds[0]}; "
                    f"the SLOs fail at {row['seed0_fails_at_rate_req_s']} req/s\n")
            yaml.safe_dump(scenario, f, sort_keys=False)
    return out


def _file_name(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-." else "_" for c in label)


def _absolute_paths(workload: dict, base_dir: Path) -> dict:
    workload = copy.deepcopy(workload)
    trace = workload.get("trace")
    if isinstance(trace, dict) and "path" in trace:
        trace["path"] = str((base_dir / os.path.expandvars(trace["path"])).resolve())
    for key in ("prompt_len", "output_len"):
        dist = workload.get(key)
        if isinstance(dist, dict) and "file" in dist:
            dist["file"] = str((base_dir / os.path.expandvars(dist["file"])).resolve())
    return workload


# ----------------------------------------------------------------------------
# The command
# ----------------------------------------------------------------------------

def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "plan", help="capacity planning: highest rate meeting SLOs per GPU candidate",
        description="For each candidate (GPU, TP, KV dtype, engine knobs) find by bisection over "
                    "simulations the highest request rate that meets the SLOs; print a table "
                    "and write DIR/plan.csv and DIR/plan.png. See docs/plan.md.")
    p.add_argument("plan", nargs="?", metavar="PLAN.yaml",
                   help="a scenario with a plan: section (or give --workload and flags)")
    p.add_argument("--out", metavar="DIR", help="folder for plan.csv and plan.png (created)")
    p.add_argument("--workload", metavar="SCENARIO.yaml",
                   help="take model, engine, cost model and workload from this scenario")
    p.add_argument("--model", help="model catalog name (overrides the file's)")
    p.add_argument("--gpu", action="append", metavar="NAME", help="GPU candidate; repeatable")
    p.add_argument("--tp", action="append", type=int, metavar="N", help="TP degree; repeatable")
    p.add_argument("--kv-cache-dtype", action="append", metavar="DTYPE", help="repeatable")
    p.add_argument("--max-num-batched-tokens", action="append", type=int, metavar="N",
                   help="repeatable")
    p.add_argument("--max-num-seqs", action="append", type=int, metavar="N", help="repeatable")
    p.add_argument("--slo", action="append", metavar="KEY=MS",
                   help="e.g. --slo p99_ttft_ms=2000 --slo p99_tpot_ms=100; replaces plan.slo")
    p.add_argument("--target-rate", type=float, metavar="REQ_S", help="total rate to size for")
    p.add_argument("--seeds", type=int, metavar="N", help="seeds per candidate")
    p.add_argument("--num-requests", type=int, metavar="N", help="requests per probe")
    p.add_argument("--workers", type=int, metavar="N", help="probes at once (default: all cores)")
    p.set_defaults(func=plan_command)
    return p


def _read_yaml(path: str, what: str) -> dict:
    file = Path(path)
    if not file.is_file():
        raise PlanError(f"{what}: no such file: {path}")
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise PlanError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise PlanError(f"{path}: expected a mapping, got {type(data).__name__}")
    return data


def plan_from_args(args: argparse.Namespace) -> Plan:
    if not args.plan and not args.workload:
        raise PlanError("give PLAN.yaml or --workload SCENARIO.yaml (see docs/plan.md)")
    data = _read_yaml(args.plan, "PLAN.yaml") if args.plan else {}
    base_dir = Path(args.plan).resolve().parent if args.plan else Path.cwd()
    if args.workload:
        scenario = _read_yaml(args.workload, "--workload")
        for key in ("model", "engine", "cost_model", "workload", "seed"):
            if key in scenario and (key == "workload" or key not in data):
                data[key] = scenario[key]
        base_dir = Path(args.workload).resolve().parent
    section = dict(data.get("plan") or {})
    for flag, key in (("gpu", "gpus"), ("tp", "tp"), ("kv_cache_dtype", "kv_cache_dtype"),
                      ("max_num_batched_tokens", "max_num_batched_tokens"),
                      ("max_num_seqs", "max_num_seqs"), ("target_rate", "target_rate"),
                      ("seeds", "seeds"), ("workers", "workers")):
        value = getattr(args, flag)
        if value is not None:
            section[key] = value
    if args.slo:
        slo = {}
        for item in args.slo:
            key, sep, value = item.partition("=")
            try:
                slo[key] = float(value)
            except ValueError:
                raise PlanError(f"--slo {item!r}: expected KEY=MS like p99_ttft_ms=2000") from None
            if not sep:
                raise PlanError(f"--slo {item!r}: expected KEY=MS like p99_ttft_ms=2000")
        section["slo"] = slo
    data["plan"] = section
    if args.model:
        data["model"] = args.model
    if args.num_requests is not None:
        data.setdefault("workload", {})["num_requests"] = args.num_requests
    return parse_plan(data, base_dir)


def plan_command(args: argparse.Namespace) -> int:
    plan = plan_from_args(args)
    t0 = time.perf_counter()
    progress = None
    if sys.stderr.isatty():   # a redrawn count on a terminal; nothing when piped or in CI
        def progress(done: int) -> None:
            print(f"\rkvsim plan: {done} simulations", end="", file=sys.stderr, flush=True)
    rows = run_plan(plan, workers=args.workers, progress=progress)
    if progress is not None:
        print(file=sys.stderr)
    wall = time.perf_counter() - t0
    print(format_table(rows, plan), flush=True)
    probes = sum(r["num_probes"] or 0 for r in rows)
    where = ""
    if args.out:
        write_outputs(rows, plan, args.out)
        where = f"; wrote {Path(args.out) / 'plan.csv'}, plan.png, runs/*.yaml"
    print(f"{len(rows)} candidate(s), {probes} simulations in {wall:.1f} s wall{where}",
          file=sys.stderr)
    return 0
