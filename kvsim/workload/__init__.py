"""What arrives at the engine: synthetic workloads, real traces, requests files.

    workload = build_workload({"arrival": {"type": "poisson", "rate": 2.0}}, rng=rng, base_dir=scenario_dir)
    for spec in workload.requests():   # RequestSpec, in arrival order, generated lazily
        ...

Keys and semantics are documented in docs/workloads.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kvsim.workload.bench import bench_arrival_times, bench_requests, bench_table
from kvsim.workload.config import (ClosedLoopArrival, WorkloadConfig, format_validation_error,
                                   parse_workload_config, resolve_path)
from kvsim.workload.lengths import LengthSampler
from kvsim.workload.request import RequestSpec
from kvsim.workload.requests_file import read_requests_file
from kvsim.workload.synthetic import synthetic_requests
from kvsim.workload.traces import read_trace, trace_requests

__all__ = ["RequestSpec", "Workload", "WorkloadConfig", "build_workload", "format_validation_error",
           "parse_workload_config"]


@dataclass(frozen=True)
class Workload:
    """The requests of one run.

    ``requests()`` yields ``RequestSpec``s in arrival order, lazily; every call
    starts over and yields the same requests. ``concurrency`` is set for a
    closed loop: the engine keeps that many requests in flight and releases the
    next one when one finishes, ignoring ``arrival_time_s``. ``num_requests`` is
    the number ``requests()`` yields. ``independent``: no request waits on
    another (no ``after_request_id``; a fleet may then simulate replicas behind
    a router that reads no replica state one at a time, kvsim/fleet/separate.py);
    False whenever it is not known.
    """

    num_requests: int | None
    concurrency: int | None
    _make_requests: Callable[[], Iterator[RequestSpec]] = field(repr=False)
    independent: bool = False

    def requests(self) -> Iterator[RequestSpec]:
        return self._make_requests()


def build_workload(config: WorkloadConfig | dict, *, rng: np.random.Generator,
                   base_dir: Path | None = None, max_prompt_len: int | None = None) -> Workload:
    """Validate ``config``, read its files, and return the workload.

    Every check (keys, values, files, trace rows) happens here, before any
    simulation starts. Relative paths resolve against ``base_dir`` (the scenario
    file's folder). One number is drawn from ``rng`` now; the workload's own
    generator is seeded from it, so the requests do not depend on what else
    draws from ``rng`` later.

    ``max_prompt_len`` is the longest prompt the engine can run (``max_model_len
    - 1``): a longer synthetic or trace prompt is yielded with its true length
    but without its ids (``tokens.unrun_prompt``), since the engine fails it on
    arrival without reading them; a prompt of 2e9 tokens then costs no memory.
    A closed loop with more clients than requests has one client per request
    (the same run: every request is released at t=0).
    """
    config = parse_workload_config(config)
    seed = int(rng.integers(0, 2**63 - 1))
    arrival = config.arrival_or_default()
    concurrency = arrival.concurrency if isinstance(arrival, ClosedLoopArrival) else None

    if config.kind == "requests_file":
        path = resolve_path(config.requests_file, base_dir, yaml_path="workload.requests_file")
        specs = read_requests_file(path)
        return Workload(len(specs), None, lambda: iter(specs),
                        independent=all(s.after_request_id is None for s in specs))

    if config.kind == "bench":
        bench = config.bench
        # vLLM's --seed seeds the dataset and the send times directly; without
        # one, the number drawn from the run's generator does.
        bench_seed = bench.seed if bench.seed is not None else seed % 2**32
        table = bench_table(bench, seed=bench_seed, base_dir=base_dir)
        times = bench_arrival_times(bench, len(table), bench_seed, table.timestamps)
        # With every request sent at t=0, vLLM's --max-concurrency semaphore is a
        # closed loop of that many clients (bench_config refuses it otherwise).
        return Workload(len(table), bench.max_concurrency,
                        lambda: bench_requests(bench, table, times))

    if config.kind == "trace":
        table = read_trace(config.trace, base_dir=base_dir)
        if table.after is not None and (concurrency or config.n > 1 or config.beam_width > 1):
            # A later turn waits for one named request: a closed loop would release it
            # early, and n > 1 copies would leave it waiting on a name that never finishes.
            raise ValueError(f"workload.trace.path = {config.trace.path!r}: a session trace (rows with "
                             f"session_id) needs an open-loop arrival, n: 1 and beam_width: 1")
        return Workload(len(table), _cap(concurrency, len(table)), lambda: trace_requests(
            table, arrival=arrival, seed=seed, priority=config.priority,
            cache_salt=config.cache_salt, n=config.n, beam_width=config.beam_width,
            max_prompt_len=max_prompt_len), independent=table.after is None)

    prompt_len = LengthSampler(config.prompt_len, base_dir=base_dir, yaml_path="workload.prompt_len")
    output_len = LengthSampler(config.output_len, base_dir=base_dir, yaml_path="workload.output_len")
    return Workload(config.num_requests, _cap(concurrency, config.num_requests), lambda: synthetic_requests(
        config, arrival, seed, prompt_len, output_len, max_prompt_len=max_prompt_len),
        independent=config.sessions.turns == 1)          # turn 2 on waits on turn 1 (synthetic.py)


def _cap(concurrency: int | None, num_requests: int) -> int | None:
    """Clients beyond the request count would never send anything (the engine starts one per client)."""
    return None if concurrency is None else max(1, min(concurrency, num_requests))
