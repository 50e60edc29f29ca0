"""Decode runs of the ``chunked`` scheduler: how many decode steps would go exactly
as ``schedule()`` takes them (the skip-ahead's question, issue #12).

A mixin of :class:`~kvsim.sched.chunked.ChunkedScheduler`, split out by
concern: every rule it applies is the step path's own (``new_budget``,
``try_admission``, the cadence, the KV manager's decode-run methods), asked
ahead of time; nothing here allocates or changes state except through
``PagedScheduler.apply_decode_run``.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvsim.sched.base import DecodeRun, StepPlan
from kvsim.sched.budget import StepBudget
from kvsim.sched.request import Request, RequestStatus


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
        if batch is None:
            return self._plan_chunk_run()
        budget = self.new_budget()
        if len(self.running) > budget.room:
            return None
        if self.cadence.blocks_run(self.running):
            return None
        max_steps, context_sum, computed = batch
        self.refresh_threshold()
        max_steps = min(max_steps, self._steps_waiting_stays_shut(max_steps, computed, budget))
        return self._make_run(max_steps, context_sum, computed, _steps_before_a_block_runs_out)

    def _plan_chunk_run(self) -> DecodeRun | None:
        """A chunk run: the steps in which the newest running request's prompt
        goes on in chunks while every other one decodes, as ``schedule()``
        takes them.

        S2 gives each decode its token (the leading ones, in one KV call on
        the fast path), then the chunked request ``chunk`` tokens: what the
        budget leaves, the same every step while the batch is unchanged,
        and the rest of its prompt in the last of its chunks, in which it
        samples its first token. The run ends with that step (the batch
        changes after it) or before it if the waiting queue is not empty
        (its budget may admit), with the first decode that finishes, and
        before a step whose blocks are not all free (it would preempt, P1).
        Nothing is admitted meanwhile: a full chunk spends the budget, or the
        queue is empty (an arrival ends the run, as it ends a decode run).
        A long-prefill threshold cuts every chunk alike (the requests in the
        system do not change during the run). Only where every step is
        otherwise plain: no lookahead, cadence, KV connector, async
        scheduling or Mamba alignment, and the single-group KV manager.
        """
        running = self.running
        if (len(running) < 1 or self._lookahead or self.cadence.on or self.transfers is not None
                or self.config.async_scheduling or self._finishing or self.kv.aligns_chunks
                or not getattr(self.kv, "chunk_runs", False)):
            return None
        req = running[-1]
        computed = self._leading_decodes()
        d = len(computed)
        num_tokens = req.prompt_len + req.num_output_tokens
        pending = num_tokens - req.num_computed_tokens
        if (d != len(running) - 1 or req.status is not RequestStatus.RUNNING or pending < 2
                or num_tokens >= self.config.max_model_len):
            return None            # (below max_model_len its cap never cuts a chunk of the run)
        self.refresh_threshold()                # constant in the run: nothing arrives or leaves
        budget = self.new_budget()
        if d > budget.room:
            return None
        budget.take(d)
        chunk = self.running_chunk(req, min(budget.tokens, budget.room))   # the threshold's cut too
        if chunk < 2:
            return None            # a one-token chunk reads as a decode in the step table
        budget.take(chunk)
        waiting = len(self.waiting)
        if budget.open and waiting and len(running) < self.max_num_active_reqs:
            return None            # budget left to admit the waiting head: step
        max_steps = (pending - 1) // chunk      # steps whose chunk stops short of the prompt's end
        last = pending - max_steps * chunk      # the tokens of the one that reaches it
        if not waiting and (last > 1 or req.num_computed_tokens + max_steps * chunk < req.prompt_len):
            max_steps += 1                      # that step too: nothing waits for its budget
        if max_steps < 1:
            return None
        if d:
            max_steps = min(max_steps, min(r.final_num_tokens - r.prompt_len - r.num_output_tokens
                                           for r in running[:d]))
        decodes = running[:d]
        first = self.kv.decode_run_first_allocations(decodes, computed)
        if first is None:
            return None
        computed.append(req.num_computed_tokens)
        k = self.kv.chunk_run_steps_that_fit(running, computed, first, chunk, pending, max_steps)
        if k < 1:
            return None
        return DecodeRun(num_seqs=len(running), context_token_sum=sum(computed), max_steps=k,
                         requests=list(running), num_computed=computed, first_allocations=first,
                         num_free_blocks=self.kv.get_num_free_blocks(), chunk=chunk,
                         chunk_left=pending)

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

    def apply_decode_run(self, run: DecodeRun, num_steps: int, token_times: Sequence[float]) -> list[Request]:
        """The run's steps, and their prefill cadence counters (sched/cadence.py)."""
        finished = super().apply_decode_run(run, num_steps, token_times)
        self.cadence.after_run(num_steps, len(self.waiting))
        return finished


def _steps_before_a_block_runs_out(nth_allocation, num_free: int, num_seqs: int,
                                   max_steps: int) -> int:
    """A2/P1: the run stops before the step whose allocation would not fit."""
    beyond = nth_allocation(num_free + 1)
    return max_steps if beyond is None else min(max_steps, beyond[0] - 1)
