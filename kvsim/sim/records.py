"""What an engine records: finished requests and step rows (``Engine``'s records,
split out of ``engine.py`` by concern), and ``EngineStats``.

Records change nothing the scheduler sees: a step row is read from the
scheduler's accessors after the step, a decode run's rows from the run's
precomputed free-block counts (``DecodeRun.free_after``), so the step path
and the run path write the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.sched.base import StepPlan
from kvsim.sched.request import Request, RequestStatus
from kvsim.sim.client import stream_interval_times
from kvsim.sim.steplog import StepLog


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


class EngineRecords:
    """``Engine``'s record keeping (a mixin: it reads the engine's attributes)."""

    def _on_done(self, req: Request) -> None:
        # A done request never touches the KV cache again: drop its token ids
        # and hashes (the bulk of its memory); its timings stay for the tables.
        req.all_token_ids = req.block_hashes = None
        if self.stream_interval > 1 and req.status is not RequestStatus.FAILED:
            # The times the client sees (first and last token are never held back).
            req.token_times = stream_interval_times(req.token_times, self.stream_interval)
        if self.queue_limits is not None:
            self.queue_limits.done(req)
        self.done.append(req)
        self.num_done += 1
        if self.sink is not None and len(self.done) >= self.flush_every:
            self.sink.add_done(self.done)
            self.done = []
        if self.on_done is not None:
            self.on_done(req)

    def _record(self, plan: StepPlan, finished: list[Request], start: float, duration: float) -> None:
        sched = self.scheduler
        prefill = decode = 0
        drafts = plan.scheduled_drafts
        for req, n, ctx in plan.scheduled:
            # A one-token step of a request past its prompt is a decode (with its drafts).
            if ctx >= req.prompt_len and (n == 1 if not drafts
                                          else n - drafts.get(req.request_id, 0) == 1):
                decode += 1
            else:
                prefill += n
        running, waiting = sched.get_request_counts()
        free = sched.num_free_blocks()
        self.steps.append(
            self.steps.next_step, start, duration, prefill, decode, len(plan.scheduled),
            running, waiting, len(plan.preempted), len(finished), free, sched.kv_cache_usage(),
            plan.num_sampled if plan.num_generated_tokens < 0 else plan.num_generated_tokens)
        if self.trace is not None:
            self.trace({
                "step": self.steps.next_step - 1,
                "start_time": start,
                "scheduled": {r.request_id: n for r, n, _ in plan.scheduled},
                "preempted": [r.request_id for r in plan.preempted],
                "finished": [r.request_id for r in finished],
                "num_free_blocks": free,
                "num_running": running,
                "num_waiting": waiting,
                "prefix_hit_tokens": dict(plan.prefix_hit_tokens),
                "resume_hit_tokens": dict(plan.resume_hit_tokens),
            })

    def _record_run(self, flight, finished: list[Request]) -> None:
        sched = self.scheduler
        k = flight.num_steps
        run = flight.run
        b = run.num_seqs
        waiting = sched.get_request_counts()[1]
        first = self.steps.next_step
        free = run.free_after[:k]
        free[-1] = sched.num_free_blocks()               # after the finished were freed
        # A chunk run that reached its request's last chunk: that step's chunk and sample.
        last_chunk = run.chunk_tokens(k) if run.chunk and k == run.chunk_end_step else 0
        self.steps.add_run(flight.times[:k], flight.durations[:k], free, b, waiting, len(finished),
                           sched.num_usable_blocks, run.chunk, last_chunk)
        self.num_run_steps += k
        self.num_runs += 1
        if self.trace is not None:
            scheduled = dict.fromkeys((r.request_id for r in run.requests), 1)
            if run.chunk:
                scheduled[run.requests[-1].request_id] = run.chunk
            for j in range(k):
                last = j == k - 1
                if last and last_chunk:
                    scheduled[run.requests[-1].request_id] = last_chunk
                self.trace({"step": first + j, "start_time": float(flight.times[j]),
                            "scheduled": dict(scheduled), "preempted": [],
                            "finished": [r.request_id for r in finished] if last else [],
                            "num_free_blocks": int(free[j]),
                            "num_running": b - len(finished) if last else b,
                            "num_waiting": waiting, "prefix_hit_tokens": {},
                            "resume_hit_tokens": {}})

    def _flush_steps(self) -> None:
        self.sink.add_steps(self.steps.columns)
        self.steps = StepLog(first_step=self.steps.next_step)
