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
With a prefill and a decode pool in the base scenario (``cluster.pools``,
kvsim/fleet/pd.py) the size is P + D: a probe at size N runs every split
P = 1 .. N-1 (every seed each) and meets the SLOs when one split does on
every seed; the row gives that split (the best one by SLO attainment, ties
to fewer prefill replicas) and GPUs = N x TP.
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
                 "binding", "detail", "num_probes", "prefill_replicas", "decode_replicas"]


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


def fleet_scenario(base: dict, cand: Candidate, router, replicas: int, rate: float, seed: int,
                   prefill: int | None = None) -> dict:
    """The base scenario as ``replicas`` copies of ``cand`` behind ``router``, at ``rate``;
    with ``prefill``, its prefill pool gets ``prefill`` of them and its decode pool the rest."""
    sc = with_rate(cand.apply(base), rate, seed)
    cluster = {k: v for k, v in (sc.get("cluster") or {}).items() if k not in ("pools", "router", "replicas")}
    if prefill is None:
        sc["cluster"] = {**cluster, "replicas": replicas, "router": copy.deepcopy(router)}
        return sc
    pools = [{**p, "replicas": prefill if p.get("role") == "prefill" else replicas - prefill}
             for p in copy.deepcopy(base["cluster"]["pools"])]
    sc["cluster"] = {**cluster, "pools": pools, "router": copy.deepcopy(router)}
    return sc


def splits(spec: FleetSpec, size: int) -> list[int | None]:
    """The prefill sizes a probe at ``size`` tries: every P of P + D = size, or None (mixed)."""
    return list(range(1, size)) if spec.pd else [None]


@dataclass
class ReplicaSearch:
    """The smallest fleet size that meets the SLOs, for an outcome monotone in the size."""

    start: int
    maximum: int
    minimum: int = 1
    missed: int | None = None       # largest size that missed
    met: int | None = None          # smallest size that met
    probes: list[tuple[int, bool]] = field(default_factory=list)

    def next_size(self) -> int | None:
        if self.missed is None and self.met is None:
            return self.start
        if self.met is None:                              # only misses: grow
            return None if self.missed >= self.maximum else min(2 * self.missed, self.maximum)
        if self.missed is None:                           # only hits: shrink
            return None if self.met <= self.minimum else max(self.met // 2, self.minimum)
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
    results: dict[tuple, dict[int, dict]] = field(default_factory=dict)  # (size, P) -> seed -> summary
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
                jobs.append(_FleetJob(i, j, ReplicaSearch(spec.start_replicas, spec.max_replicas,
                                                          minimum=2 if spec.pd else 1)))
    runner = functools.partial(probe, base_dir=plan.base_dir)
    counts = {"probes": 0, "reused": 0}

    def scenario_of(job: _FleetJob, size: int, split, seed: int) -> dict:
        return fleet_scenario(plan.base, plan.candidates[job.candidate], spec.routers[job.router_index],
                              size, plan.target_rate_req_s, seed, prefill=split)

    def label(job: _FleetJob, size: int, split) -> Candidate:
        cand = plan.candidates[job.candidate]
        shape = f"x{size}" if split is None else f"{split}P+{size - split}D"
        return replace(cand, label=f"{cand.label} {router_label(spec.routers[job.router_index])} {shape}")

    with _ProbeLog(out_dir, plan, probe, log) as probes:
        def record(job: _FleetJob, size: int, split, seed: int, result: dict) -> list[Task]:
            counts["probes"] += 1
            if progress:
                progress(counts["probes"])
            if result.get("summary") is None:
                shape = _replicas(size) if split is None else f"{split} P + {size - split} D"
                job.error = f"the probe with {shape} (seed {seed}) raised {result.get('error')}"
                return []
            job.results.setdefault((size, split), {})[seed] = result["summary"]
            if any(len(job.results.get((size, p), {})) < len(plan.seeds) for p in splits(spec, size)):
                return []                                # other seeds or splits of this size are in flight
            ok = _best_split(plan, job, size)[1]
            job.search.record(size, ok)
            return advance(job)

        def advance(job: _FleetJob) -> list[Task]:
            """The next size's probes (one task per split and seed not logged yet)."""
            if job.error:
                return []
            size = job.search.next_size()
            if size is None:
                return []
            tasks = []
            for split in splits(spec, size):
                for seed in plan.seeds:
                    scenario = scenario_of(job, size, split, seed)
                    probe_id, logged = probes.lookup(scenario)
                    if logged is None:
                        tasks.append(Task((job, size, split, seed, probe_id), scenario))
                    else:
                        counts["reused"] += 1
                        more = record(job, size, split, seed, logged)
                        if more:                          # every probe was logged: the search moved on
                            return more
            return tasks

        def on_done(task: Task, result: dict) -> list[Task]:
            job, size, split, seed, probe_id = task.key
            probes.append(probe_id, label(job, size, split), seed, plan.target_rate_req_s, result)
            return record(job, size, split, seed, result)

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
        worst = _worst_seed(plan, _best_split(plan, job, search.missed)[2])
        missed = slo_violations(worst, plan.slo_ms)
        return _row(plan, cand, router, status="unreachable", num_probes=num_probes,
                    fails_at_replicas=search.missed,
                    detail=f"SLOs missed even with {_replicas(search.missed)}: {'; '.join(missed)}")
    split, _, by_seed = _best_split(plan, job, search.met)
    at = list(by_seed.values())
    values = {key: _extreme(at, key, max) for key in plan.slo_ms}     # the worst seed's
    binding = detail = None
    if search.missed is not None:
        worst = _worst_seed(plan, _best_split(plan, job, search.missed)[2])
        binding, why = binding_constraint(worst, slo_violations(worst, plan.slo_ms))
        detail = f"with {_replicas(search.missed)}: {why}"
    else:
        binding, detail = "none", "SLOs met with a single replica"
    return _row(plan, cand, router, status="ok", replicas=search.met, num_gpus=search.met * cand.tp,
                prefix_cache_hit_rate=_mean(at, "prefix_cache_hit_rate"),
                slo_attainment=_extreme(at, "slo_attainment", min),
                imbalance_routed=_extreme(at, "imbalance_routed", max),
                fails_at_replicas=search.missed, binding=binding, detail=detail, num_probes=num_probes,
                prefill_replicas=split, decode_replicas=None if split is None else search.met - split,
                **values)


def _best_split(plan, job: _FleetJob, size: int) -> tuple:
    """(P, met on every seed?, seed -> summary) of the best split probed at ``size``: one that
    meets the SLOs on every seed with the highest worst-seed attainment (ties: fewer P), else
    the one with the fewest missed SLOs on its worst seed."""
    def key(p):
        by_seed = job.results[size, p]
        missed = max(len(slo_violations(s, plan.slo_ms)) for s in by_seed.values())
        return (missed, -_extreme(list(by_seed.values()), "slo_attainment", min), p or 0)
    best = min((p for p in splits(plan.fleet, size) if (size, p) in job.results), key=key)
    by_seed = job.results[size, best]
    return best, all(not slo_violations(s, plan.slo_ms) for s in by_seed.values()), by_seed


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
