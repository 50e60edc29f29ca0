"""The SimPy engine loop: schedule -> cost -> advance clock -> apply outputs -> record.

Two processes tell the whole story::

    arrivals:  wait until the next request arrives, put it in the waiting
               queue, wake the engine if it sleeps
    engine:    while there is work: plan a step, cost it, yield its duration,
               apply its outputs; sleep when idle

Arrival events are URGENT in SimPy's sense, so every request arriving at or
before a step's start time is in the queue when that step is scheduled.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import numpy as np
import simpy
from simpy.core import NORMAL, URGENT
from simpy.events import Event

from kvsim.cost.base import CostModel, decode_run_function, step_time_function
from kvsim.sched.base import Scheduler, StepPlan
from kvsim.sched.request import Request, RequestStatus
from kvsim.sim.fast import apply_decode_run, plan_decode_run, schedule_step
from kvsim.workload.request import RequestSpec


class _ArrivalTimeout(Event):
    """A timeout that fires before ordinary events at the same instant."""

    def __init__(self, env: simpy.Environment, delay: float) -> None:
        super().__init__(env)
        self._ok = True
        self._value = None
        env.schedule(self, URGENT, delay)


class _AtTime(Event):
    """An event at an absolute time (not now + delay, which may round differently).

    The fast path computes step boundaries by left-to-right accumulation, as the
    step path's successive timeouts do; landing exactly on the last boundary
    keeps the two paths bit-identical. Uses SimPy's event queue directly.
    """

    def __init__(self, env: simpy.Environment, at: float) -> None:
        super().__init__(env)
        self._ok = True
        self._value = None
        heapq.heappush(env._queue, (at, NORMAL, next(env._eid), self))


class StepLog:
    """Per-step records, kept as columns (cheap to append, cheap to tabulate).

    A step of the step path is appended as a row. A decode run of the fast
    path is kept as one record (its K steps differ only in their times and
    free blocks) and expanded with numpy when ``columns`` is read.
    """

    COLUMNS = ("step", "start_time_s", "duration_s", "num_prefill_tokens", "num_decode_tokens",
               "num_scheduled_reqs", "num_running", "num_waiting", "num_preempted",
               "num_finished", "num_free_blocks", "kv_cache_usage")
    FLOAT_COLUMNS = ("start_time_s", "duration_s", "kv_cache_usage")

    def __init__(self, first_step: int = 0) -> None:
        self._rows: dict[str, list] = {c: [] for c in self.COLUMNS}
        # Decode runs: one (first step, K, batch size, waiting, finished in the
        # last step, usable blocks) each; their per-step values in flat lists.
        self._runs: list[tuple] = []
        self._run_starts: list[float] = []
        self._run_durations: list[float] = []
        self._run_free: list[int] = []
        self._len = 0
        self.first_step = first_step

    def __len__(self) -> int:
        return self._len

    @property
    def next_step(self) -> int:
        return self.first_step + self._len

    def append(self, *values) -> None:
        """One step, values in ``COLUMNS`` order (its step number first)."""
        for col, v in zip(self._rows.values(), values):
            col.append(v)
        self._len += 1

    def add_run(self, starts: list[float], durations: list[float], free_after: list[int],
                batch: int, waiting: int, num_finished: int, usable_blocks: int) -> None:
        """K decode steps of ``batch`` requests; the last one finishes ``num_finished``."""
        k = len(durations)
        self._runs.append((self.next_step, k, batch, waiting, num_finished, usable_blocks))
        self._run_starts += starts
        self._run_durations += durations
        self._run_free += free_after
        self._len += k

    @property
    def columns(self) -> dict[str, np.ndarray]:
        """Every step in step order, one numpy array per column."""
        n = self._len
        out = {c: np.empty(n, dtype=float if c in self.FLOAT_COLUMNS else np.int64)
               for c in self.COLUMNS}
        if self._rows["step"]:
            at = np.asarray(self._rows["step"], dtype=np.int64) - self.first_step
            for c, values in self._rows.items():
                out[c][at] = values
        if self._runs:
            firsts, ks, batch, waiting, fin, usable = (np.asarray(v, dtype=np.int64)
                                                        for v in zip(*self._runs))
            total = len(self._run_durations)
            ends = np.cumsum(ks)
            last = ends - 1                              # index of each run's last step
            at = np.repeat(firsts - self.first_step, ks) + np.arange(total) - np.repeat(ends - ks, ks)
            b = np.repeat(batch, ks)
            free = np.asarray(self._run_free, dtype=np.int64)
            running = b.copy()
            running[last] -= fin
            finished = np.zeros(total, dtype=np.int64)
            finished[last] = fin
            cols = {
                "step": at + self.first_step,
                "start_time_s": np.asarray(self._run_starts, dtype=float),
                "duration_s": np.asarray(self._run_durations, dtype=float),
                "num_prefill_tokens": 0,
                "num_decode_tokens": b,
                "num_scheduled_reqs": b,
                "num_running": running,
                "num_waiting": np.repeat(waiting, ks),
                "num_preempted": 0,
                "num_finished": finished,
                "num_free_blocks": free,
                "kv_cache_usage": 1.0 - free / np.repeat(usable, ks),
            }
            for c, values in cols.items():
                out[c][at] = values
        return out


@dataclass(frozen=True)
class EngineStats:
    """How a run was simulated (for benchmarks, reports and tests).

    ``num_steps`` engine steps in all; ``num_run_steps`` of them were skipped
    ahead in ``num_runs`` decode runs (costed and recorded in one go), the
    other ``num_steps - num_run_steps`` went one by one through
    ``Scheduler.schedule()``. ``scheduler`` holds the scheduler's own
    counters (``Scheduler.stats()``; e.g. ``slot_utilization`` of ``static``).
    """

    num_steps: int
    num_run_steps: int
    num_runs: int
    num_arrived: int
    scheduler: dict[str, float]

    @property
    def num_single_steps(self) -> int:
        return self.num_steps - self.num_run_steps

    @property
    def skip_ahead_share(self) -> float:
        """Fraction of the steps simulated inside decode runs."""
        return self.num_run_steps / self.num_steps if self.num_steps else 0.0


class Engine:
    """One serving engine replica driven by SimPy.

    ``make_request(spec, index, arrival_time)`` builds the engine's request
    state; ``check_request(req)`` returns a reason string when the request can
    never run (it is then reported as failed instead of being queued).
    """

    def __init__(self, scheduler: Scheduler, cost_model: CostModel, *,
                 make_request: Callable[[RequestSpec, int, float], Request],
                 check_request: Callable[[Request], str],
                 trace: Callable[[dict], None] | None = None,
                 concurrency: int | None = None, fast_path: bool = True,
                 sink=None, flush_every: int = 20_000) -> None:
        self.env = simpy.Environment(initial_time=0.0)
        self.scheduler = scheduler
        self.cost_model = cost_model
        self._step_time = step_time_function(cost_model)     # costs a step given as lists
        self._decode_run_times = decode_run_function(cost_model)   # costs a run of decode steps
        self.make_request = make_request
        self.check_request = check_request
        self.trace = trace
        self.concurrency = concurrency
        self.fast_path = fast_path
        # Streaming: hand finished requests and step records to ``sink``
        # (``add_done(list[Request])``, ``add_steps(columns)``) every
        # ``flush_every`` items and forget them, so memory stays bounded.
        self.sink = sink
        self.flush_every = flush_every
        self.num_fast_steps = 0                  # steps simulated inside decode runs
        self.num_runs = 0
        self.steps = StepLog()
        self.done: list[Request] = []            # finished or failed, in order
        self.num_arrived = 0
        self._wake: Event | None = None
        self._index = 0
        self._specs: Iterator[RequestSpec] = iter(())
        self._arrivals_done = False
        self._parked: dict[str, list[RequestSpec]] = {}   # waiting on another request
        self._finished_at: dict[str, float] = {}
        self._num_pending_releases = 0
        # Requests that arrived but were not handed to the scheduler yet: as in
        # vLLM's engine core, a step's schedule() sees the requests that arrived
        # before it started; the rest wait in the input queue for the next one.
        self._inbox: list = []
        self._reported_finished = False

    # ---------------------------------------------------------------- run

    def run(self, specs: Iterator[RequestSpec]) -> None:
        self._specs = iter(specs)
        if self.concurrency:
            for _ in range(self.concurrency):
                self._release_next_closed_loop()
            self._arrivals_done = True
        else:
            self.env.process(self._arrivals())
        self.env.process(self._engine())
        self.env.run()
        if self.sink is not None:
            self.sink.add_done(self.done)
            self.done = []
            self._flush_steps()
        stuck = sum(len(v) for v in self._parked.values())
        if stuck:
            raise RuntimeError(f"{stuck} requests wait on requests that never arrived")

    def stats(self) -> EngineStats:
        sched_stats = getattr(self.scheduler, "stats", None)
        return EngineStats(num_steps=self.steps.next_step, num_run_steps=self.num_fast_steps,
                           num_runs=self.num_runs, num_arrived=self.num_arrived,
                           scheduler=dict(sched_stats()) if sched_stats else {})

    # ---------------------------------------------------------- processes

    def _arrivals(self):
        for spec in self._specs:
            if spec.after_request_id is not None:
                self._park(spec)
                continue
            delay = spec.arrival_time_s - self.env.now
            if delay > 0:
                yield _ArrivalTimeout(self.env, delay)
            self._admit(spec, max(spec.arrival_time_s, self.env.now))
        self._arrivals_done = True

    def _engine(self):
        sched = self.scheduler
        while True:
            arrived = bool(self._inbox)
            for req in self._inbox:
                sched.add_request(req)
            self._inbox.clear()
            if not sched.has_requests():
                if self._arrivals_done and not self._num_pending_releases:
                    return
                if not self._reported_finished:
                    yield from self._sleep_until_arrival()
                    continue
            run = None
            # A step right after arrivals nearly always admits one (no decode
            # run); stepping it one by one is exact either way.
            if self.fast_path and not arrived:
                run = plan_decode_run(sched, self._decode_run_times, self.env.now, self.env.peek())
            if run is not None:
                yield from self._decode_run(run)
            else:
                yield from self._step()

    def _sleep_until_arrival(self):
        self._wake = self.env.event()
        yield self._wake
        self._wake = None

    def _step(self):
        """One engine step: schedule -> cost -> advance clock -> apply outputs -> record."""
        env, sched = self.env, self.scheduler
        start = env.now
        plan = (self.fast_path and schedule_step(sched)) or sched.schedule()
        for req, _, _ in plan.scheduled:
            if math.isnan(req.scheduled_time):
                req.scheduled_time = start
        for req in plan.failed:
            req.finish_time = start
            self._on_done(req)
        if plan.is_empty and plan.failed:
            return
        scheduled = plan.scheduled
        duration = self._step_time([e[1] for e in scheduled], [e[2] for e in scheduled],
                                   plan.num_sampled, plan.swap_bytes)
        yield env.timeout(duration)
        finished = sched.update_from_output(plan, env.now)
        self._record(plan, finished, start, duration)
        self._finish(finished)
        if plan.is_empty and not self._progress_possible():
            self._fail_unschedulable()

    def _decode_run(self, run):
        """K identical decode steps at once (the fast path, kvsim/sim/fast.py)."""
        yield _AtTime(self.env, float(run.times[-1]))
        finished = apply_decode_run(self.scheduler, run)
        self._record_run(run, finished)
        self._finish(finished)

    def _finish(self, finished: list[Request]) -> None:
        for req in finished:
            self._on_done(req)
        # vLLM runs one more (possibly empty) step after requests finish, to
        # report them, before an idle engine sleeps (Scheduler.has_requests
        # counts finished ids not yet reported).
        self._reported_finished = bool(finished)
        if self.sink is not None and len(self.steps) >= self.flush_every:
            self._flush_steps()

    # ------------------------------------------------------------ helpers

    def _admit(self, spec: RequestSpec, now: float) -> None:
        if spec.n > 1:
            # vLLM V1 fans parallel sampling out into n child requests with the
            # same prompt; prefix caching shares their full prompt blocks.
            for k in range(spec.n):
                self._admit(replace(spec, request_id=f"{spec.request_id}#{k}", n=1), now)
            return
        req = self.make_request(spec, self._index, now)
        self._index += 1
        self.num_arrived += 1
        reason = self.check_request(req)
        if reason:
            req.status = RequestStatus.FAILED
            req.fail_reason = reason
            req.finish_time = now
            self._on_done(req)
            return
        self._inbox.append(req)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _park(self, spec: RequestSpec) -> None:
        dep = spec.after_request_id
        if dep in self._finished_at:
            self._schedule_release(spec, self._finished_at[dep] + spec.think_time_s)
        else:
            self._parked.setdefault(dep, []).append(spec)

    def _schedule_release(self, spec: RequestSpec, at: float) -> None:
        if at <= self.env.now:
            # Due now: it must be visible to the step that starts now.
            self._admit(spec, self.env.now)
            return
        self._num_pending_releases += 1

        def release(_event, spec=spec, at=at):
            self._num_pending_releases -= 1
            self._admit(spec, at)

        ev = _ArrivalTimeout(self.env, max(0.0, at - self.env.now))
        ev.callbacks.append(release)

    def _on_done(self, req: Request) -> None:
        # A done request never touches the KV cache again: drop its token ids
        # and hashes (the bulk of its memory); its timings stay for the tables.
        req.all_token_ids = req.block_hashes = None
        self.done.append(req)
        # Kept for every request: a later turn may name one that finished
        # (or failed on arrival) before the turn itself was read.
        self._finished_at[req.request_id] = req.finish_time
        if self.sink is not None and len(self.done) >= self.flush_every:
            self.sink.add_done(self.done)
            self.done = []
        for spec in self._parked.pop(req.request_id, ()):
            self._schedule_release(spec, req.finish_time + spec.think_time_s)
        if self.concurrency:
            self._release_next_closed_loop()

    def _release_next_closed_loop(self) -> None:
        spec = next(self._specs, None)
        if spec is not None:
            self._schedule_release(spec, self.env.now)

    def _record(self, plan: StepPlan, finished: list[Request], start: float, duration: float) -> None:
        sched = self.scheduler
        prefill = decode = 0
        for req, n, ctx in plan.scheduled:
            # A one-token step of a request past its prompt is a decode.
            if n == 1 and ctx >= req.prompt_len:
                decode += 1
            else:
                prefill += n
        running, waiting = sched.get_request_counts()
        kv = sched.kv
        self.steps.append(
            self.steps.next_step, start, duration, prefill, decode, len(plan.scheduled),
            running, waiting, len(plan.preempted), len(finished),
            kv.get_num_free_blocks(), kv.usage)
        if self.trace is not None:
            self.trace({
                "step": self.steps.next_step - 1,
                "start_time": start,
                "scheduled": {r.request_id: n for r, n, _ in plan.scheduled},
                "preempted": [r.request_id for r in plan.preempted],
                "finished": [r.request_id for r in finished],
                "num_free_blocks": kv.get_num_free_blocks(),
                "num_running": running,
                "num_waiting": waiting,
                "prefix_hit_tokens": dict(plan.prefix_hit_tokens),
                "resume_hit_tokens": dict(plan.resume_hit_tokens),
            })

    def _flush_steps(self) -> None:
        self.sink.add_steps(self.steps.columns)
        self.steps = StepLog(first_step=self.steps.next_step)

    def _record_run(self, run, finished: list[Request]) -> None:
        sched = self.scheduler
        k = run.num_steps
        b = len(sched.running) + len(finished)          # batch size during the run
        waiting = sched.get_request_counts()[1]
        first = self.steps.next_step
        free = run.free_after
        free[-1] = sched.kv.get_num_free_blocks()        # after the finished were freed
        self.steps.add_run(run.times[:-1], run.durations, free, b, waiting, len(finished),
                           sched.kv.num_usable_blocks)
        self.num_fast_steps += k
        self.num_runs += 1
        if self.trace is not None:
            scheduled = {rid: 1 for rid in run.request_ids}
            for j in range(k):
                last = j == k - 1
                self.trace({"step": first + j, "start_time": float(run.times[j]),
                            "scheduled": dict(scheduled), "preempted": [],
                            "finished": [r.request_id for r in finished] if last else [],
                            "num_free_blocks": int(free[j]),
                            "num_running": b - len(finished) if last else b,
                            "num_waiting": waiting, "prefix_hit_tokens": {},
                            "resume_hit_tokens": {}})

    def _progress_possible(self) -> bool:
        running, waiting = self.scheduler.get_request_counts()
        return running > 0 or waiting == 0

    def _fail_unschedulable(self) -> None:
        """Nothing runs and the waiting head cannot start: fail it, never hang."""
        sched = self.scheduler
        req = sched.waiting.pop()
        req.status = RequestStatus.FAILED
        req.fail_reason = "cannot be scheduled even with the whole KV cache free"
        req.finish_time = self.env.now
        self._on_done(req)
