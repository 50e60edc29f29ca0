"""Decode runs of the ``chunked`` scheduler: how many decode steps would go exactly
as ``schedule()`` takes them (the skip-ahead's question, issue #12).

A mixin of :class:`~kvsim.sched.chunked.ChunkedScheduler`, split out by
concern: every rule it applies is the step path's own (``new_budget``,
``try_admission``, the cadence, the KV manager's decode-run methods), asked
ahead of time; nothing here allocates or changes state except through
``PagedScheduler.apply_decode_run``.
"""

from __future__ import annotations

from kvsim.sched.base import DecodeRun, StepPlan
from kvsim.sched.budget import StepBudget
from kvsim.sched.request import Request


class ChunkedDecodeRuns:
    """``plan_decode_run`` / ``apply_decode_run`` for ``ChunkedScheduler``."""

    def plan_decode_run(self) -> DecodeRun | None:
        """The decode steps that would go exactly the same way through ``schedule()``.

        Every running request decodes (S2 gives each one token: the budget
        covers the batch, and the threshold and max_model_len cut nothing
        below a finish), the run ends with the first finish, no step may need
        a block that is not free (it would preempt, P1), and the waiting
        queue must stay shut for the whole run (``_steps_waiting_stays_shut``).
        """
        if self._drafts is not None:
            return None          # accepted drafts vary step by step: no run is exact
        batch = self._decoding_batch()
        budget = self.new_budget()
        if batch is None or len(self.running) > budget.room:
            return None
        if self.cadence.blocks_run(self.running):
            return None
        max_steps, context_sum, computed = batch
        self.refresh_threshold()
        max_steps = min(max_steps, self._steps_waiting_stays_shut(max_steps, computed, budget))
        return self._make_run(max_steps, context_sum, computed, _steps_before_a_block_runs_out)

    def _steps_waiting_stays_shut(self, max_steps: int, computed: list[int], budget: StepBudget) -> int:
        """How many of the next decode steps certainly admit nothing (S3, S4).

        Nothing is admitted while the queue is empty, ``max_num_active_seqs``
        is reached or the decodes use the whole budget. Otherwise the head must
        not fit now (or the steps hold prefill back, sched/cadence.py),
        and it still will not during the run: free blocks only
        shrink, and with ``scheduler_reserve_full_isl`` losing a prefix hit
        to eviction never lowers the blocks its whole sequence needs (a hit
        in the free queue costs one free block, as a new block does). What
        can open it is a running request caching the very block the head
        misses next (A4, at schedule time, before the waiting queue is
        served): the run stops before that step.
        """
        cfg = self.config
        budget.take(len(self.running))           # one token per decode (``budget``: a fresh step's)
        shut = len(self.running) >= self.max_num_active_reqs or not budget.open
        if self.transfers is not None and not shut and self.transfers.may_change():
            return 0                              # a request whose KV arrived may start
        if not len(self.waiting) or shut:
            return max_steps
        if self.transfers is not None:
            return 0                              # its external hit may change: step
        head = self.waiting.peek()
        admission = self.try_admission(head, budget.room)  # no connector here: never SKIP
        if admission is not None:                          # admitted now, unless the step holds it
            return self.cadence.steps_head_stays_held(head, admission[1], max_steps, self.kv,
                                                      self.running)
        # The hybrid KV manager frees blocks during a run, so free blocks do not
        # only shrink: it says itself how long the head stays blocked (None:
        # the single-group manager, whose case the rest of this method covers).
        limit = self.kv.decode_run_head_limit(head, self.running, max_steps)
        if limit is not None:
            return limit
        if not self.kv.enable_caching or head.num_computed_tokens:
            return max_steps
        hits, _ = self.kv.get_computed_blocks(head)
        if not cfg.scheduler_reserve_full_isl and self.kv.has_evictable_hits(hits):
            # Without the whole-sequence gate, a chunk capped by the budget can
            # need fewer blocks once an evicted hit shortens the prefix: step.
            return 0
        j = len(hits)
        if j >= (head.num_tokens - 1) // self.kv.block_size:
            return max_steps                     # the longest hit H3 allows
        if not self.kv.caches_at_schedule_time:
            # A cache that inserts after the step (radix, SGLang G3) takes decode
            # tokens in only at finish: no hit grows during a decode run.
            return max_steps
        first = self.kv.first_step_caching(self.running, computed, head.block_hashes[j], max_steps)
        return max_steps if first is None else first - 1

    def _schedule_decodes_at_once(self, plan: StepPlan, budget: StepBudget) -> int:
        """S2 for the leading plain decodes of the running batch in one KV call,
        when nothing can differ from ``_schedule_running``'s loop over them:
        each decodes one token (``_leading_decodes``), the budget covers them,
        and every block they need is free (no preemption), so the loop would
        give each one token and call ``allocate_slots(req, 1)`` on each, in
        order -- which is what ``kv.allocate_decode_step`` does.
        The loop goes on from the first request after them (a prefill chunk,
        usually the newest). The engine turns this on with its fast path
        only (``decodes_at_once``), so the step-by-step path stays the plain
        reference. Returns how many requests it scheduled (0: none).
        """
        if (not self.decodes_at_once or self._drafts is not None or self._lookahead
                or self.cadence.on or self._finishing or self.transfers is not None
                or self.kv.aligns_chunks):
            return 0
        computed = self._leading_decodes()
        k = len(computed)
        if not k or k > budget.room:
            return 0
        reqs = self.running if k == len(self.running) else self.running[:k]
        if not self.kv.allocate_decode_step(reqs, computed):
            return 0
        plan.scheduled += [(r, 1, c) for r, c in zip(reqs, computed)]
        budget.take(k)
        return k

    def apply_decode_run(self, run: DecodeRun, num_steps: int, token_times: list[float]) -> list[Request]:
        """The run's steps, and their prefill cadence counters (sched/cadence.py)."""
        finished = super().apply_decode_run(run, num_steps, token_times)
        self.cadence.after_run(num_steps, len(self.waiting))
        return finished


def _steps_before_a_block_runs_out(nth_allocation, num_free: int, num_seqs: int,
                                   max_steps: int) -> int:
    """A2/P1: the run stops before the step whose allocation would not fit."""
    beyond = nth_allocation(num_free + 1)
    return max_steps if beyond is None else min(max_steps, beyond[0] - 1)
