"""Fleet plans: the fewest GPUs (replicas x TP) that meet the SLOs at the target rate, per router.

A plan with a ``plan.fleet`` section (or ``--router``) does not divide the
target rate by one replica's capacity, which holds only for a perfect
balancer and no cache locality (a round-robin fleet splits the prefix cache
N ways; a prefix-aware router keeps it but may unbalance the load). It
simulates the fleet itself: for every candidate (GPU x TP x knobs, as in a
rate plan) and every router, the whole fleet of N replicas serves the
workload at ``plan.target_rate``, and the search finds the smallest N at which
every seed meets the SLOs::

    bracket:  N = start_replicas; x2 while the SLOs are missed (up to max_replicas),
              /2 while they are met
    bisect:   between the largest N that missed and the smallest that met, until they are 1 apart
    answer:   the smallest N that met; GPUs = N x tp

A probe is one N with every seed (its seeds run at the same time); it meets
the SLOs when every seed does. Probes run on the executor of ``kvsim sweep``
and are logged to ``OUT/probes.jsonl`` like a rate plan's (resume).
Prefill/decode pools (P + D) are planned the same way once they run.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from kvsim.plan.probes import _check_candidate, _ProbeLog
from kvsim.plan.search import binding_constraint, probe_point, slo_violations
from kvsim.plan.spec import Candidate, FleetSpec, with_rate
from kvsim.scenario.executor import RunPoint, Task, execute

FLEET_COLUMNS = ["candidate", "gpu", "tp", "kv_cache_dtype", "max_num_batched_tokens", "max_num_seqs",
                 "router", "status", "replicas", "num_gpus", "target_rate_req_s", "num_seeds",
                 "prefix_cache_hit_rate", "slo_attainment", "imbalance_routed", "fails_at_replicas",
                 "binding", "detail", "num_probes"]


def router_label(router) -> str:
    """``round_robin``; a mapping with options: ``prefix_aware(mode=precise)``."""
    if isinstance(router, str):
        return router
    options = {k: v for k, v in router.items() if k != "policy"}
    if not options:
        return str(router["policy"])
    text = ",".join(f"{k}={json.dumps(v, separators=(',', ':')) if isinstance(v, (dict, list)) else v}"
                    for k, v in options.items())
    return f"{router['policy']}({text})"


def fleet_scenario(base: dict, cand: Candidate, router, replicas: int, rate: float, seed: int) -> dict:
    """The base scenario as ``replicas`` copies of ``cand`` behind ``router``, at ``rate``."""
    sc = with_rate(cand.apply(base), rate, seed)
    cluster = {k: v for k, v in (sc.get("cluster") or {}).items() if k not in ("pools", "router")}
    sc["cluster"] = {**cluster, "replicas": replicas, "router": copy.deepcopy(router)}
    return sc


@dataclass
class ReplicaSearch:
    """The smallest fleet size that meets the SLOs, for an outcome monotone in the size."""

    start: int
    maximum: int
    missed: int | None = None       # largest size that missed
    met: int | None = None          # smallest size that met
    probes: list[tuple[int, bool]] = field(default_factory=list)

    def next_size(self) -> int | None:
        if self.missed is None and self.met is None:
            return self.start
        if self.met is None:                              # only misses: grow
            return None if self.missed >= self.maximum else min(2 * self.missed, self.maximum)
        if self.missed is None:                           # only hits: shrink
            return None if self.met == 1 else max(self.met // 2, 1)
        if self.met - self.missed <= 1:
            return None
        return (self.missed + self.met) // 2

    def record(self, size: int, ok: bool) -> None:
        self.probes.append((size, ok))
        if ok:
            self.met = size if self.met is None else min(self.met, size)
        else:
            self.missed = size if self.missed is None else max(self.missed, size)

    @property
    def status(self) -> str:
        return "ok" if self.met is not None else "unreachable"


@dataclass
class _FleetJob:
    candidate: int
    router_index: int
    search: ReplicaSearch
    results: dict[int, dict[int, dict]] = field(default_factory=dict)   # size -> seed -> summary
    error: str = ""


def run_fleet_plan(plan, *, workers: int | None = None, progress: Callable[[int], None] | None = None,
                   executor: str = "local", address: str | None = None, out_dir=None,
                   probe: RunPoint = probe_point, log: Callable[[str], None] | None = None) -> list[dict]:
    """One row per (candidate, router): the fewest replicas meeting the SLOs at the target rate."""
    spec: FleetSpec = plan.fleet
    rows: dict[tuple[int, int], dict] = {}
    jobs: list[_FleetJob] = []
    for i, cand in enumerate(plan.candidates):
        problem = _check_candidate(plan, cand)
        for j, router in enumerate(spec.routers):
            if problem:
                rows[i, j] = _row(plan, cand, router, status="does not fit" if "model/hardware" in problem
                                  else "invalid", detail=problem)
            else:
                jobs.append(_FleetJob(i, j, ReplicaSearch(spec.start_replicas, spec.max_replicas)))
    runner = functools.partial(probe, base_dir=plan.base_dir)
    counts = {"probes": 0, "reused": 0}

    def scenario_of(job: _FleetJob, size: int, seed: int) -> dict:
        return fleet_scenario(plan.base, plan.candidates[job.candidate], spec.routers[job.router_index],
                              size, plan.target_rate_req_s, seed)

    def label(job: _FleetJob, size: int) -> Candidate:
        cand = plan.candidates[job.candidate]
        return replace(cand, label=f"{cand.label} {router_label(spec.routers[job.router_index])} x{size}")

    with _ProbeLog(out_dir, plan, probe, log) as probes:
        def record(job: _FleetJob, size: int, seed: int, result: dict) -> list[Task]:
            counts["probes"] += 1
            if progress:
                progress(counts["probes"])
            if result.get("summary") is None:
                job.error = f"the probe with {_replicas(size)} (seed {seed}) raised {result.get('error')}"
                return []
            done = job.results.setdefault(size, {})
            done[seed] = result["summary"]
            if len(done) < len(plan.seeds):
                return []                                # the other seeds of this size are in flight
            ok = all(not slo_violations(s, plan.slo_ms) for s in done.values())
            job.search.record(size, ok)
            return advance(job)

        def advance(job: _FleetJob) -> list[Task]:
            """The next size's probes (one task per seed not logged yet)."""
            if job.error:
                return []
            size = job.search.next_size()
            if size is None:
                return []
            tasks = []
            for seed in plan.seeds:
                scenario = scenario_of(job, size, seed)
                probe_id, logged = probes.lookup(scenario)
                if logged is None:
                    tasks.append(Task((job, size, seed, probe_id), scenario))
                else:
                    counts["reused"] += 1
                    more = record(job, size, seed, logged)
                    if more:                              # every seed was logged: the search moved on
                        return more
            return tasks

        def on_done(task: Task, result: dict) -> list[Task]:
            job, size, seed, probe_id = task.key
            probes.append(probe_id, label(job, size), seed, plan.target_rate_req_s, result)
            return record(job, size, seed, result)

        first = [task for job in jobs for task in advance(job)]
        execute(first, runner, on_done, executor=executor, workers=workers or plan.workers, address=address)

    for job in jobs:
        rows[job.candidate, job.router_index] = _aggregate(plan, job)
    if counts["reused"] and log is not None:
        log(f"{counts['reused']} of {counts['probes']} probes read back from {probes.path}")
    return [rows[i, j] for i in range(len(plan.candidates)) for j in range(len(spec.routers))]


def _row(plan, cand: Candidate, router, **values) -> dict:
    row = {c: None for c in FLEET_COLUMNS}
    row.update(candidate=cand.label, gpu=cand.gpu, tp=cand.tp, kv_cache_dtype=cand.kv_cache_dtype,
               max_num_batched_tokens=cand.max_num_batched_tokens, max_num_seqs=cand.max_num_seqs,
               router=router_label(router), num_seeds=len(plan.seeds),
               target_rate_req_s=plan.target_rate_req_s)
    row.update(values)
    return row


def _aggregate(plan, job: _FleetJob) -> dict:
    cand = plan.candidates[job.candidate]
    router = plan.fleet.routers[job.router_index]
    search = job.search
    num_probes = sum(len(s) for s in job.results.values())
    if job.error:
        return _row(plan, cand, router, status="error", detail=job.error, num_probes=num_probes)
    if search.met is None:
        worst = _worst_seed(plan, job.results[search.missed])
        missed = slo_violations(worst, plan.slo_ms)
        return _row(plan, cand, router, status="unreachable", num_probes=num_probes,
                    fails_at_replicas=search.missed,
                    detail=f"SLOs missed even with {_replicas(search.missed)}: {'; '.join(missed)}")
    at = list(job.results[search.met].values())
    values = {key: _extreme(at, key, max) for key in plan.slo_ms}     # the worst seed's
    binding = detail = None
    if search.missed is not None:
        worst = _worst_seed(plan, job.results[search.missed])
        binding, why = binding_constraint(worst, slo_violations(worst, plan.slo_ms))
        detail = f"with {_replicas(search.missed)}: {why}"
    else:
        binding, detail = "none", "SLOs met with a single replica"
    return _row(plan, cand, router, status="ok", replicas=search.met, num_gpus=search.met * cand.tp,
                prefix_cache_hit_rate=_mean(at, "prefix_cache_hit_rate"),
                slo_attainment=_extreme(at, "slo_attainment", min),
                imbalance_routed=_extreme(at, "imbalance_routed", max),
                fails_at_replicas=search.missed, binding=binding, detail=detail, num_probes=num_probes,
                **values)


def _worst_seed(plan, by_seed: dict[int, dict]) -> dict:
    """The seed's summary with the most missed SLOs (ties: the first seed)."""
    return max(by_seed.values(), key=lambda s: len(slo_violations(s, plan.slo_ms)))


def _extreme(summaries: list[dict], key: str, pick) -> float:
    values = [float(s[key]) for s in summaries if s.get(key) is not None and s[key] == s[key]]
    return pick(values) if values else float("nan")


def _mean(summaries: list[dict], key: str) -> float:
    values = [float(s[key]) for s in summaries if s.get(key) is not None]
    return sum(values) / len(values) if values else float("nan")


def _replicas(n: int) -> str:
    return f"{n} replica" if n == 1 else f"{n} replicas"
