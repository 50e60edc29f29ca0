"""The ``chunked`` scheduler's KV connector hooks (sched/connector.py), as vLLM 0.33 has them.

A mixin of :class:`~kvsim.sched.chunked.ChunkedScheduler`, split out by
concern: finished requests whose blocks a reader still needs, transfers
observed after each step, the queue of requests holding loaded KV
(``kv_holding_waiting``, served before the waiting queue), and the gate
that keeps an asynchronous load from taking the blocks the prefills in
flight still need. Each method cites the vLLM rule it follows; every one
is a no-op without a connector (``self.transfers`` is None).
"""

from __future__ import annotations

from kvsim.sched.base import StepPlan, record_admission
from kvsim.sched.budget import StepBudget
from kvsim.sched.request import Request


class ChunkedConnectorHooks:
    """KV-connector parts of ``ChunkedScheduler``."""

    def _free_finished(self, req: Request) -> None:
        t = self.transfers
        if t is not None:
            t.forget(req)
        if t is not None and t.connector.request_finished(req, list(self.kv.get_blocks(req.request_id))):
            t.keep_for_sending(req)          # a reader still needs the blocks (finished_sending)
        else:
            self.kv.free(req, finished=True)

    def _after_step(self, now: float) -> None:
        if self.transfers is not None:
            for req in self.transfers.poll(now):
                self.kv.free(req, finished=True)     # finished, its blocks sent

    def next_wakeup_time(self) -> float:
        if self.transfers is None:
            return float("inf")
        return self.transfers.connector.next_transfer_done_time()

    def waits_on_sends(self) -> bool:
        """Finished requests keep blocks for a reader (sched/connector.py): they come back.

        An engine with nothing to run then waits (vLLM's engine polls the
        connector) instead of failing the waiting head (``pop_unschedulable``);
        kvsim sleeps until a send ends or the connector wakes it (kvsim/fleet/pd.py).
        """
        return self.transfers is not None and self.transfers.num_sending > 0

    def pop_unschedulable(self) -> Request | None:
        if self.waits_on_sends():
            return None
        if self.transfers is not None and self.transfers.holding:
            # Nothing runs and no transfer is pending, so every holding
            # request's KV is in: the first (served before any waiting one)
            # cannot start and nothing will free blocks for it. (vLLM's gate on
            # asynchronous loads, try_admission, keeps this from happening.)
            req = self.transfers.drop_holding_head()
            self.kv.free(req)
            req.fail_reason = ("its KV was loaded but its whole sequence does not fit beside the "
                               "blocks the other loaded requests hold")
            return req
        if not len(self.waiting):
            return None
        req = self.waiting.pop()
        self.cadence.deferred.discard(req)
        return req

    def _schedule_holding(self, plan: StepPlan, budget: StepBudget) -> StepBudget | None:
        """Requests whose KV was loaded asynchronously, in the order they got their
        blocks; None when the waiting queue must not be served in this step."""
        t = self.transfers
        for req in list(t.holding):
            if not budget.open or len(self.running) >= self.max_num_active_reqs:
                return None
            arrived = t.ready(req)
            if arrived is None:
                continue                            # still loading: skipped this step
            if arrived:
                self.kv.cache_blocks(req, arrived)  # cached once the KV is there
            if self.cadence.holds(req, req.num_computed_tokens):
                return None                         # prefill_schedule_interval: a held step
            n = self._prefill_chunk(req, req.num_computed_tokens, budget.room)
            cfg = self.config
            fit = min(req.num_tokens, cfg.max_model_len) if cfg.scheduler_reserve_full_isl else None
            if n is None or not self._can_admit(req, n, req.num_computed_tokens, [], fit):
                return None
            self.kv.allocate_slots(req, n, num_lookahead_tokens=self._lookahead)
            t.holding.remove(req)
            self.running.append(req)
            t.admitted(req, req.num_computed_tokens, n)
            record_admission(plan, req, req.num_computed_tokens, n)
            self.cadence.admitted(req, req.num_computed_tokens)
            budget.take(n)
        return budget

    def _reserved_for_inflight_prefills(self) -> int:
        """vLLM ``_inflight_prefill_reserved_blocks() + _spec_decode_step_blocks``."""
        spec = self.config.speculative
        k = spec.num_speculative_tokens if spec is not None else 0
        extra = 1 + k + self._lookahead if k else 0
        max_len, kv = self.config.max_model_len, self.kv

        def remaining(req: Request) -> int:       # vLLM _request_remaining_blocks
            return kv.num_blocks_to_allocate(req, min(req.num_tokens, max_len) + extra, (),
                                             full_sequence=True)

        return self.transfers.reserved_blocks(remaining) + (-(-extra // kv.block_size))
