"""``chunked``: vLLM V1's scheduler (decode-first, chunked prefill, token budget).

There is no prefill or decode phase (kv-semantics S1): every request wants
``num_tokens - num_computed_tokens`` tokens, and one step hands out at most
``max_num_batched_tokens`` of them — RUNNING requests first, in list order,
then WAITING ones, unless something was preempted in this step.

This is the reference path: it follows ``vllm/v1/core/sched/scheduler.py``
(0.33) rule by rule, and the golden traces of the real scheduler check it.
"""

from __future__ import annotations

from kvsim.sched.base import DecodeRun, StepPlan, commit_scheduled, record_admission, sample_tokens
from kvsim.sched.budget import StepBudget
from kvsim.sched.config import SchedulerConfig
from kvsim.sched.paged import PagedScheduler
from kvsim.sched.queues import make_waiting_queue
from kvsim.sched.request import Request, RequestStatus



class ChunkedScheduler(PagedScheduler):
    """vLLM V1 ``Scheduler`` in synchronous mode, with fake one-token outputs."""

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.waiting = make_waiting_queue(config.policy)
        # N2: vLLM sizes the watermark on all blocks, the null block included.
        self.watermark_blocks = int(config.watermark * config.num_gpu_blocks)
        # Async scheduling: requests whose last token was sampled in the step
        # before, still holding their blocks until the next schedule() is made.
        self._finishing: list[Request] = []
        # Speculative decoding (kvsim.sched.spec_decode): drafts, and the KV
        # slots reserved past the scheduled tokens for the drafter.
        spec = config.speculative
        self._drafts = None
        self._lookahead = 0
        if spec is not None:
            from kvsim.sched.spec_decode import Drafts
            self._drafts = Drafts(spec)
            self._lookahead = spec.num_lookahead_tokens

    # ------------------------------------------------------------ protocol

    def add_request(self, req: Request) -> None:
        self.waiting.add(req)

    def has_requests(self) -> bool:
        return bool(self.running) or bool(len(self.waiting))

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        self.refresh_threshold()
        budget = self._schedule_running(plan, self.new_budget())
        if not plan.preempted:
            # S3: a step that preempted admits nothing.
            self._schedule_waiting(plan, budget)
        commit_scheduled(plan)
        if self._drafts is not None:
            self._drafts.after_schedule(plan)
        if self._finishing:
            self._release_finishing()
        return plan

    def refresh_threshold(self) -> None:
        """N4: the threshold only stops a long prefill starving *other* requests;
        alone in the system, a request may use the whole budget."""
        num_in_system = len(self.running) + len(self.waiting)
        self._threshold = self.config.long_prefill_token_threshold if num_in_system > 1 else 0

    def new_budget(self) -> StepBudget:
        """This step's token and input budgets (kvsim.sched.budget)."""
        cfg = self.config
        slots = cfg.speculative.max_num_new_slots_for_drafting if cfg.speculative else 0
        return StepBudget(cfg.max_num_scheduled_tokens or cfg.max_num_batched_tokens,
                          cfg.max_num_batched_tokens, slots)

    def update_from_output(self, plan: StepPlan, now: float) -> list[Request]:
        """Every request whose chunk reached its last token samples one (S7)."""
        if self._drafts is not None:
            return self.finish_requests(self._verify(plan, now), now)
        return self.finish_requests(sample_tokens(plan, now), now)

    def finish_requests(self, finished: list[Request], now: float) -> list[Request]:
        if self.config.async_scheduling:
            return self._finish_after_next_schedule(finished, now)
        return super().finish_requests(finished, now)

    def get_request_counts(self) -> tuple[int, int]:
        # vLLM's stats come after the step's outputs, finished requests gone.
        return len(self.running) - len(self._finishing), len(self.waiting)

    def pop_unschedulable(self) -> Request | None:
        return self.waiting.pop() if len(self.waiting) else None

    # ---------------------------------------------------------- decode runs

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
        if batch is None or len(self.running) > self.new_budget().room:
            return None
        max_steps, context_sum = batch
        self.refresh_threshold()
        max_steps = min(max_steps, self._steps_waiting_stays_shut(max_steps))
        return self._make_run(max_steps, context_sum, _steps_before_a_block_runs_out)

    def _steps_waiting_stays_shut(self, max_steps: int) -> int:
        """How many of the next decode steps certainly admit nothing (S3, S4).

        Nothing is admitted while the queue is empty, ``max_num_seqs`` is
        reached or the decodes use the whole budget. Otherwise the head must
        not fit now, and it still will not during the run: free blocks only
        shrink, and with ``scheduler_reserve_full_isl`` losing a prefix hit
        to eviction never lowers the blocks its whole sequence needs (a hit
        in the free queue costs one free block, as a new block does). What
        can open it is a running request caching the very block the head
        misses next (A4, at schedule time, before the waiting queue is
        served): the run stops before that step.
        """
        cfg = self.config
        if not len(self.waiting):
            return max_steps
        budget = self.new_budget()
        budget.take(len(self.running))          # one token per decode
        if len(self.running) >= cfg.max_num_seqs or not budget.open:
            return max_steps
        head = self.waiting.peek()
        if self.try_admission(head, budget.room) is not None:
            return 0
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
        first = self.kv.first_step_caching(self.running, [r.num_computed_tokens for r in self.running],
                                           head.block_hashes[j], max_steps)
        return max_steps if first is None else first - 1

    # ------------------------------------------------------------- running

    def _schedule_running(self, plan: StepPlan, budget: StepBudget) -> StepBudget:
        """S2: give each running request its chunk, preempting when blocks run out."""
        cfg = self.config
        running, allocate, scheduled = self.running, self.kv.allocate_slots, plan.scheduled
        chunk, lookahead = self.running_chunk, self._lookahead
        scheduled_now: dict[str, int] = {}
        i = 0
        while i < len(running) and budget.open:
            req = running[i]
            computed = req.num_computed_tokens
            n = chunk(req, budget.room)
            if n <= 0:
                i += 1
                continue
            if allocate(req, n, num_lookahead_tokens=lookahead) is None:
                i, budget = self._preempt_for(req, n, i, budget, plan, scheduled_now)
                scheduled = plan.scheduled
                if req.status is RequestStatus.PREEMPTED:
                    if cfg.policy == "priority":
                        # P4 [new]: the victim left the list, so i already
                        # points at the next (higher-priority) request.
                        continue
                    break
            scheduled.append((req, n, computed))
            scheduled_now[req.request_id] = n
            budget.take(n)
            i += 1
        return budget

    def running_chunk(self, req: Request, budget: int) -> int:
        """S2: the tokens a running request gets this step (<= 0: none).

        What it still wants, cut to the long-prefill threshold and the budget;
        one slot stays free for the token this step samples.
        """
        if req.status is RequestStatus.FINISHED:
            return 0                 # async scheduling: its last token is in flight (see below)
        computed = req.num_computed_tokens
        n = req.prompt_len + req.num_output_tokens - computed      # num_tokens - computed
        if self._drafts is not None:
            n += self._drafts.num_drafts(req)       # num_tokens_with_spec - computed
        if 0 < self._threshold < n:
            n = self._threshold
        return min(n, budget, self.config.max_model_len - computed - 1)

    def _preempt_for(self, req: Request, n: int, i: int, budget: StepBudget, plan: StepPlan,
                      scheduled_now: dict[str, int]) -> tuple[int, StepBudget]:
        """P1: preempt victims until ``req``'s ``n`` slots fit, or ``req`` itself is the victim.

        Returns the updated running index and budget.
        """
        while True:
            victim = self._pick_victim()
            vi = self.running.index(victim)
            del self.running[vi]
            if vi < i:
                i -= 1
            if victim.request_id in scheduled_now:
                # [new] P1: roll the victim's entry and budget back.
                budget.give_back(scheduled_now.pop(victim.request_id))
                plan.scheduled = [e for e in plan.scheduled if e[0] is not victim]
            self._preempt(victim, plan)
            if victim is req:
                return i, budget
            if self.kv.allocate_slots(req, n, num_lookahead_tokens=self._lookahead) is not None:
                return i, budget

    def _pick_victim(self) -> Request:
        """P1: FCFS takes the last running request; priority the worst one.

        ``max`` keeps the first of equal keys, so ties go to the earliest in
        the running list, as in vLLM.
        """
        if self.config.policy == "priority":
            return max(self.running, key=lambda r: (r.priority, r.arrival_time))
        return self.running[-1]

    def _preempt(self, req: Request, plan: StepPlan) -> None:
        """P2: recompute preemption: free everything, back to the queue front."""
        if req.status is RequestStatus.FINISHED:
            self._preempt_finishing(req, plan)
            return
        self.kv.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        if self._drafts is not None:
            self._drafts.drop(req)
        self.waiting.prepend(req)
        plan.preempted.append(req)

    # --------------------------------------------------- async scheduling

    def _finish_after_next_schedule(self, finished: list[Request], now: float) -> list[Request]:
        """Async scheduling: the step's outputs are in, but the next step was scheduled before.

        vLLM V1 with ``async_scheduling`` (``vllm/v1/engine/core.py``,
        ``EngineCore.step_with_batch_queue``) schedules step N+1 while step N
        runs, and applies N's outputs after that (``update_from_output``).
        kvsim samples N's tokens now (what N+1's placeholders stand for) and
        reports the finished requests, but they keep their running slot and
        their blocks through the next ``schedule()``, which skips them: vLLM
        does not schedule a request whose last token is in flight
        (``Scheduler.schedule``: ``num_computed_tokens + 2 -
        num_output_placeholders >= num_prompt_tokens + max_tokens``, or no
        room left under ``max_model_len``). The next ``schedule()`` frees them
        when it is done (``_release_finishing``).
        """
        for req in finished:
            req.status = RequestStatus.FINISHED
            req.finish_time = now
        self._finishing += finished
        return finished

    def _release_finishing(self) -> None:
        """After the schedule that skipped them: free the finished requests, in output order."""
        for req in self._finishing:
            self.running.remove(req)
            self.kv.free(req)
        self._finishing = []

    def _preempt_finishing(self, req: Request, plan: StepPlan) -> None:
        """P1 picked a request whose last token is in flight (async scheduling).

        vLLM preempts it (its blocks are freed now, ``num_preemptions`` counts
        it) and, as its stale output is kept (``drop_stale_output`` is False
        without a KV connector), that output still finishes it: it never
        goes back to the queue. The caller took it out of ``running``.
        """
        self._finishing.remove(req)
        self.kv.free(req)
        req.num_preemptions += 1
        plan.preempted.append(req)

    def _verify(self, plan: StepPlan, now: float) -> list[Request]:
        """Speculative decoding's S7 (kvsim.sched.spec_decode), then the blocks
        the accepted drafts filled are cached (``cache_blocks``)."""
        finished = self._drafts.verify(plan, now)
        for req, _, _ in plan.scheduled:
            if req.num_computed_tokens:
                self.kv.cache_blocks(req, req.num_computed_tokens)
        return finished

    # ------------------------------------------------------------- waiting

    def _schedule_waiting(self, plan: StepPlan, budget: StepBudget) -> StepBudget:
        """S3-S5: admit from the waiting queue until a request does not fit."""
        while budget.open and len(self.waiting):
            if len(self.running) >= self.config.max_num_seqs:
                break                               # TV9: the cap counts running requests
            req = self.waiting.peek()
            admission = self.try_admission(req, budget.room)
            if admission is None:
                break                               # TV10: head-of-line blocking
            hits, num_hit, n = admission
            self.kv.allocate_slots(req, n, num_hit, hits, num_lookahead_tokens=self._lookahead)
            self.waiting.pop()
            self.running.append(req)
            record_admission(plan, req, num_hit, n)
            budget.take(n)
        return budget

    def try_admission(self, req: Request, budget: int) -> tuple[list[int], int, int] | None:
        """(prefix-hit blocks, hit tokens, chunk) if ``req`` can be admitted now, else None.

        Read-only: the lookup (H3, H4) and the fit checks (S4, N1, N2), not the
        allocation.
        """
        cfg = self.config
        if req.num_computed_tokens == 0:
            hits, num_hit = self.kv.get_computed_blocks(req)
        else:
            hits, num_hit = [], req.num_computed_tokens
        n = req.num_tokens - num_hit
        if 0 < self._threshold < n:
            n = self._threshold
        if not cfg.enable_chunked_prefill and n > budget:
            return None                             # S4 [new]: break, do not skip
        n = min(n, budget)
        fit = min(req.num_tokens, cfg.max_model_len) if cfg.scheduler_reserve_full_isl else None
        if not self._can_admit(req, n, num_hit, hits, fit):
            return None
        return hits, num_hit, n

    def _can_admit(self, req: Request, n: int, num_hit: int, hits: list[int],
                   full_tokens: int | None) -> bool:
        """Would ``allocate_slots`` succeed for this admission? (N1, N2, A2)

        The watermark applies to waiting and preempted requests only while
        something is running; with ``scheduler_reserve_full_isl`` the blocks
        for the whole current sequence must fit now, though only this chunk's
        are taken.
        """
        kv = self.kv
        wm = self.watermark_blocks if self.running else 0
        free = kv.get_num_free_blocks()
        if full_tokens is not None:
            if kv.num_blocks_to_allocate(req, full_tokens, hits) + wm > free:
                return False
        need = min(num_hit + n + self._lookahead, self.config.max_model_len)
        return kv.num_blocks_to_allocate(req, need, hits) + wm <= free


def _steps_before_a_block_runs_out(nth_allocation, num_free: int, num_seqs: int,
                                   max_steps: int) -> int:
    """A2/P1: the run stops before the step whose allocation would not fit."""
    beyond = nth_allocation(num_free + 1)
    return max_steps if beyond is None else min(max_steps, beyond[0] - 1)
