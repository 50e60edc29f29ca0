"""A scenario with ``cluster:``: resolve its pools and simulate the fleet.

The ``cluster:`` section itself is kvsim/fleet/config.py's; what needs the
scenario layer is turning each pool into what a replica runs: a pool is the
scenario with the pool's ``model``/``hardware``/``engine``/``cost_model``
put over it, loaded by ``load_scenario`` like any scenario (so every default
and every check is the one-replica one), its errors prefixed with the pool's
YAML path. A scenario without ``cluster:`` never comes here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvsim.fleet.config import ClusterConfig, PoolConfig, PoolFacts, check_pools, parse_cluster_config
from kvsim.fleet.replica import PoolPlan
from kvsim.fleet.runner import Fleet, FleetRun
from kvsim.metrics.chunked_stats import Segments
from kvsim.metrics.fleet import computed_tokens, group_summary
from kvsim.metrics.summary import summarize
from kvsim.scenario.loader import LoadedScenario, load_scenario
from kvsim.scenario.schema import ScenarioError
from kvsim.scenario.result import Result, arrival_indices, itl_seconds_and_counts, requests_frame, steps_frame
from kvsim.sim.engine import EngineStats
from kvsim.sim.gc_pause import collector_paused
from kvsim.workload import build_workload

_POOL_SECTIONS = ("model", "hardware", "engine", "cost_model")
_NOT_IN_POOL = ("cluster", "sweep", "plan")


def load_cluster(sc: LoadedScenario) -> tuple[ClusterConfig, list[PoolPlan]]:
    """The scenario's cluster section and one resolved plan per pool."""
    try:
        cluster = parse_cluster_config(sc.scenario.cluster)
    except ValueError as exc:
        raise ScenarioError(str(exc)) from None
    pools = cluster.pool_list()
    loaded = [sc if cluster.pools is None else _load_pool(sc, i, p) for i, p in enumerate(pools)]
    facts = [PoolFacts(i, p.name, p.role, ls.model.name, ls.sched_config.block_size,
                       ls.scenario.engine.kv_cache_dtype, ls.sched_config.max_model_len,
                       (ls.sched_config.num_gpu_blocks - 1) * ls.sched_config.block_size)
             for i, (p, ls) in enumerate(zip(pools, loaded))]
    try:
        check_pools(facts)
    except ValueError as exc:
        raise ScenarioError(str(exc)) from None
    plans = []
    for i, (p, ls) in enumerate(zip(pools, loaded)):
        eng = ls.scenario.engine
        if ls.kv_offload is not None and p.role != "mixed":
            # One KV connector per replica: the P/D transfer's (fleet/pd.py) or the tiers'.
            raise ScenarioError(f"cluster.pools[{i}] ({p.name!r}): engine.kv_offloading with role "
                                f"{p.role!r} is not modelled (a replica has one KV connector, here "
                                f"the prefill/decode transfer's); allowed: role mixed")
        plans.append(PoolPlan(
            name=p.name, role=p.role, replicas=p.replicas, scheduler=ls.scheduler,
            sched_config=ls.sched_config, cost_model=ls.cost_model, tp=ls.tp,
            block_bytes_per_rank=ls.model.kv_bytes_per_block(eng.block_size, eng.kv_cache_dtype, ls.tp),
            kv_replicated=bool(getattr(ls.model, "is_mla", False)),
            # KV offload tiers per replica; a remote tier is one store for all (kvtiers, issue 15)
            connector_factory=ls.kv_offload.make_connector if ls.kv_offload is not None else None))
    return cluster, plans


def _load_pool(sc: LoadedScenario, index: int, pool: PoolConfig) -> LoadedScenario:
    data: dict[str, Any] = {k: v for k, v in sc.raw.items() if k not in _NOT_IN_POOL}
    for key in _POOL_SECTIONS:
        value = getattr(pool, key)
        if value is None:
            continue
        base = data.get(key)
        if key in ("hardware", "engine") and isinstance(base, dict):
            value = {**base, **value}             # the pool's keys over the scenario's
        data[key] = value
    try:
        return load_scenario(data, base_dir=sc.base_dir)
    except ScenarioError as exc:
        msg = str(exc)
        where = f"cluster.pools[{index}]"
        if msg.startswith(_POOL_SECTIONS):
            raise ScenarioError(f"{where}.{msg}") from None
        raise ScenarioError(f"{where} ({pool.name!r}): {msg}") from None


@dataclass
class FleetResult(Result):
    """A fleet run: the fleet-wide tables and summary, plus each pool's and replica's summary.

    ``requests`` and ``steps`` carry a ``replica`` column (the replica's name,
    ``<pool>-<k>``; requests in the client's order, steps grouped by replica,
    in pool order; ``itl_s`` too is grouped by replica, which the summaries
    read in the client's order). ``summary`` is
    the fleet's, flat (what a sweep row or a plan probe reads);
    ``per_pool`` and ``per_replica`` map names to their summaries
    (kvsim/metrics/fleet.py). ``write`` puts all three in summary.json.
    """

    per_replica: dict[str, dict] = field(default_factory=dict)
    per_pool: dict[str, dict] = field(default_factory=dict)
    run: FleetRun | None = field(default=None, repr=False)
    replica_itls: list = field(default_factory=list, repr=False)     # each replica's itl_s

    def write(self, out_dir, *, steps_ahead=None) -> Path:
        """``Result.write`` for a fleet. ``steps_ahead`` is never one here: a fleet's
        steps.csv is made from its replicas' tables (``steps_csv_ahead`` gives None)."""
        if steps_ahead is not None:
            raise ValueError("FleetResult.write: a fleet's steps.csv has no rows made ahead")
        from kvsim.scenario.cluster_outputs import write_fleet_run
        return write_fleet_run(self, out_dir)


def simulate_cluster(scenario, *, overrides=None, fast_path: bool = True, trace=None,
                     progress=None, streaming: bool | None = None) -> FleetResult:
    """Run a scenario that has a ``cluster:`` section (a ``LoadedScenario``, mapping or path).

    ``kvsim.simulate`` comes here for such a scenario. ``trace`` gets every
    replica's step records, each with a ``replica`` key; ``progress`` is
    called as ``progress(sim_time_s, num_done, total)`` for the whole fleet.
    """
    sc = scenario if isinstance(scenario, LoadedScenario) else load_scenario(scenario, overrides=overrides)
    if sc.scenario.cluster is None:
        raise ScenarioError("cluster: missing; simulate_cluster runs scenarios with a cluster section")
    if streaming or (streaming is None and sc.scenario.metrics.streaming):
        raise ScenarioError("metrics.streaming: true is not supported with cluster: yet (each replica's "
                            "summary needs its tables); remove one of them")
    cluster, plans = load_cluster(sc)
    workload = fleet_workload(sc, plans)
    hook = None
    if progress is not None:
        total = None if workload.num_requests is None else workload.num_requests * sc.workload.n

        def hook(now_s: float, num_done: int) -> None:
            progress(now_s, num_done, total)
    if cluster.disaggregated:
        _check_pd(sc, plans)
    # Requests that wait on none (and no closed loop): replicas behind a router that reads
    # no replica state are simulated one at a time (kvsim/fleet/separate.py, same results),
    # and with cluster.workers in several processes (kvsim/scenario/cluster_parallel.py).
    independent = workload.independent and workload.concurrency is None
    # The collector stays paused until the tables are built (the result keeps the replicas,
    # for its files; Fleet._close leaves them in no reference cycle).
    with collector_paused():
        fleet = Fleet(plans, cluster, seed=sc.seed, fast_path=fast_path, trace=trace, progress=hook,
                      independent=independent)
        workers = fleet_workers(cluster, len(fleet.replicas)) if fleet.separate else 1
        if workers > 1:
            from kvsim.scenario.cluster_parallel import simulate_apart
            run, tables = simulate_apart(sc, fleet, workers, simulate_share, fast_path=fast_path)
        else:
            run, tables = fleet.run(workload.requests(), concurrency=workload.concurrency), None
        del fleet
        return collect_fleet(run, sc, cluster, tables)


def fleet_workload(sc: LoadedScenario, plans: list[PoolPlan]):
    """The fleet's workload, drawn from the run's stream as simulate() draws it."""
    rng = np.random.default_rng(sc.seed)
    # Prompts no replica can run are not spelled out (as simulate() does for one engine).
    longest = max(p.sched_config.max_model_len for p in plans)
    return build_workload(sc.workload, rng=rng, base_dir=sc.base_dir, max_prompt_len=longest - 1)


def fleet_workers(cluster: ClusterConfig, num_replicas: int) -> int:
    """Processes for a fleet whose replicas run apart: ``cluster.workers`` ("auto": every
    core this process may use), at most one per replica; 1 inside a daemonic process
    (a sweep's worker, which may not start processes of its own)."""
    import multiprocessing

    from kvsim.scenario.executor import default_workers
    if multiprocessing.current_process().daemon:
        return 1
    wanted = default_workers() if cluster.workers == "auto" else cluster.workers
    return max(1, min(wanted, num_replicas))


@dataclass
class ReplicaTables:
    """What a fleet's tables and summaries read of one replica, built where it ran
    (in this process, or in a worker of kvsim/scenario/cluster_parallel.py)."""

    requests: pd.DataFrame
    steps: pd.DataFrame
    itl: np.ndarray
    summary: dict                    # summarize(...) and computed_tokens
    stats: EngineStats
    order: np.ndarray                # each row's Request.index (arrival_indices)
    gap_counts: np.ndarray           # each row's number of gaps in itl (itl_seconds_and_counts)


def simulate_share(task: dict, _point_dir=None) -> dict:
    """A worker of kvsim/scenario/cluster_parallel.py: the replicas ``task["replicas"]``
    of the scenario's fleet (every request routed, only theirs simulated), and their tables."""
    sc = load_scenario(task["raw"], base_dir=task["base_dir"])
    cluster, plans = load_cluster(sc)
    workload = fleet_workload(sc, plans)
    slo = sc.scenario.slo.as_dict() or None
    only = task["replicas"]
    with collector_paused():
        fleet = Fleet(plans, cluster, seed=sc.seed, fast_path=task["fast_path"],
                      independent=workload.independent and workload.concurrency is None, only=only)
        run = fleet.run(workload.requests())
        del fleet
        tables = []
        for k in only:
            tables.append(replica_tables(run.replicas[k], run.infos[k], slo))
            # Each engine goes once its tables are built: the next one's reuse its memory.
            run.replicas[k] = None
    return {"tables": tables, "num_routed": run.num_routed}


def replica_tables(replica, info, slo: dict | None) -> ReplicaTables:
    requests = requests_frame(replica.done)
    steps = steps_frame(replica)
    itl, gap_counts = itl_seconds_and_counts(replica.done)
    summary = {**summarize(requests, steps, itl, num_gpu_blocks=info.num_usable_blocks + 1, slo=slo),
               "computed_tokens": computed_tokens(steps)}
    return ReplicaTables(requests, steps, itl, summary, replica.stats(), arrival_indices(replica.done),
                         gap_counts)


def collect_fleet(run: FleetRun, sc: LoadedScenario, cluster: ClusterConfig,
                  tables: list[ReplicaTables] | None = None) -> FleetResult:
    """The tables and summaries of a finished fleet run; ``tables``: each replica's, when
    they were built elsewhere (``run.replicas`` is then empty), else built here."""
    slo = sc.scenario.slo.as_dict() or None
    if tables is None:
        tables = [replica_tables(replica, info, slo) for replica, info in zip(run.replicas, run.infos)]
    frames, per_replica = [], {}
    for k, (t, info) in enumerate(zip(tables, run.infos)):
        per_replica[info.name] = {"pool": info.pool, "routed": run.num_routed[k], **t.summary}
        frames.append(t.requests.assign(replica=info.name))

    # The fleet's step table and gaps, every replica in order (read by the
    # summary of a group of every replica, and returned); each replica's
    # steps and gaps then become views of the fleet's (W7: 0.3 GB each kind,
    # held once, not twice, from here on), in the replicas' tables too.
    num_steps, num_gaps = [len(t.steps) for t in tables], [len(t.itl) for t in tables]
    steps, itl = _fleet_steps_and_gaps(tables)
    # (The replica column added once: not each replica's table copied with it first.)
    steps["replica"] = np.repeat(np.array([i.name for i in run.infos], dtype=object), num_steps)
    step_frames = _parts(steps, num_steps, lambda t, a, b: t.iloc[a:b, :-1])
    itls = _parts(itl, num_gaps, lambda t, a, b: t[a:b])
    for t, s, g in zip(tables, step_frames, itls):
        t.steps, t.itl = s, g
    everyone = list(range(len(run.infos)))

    def as_one_client(indices: list[int], failed: list | None = None) -> tuple[pd.DataFrame, Segments]:
        """The request rows of these replicas (and ``failed`` requests) in one client's
        order, and that order of their gaps (each replica's are in ``itls``)."""
        parts = [frames[k] for k in indices]
        orders = [tables[k].order for k in indices]
        counts = [tables[k].gap_counts for k in indices]
        if failed is not None:
            parts.append(requests_frame(failed).assign(replica=None))
            orders.append(arrival_indices(failed))
            counts.append(np.zeros(len(failed), dtype=np.int64))
        requests, rows = _client_order(parts, orders)
        return requests, _gap_order(counts, rows)

    def group(indices: list[int], requests: pd.DataFrame, gap_order: Segments) -> dict:
        whole = indices == everyone
        return group_summary(requests, [step_frames[k] for k in indices], [itls[k] for k in indices],
                             num_gpu_blocks=sum(run.infos[k].num_usable_blocks + 1 for k in indices),
                             routed=[run.num_routed[k] for k in indices], slo=slo,
                             steps=steps if whole else None, itl=itl if whole else None,
                             itl_order=gap_order)

    if run.transfers is not None:
        # P/D: the client's requests are the decode replicas' (every token the
        # client sees is D's: kvsim/fleet/pd.py), and those that failed on P.
        clients = [k for k, i in enumerate(run.infos) if i.role == "decode"]
        requests, gap_order = as_one_client(clients, run.prefill_failed)
        requests = _pd_columns(requests, run.transfers)
    else:
        clients = everyone
        requests, gap_order = as_one_client(clients)
    fleet = group(clients, requests, gap_order)
    per_pool = {}
    for pool in dict.fromkeys(i.pool for i in run.infos):
        members = [k for k, i in enumerate(run.infos) if i.pool == pool]
        if members == clients:                    # the client's pool: its summary is the fleet's
            numbers = fleet
        else:
            numbers = group(members, *as_one_client(members))
        per_pool[pool] = {"role": run.infos[members[0]].role, "replicas": len(members), **numbers}
    summary = {"scenario": sc.name, "scheduler": sc.scheduler, "num_replicas": len(run.infos),
               "router": cluster.router.policy, **fleet}
    if run.transfers is not None:
        # A decode replica counts the pulled tokens as computed when it admits
        # (vLLM's num_cached_tokens does too): the fleet's hit rate is the
        # prefill pools', where prompts meet the prefix cache.
        prefill = [k for k, i in enumerate(run.infos) if i.role == "prefill"]
        summary["prefix_cache_hit_rate"] = group(prefill, *as_one_client(prefill))["prefix_cache_hit_rate"]
        summary.update(_pd_summary(requests))
    # (P/D pools have their own connectors and never offload: refused at load.)
    connectors = [] if run.transfers is not None else [
        r.scheduler.transfers.connector for r in run.replicas
        if getattr(r.scheduler, "transfers", None) is not None]
    if connectors:                                # KV offloading (kvtiers): the fleet's counters
        from kvsim.scenario.kv_offload import offload_summary, with_connector_columns
        requests = with_connector_columns(requests, connectors)    # metrics.csv's split
        summary["kv_offload"] = offload_summary(connectors, requests)
    return FleetResult(summary, requests, steps, itl, sc, fleet_stats(t.stats for t in tables),
                       per_replica=per_replica, per_pool=per_pool, run=run, replica_itls=itls)


def _parts(whole, sizes: list[int], cut) -> list:
    """The parts of these sizes, concatenated in ``whole``, as ``cut(whole, start, stop)`` of it."""
    out, start = [], 0
    for size in sizes:
        out.append(cut(whole, start, start + size))
        start += size
    return out


def _fleet_steps_and_gaps(tables: list[ReplicaTables]) -> tuple[pd.DataFrame, np.ndarray]:
    """Every replica's steps and gaps concatenated in order, each replica's let
    go of (``t.steps``, ``t.itl`` None) once copied in.

    ``pd.concat`` and ``np.concatenate`` hold every part and the whole at once:
    W7's driver peaked at 1.3 GB there, twice the tables. Here each column is
    an array of the whole, filled replica by replica, so the parts received
    from the workers go as they are copied (when nothing else holds them).
    The same table, column by column: the same names, dtypes and values, a
    fresh range index. Tables whose columns are not all plain numpy numbers
    of the same dtypes everywhere go through ``pd.concat``.
    """
    first = tables[0].steps if tables else None
    plain = first is not None and all(
        list(t.steps.columns) == list(first.columns)
        and all(isinstance(d, np.dtype) and d.kind in "biuf" for d in t.steps.dtypes)
        and list(t.steps.dtypes) == list(first.dtypes) for t in tables)
    if not plain:
        steps = pd.concat([t.steps for t in tables], ignore_index=True)
        itl = np.concatenate([t.itl for t in tables]) if tables else np.zeros(0)
        return steps, itl
    columns = {name: np.empty(sum(len(t.steps) for t in tables), dtype=dtype)
               for name, dtype in first.dtypes.items()}
    itl = np.empty(sum(len(t.itl) for t in tables), dtype=np.result_type(*(t.itl for t in tables)))
    del first
    row = gap = 0
    for t in tables:
        n, g = len(t.steps), len(t.itl)
        for name, whole in columns.items():
            whole[row:row + n] = t.steps[name].to_numpy()
        itl[gap:gap + g] = t.itl
        row, gap = row + n, gap + g
        t.steps = t.itl = None                      # this replica's copies may go now
    return pd.DataFrame(columns, copy=False), itl


def fleet_stats(each) -> EngineStats:
    """How the fleet was simulated: every replica's steps, runs and arrivals added up.

    ``scheduler`` is left empty: a scheduler's own counters (a utilisation, say)
    do not add up across replicas; each replica's are ``replica.stats()``.
    """
    each = list(each)
    return EngineStats(num_steps=sum(e.num_steps for e in each),
                       num_run_steps=sum(e.num_run_steps for e in each),
                       num_runs=sum(e.num_runs for e in each),
                       num_arrived=sum(e.num_arrived for e in each), scheduler={})


def _check_pd(sc: LoadedScenario, plans: list[PoolPlan]) -> None:
    """What P/D serving does not model yet, refused in one line naming the key."""
    if sc.workload.n > 1:
        raise ScenarioError(f"workload.n: {sc.workload.n} parallel samples with prefill/decode pools are "
                            f"not modelled (one KV pull per request); use n: 1 or mixed pools")
    for i, p in enumerate(plans):
        if p.scheduler != "chunked":
            raise ScenarioError(f"cluster.pools[{i}].engine.scheduler: {p.scheduler!r}; prefill/decode "
                                f"pools need the KV connector of the chunked scheduler")
        if p.sched_config.async_scheduling:
            raise ScenarioError(f"cluster.pools[{i}].engine.async_scheduling: true with prefill/decode "
                                f"pools is not modelled yet; set it false")


def _pd_columns(requests: pd.DataFrame, transfers: dict) -> pd.DataFrame:
    """requests.csv's P/D columns: where the prompt was prefilled and when its KV moved."""
    t = [transfers.get(rid) for rid in requests["request_id"]]
    nan = float("nan")
    return requests.assign(
        prefill_replica=[x.prefill_replica if x else None for x in t],
        prefill_done_s=[x.prefill_done_s if x else nan for x in t],
        kv_transfer_start_s=[x.start_s if x else nan for x in t],
        kv_transfer_end_s=[x.end_s if x else nan for x in t],
        kv_transfer_blocks=[x.num_blocks if x else 0 for x in t])


def _pd_summary(requests: pd.DataFrame) -> dict:
    """Means of the P/D pieces of TTFT over completed requests (seconds)."""
    done = requests[requests["status"] == "completed"]
    if done.empty:
        return {"mean_prefill_done_ms": None, "mean_kv_transfer_ms": None, "kv_transfer_blocks": 0}
    wait = done["kv_transfer_end_s"] - done["kv_transfer_start_s"]
    return {"mean_prefill_done_ms": float((done["prefill_done_s"] - done["arrival_time_s"]).mean() * 1e3),
            "mean_kv_transfer_ms": float(wait.mean() * 1e3),
            "kv_transfer_blocks": int(done["kv_transfer_blocks"].sum())}


def _client_order(frames: list[pd.DataFrame], orders: list[np.ndarray]) -> tuple[pd.DataFrame, np.ndarray]:
    """Several engines' request rows as one client lists them: by arrival time, then in
    the workload's order (``Request.index``), as ``in_arrival_order`` has one engine's
    (``orders``: each frame's ``arrival_indices``); and where each row came from in
    the frames one after the other."""
    requests = pd.concat(frames, ignore_index=True)
    order = np.concatenate(orders) if orders else np.zeros(0, dtype=np.int64)
    rows = np.lexsort((order, requests["arrival_time_s"].to_numpy(dtype=float)))
    return requests.take(rows).reset_index(drop=True), rows


def _gap_order(counts: list[np.ndarray], rows: np.ndarray) -> Segments:
    """The order the client pools the gaps in, request by request in ``rows``' order,
    of gaps held frame by frame, each frame's request by request (``counts``)."""
    counts = np.concatenate(counts) if counts else np.zeros(0, dtype=np.int64)
    starts = np.cumsum(counts) - counts
    return Segments(starts[rows], counts[rows])
