"""``kvsim.simulate(scenario) -> Result``: one run, from scenario to tables."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvsim.metrics.schema import REQUEST_COLUMNS, STEP_COLUMNS
from kvsim.metrics.streaming import StreamingStats
from kvsim.metrics.summary import summarize
from kvsim.metrics.tables import write_csv
from kvsim.scenario.loader import LoadedScenario, load_scenario
from kvsim.scenario.outputs import check_output_dir, summary_json, write_files
from kvsim.sched.request import Request, RequestStatus
from kvsim.sim.engine import Engine, EngineStats
from kvsim.sim.run import run_engine
from kvsim.workload import build_workload

RUN_FILES = ("summary.json", "requests.csv", "steps.csv")


@dataclass
class Result:
    """What a run produced: the summary, per-request and per-step tables.

    ``stats`` says how the run was simulated (steps, decode runs, the
    scheduler's own counters): what benchmarks and reports read instead of
    reaching into the engine.
    """

    summary: dict[str, Any]
    requests: pd.DataFrame
    steps: pd.DataFrame
    itl_s: np.ndarray = field(repr=False)
    scenario: LoadedScenario | None = field(default=None, repr=False)
    stats: EngineStats | None = field(default=None, repr=False)

    def write(self, out_dir: str | Path) -> Path:
        """Write summary.json (strict JSON), requests.csv, steps.csv atomically (scenario/outputs.py)."""
        out = check_output_dir(out_dir, files=RUN_FILES)
        summary = summary_json(self.summary)
        # The same bytes as DataFrame.to_csv(index=False), several times faster.
        write_files({out / "summary.json": lambda path: path.write_text(summary, encoding="utf-8"),
                     out / "requests.csv": lambda path: write_csv(self.requests, path),
                     out / "steps.csv": lambda path: write_csv(self.steps, path)})
        return out


def simulate(scenario, *, trace=None, overrides=None, fast_path: bool = True,
             streaming: bool | None = None, progress=None) -> Result:
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
    """
    sc = scenario if isinstance(scenario, LoadedScenario) else load_scenario(scenario, overrides=overrides)
    if sc.scenario.cluster is not None:      # replicas behind a router: docs/fleet.md
        from kvsim.scenario.cluster import simulate_cluster
        return simulate_cluster(sc, fast_path=fast_path, trace=trace, progress=progress,
                                streaming=streaming)
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
    engine = run_engine(workload.requests(), sc.sched_config, scheduler=sc.scheduler,
                        cost_model=sc.cost_model, trace=trace,
                        concurrency=workload.concurrency, fast_path=fast_path, sink=sink,
                        progress=hook)
    if sink is not None:
        summary = sink.stats.summary(num_gpu_blocks=sc.sched_config.num_gpu_blocks)
        summary = {"scenario": sc.name, "scheduler": sc.scheduler, **summary}
        return Result(summary, requests_frame([]), steps_frame(engine), np.zeros(0), sc,
                      engine.stats())
    return collect_result(engine, sc)


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


def requests_frame(done: list[Request]) -> pd.DataFrame:
    rows = {c: [] for c in REQUEST_COLUMNS}
    for r in done:
        rows["request_id"].append(r.request_id)
        rows["arrival_time_s"].append(r.arrival_time)
        rows["scheduled_time_s"].append(r.scheduled_time)
        rows["first_token_time_s"].append(r.first_token_time)
        rows["finish_time_s"].append(r.finish_time)
        rows["num_prompt_tokens"].append(r.prompt_len)
        rows["num_output_tokens"].append(r.num_output_tokens)
        rows["num_cached_tokens"].append(max(r.num_cached_tokens, 0))
        rows["num_preemptions"].append(r.num_preemptions)
        rows["priority"].append(r.priority)
        rows["status"].append("failed" if r.status is RequestStatus.FAILED else "completed")
        rows["fail_reason"].append(r.fail_reason)
    df = pd.DataFrame(rows, columns=REQUEST_COLUMNS)
    return df.sort_values(["arrival_time_s"], kind="stable").reset_index(drop=True)


def steps_frame(engine: Engine) -> pd.DataFrame:
    return pd.DataFrame(engine.steps.columns, columns=STEP_COLUMNS)


def itl_seconds(done: list[Request]) -> np.ndarray:
    """Every gap between consecutive tokens of each completed request, request by request."""
    times = [r.token_times for r in done
             if r.status is not RequestStatus.FAILED and len(r.token_times) > 1]
    if not times:
        return np.zeros(0)
    # One diff over all requests' token times, less the gaps between requests
    # (a np.diff per request costs more than its arithmetic).
    lengths = np.fromiter(map(len, times), dtype=np.int64, count=len(times))
    flat = np.fromiter(chain.from_iterable(times), dtype=float, count=int(lengths.sum()))
    across = np.cumsum(lengths)[:-1] - 1       # gap from a request's last token to the next's first
    return np.delete(np.diff(flat), across)
