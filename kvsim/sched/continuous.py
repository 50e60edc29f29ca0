"""``continuous``: prefill-first iteration-level batching (vLLM V0, Orca).

A step is either prefill-only or decode-only (kv-semantics V1): when any
waiting request can be admitted, the step runs only prefills, and every
running request waits; otherwise the step decodes every running request,
then swaps requests back in. Admission is gated by a watermark and ignores
prefix hits (V2); decode feasibility is worst-case, one free block per
request (V3); preemption takes the last running request, by recompute or by
swapping its blocks to a CPU pool (V4). Swapped requests come back before new
ones are admitted.

The block pool is the same as ``chunked``'s (V1); V0's own evictor (hashless
blocks first, then LRU by last access) may pick other victims among cached
free blocks, which changes prefix hits but never capacity.
"""

from __future__ import annotations

from collections import deque

from kvsim.sched.base import DecodeRun, StepPlan, commit_scheduled, record_admission, sample_tokens
from kvsim.sched.config import SchedulerConfig
from kvsim.sched.errors import EngineError
from kvsim.sched.paged import PagedScheduler
from kvsim.sched.queues import FcfsQueue
from kvsim.sched.request import Request, RequestStatus

class ContinuousScheduler(PagedScheduler):
    """vLLM V0's default (non-chunked) scheduler."""

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.waiting = FcfsQueue()
        self.swapped: deque[Request] = deque()
        self.num_free_cpu_blocks = config.num_cpu_blocks
        self._cpu_blocks: dict[str, int] = {}
        # V2: the watermark is a fraction of all GPU blocks.
        self.watermark_blocks = int(config.watermark * config.num_gpu_blocks)

    # ------------------------------------------------------------ protocol

    def has_requests(self) -> bool:
        return bool(self.running or self.swapped or len(self.waiting))

    def get_request_counts(self) -> tuple[int, int]:
        return len(self.running), len(self.waiting) + len(self.swapped)

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        if not self.swapped:
            self._schedule_prefills(plan)
        if not plan.scheduled:
            # V1: no prefill this step -> decode everything, then swap in.
            self._schedule_decodes(plan)
            if not plan.preempted:
                self._schedule_swap_ins(plan)
        commit_scheduled(plan)
        return plan

    def update_from_output(self, plan: StepPlan, now: float) -> list[Request]:
        return self.finish_requests(sample_tokens(plan, now), now)

    def pop_unschedulable(self) -> Request | None:
        if len(self.waiting):
            return self.waiting.pop()
        return self.swapped.popleft() if self.swapped else None

    def stats(self) -> dict[str, float]:
        return {"num_free_cpu_blocks": self.num_free_cpu_blocks}

    # ---------------------------------------------------------- decode runs

    def plan_decode_run(self) -> DecodeRun | None:
        """The decode-only steps that would go exactly the same way through ``schedule()``.

        No step of the run may admit a prefill or swap a request in, and
        neither may become possible during it: admission waits for free
        blocks above the watermark (V2, "later"), swap-in likewise, and free
        blocks only shrink while the batch decodes. A head that would be
        admitted or ignored now ends the run before it starts. Decodes
        preempt as soon as no block is free at a request's turn (V3), so the
        run stops before that step.
        """
        cfg = self.config
        if self.swapped:
            if len(self.running) < cfg.max_num_seqs and self._can_swap_in(self.swapped[0]):
                return None
        elif len(self.waiting) and len(self.running) < cfg.max_num_seqs:
            head = self.waiting.peek()
            if head.num_tokens > min(cfg.max_model_len, cfg.max_num_batched_tokens):
                return None                       # ignored in the next step
            if self._can_allocate(head) != "later":
                return None                       # admitted (its tokens fit the budget) or ignored
        batch = self._decoding_batch()
        if batch is None:
            return None
        return self._make_run(*batch, _steps_with_a_free_block_each)

    # ------------------------------------------------------------ prefills

    def _can_allocate(self, req: Request) -> str:
        """V2: "ok", "later" or "never", ignoring prefix hits."""
        required = self.kv.num_blocks_for(req.num_tokens)
        usable = self.kv.num_usable_blocks
        if usable - required < self.watermark_blocks:
            return "never"
        if self.kv.get_num_free_blocks() - required >= self.watermark_blocks:
            return "ok"
        return "later"

    def _schedule_prefills(self, plan: StepPlan) -> None:
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        prompt_limit = min(cfg.max_model_len, cfg.max_num_batched_tokens)
        while len(self.waiting) and len(self.running) < cfg.max_num_seqs:
            req = self.waiting.peek()
            if req.num_tokens > prompt_limit:
                # V0 ignores a prompt that can never fit the batch.
                self._ignore(plan, req, f"{req.num_tokens} tokens exceed the prompt limit "
                                  f"min(max_model_len, max_num_batched_tokens) = {prompt_limit}")
                continue
            verdict = self._can_allocate(req)
            if verdict == "never":
                self._ignore(plan, req, "needs more blocks than the cache holds above the watermark")
                continue
            if verdict == "later":
                break
            hits, num_hit = self.kv.get_computed_blocks(req)
            n = req.num_tokens - num_hit
            if n > budget:
                break
            self.kv.allocate_slots(req, n, num_hit, hits)
            self.waiting.pop()
            self.running.append(req)
            record_admission(plan, req, num_hit, n)
            budget -= n

    def _ignore(self, plan: StepPlan, req: Request, reason: str) -> None:
        self.waiting.pop()
        req.status = RequestStatus.FAILED
        req.fail_reason = reason
        plan.failed.append(req)

    # ------------------------------------------------------------- decodes

    def _schedule_decodes(self, plan: StepPlan) -> None:
        """V3: a decode needs one free block, worst case; else preempt the last."""
        kv = self.kv
        queue = deque(self.running)
        kept: list[Request] = []
        while queue:
            req = queue.popleft()
            while kv.get_num_free_blocks() < self.blocks_touched(req):
                victim = queue.pop() if queue else req
                self._preempt(victim, plan)
                if victim is req:
                    break
            if req.status is not RequestStatus.RUNNING:
                continue
            kv.allocate_slots(req, 1, num_lookahead_tokens=self.num_lookahead_slots)
            kept.append(req)
            plan.scheduled.append((req, 1, req.num_computed_tokens))
        self.running = kept

    # vLLM 0.6 multi-step (kvsim.sched.multistep) reserves slots for a whole
    # window of decode steps; one step needs no lookahead and touches one block.
    num_lookahead_slots = 0

    def blocks_touched(self, req: Request) -> int:
        """V3: free blocks a decode needs at its turn, worst case (``can_append_slots``)."""
        return 1

    def _preempt(self, req: Request, plan: StepPlan) -> None:
        plan.preempted.append(req)
        req.num_preemptions += 1
        held = len(self.kv.get_blocks(req.request_id))
        if self.config.preemption_mode == "swap":
            if held > self.num_free_cpu_blocks:
                raise EngineError(
                    f"swap space exhausted: request {req.request_id} needs {held} CPU blocks, "
                    f"{self.num_free_cpu_blocks} free (raise engine.swap_space)")
            self.num_free_cpu_blocks -= held
            self._cpu_blocks[req.request_id] = held
            plan.swap_bytes += held * self.config.swap_block_bytes
            self.kv.free(req)
            req.status = RequestStatus.SWAPPED
            self.swapped.append(req)
            return
        self.kv.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        self.waiting.prepend(req)

    def _can_swap_in(self, req: Request) -> bool:
        """Swap-in must leave the watermark free, plus one block to decode."""
        blocks = self._cpu_blocks[req.request_id]
        return self.kv.get_num_free_blocks() - blocks - 1 >= self.watermark_blocks

    def _schedule_swap_ins(self, plan: StepPlan) -> None:
        kv = self.kv
        while self.swapped and len(self.running) < self.config.max_num_seqs:
            req = self.swapped[0]
            blocks = self._cpu_blocks[req.request_id]
            if not self._can_swap_in(req):
                break
            self.swapped.popleft()
            computed = req.num_computed_tokens
            req.num_computed_tokens = 0
            kv.allocate_slots(req, computed)
            req.num_computed_tokens = computed
            self.num_free_cpu_blocks += self._cpu_blocks.pop(req.request_id)
            plan.swap_bytes += blocks * self.config.swap_block_bytes
            req.status = RequestStatus.RUNNING
            kv.allocate_slots(req, 1)
            self.running.append(req)
            plan.scheduled.append((req, 1, computed))


def _steps_with_a_free_block_each(nth_allocation, num_free: int, num_seqs: int,
                                  max_steps: int) -> int:
    """V3: every decode needs a free block at its turn, whether it takes one or not.

    The pop that empties the pool ends the run: after that step when it was
    the last request's, before it otherwise (the next request would preempt).
    """
    if num_free == 0:
        return 0
    last = nth_allocation(num_free)
    if last is None:
        return max_steps
    step, index = last
    return min(max_steps, step if index == num_seqs - 1 else step - 1)
