"""``static``: request-level batching, as FasterTransformer served models.

When the engine is idle it takes up to ``max_num_seqs`` waiting requests as
one batch, reserving for each a contiguous slab of its *maximum* length
(prompt + max_tokens) — the pre-paging allocator of the vLLM paper. The batch
runs one prefill step, then decode steps until its longest request is done;
requests that finish early keep their slot (padding: the GPU still computes
them) and are returned only when the whole batch ends.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvsim.kv.contiguous import ContiguousAllocator
from kvsim.sched.base import DecodeRun, StepPlan, sample_tokens
from kvsim.sched.queues import FcfsQueue
from kvsim.sched.config import SchedulerConfig
from kvsim.sched.request import Request, RequestStatus


class StaticScheduler:
    """One batch at a time; every request holds a max-length slab."""

    decodes_at_once = False          # the Scheduler protocol; only chunked uses it

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        capacity = (config.num_gpu_blocks - 1) * config.block_size
        # Bytes per token only scale the usage report; 1 keeps it in tokens.
        self.alloc = ContiguousAllocator(capacity, 1)
        # Memory is reported in block units, as for the paged schedulers.
        self.num_usable_blocks = capacity // config.block_size
        self.waiting = FcfsQueue()
        self.batch: list[Request] = []
        self.slot_steps = 0           # batch slots x decode steps (padding included)
        self.used_slot_steps = 0      # slots that produced a token

    def add_request(self, req: Request) -> None:
        self.waiting.add(req)

    def has_requests(self) -> bool:
        return bool(self.batch) or bool(len(self.waiting))

    def get_request_counts(self) -> tuple[int, int]:
        return len(self.batch), len(self.waiting)

    def num_free_blocks(self) -> int:
        return self.alloc.usage().free_bytes // self.config.block_size

    def kv_cache_usage(self) -> float:
        u = self.alloc.usage()
        return 1.0 - u.free_bytes / u.total_bytes

    def prefix_hit_blocks(self, block_hashes) -> int:
        return 0                                  # no prefix cache

    def plan_decode_run(self) -> DecodeRun | None:
        return None                               # padded batches: no skip-ahead

    def sync_decode_run(self, run: DecodeRun, num_started: int) -> None:
        raise NotImplementedError("static plans no decode runs")

    def apply_decode_run(self, run: DecodeRun, num_steps: int, token_times: Sequence[float]) -> list[Request]:
        raise NotImplementedError("static plans no decode runs")

    def next_wakeup_time(self) -> float:
        return float("inf")                       # nothing happens outside the steps

    def drop_waiting(self, req: Request) -> bool:
        return False                                # a static batch never preempts

    def pop_unschedulable(self) -> Request | None:
        return self.waiting.pop() if len(self.waiting) else None

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        if not self.batch:
            self._form_batch(plan)
            return plan
        for req in self.batch:
            # Finished requests still occupy their slot and are computed (padding).
            plan.scheduled.append((req, 1, req.num_computed_tokens))
            if not req.is_finished:
                req.num_computed_tokens += 1
                plan.num_sampled += 1
        self.slot_steps += len(self.batch)
        self.used_slot_steps += plan.num_sampled
        return plan

    def _form_batch(self, plan: StepPlan) -> None:
        while len(self.waiting) and len(self.batch) < self.config.max_num_seqs:
            req = self.waiting.peek()
            if not self.alloc.can_allocate(req.final_num_tokens):
                break
            self.waiting.pop()
            self.alloc.allocate(req.request_id, req.final_num_tokens, req.final_num_tokens)
            req.status = RequestStatus.RUNNING
            req.num_cached_tokens = 0
            plan.prefix_hit_tokens[req.request_id] = 0
            plan.scheduled.append((req, req.prompt_len, 0))
            req.num_computed_tokens = req.prompt_len
            self.alloc.set_used(req.request_id, req.prompt_len)
            self.batch.append(req)
        plan.num_sampled = len(plan.scheduled)
        if plan.scheduled:
            self.slot_steps += len(self.batch)
            self.used_slot_steps += len(self.batch)

    def update_from_output(self, plan: StepPlan, now: float) -> list[Request]:
        sample_tokens(plan, now)
        for req, _, _ in plan.scheduled:
            self.alloc.set_used(req.request_id, req.num_tokens)
        if not all(r.is_finished for r in self.batch):
            return []
        # The whole batch is returned together when its longest request ends.
        finished, self.batch = self.batch, []
        for req in finished:
            req.status = RequestStatus.FINISHED
            req.finish_time = now
            self.alloc.free(req.request_id)
        return finished

    def stats(self) -> dict[str, float]:
        return {"slot_utilization": self.slot_utilization}

    def close(self) -> None:
        """Nothing held in a cycle (a contiguous allocator)."""

    @property
    def slot_utilization(self) -> float:
        return self.used_slot_steps / self.slot_steps if self.slot_steps else float("nan")
