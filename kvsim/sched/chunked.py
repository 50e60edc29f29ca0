"""``chunked``: vLLM V1's scheduler (decode-first, chunked prefill, token budget).

There is no prefill or decode phase (kv-semantics S1): every request wants
``num_tokens - num_computed_tokens`` tokens, and one step hands out at most
``max_num_batched_tokens`` of them — RUNNING requests first, in list order,
then WAITING ones, unless something was preempted in this step.

This is the reference path: it follows ``vllm/v1/core/sched/scheduler.py``
(0.33) rule by rule, and the golden traces of the real scheduler check it.
Engine-time options (issue #13) live in their own modules and enter here as
calls: two budgets (``budget.py``: ``max_num_scheduled_tokens``, draft
slots), speculative decoding (``spec_decode.py``), async scheduling
(``async_finish.py``). Its decode runs (the skip-ahead) are in
``chunked_runs.py``, its KV connector hooks (holding queue, kept blocks,
the asynchronous-load gate) in ``chunked_connector.py``.
"""

from __future__ import annotations

from kvsim.sched.async_finish import AsyncFinishing
from kvsim.sched.base import StepPlan, commit_scheduled, record_admission, sample_tokens
from kvsim.sched.budget import StepBudget
from kvsim.sched.chunked_connector import ChunkedConnectorHooks
from kvsim.sched.chunked_runs import ChunkedDecodeRuns
from kvsim.sched.cadence import PrefillCadence
from kvsim.sched.config import SchedulerConfig
from kvsim.sched.connector import KVConnector, KVTransfers
from kvsim.sched.paged import PagedScheduler
from kvsim.sched.queues import make_waiting_queue
from kvsim.sched.request import Request, RequestStatus


SKIP = "skip"          # try_admission: leave this request for a later step, try the next


class ChunkedScheduler(ChunkedConnectorHooks, ChunkedDecodeRuns, AsyncFinishing, PagedScheduler):
    """vLLM V1 ``Scheduler`` in synchronous mode, with fake one-token outputs.

    With a ``connector`` (sched/connector.py) some KV comes from outside the
    GPU cache: a P/D prefill replica, offload tiers.
    """

    def __init__(self, config: SchedulerConfig, connector: KVConnector | None = None) -> None:
        super().__init__(config)
        self.waiting = make_waiting_queue(config.policy)
        # N2: vLLM sizes the watermark on all blocks, the null block included.
        self.watermark_blocks = int(config.watermark * config.num_gpu_blocks)
        self.transfers = KVTransfers(connector) if connector is not None else None
        # Async scheduling: requests whose last token was sampled in the step
        # before, still holding their blocks until the next schedule() is made.
        self._finishing: list[Request] = []
        # Speculative decoding (kvsim.sched.spec_decode): drafts, and the KV
        # slots reserved past the scheduled tokens for the drafter.
        self._drafts = self._lookahead = None
        if config.speculative is not None:
            from kvsim.sched.spec_decode import Drafts
            self._drafts = Drafts(config.speculative)
        self._lookahead = config.speculative.num_lookahead_tokens if self._drafts else 0
        # vLLM 0.33 Scheduler.__init__: admission into RUNNING stops at
        # max_num_active_seqs (max_num_seqs still sizes the runner).
        self.max_num_active_reqs = config.max_num_active_seqs or config.max_num_seqs
        self.cadence = PrefillCadence(config.prefill_schedule_interval)

    # ------------------------------------------------------------ protocol

    def has_requests(self) -> bool:
        t = self.transfers
        return (bool(self.running) or bool(len(self.waiting))
                or (t is not None and bool(len(t) or t.sends_keep_engine_busy())))

    def get_request_counts(self) -> tuple[int, int]:
        # vLLM's stats come after the step's outputs: a finished request is gone.
        holding = len(self.transfers) if self.transfers is not None else 0
        return len(self.running) - len(self._finishing), len(self.waiting) + holding

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        # vLLM Scheduler.schedule: kv_cache_manager.new_step_starts() first (the
        # hybrid manager's Mamba groups forget which states this step cached).
        self.kv.new_step_starts()
        self.refresh_threshold()
        self.cadence.start_step(self.running)
        budget = self._schedule_running(plan, self.new_budget())
        if not plan.preempted:
            # S3: a step that preempted admits nothing.
            self._schedule_waiting(plan, budget)
            self.cadence.note_capacity_bound(len(self.waiting))
        commit_scheduled(plan)
        if self._drafts is not None:
            self._drafts.after_schedule(plan)
        self.cadence.end_step(plan.scheduled)
        if self.transfers is not None:
            plan.kv_wait_s = self.transfers.connector.step_wait_s(plan.scheduled)
            self.transfers.after_schedule(plan.scheduled)
        if self._finishing:
            self._release_finishing()
        return plan

    def new_budget(self) -> StepBudget:
        """This step's token and input budgets (kvsim.sched.budget)."""
        cfg = self.config
        slots = cfg.speculative.max_num_new_slots_for_drafting if cfg.speculative else 0
        return StepBudget(cfg.max_num_scheduled_tokens or cfg.max_num_batched_tokens,
                          cfg.max_num_batched_tokens, slots)

    def refresh_threshold(self) -> None:
        """N4: the threshold only stops a long prefill starving *other* requests;
        alone in the system, a request may use the whole budget.

        vLLM counts ``get_request_counts()``: the running, the waiting and the
        KV-holding requests. With ``long_prefill_token_threshold_adaptive``
        (vLLM 0.33 ``Scheduler.schedule``) a set threshold is floored at the
        fair share ``max_num_batched_tokens // that count``: the input budget,
        not ``max_num_scheduled_tokens``.
        """
        cfg = self.config
        threshold = cfg.long_prefill_token_threshold
        if threshold > 0:                           # only a set threshold needs the count
            num_in_system = sum(self.get_request_counts())
            if num_in_system <= 1:
                threshold = 0
            elif cfg.long_prefill_token_threshold_adaptive:
                threshold = max(threshold, cfg.max_num_batched_tokens // num_in_system)
        self._threshold = threshold

    def update_from_output(self, plan: StepPlan, now: float) -> list[Request]:
        """Every request whose chunk reached its last token samples one (S7);
        then the KV transfers that completed during the step are taken in.

        vLLM caches blocks at schedule time (A4); a KV manager that caches
        after the forward pass instead (the radix strategy, SGLang G3) takes
        in the step's prefills and chunks here, before finished requests are
        freed.
        """
        sampled = (sample_tokens(plan, now) if self._drafts is None
                   else self._drafts.verify(plan, now, self.kv))
        if not self.kv.caches_at_schedule_time:
            self.kv.cache_after_step(plan.scheduled)
        finished = self.finish_requests(sampled, now)
        self._after_step(now)
        return finished

    def finish_requests(self, finished: list[Request], now: float) -> list[Request]:
        if self.config.async_scheduling:
            return self._finish_after_next_schedule(finished, now)
        return super().finish_requests(finished, now)

    # ------------------------------------------------------------- running

    def _schedule_running(self, plan: StepPlan, budget: StepBudget) -> StepBudget:
        """S2: give each running request its chunk, preempting when blocks run out.

        The budget's two counters are kept in locals for the loop (the same
        arithmetic as ``StepBudget.room`` / ``take``; written back around a
        preemption, which gives a victim's tokens back)."""
        i = self._schedule_decodes_at_once(plan, budget)   # the leading decodes, on the fast path
        cfg = self.config
        running, allocate, scheduled = self.running, self.kv.allocate_slots, plan.scheduled
        if i == len(running):
            return budget
        chunk, lookahead, cadence = self.running_chunk, self._lookahead, self.cadence
        tokens, inputs, slots = budget.tokens, budget.inputs, budget.draft_slots
        while i < len(running) and tokens > 0 and inputs > slots:
            req = running[i]
            computed = req.num_computed_tokens
            room = inputs - slots
            n = chunk(req, tokens if tokens < room else room)
            if n <= 0:
                i += 1
                continue
            if allocate(req, n, num_lookahead_tokens=lookahead) is None:
                budget.tokens, budget.inputs = tokens, inputs
                # What this loop scheduled so far (the plan is this step's, so
                # its entries are), for the victims' rollback.
                scheduled_now = {r.request_id: k for r, k, _ in plan.scheduled}
                i, budget = self._preempt_for(req, n, i, budget, plan, scheduled_now)
                tokens, inputs = budget.tokens, budget.inputs
                scheduled = plan.scheduled
                if req.status is RequestStatus.PREEMPTED:
                    if cfg.policy == "priority":
                        # P4 [new]: the victim left the list, so i already
                        # points at the next (higher-priority) request.
                        continue
                    break
            scheduled.append((req, n, computed))
            if cadence.on and req in cadence.chunks:
                cadence.carried = True              # prefill_schedule_interval: a prefill chunk ran
            tokens -= n
            inputs -= n + slots
            i += 1
        budget.tokens, budget.inputs = tokens, inputs
        return budget

    def running_chunk(self, req: Request, budget: int) -> int:
        """S2: the tokens a running request gets this step (<= 0: none).

        What it still wants, cut to the long-prefill threshold and the budget;
        one slot stays free for the token this step samples.
        """
        if req.status is RequestStatus.FINISHED:
            return 0                 # async scheduling: its last token is in flight
        if self.cadence.held and req in self.cadence.chunks:
            return 0                                # prefill_schedule_interval: a held step (skips)
        computed = req.num_computed_tokens
        n = req.prompt_len + req.num_output_tokens - computed      # num_tokens - computed
        if self._drafts is not None:
            n += self._drafts.num_drafts(req)       # num_tokens_with_spec - computed
        if 0 < self._threshold < n:
            n = self._threshold
        if n > budget:
            n = budget
        cap = self.config.max_model_len - computed - 1   # (min(n, budget, cap), as comparisons)
        if n > cap:
            n = cap
        if n > 0 and self.kv.aligns_chunks:
            n = self.kv.align_chunk(req, n)         # vLLM _mamba_block_aligned_split (hybrid Mamba)
        return n

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

    def drop_waiting(self, req: Request) -> bool:
        if not super().drop_waiting(req):
            return False
        self.cadence.deferred.discard(req)          # (prefill_schedule_interval's bookkeeping)
        return True

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
        if self.transfers is not None:
            self.transfers.forget(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        if self._drafts is not None:
            self._drafts.drop(req)
        self.waiting.prepend(req)
        plan.preempted.append(req)

    # ------------------------------------------------------------- waiting

    def _schedule_waiting(self, plan: StepPlan, budget: StepBudget) -> StepBudget | None:
        """S3-S5: admit from the waiting queue until a request does not fit.

        Requests that hold KV blocks (a connector's load, sched/connector.py)
        are served first, as vLLM serves ``kv_holding_waiting``.
        """
        if self.transfers is not None and len(self.transfers):
            budget = self._schedule_holding(plan, budget)
            if budget is None:
                return None
        skipped = []
        while budget.open and len(self.waiting):
            if len(self.running) >= self.max_num_active_reqs:
                break                               # TV9: the cap counts running requests
            req = self.waiting.peek()
            admission = self.try_admission(req, budget.room)
            if admission is SKIP:
                skipped.append(self.waiting.pop())
                self.cadence.defer(req)
                continue
            if admission is None:
                break                               # TV10: head-of-line blocking
            hits, num_hit, n, num_external, load_async = admission
            if not load_async and self.cadence.holds(req, num_hit + num_external):
                break                               # prefill_schedule_interval: a held step
            self.kv.allocate_slots(req, n, num_hit, hits, num_external_computed_tokens=num_external,
                                   delay_cache_blocks=load_async,
                                   num_lookahead_tokens=0 if load_async else self._lookahead)
            self.waiting.pop()
            self.cadence.deferred.discard(req)      # an async load counts as holding from now
            if num_external:
                self.transfers.connector.update_state_after_alloc(
                    req, list(self.kv.get_blocks(req.request_id)), num_external)
            if load_async:
                self.transfers.start_load(req, num_hit + num_external)
                continue
            self.running.append(req)
            if self.transfers is not None:
                self.transfers.admitted(req, num_hit + num_external, n)
            record_admission(plan, req, num_hit + num_external, n)
            self.cadence.admitted(req, num_hit + num_external)
            budget.take(n)
        for req in reversed(skipped):               # skipped requests keep their order (N5)
            self.waiting.prepend(req)
        return budget

    def _prefill_chunk(self, req: Request, num_computed: int, budget: int) -> int | None:
        """S4: the chunk a waiting request gets: the rest of its tokens, cut to the
        threshold and the budget; None when chunking is off and it does not fit."""
        n = req.num_tokens - num_computed
        if 0 < self._threshold < n:
            n = self._threshold
        if not self.config.enable_chunked_prefill and n > budget:
            return None                             # S4 [new]: break, do not skip
        n = self.kv.align_chunk(req, min(n, budget), num_computed)   # Mamba: block-aligned chunks
        return n if n > 0 else None

    def try_admission(self, req: Request, budget: int):
        """What admitting ``req`` now would do, or None (it does not fit: the queue
        stops here), or ``SKIP`` (a connector cannot tell yet: try the next one).

        Returns (prefix-hit blocks, hit tokens, chunk, external tokens, load
        asynchronously). Read-only: the lookups (H3, H4, the connector's) and
        the fit checks (S4, N1, N2), not the allocation.
        """
        cfg = self.config
        num_external, load_async = 0, False
        if req.num_computed_tokens == 0:
            hits, num_hit = self.kv.get_computed_blocks(req)
            if self.transfers is not None:
                num_external, load_async = self.transfers.connector.get_num_new_matched_tokens(req, num_hit)
                if num_external is None:
                    return SKIP
                if num_hit + num_external > req.num_tokens:
                    raise ValueError(f"KV connector: {num_external} external tokens past a hit of "
                                     f"{num_hit} for request {req.request_id} of {req.num_tokens} "
                                     f"tokens")
                load_async = load_async and num_external > 0
        else:
            hits, num_hit = [], req.num_computed_tokens
        num_computed = num_hit + num_external
        if load_async:
            n = 0                                   # no work until the KV has arrived
        else:
            n = self._prefill_chunk(req, num_computed, budget)
            if n is None:
                return None
        fit = min(req.num_tokens, cfg.max_model_len) if cfg.scheduler_reserve_full_isl else None
        # An asynchronous load holds its blocks with no progress and cannot be
        # preempted: vLLM admits it only if it leaves free what the prefills in
        # flight still need (``_inflight_prefill_reserved_blocks``, "to avoid
        # deadlock"), plus one speculative step's blocks.
        reserved = self._reserved_for_inflight_prefills() if load_async else 0
        if not self._can_admit(req, n, num_computed, hits, fit, reserved):
            return None
        return hits, num_hit, n, num_external, load_async

    def _can_admit(self, req: Request, n: int, num_hit: int, hits: list[int],
                   full_tokens: int | None, reserved: int = 0) -> bool:
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
            if kv.num_blocks_to_allocate(req, full_tokens, hits, full_sequence=True) + wm > free:
                return False
        # Lookahead slots come with work to do (none for an asynchronous load, n = 0).
        need = min(num_hit + n + (self._lookahead if n else 0), self.config.max_model_len)
        return kv.num_blocks_to_allocate(req, need, hits) + wm <= free - reserved
