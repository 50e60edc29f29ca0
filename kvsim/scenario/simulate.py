"""``kvsim.simulate(scenario) -> Result``: one run, from scenario to tables."""

from __future__ import annotations

import numpy as np

from kvsim.metrics.streaming import StreamingStats
from kvsim.metrics.summary import summarize
from kvsim.scenario.kv_offload import offload_summary, with_connector_columns
from kvsim.scenario.loader import LoadedScenario, load_scenario
# Result and the tables live in result.py (a fleet builds them too); imported here by name.
from kvsim.scenario.result import RUN_FILES, Result, itl_seconds, requests_frame, steps_frame
from kvsim.sched.request import Request
from kvsim.sim.engine import Engine
from kvsim.sim.gc_pause import collector_paused
from kvsim.sim.run import run_engine
from kvsim.workload import build_workload

__all__ = ["RUN_FILES", "Result", "StreamingSink", "collect_result", "itl_seconds", "requests_frame",
           "simulate", "steps_frame"]


def simulate(scenario, *, trace=None, overrides=None, fast_path: bool = True,
             streaming: bool | None = None, progress=None, watch_steps=None) -> Result:
    """Run one scenario (a ``LoadedScenario``, a mapping, or a YAML path).

    ``trace``, if given, is called with one dict per engine step (the
    ``--trace`` format). Same scenario and seed give identical results.
    ``fast_path=False`` simulates every step one by one (the reference path;
    the fast path skips ahead over runs of identical decode steps and gives
    the same results). ``streaming=True`` (or ``metrics: {streaming: true}``
    in the scenario) keeps no per-request or per-step tables: the summary is
    accumulated in bounded memory (percentiles within 0.5%), for very long runs.
    ``progress``, if given, is called as ``progress(sim_time_s, count, total)``
    while the run goes (``kvsim.scenario.run_progress``; wall-clock reporting only).
    ``watch_steps``, if given, is called with the engine's step log
    (``kvsim.sim.steplog.StepLog``) as it grows, and returns the number of steps
    at which to be called next; it must change nothing (``kvsim run`` makes
    steps.csv's rows text meanwhile: ``kvsim.metrics.tables.RowsAhead``). Not
    called for a fleet, nor with streaming metrics (no step log is kept).
    """
    sc = scenario if isinstance(scenario, LoadedScenario) else load_scenario(scenario, overrides=overrides)
    if sc.scenario.cluster is not None:      # replicas behind a router: docs/fleet.md
        from kvsim.scenario.cluster import simulate_cluster
        return simulate_cluster(sc, fast_path=fast_path, trace=trace, progress=progress,
                                streaming=streaming)
    # The collector stays paused until the tables are built and the engine is gone
    # (freed by reference counting: Engine.close), so it never traces the run's objects.
    with collector_paused():
        return _simulate_engine(sc, trace=trace, fast_path=fast_path, streaming=streaming,
                                progress=progress, watch_steps=watch_steps)


def _simulate_engine(sc: LoadedScenario, *, trace, fast_path: bool, streaming: bool | None,
                     progress, watch_steps=None) -> Result:
    rng = np.random.default_rng(sc.seed)
    # A prompt of max_model_len tokens or more is refused on arrival: not spelled out.
    workload = build_workload(sc.workload, rng=rng, base_dir=sc.base_dir,
                              max_prompt_len=sc.sched_config.max_model_len - 1)
    if streaming is None:
        streaming = sc.scenario.metrics.streaming
    sink = StreamingSink(sc.scenario.slo.as_dict() or None) if streaming else None
    hook = None
    if progress is not None:
        # n > 1 fans every request out into n that finish on their own.
        total = None if workload.num_requests is None else workload.num_requests * sc.workload.n

        def hook(now_s: float, num_done: int) -> None:
            progress(now_s, num_done, total)
    # CPU/disk offload tiers: vLLM's OffloadingConnector (kvsim/kv/offload_engine.py), fresh per run.
    connector = sc.kv_offload.make_connector() if sc.kv_offload is not None else None
    engine = run_engine(workload.requests(), sc.sched_config, scheduler=sc.scheduler,
                        cost_model=sc.cost_model, trace=trace,
                        concurrency=workload.concurrency, fast_path=fast_path, sink=sink,
                        progress=hook, connector=connector, watch_steps=watch_steps)
    if sink is not None:
        summary = sink.stats.summary(num_gpu_blocks=sc.sched_config.num_gpu_blocks)
        summary = {"scenario": sc.name, "scheduler": sc.scheduler, **summary}
        if connector is not None:
            summary["kv_offload"] = connector.stats()
        return Result(summary, requests_frame([]), steps_frame(engine), np.zeros(0), sc,
                      engine.stats())
    result = collect_result(engine, sc)
    if connector is not None:
        # The GPU / connector split of each hit, for vLLM's prefix-cache counters
        # (metrics.csv: kvsim/metrics/prometheus.py); only with a connector.
        result.requests = with_connector_columns(result.requests, connector)
        result.summary["kv_offload"] = offload_summary(connector, result.requests)
    return result


class StreamingSink:
    """Feeds finished requests and step records into ``StreamingStats`` and forgets them."""

    def __init__(self, slo: dict | None) -> None:
        self.stats = StreamingStats(slo=slo)

    def add_done(self, done: list[Request]) -> None:
        if not done:
            return
        self.stats.add_requests(requests_frame(done))
        itl = itl_seconds(done)
        if len(itl):
            self.stats.add_itl(itl)

    def add_steps(self, columns: dict) -> None:
        if len(columns["step"]):
            self.stats.add_steps(columns)


def collect_result(engine: Engine, sc: LoadedScenario | None) -> Result:
    requests = requests_frame(engine.done)
    steps = steps_frame(engine)
    itl = itl_seconds(engine.done)
    slo = sc.scenario.slo.as_dict() if sc is not None else {}
    summary = summarize(requests, steps, itl, num_gpu_blocks=engine.scheduler.config.num_gpu_blocks,
                        slo=slo or None)
    if sc is not None:
        summary = {"scenario": sc.name, "scheduler": sc.scheduler, **summary}
    return Result(summary, requests, steps, itl, sc, engine.stats())
