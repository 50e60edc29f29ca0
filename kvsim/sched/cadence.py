"""``prefill_schedule_interval``: vLLM 0.33's prefill cadence, for the chunked scheduler.

Without data parallelism vLLM applies the interval N itself
(``vllm/v1/core/sched/scheduler.py`` ``Scheduler.schedule``,
``local_prefill_interval``):

* a step *holds prefill back* when N > 1, ``prefill_capacity_bound`` is
  false, ``(num_executed_steps + 1) - last_prefill_step < N`` and some
  running request is not a prefill chunk (``Request.is_prefill_chunk``);
* a held step skips running prefill chunks and stops the waiting loop at
  the first request that still has prompt to compute
  (``num_computed_tokens < num_tokens - 1``: one whose prefix hit leaves only
  the last token is still admitted, as is an asynchronous KV load);
* ``num_executed_steps`` counts steps that scheduled a token;
  ``last_prefill_step`` is set to it after a step that ran a prefill chunk
  or admitted a request with prompt left; it starts at ``-N``, so the first
  step is never held;
* after the waiting loop of a step that did not hold (and did not preempt),
  ``prefill_capacity_bound = num_waiting > len(deferred_waiting)``: a step
  that could not drain the queue lifts the hold until one drains it.

``PrefillCadence`` keeps that state; the scheduler calls it at those points.
With N = 1 it never holds and keeps nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvsim.sched.request import Request


def admits_prompt(req: Request, num_computed: int) -> bool:
    """vLLM's ``num_computed_tokens < num_tokens - 1``: the admission computes prompt."""
    return num_computed < req.num_tokens - 1


class PrefillCadence:
    """The prefill cadence state of one chunked scheduler."""

    def __init__(self, interval: int) -> None:
        self.interval = interval
        self.on = interval > 1
        self.num_executed_steps = 0
        self.last_prefill_step = -interval
        self.capacity_bound = False
        # Running requests whose last chunk stopped short of their tokens
        # (vLLM ``is_prefill_chunk``); kept only when on.
        self.chunks: set[Request] = set()
        # Waiting requests a connector made the scheduler skip, until admitted
        # (vLLM ``deferred_waiting``, less the KV-holding ones, which are all in it).
        self.deferred: set[Request] = set()
        self.held = False          # this step holds prefill back
        self.carried = False       # this step ran a prefill chunk or admitted a prompt

    # ----------------------------------------------------------- one step

    def steps_held(self) -> int:
        """How many of the next steps hold prefill back, if each of them runs a decode."""
        if not self.on or self.capacity_bound:
            return 0
        return max(0, self.interval - 1 - (self.num_executed_steps - self.last_prefill_step))

    def start_step(self, running: Sequence[Request]) -> None:
        self.carried = False
        self.held = self.steps_held() > 0 and any(r not in self.chunks for r in running)

    def skips(self, req: Request) -> bool:
        """A running request this step skips: a prefill chunk on a held step."""
        return self.held and req in self.chunks

    def holds(self, req: Request, num_computed: int) -> bool:
        """The waiting loop stops at this request (it has prompt left, the step holds)."""
        return self.held and admits_prompt(req, num_computed)

    def admitted(self, req: Request, num_computed: int) -> None:
        self.deferred.discard(req)
        if self.on and admits_prompt(req, num_computed):
            self.carried = True

    def defer(self, req: Request) -> None:
        if self.on:
            self.deferred.add(req)

    def note_capacity_bound(self, num_waiting: int) -> None:
        """After the waiting loop: did a step that did not hold leave a request it
        could have tried? (``num_waiting`` without the KV-holding requests.)"""
        if self.on and not self.held:
            self.capacity_bound = num_waiting > len(self.deferred)

    def end_step(self, scheduled: Sequence[tuple[Request, int, int]]) -> None:
        """vLLM ``_update_after_schedule`` (is_prefill_chunk), then the counters."""
        if not self.on:
            return
        chunks = self.chunks
        for req, _, _ in scheduled:
            if req.num_computed_tokens < req.num_tokens:
                chunks.add(req)
            else:
                chunks.discard(req)
        if scheduled:
            self.num_executed_steps += 1
        if self.carried:
            self.last_prefill_step = self.num_executed_steps

    # -------------------------------------------------------- decode runs

    def blocks_run(self, running: Sequence[Request]) -> bool:
        """A running chunk that stopped one token short of its end looks like a
        decode, but a held step would skip it: no decode run then."""
        return bool(self.chunks) and any(r in self.chunks for r in running)

    def steps_head_stays_held(self, head: Request, num_hit: int, max_steps: int, kv,
                              running: Sequence[Request]) -> int:
        """The waiting head fits now: how many decode steps still admit nothing.

        Only steps that hold prefill back, and only while the head has prompt
        left: its hit grows only when a running request caches the block it
        misses next (A4, before the waiting loop), so the run stops before
        that step; eviction only shortens the hit.
        """
        steps = min(self.steps_held(), max_steps)
        if steps == 0 or not admits_prompt(head, num_hit):
            return 0
        j = num_hit // kv.block_size
        if not kv.enable_caching or head.num_computed_tokens or j >= (head.num_tokens - 1) // kv.block_size:
            return steps
        if not head.block_hashes:
            # The radix cache hashes no blocks, and nothing enters its tree during
            # decode steps (kv/radix_manager.py first_step_caching): the head's hit stays.
            return steps
        first = kv.first_step_caching(running, [r.num_computed_tokens for r in running],
                                      head.block_hashes[j], steps)
        return steps if first is None else first - 1

    def after_run(self, num_steps: int, num_waiting: int) -> None:
        """``num_steps`` decode steps ran: each one executed, none carried prefill,
        and every one that did not hold saw the waiting queue as it is now
        (nothing joins or leaves it during a run): the last one's view counts."""
        if not self.on:
            return
        self.held = num_steps <= self.steps_held()
        self.note_capacity_bound(num_waiting)
        self.num_executed_steps += num_steps
