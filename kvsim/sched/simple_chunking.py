"""``simple_chunking``: Sarathi-Serve's chunked prefill that never mixes prefills with decodes.

The baseline of the Sarathi-Serve paper (Agrawal et al., OSDI'24, sec. 5:
chunked prefill without stall-free batching), as its artifact implements it
(``sarathi/core/scheduler/simple_chunking_scheduler.py``,
``SimpleChunkingScheduler._schedule``, with ``VLLMBlockSpaceManager``). Turns
alternate, and a step holds either prefill chunks or decodes, never both:

* **prefill turn**: running requests whose prompt is not done get chunks, in
  running order, out of ``max_num_batched_tokens`` (Sarathi's
  ``chunk_size``); only if none did, waiting requests are admitted the same
  way while their whole prompt's blocks fit above the watermark and
  ``max_num_seqs`` is not reached. A step that scheduled a chunk makes the
  next turn a decode turn. With nothing to prefill, the turn decodes.
* **decode turn**: every running request whose prompt is done decodes one
  token; a decode that finds no free block preempts the last running request
  (recompute: back to the front of the queue), or itself when it is the
  last. The next turn prefills.

Sarathi sorts the running requests by arrival time before every step (FCFS
``sort_by_priority``), so a recomputed request takes its old place. There is
no prefix cache, so kvsim runs this scheduler with caching off. A turn that
finds nothing to do returns an empty batch, which Sarathi's engine skips at no
cost (``BaseLLMEngine.step``); here the other turn runs in the same step.

Blocks: a request's whole prompt (its whole sequence, after a preemption) is
allocated when it is admitted (``BaseBlockSpaceManager.allocate``), each
decode takes a block at a block boundary. That artifact's ``append_slot``
reserves a slot for one token past the sequence; kvsim's KV manager holds
exactly the computed tokens plus the one being written (A1), as vLLM does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from kvsim.sched.base import DecodeRun, StepPlan, commit_scheduled, record_admission, sample_tokens
from kvsim.sched.config import SchedulerConfig
from kvsim.sched.continuous import _steps_with_a_free_block_each
from kvsim.sched.paged import PagedScheduler
from kvsim.sched.queues import FcfsQueue
from kvsim.sched.request import Request, RequestStatus

PREFILL, DECODE = "prefill", "decode"


class SimpleChunkingScheduler(PagedScheduler):
    """Sarathi-Serve's ``SimpleChunkingScheduler`` (no prefix caching, recompute preemption)."""

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(replace(config, enable_prefix_caching=False))   # Sarathi has no prefix cache
        self.waiting = FcfsQueue()
        self.whose_turn = PREFILL
        # sarathi BaseBlockSpaceManager: watermark = 0.01 of the blocks by default.
        self.watermark_blocks = int(config.watermark * config.num_gpu_blocks)
        # Tokens a request prefills since its (re)admission (Sarathi's prompt,
        # the whole sequence after a recompute preemption).
        self._prefill_end: dict[str, int] = {}

    # ------------------------------------------------------------ protocol

    def pop_unschedulable(self) -> Request | None:
        return self.waiting.pop() if len(self.waiting) else None

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        # A turn that schedules nothing returns an empty batch, which Sarathi's
        # engine skips at no cost (BaseLLMEngine.step): the next turn follows at once.
        for _ in range(2):
            self._sort_running()
            if self.whose_turn == PREFILL:
                self._schedule_prefills(plan)
                if plan.scheduled:
                    self.whose_turn = DECODE
                    break
            self._schedule_decodes(plan)
            self.whose_turn = PREFILL
            if plan.scheduled:
                break
        commit_scheduled(plan)
        return plan

    def update_from_output(self, plan: StepPlan, now: float) -> list[Request]:
        finished = sample_tokens(plan, now)
        for req in finished:
            self._prefill_end.pop(req.request_id, None)
        return self.finish_requests(finished, now)

    # ---------------------------------------------------------- decode runs

    def plan_decode_run(self) -> DecodeRun | None:
        """Decode steps that go the same way through ``schedule()``.

        Every running request has finished its prompt and decodes, and the
        waiting head cannot be admitted now: then no prefill turn finds work
        (free blocks only shrink while the batch decodes, and the run ends at
        the first finish), so every step decodes the whole batch. Decodes
        preempt when no block is free at a request's turn, as in V0 (V3).
        """
        if len(self.waiting) and self._can_admit(self.waiting.peek()):
            return None
        self._sort_running()
        if any(not self._prefill_done(r) for r in self.running):
            return None
        batch = self._decoding_batch()
        if batch is None:
            return None
        return self._make_run(*batch, _steps_with_a_free_block_each)

    def apply_decode_run(self, run: DecodeRun, num_steps: int,
                         token_times: Sequence[float]) -> list[Request]:
        finished = super().apply_decode_run(run, num_steps, token_times)
        for req in finished:
            self._prefill_end.pop(req.request_id, None)
        self.whose_turn = PREFILL                # every decode step hands the turn back
        return finished

    # ------------------------------------------------------------ prefills

    def _sort_running(self) -> None:
        # sarathi/core/policy.py FCFS.sort_by_priority: by arrival time (sorted() is stable).
        self.running.sort(key=lambda r: r.arrival_time)

    def _prefill_done(self, req: Request) -> bool:
        return req.num_computed_tokens >= self._prefill_end[req.request_id]

    def _schedule_prefills(self, plan: StepPlan) -> None:
        """The prefill turn: running prompts first; new admissions only if none."""
        budget = self.config.max_num_batched_tokens
        for req in self.running:
            if self._prefill_done(req):
                continue
            n = min(self._prefill_end[req.request_id] - req.num_computed_tokens, budget)
            if n <= 0:
                continue
            plan.scheduled.append((req, n, req.num_computed_tokens))
            budget -= n
        if plan.scheduled:
            return
        while len(self.waiting) and budget > 0:
            req = self.waiting.peek()
            if not self._can_admit(req):
                break
            n = min(req.num_tokens, budget)
            self.waiting.pop()
            # Sarathi allocates the blocks of the whole prompt at admission.
            self.kv.allocate_slots(req, req.num_tokens)
            self._prefill_end[req.request_id] = req.num_tokens
            self.running.append(req)
            record_admission(plan, req, 0, n)
            budget -= n

    def _can_admit(self, req: Request) -> bool:
        """``BaseBlockSpaceManager.can_allocate``: the blocks of the whole prompt
        leave the watermark free; then ``max_num_seqs`` must not be reached."""
        need = self.kv.num_blocks_for(req.num_tokens)
        if self.kv.get_num_free_blocks() - need < self.watermark_blocks:
            return False
        return len(self.running) + 1 <= self.config.max_num_seqs

    # ------------------------------------------------------------- decodes

    def _schedule_decodes(self, plan: StepPlan) -> None:
        """The decode turn: one token per finished prompt; no free block -> preempt the last."""
        kv = self.kv
        queue = list(self.running)
        kept: list[Request] = []
        while queue:
            req = queue.pop(0)
            if not self._prefill_done(req):
                kept.append(req)
                continue
            while kv.get_num_free_blocks() < 1:         # can_append_slot
                victim = queue.pop() if queue else req
                self._preempt(victim, plan)
                if victim is req:
                    break
            if req.status is not RequestStatus.RUNNING:
                continue
            kv.allocate_slots(req, 1)
            kept.append(req)
            plan.scheduled.append((req, 1, req.num_computed_tokens))
        self.running = kept

    def _preempt(self, req: Request, plan: StepPlan) -> None:
        """Recompute preemption: free everything, back to the front of the queue."""
        self.kv.free(req)
        self._prefill_end.pop(req.request_id, None)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.waiting.prepend(req)
        plan.preempted.append(req)
