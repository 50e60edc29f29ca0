"""One serving engine: schedule -> cost -> advance clock -> apply outputs -> record.

The engine is one SimPy process that reads like the story it models::

    while there is work:
        a decode run the scheduler offers?  cost its steps, wait for their end,
                                            apply them (the skip-ahead)
        otherwise:                          schedule one step, cost it, wait
                                            for its end, apply its outputs
    sleep until a request is submitted

Requests reach it through ``submit`` (from the front end, or a router), at
the simulated instant they arrive. As in vLLM's engine core, a step's
``schedule()`` sees the requests that arrived before it started; the rest
wait in the input queue (``_inbox``) for the next step.

Every rule of *what* a step does lives in the scheduler and the KV manager;
the engine only costs (``costing.py``), advances the clock and records
(``records.py``). A decode run is
costed in one call and its effects applied in one call; a request submitted
while a run is in flight cuts the run after the step in progress, so the
run path and the step path give the same results whatever arrives when.
When no event is due before a step or a run ends, the engine moves the clock
to its end in place instead of waiting for it as an event
(``kvsim.sim.frontend.advance_in_place``): nothing else could run in
between, so the results are the same (tests/test_clock_in_place.py).
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, replace

import simpy

from kvsim.cost.base import CostModel
from kvsim.sched.base import DecodeRun, Scheduler
from kvsim.sched.request import Request, RequestStatus
from kvsim.sim.admission import QueueLimits
from kvsim.sim.costing import StepCosts
from kvsim.sim.frontend import AtTime, advance_in_place
from kvsim.sim.inbox import Inbox
from kvsim.sim.records import EngineRecords, EngineStats
from kvsim.sim.steplog import StepLog
from kvsim.workload.request import RequestSpec

# A livelock: requests preempt one another and no request makes a token. vLLM
# 0.33 can loop so forever (with ``scheduler_reserve_full_isl: false`` a
# request is admitted whose whole sequence does not fit, and two such
# requests take turns preempting each other; found by a differential
# campaign, tests/golden/oracle/README.md). After this many steps in a row
# in which nothing was sampled, the requests a step preempts are failed
# instead of queued again (``Engine._break_livelock``). No legitimate run
# comes near it: the most steps without a sampled token in 8,530 random
# cases of the real scheduler (8,300 plain, 230 long) was 61.
LIVELOCK_STEPS = 100_000


@dataclass(slots=True)
class _RunInFlight:
    run: DecodeRun
    times: array                # step boundaries: start of step 1 .. end of the last step
    durations: array            # (both array('d'), from the cost model)
    num_steps: int              # steps it will apply (cut by a submit)


def _closed() -> bool:
    """``more_input`` and ``next_input_time`` of a closed engine (never called)."""
    raise RuntimeError("the engine is closed: its simulation is over")


class Engine(EngineRecords):
    """One serving engine replica driven by SimPy.

    ``make_request(spec, index, arrival_time, read_tokens=True)`` builds the
    engine's request state (``read_tokens=False``: without hashing its blocks,
    for a request that fails on arrival); ``check_request(spec)`` returns a
    reason string when the request can never run, read before it is built
    (it is then reported as failed instead of being queued). ``queue_limits``
    (``kvsim.sim.admission``) refuses requests past the API server's queue
    limits with HTTP 503, the same way.
    ``on_done(req)`` hears of every finished or failed request.
    ``more_input()`` says whether any request may still be submitted (an
    engine that just finished requests runs one more, possibly empty, step
    before it sleeps, as vLLM reports finished requests, except at the very
    end). ``next_input_time()`` bounds a decode run: no step of it starts at
    or after that time (default: the environment's next event).
    """

    def __init__(self, scheduler: Scheduler, cost_model: CostModel, *,
                 make_request: Callable[[RequestSpec, int, float], Request],
                 check_request: Callable[[Request], str],
                 env: simpy.Environment | None = None, name: str = "",
                 trace: Callable[[dict], None] | None = None, fast_path: bool = True,
                 sink=None, flush_every: int = 20_000,
                 on_done: Callable[[Request], None] | None = None,
                 more_input: Callable[[], bool] | None = None,
                 next_input_time: Callable[[], float] | None = None,
                 progress: Callable[[float, int], None] | None = None,
                 stream_interval: int = 1, async_scheduling: bool = False,
                 queue_limits: QueueLimits | None = None,
                 watch_steps: Callable[[StepLog], float] | None = None) -> None:
        self.env = env if env is not None else simpy.Environment(initial_time=0.0)
        self.name = name
        self.scheduler = scheduler
        self.cost_model = cost_model
        # vLLM V1 async scheduling: step N+1 is scheduled while step N runs (kvsim.sim.inbox).
        self.async_scheduling = async_scheduling
        self._costs = StepCosts(cost_model, async_scheduling=async_scheduling)
        self.make_request = make_request
        self.check_request = check_request
        self.trace = trace
        self.fast_path = fast_path
        scheduler.decodes_at_once = fast_path
        # Streaming: hand finished requests and step records to ``sink``
        # (``add_done(list[Request])``, ``add_steps(columns)``) every
        # ``flush_every`` items and forget them, so memory stays bounded.
        self.sink = sink
        self.flush_every = flush_every
        # ``watch_steps(steps)`` once the step log holds the number of steps it last
        # returned (first at once): it reads them as they are, changing nothing
        # (``kvsim run`` makes steps.csv's rows text meanwhile, kvsim.metrics.tables.RowsAhead).
        self.watch_steps = watch_steps
        self._watch_at = 0 if watch_steps is not None and sink is None else math.inf
        self.on_done = on_done
        self._more_input = more_input or (lambda: False)
        self._next_input_time = next_input_time or self.env.peek
        self.progress = progress
        self.stream_interval = stream_interval      # kvsim.sim.client
        self.queue_limits = queue_limits
        self.steps = StepLog()
        self.done: list[Request] = []            # finished or failed, in order
        self.num_done = 0
        self.num_arrived = 0
        self.num_run_steps = 0
        self.num_runs = 0
        self._inbox = Inbox(async_scheduling)      # submitted, not yet seen by the scheduler
        self._wake: simpy.Event | None = None
        self._reported_finished = False
        self._steps_without_output = 0              # steps in a row that sampled nothing
        self._in_flight: _RunInFlight | None = None
        self._process: simpy.Process | None = None
        self._generator = None                      # the process's generator (closed by close())

    # ------------------------------------------------------------ public

    def start(self) -> None:
        """Start the engine process (once)."""
        if self._process is None:
            self._generator = self._loop()
            self._process = self.env.process(self._generator)

    def submit(self, spec: RequestSpec, arrival_time: float, index: int) -> None:
        """A request reaches the engine now; n > 1 fans out into n samples (indices
        ``index .. index + n - 1``) sharing the prompt through the prefix cache,
        as vLLM V1 does.

        As in vLLM, the request is checked first (its lengths, then the queue
        limits, once for all n samples: ``AsyncLLM.add_request``); a refused
        one fails now, every sample with the same reason, without its blocks
        being hashed.
        """
        n = max(spec.n, 1)
        reason = self.check_request(spec)
        if not reason and self.queue_limits is not None:
            reason = self.queue_limits.refusal(self.num_arrived - self.num_done, n)
        if n > 1:
            for k in range(n):
                self._submit_one(replace(spec, request_id=f"{spec.request_id}#{k}", n=1),
                                 arrival_time, index + k, reason)
        else:
            self._submit_one(spec, arrival_time, index, reason, alone=True)

    def _submit_one(self, spec: RequestSpec, arrival_time: float, index: int, reason: str,
                    alone: bool = False) -> None:
        """``alone``: no sibling sample shares its prompt (``Request.private_keys``)."""
        self.num_arrived += 1
        if reason:
            req = self.make_request(spec, index, arrival_time, read_tokens=False)
            req.status = RequestStatus.FAILED
            req.fail_reason = reason
            req.finish_time = arrival_time
            self._on_done(req)
            return
        req = self.make_request(spec, index, arrival_time, alone=alone)
        if self.queue_limits is not None:
            self.queue_limits.accepted(req)
        self._inbox.add(req, self.env.now)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()
        if self._in_flight is not None:
            self._cut_run()

    def wake(self) -> None:
        """End a sleep: something outside this engine changed when it next has work.

        A fleet's decode replica started pulling a finished prefill's KV
        (kvsim/fleet/pd.py), so this prefill replica now knows when to free
        those blocks (sched/connector.py ``sends_keep_engine_busy``).
        """
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def close(self) -> None:
        """The simulation is over: hand what is left to the sink, and let go of the
        process and of the callbacks into the front end (or fleet).

        Those are the run's reference cycles: the engine holds its process,
        whose suspended generator holds the engine, and ``on_done`` /
        ``more_input`` reach the front end, whose ``submit`` reaches the
        engine. Without them the finished engine and everything it holds are
        freed by reference counting when its caller lets go, and the
        collector, paused during the run (kvsim/sim/gc_pause.py), has nothing
        of it to trace.
        """
        if self.sink is not None:
            self.sink.add_done(self.done)
            self.done = []
            self._flush_steps()
        if self._generator is not None:
            self._generator.close()                 # GeneratorExit at its last yield
        self.scheduler.close()                      # the radix cache's tree (kv/radix.py)
        self.on_done = self.progress = None
        self._more_input = self._next_input_time = _closed

    def stats(self) -> EngineStats:
        return EngineStats(num_steps=self.steps.next_step, num_run_steps=self.num_run_steps,
                           num_runs=self.num_runs, num_arrived=self.num_arrived,
                           scheduler=dict(self.scheduler.stats()))

    # --------------------------------------- state, as a router sees it now

    @property
    def num_running(self) -> int:
        return self.scheduler.get_request_counts()[0]

    @property
    def num_waiting(self) -> int:
        """Queued in the scheduler, plus submitted and not yet scheduled."""
        return self.scheduler.get_request_counts()[1] + len(self._inbox)

    def kv_cache_usage(self) -> float:
        self._sync_run()
        return self.scheduler.kv_cache_usage()

    def num_free_blocks(self) -> int:
        self._sync_run()
        return self.scheduler.num_free_blocks()

    def prefix_hit_blocks(self, block_hashes) -> int:
        self._sync_run()
        return self.scheduler.prefix_hit_blocks(block_hashes)

    # ------------------------------------------------------------ process

    def _loop(self):
        sched = self.scheduler
        ticks = 0
        while True:
            arrived = self._hand_over(self._inbox.take(self.env.now))
            if not sched.has_requests() and len(self._inbox):
                arrived = self._hand_over(self._inbox.take_all(self.env.now))   # nothing else to run
            if not sched.has_requests() and not (self._reported_finished and self._more_input()):
                self._reported_finished = False
                yield from self._sleep()
                continue
            ticks += 1
            if self.progress is not None and not ticks & 255:
                self.progress(self.env.now, self.num_done)
            # A step right after arrivals nearly always admits one, so no run
            # is asked for then; stepping it one by one is exact either way.
            run = sched.plan_decode_run() if self.fast_path and not arrived else None
            if run is not None:
                times, durations = self._run_times(run)
                if durations:
                    yield from self._decode_run(run, times, durations)
                    continue
            yield from self._step()

    def _hand_over(self, reqs: list[Request]) -> bool:
        for req in reqs:
            self.scheduler.add_request(req)
        return bool(reqs)

    def _run_times(self, run: DecodeRun) -> tuple[array, array]:
        """The run's steps that start before the next input (or KV transfer, sched/connector.py).

        With async scheduling the step due when that input arrives was already
        scheduled without it (kvsim.sim.inbox), so it is part of the run too,
        and a request held back in the inbox is seen by the step after the
        next. The rest of a multi-step window is not changed by an arrival,
        but the arrival is recorded as waiting from the next step on: it ends
        the run too.
        """
        until = min(self._next_input_time(), self.scheduler.next_wakeup_time())
        ahead = self._inbox.scheduled_ahead and not run.continuation
        if ahead and len(self._inbox):
            until = self.env.now
        return self._costs.run(run, self.env.now, until, one_more=ahead)

    def _sleep(self, until: float | None = None):
        """Until a request is submitted, or the time ``until``."""
        self._inbox.nothing_ahead()
        wake = self._wake = self.env.event()
        if until is not None:
            AtTime(self.env, max(until, self.env.now)).callbacks.append(
                lambda _e: None if wake.triggered else wake.succeed())
        yield wake
        self._wake = None

    def _step(self):
        """One engine step: schedule -> cost -> advance clock -> apply outputs -> record."""
        env, sched = self.env, self.scheduler
        start = env.now
        plan = sched.schedule()
        if plan.is_empty and not plan.failed and self.async_scheduling:
            # The schedule made while the last step ran found nothing: an empty
            # batch costs the loop no time, and the next schedule follows once
            # that step's outputs are in, seeing every request (kvsim.sim.inbox).
            self._hand_over(self._inbox.take_all(self.env.now))
            plan = sched.schedule()
            if plan.is_empty and not plan.failed:
                # Nothing to run: the loop waits for input, no step is taken.
                self._inbox.nothing_ahead()
                self._reported_finished = False
                if self._stuck(plan):
                    self._fail_unschedulable()
                return
        if plan.is_empty:
            self._inbox.nothing_ahead()
        else:
            self._inbox.step_started(start)
        for req, _, _ in plan.scheduled:
            if req.scheduled_time != req.scheduled_time:      # NaN: first scheduled now
                req.scheduled_time = start
        for req in plan.failed:
            req.finish_time = start
            self._on_done(req)
        if plan.is_empty and plan.failed:
            return
        if plan.is_empty and ((wakeup := sched.next_wakeup_time()) < math.inf
                              or getattr(sched, "waits_on_sends", bool)()):
            # Only KV transfers are pending (sched/connector.py): vLLM's engine
            # core polls with empty steps; kvsim waits for the completion (or a
            # submit) and records no step. Blocks kept for a send not started
            # yet (a P/D prefill replica, kvsim/fleet/pd.py) end with Engine.wake.
            yield from self._sleep(until=wakeup if wakeup < math.inf else None)
            sched.update_from_output(plan, env.now)
            return
        duration = self._costs.step(plan)
        if not advance_in_place(env, start + duration):     # (env.timeout's own sum)
            yield env.timeout(duration)
        finished = sched.update_from_output(plan, env.now)
        if self.queue_limits is not None:
            self.queue_limits.outputs(plan.scheduled)      # first tokens leave the prefill backlog
        self._record(plan, finished, start, duration)
        if plan.num_sampled or finished:                   # steps in a row that made no token
            self._steps_without_output = 0
        else:
            self._steps_without_output += 1
        self._finish(finished)
        if plan.preempted and self._steps_without_output >= LIVELOCK_STEPS:
            self._break_livelock(plan.preempted)
        if plan.is_empty and self._stuck(plan):
            self._fail_unschedulable()

    def _decode_run(self, run: DecodeRun, times: array, durations: array):
        """Decode steps costed at once; their effects applied at the end of the last."""
        flight = _RunInFlight(run, times, durations, len(durations))
        # At the exact last boundary: the fast path adds step times left to
        # right, as the step path's successive timeouts do. Nothing can cut a
        # run that ends before the next event.
        if not advance_in_place(self.env, times[flight.num_steps]):
            self._in_flight = flight
            while True:
                try:
                    yield AtTime(self.env, times[flight.num_steps])
                    break
                except simpy.Interrupt:
                    pass                             # cut by a submit: wait for the new end
            self._in_flight = None
        k = flight.num_steps
        if k == 0:
            return                                   # cut before its first step began
        self._inbox.step_started(times[k - 1])
        finished = self.scheduler.apply_decode_run(run, k, times[1:k + 1])
        if run.chunk and self.queue_limits is not None:
            # A chunk run's request that got its first token leaves the prefill backlog.
            self.queue_limits.outputs(((run.requests[-1], run.chunk, 0),))
        self._record_run(flight, finished)
        if run.chunk and run.num_seqs == 1 and k != run.chunk_end_step:
            self._steps_without_output += k            # a lone prompt's chunks make no token
        else:
            self._steps_without_output = 0             # every decode made one
        self._finish(finished)

    def _cut_run(self) -> None:
        """A request was submitted mid-run: keep the steps that already started
        (and, with async scheduling, the one already scheduled after them)."""
        flight = self._in_flight
        keep = bisect_left(flight.times, self.env.now, 0, flight.num_steps) + self.async_scheduling
        if keep < flight.num_steps:
            flight.num_steps = keep
            self._process.interrupt()

    def _sync_run(self) -> None:
        """Blocks and caching of the run steps started so far, as the step path has them."""
        flight = self._in_flight
        if flight is not None:
            started = bisect_left(flight.times, self.env.now, 0, flight.num_steps)
            self.scheduler.sync_decode_run(flight.run, started)

    def _finish(self, finished: list[Request]) -> None:
        for req in finished:
            self._on_done(req)
        # vLLM runs one more (possibly empty) step after requests finish, to
        # report them, before an idle engine sleeps (Scheduler.has_requests
        # counts finished ids not yet reported).
        self._reported_finished = bool(finished)
        if self.sink is not None and len(self.steps) >= self.flush_every:
            self._flush_steps()
        elif len(self.steps) >= self._watch_at:
            self._watch_at = self.watch_steps(self.steps)

    def _stuck(self, plan) -> bool:
        """An empty step after which nothing can change: nothing runs and the waiting head
        could not start. Not after a step that preempted: it admits nothing (S3), but
        the next step sees the blocks it freed (a P/D decode replica whose only running
        request was preempted for a loaded request's blocks runs that one next)."""
        return not plan.preempted and not self._progress_possible()

    def _progress_possible(self) -> bool:
        running, waiting = self.scheduler.get_request_counts()
        return running > 0 or waiting == 0

    def _break_livelock(self, preempted: list[Request]) -> None:
        """No request sampled a token in ``LIVELOCK_STEPS`` steps and this step
        preempted again: fail the requests it preempted (out of the waiting
        queue), so the others can run. Never before that many steps, so the
        step path and the fast path (whose runs never preempt) fail the same
        requests at the same step."""
        n = self._steps_without_output
        for req in preempted:
            if not self.scheduler.drop_waiting(req):
                continue
            req.status = RequestStatus.FAILED
            req.fail_reason = (
                f"livelock: no request generated a token in {n:,} steps while requests "
                f"preempted one another ({req.request_id} {req.num_preemptions:,} times); vLLM "
                f"0.33 loops here forever (e.g. scheduler_reserve_full_isl: false admits a "
                f"request whose whole sequence does not fit), kvsim fails the preempted request")
            req.finish_time = self.env.now
            self._on_done(req)
        self._steps_without_output = 0

    def _fail_unschedulable(self) -> None:
        """Nothing runs and the waiting head cannot start: fail it, never hang."""
        req = self.scheduler.pop_unschedulable()
        if req is None:
            return
        req.status = RequestStatus.FAILED
        req.fail_reason = req.fail_reason or "cannot be scheduled even with the whole KV cache free"
        req.finish_time = self.env.now
        self._on_done(req)
