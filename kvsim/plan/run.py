"""Running a plan: a rate search per (candidate, seed) on the shared executor, rows from the searches.

The searches' probes go to ``kvsim.scenario.executor`` (the executor of
``kvsim sweep``: local processes or Ray, a dead worker is an error row, not a
crash). With an output folder every probe is logged and a rerun reads the
finished ones back (resume).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from kvsim.plan.output import CSV_COLUMNS
from kvsim.plan.probes import _check_candidate, _ProbeLog
from kvsim.plan.search import RateSearch, binding_constraint, probe_point, slo_violations
from kvsim.plan.spec import Candidate, Plan, RateBounds, with_rate
from kvsim.scenario.executor import RunPoint, Task, execute


@dataclass
class _Job:
    candidate: int
    seed: int
    search: RateSearch
    summaries: dict[float, dict] = field(default_factory=dict)
    error: str = ""          # a probe that raised: the search stops, the row says why

    def next_rate(self) -> float | None:
        return None if self.error else self.search.next_rate()


def run_plan(plan: Plan, *, workers: int | None = None,
             progress: Callable[[int], None] | None = None, executor: str = "local",
             address: str | None = None, out_dir: str | os.PathLike | None = None,
             probe: RunPoint = probe_point, log: Callable[[str], None] | None = None) -> list[dict]:
    """Search every (candidate, seed); return one row per candidate (``CSV_COLUMNS``).

    The first seed of a candidate searches from ``plan.rate.start``; the
    other seeds then start at its answer and bracket with steps of
    ``1 + tolerance`` (two or three probes instead of a whole search), so the
    spread over seeds costs little. Searches of different candidates, and the
    later seeds of one, run at the same time on the sweep's executor
    (``kvsim.scenario.executor``: a local process pool, or Ray with
    ``executor="ray"``); a probe whose worker dies is that search's error row.

    ``out_dir``: every finished probe is logged to ``OUT/probes.jsonl`` (under
    OUT's lock), and a probe already there, ok, for the same scenario, probe
    function and kvsim code, is read back instead of simulated again: a rerun
    after a crash or Ctrl-C resumes. ``probe(scenario, point_dir) -> summary``
    simulates one probe (default :func:`probe_point`; it must pickle).
    """
    if plan.fleet is not None:            # the fewest replicas per router: kvsim/plan/fleet.py
        from kvsim.plan.fleet import run_fleet_plan
        return run_fleet_plan(plan, workers=workers, progress=progress, executor=executor,
                              address=address, out_dir=out_dir, probe=probe, log=log)
    rows: list[dict | None] = [None] * len(plan.candidates)
    jobs: list[_Job] = []
    for i, cand in enumerate(plan.candidates):
        problem = _check_candidate(plan, cand)
        if problem:
            rows[i] = _row(plan, cand, status="does not fit" if "model/hardware" in problem
                           else "invalid", detail=problem)
            continue
        jobs.append(_Job(i, plan.seeds[0], RateSearch(plan.bounds)))

    runner = functools.partial(probe, base_dir=plan.base_dir)
    workers = workers or plan.workers
    counts = {"probes": 0, "reused": 0}

    def record(job: _Job, rate: float, result: dict) -> None:
        counts["probes"] += 1
        if result.get("summary") is None:   # an engine error (or a dead worker), not an SLO miss
            job.error = f"the probe at {rate:.3g} req/s (seed {job.seed}) raised {result.get('error')}"
            return
        job.summaries[rate] = result["summary"]
        job.search.record(rate, not slo_violations(result["summary"], plan.slo_ms))
        if progress:
            progress(counts["probes"])

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

    with _ProbeLog(out_dir, plan, probe, log) as probes:
        def advance(job: _Job) -> list[Task]:
            """The job's next probe to simulate, its search run on through logged probes;
            when it is done, the next seeds' first probes."""
            while (rate := job.next_rate()) is not None:
                scenario = with_rate(plan.candidates[job.candidate].apply(plan.base), rate, job.seed)
                probe_id, logged = probes.lookup(scenario)
                if logged is None:
                    return [Task((job, rate, probe_id), scenario)]
                counts["reused"] += 1
                record(job, rate, logged)
            return [task for new in followers(job) for task in advance(new)]

        def on_done(task: Task, result: dict) -> list[Task]:
            job, rate, probe_id = task.key
            probes.append(probe_id, plan.candidates[job.candidate], job.seed, rate, result)
            record(job, rate, result)
            return advance(job)

        # Each search has one probe in flight at most; when it returns, that
        # search's next probe (or the next seeds' searches) go in at once.
        first = [task for job in list(jobs) for task in advance(job)]
        execute(first, runner, on_done, executor=executor, workers=workers, address=address)

    for i, cand in enumerate(plan.candidates):
        if rows[i] is None:
            rows[i] = _aggregate(plan, cand, [j for j in jobs if j.candidate == i])
    if counts["reused"] and log is not None:
        log(f"{counts['reused']} of {counts['probes']} probes read back from {probes.path}")
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
