"""``orca``: iteration-level batching with contiguous KV reservations (Orca, OSDI'22).

Orca (Yu et al., OSDI'22) schedules every iteration anew: each step decodes
every running request and admits waiting requests, whose whole prompt runs in
the same step (selective batching), while their KV reservation fits and
``max_num_seqs`` is not reached. As the Sarathi-Serve artifact's baseline
implements it (``sarathi/core/scheduler/orca_scheduler.py``,
``OrcaScheduler._schedule``): running requests first, then the waiting queue
in order until one does not fit; no token budget, no chunking, no preemption
(a reservation holds the request's whole length, so a running request never
runs out of memory).

Before paging, a request reserved one contiguous slab up front. The vLLM
paper (Kwon et al., SOSP'23, sec. 6.1) runs Orca with three reservations,
``engine.orca_reservation``:

* ``max``: the model's maximum length (``max_model_len``), which is what
  Sarathi's ``OrcaBlockSpaceManager`` reserves;
* ``pow2``: the request's final length rounded up to a power of two (an
  oracle that knows the output length within 2x), at most ``max_model_len``;
* ``oracle``: exactly the request's final length (prompt + output).

Slabs are placed first fit in one address space of ``(num_gpu_blocks - 1) x
block_size`` token slots (``kvsim.kv.contiguous``), so external
fragmentation can keep a request waiting although enough slots are free.
Free "blocks" are reported as free slots / block size, as for ``static``.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from kvsim.kv.contiguous import ContiguousAllocator
from kvsim.sched.base import DecodeRun, StepPlan, commit_scheduled, record_admission, sample_tokens
from kvsim.sched.config import SchedulerConfig
from kvsim.sched.queues import FcfsQueue, QueuedRequests
from kvsim.sched.request import Request, RequestStatus

RESERVATIONS = ("max", "pow2", "oracle")


def reservation_tokens(policy: str, final_num_tokens: int, max_model_len: int) -> int:
    """Token slots a request reserves under ``policy`` (vLLM paper sec. 6.1)."""
    if policy == "max":
        return max_model_len
    if policy == "pow2":
        return min(1 << (final_num_tokens - 1).bit_length(), max_model_len)
    if policy == "oracle":
        return final_num_tokens
    raise ValueError(f"engine.orca_reservation: {policy!r} is not one of {', '.join(RESERVATIONS)}")


class OrcaScheduler(QueuedRequests):
    """Iteration-level batching; every request holds a contiguous slab for its whole life."""

    decodes_at_once = False          # the Scheduler protocol; only chunked uses it

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.policy = config.orca_reservation
        reservation_tokens(self.policy, 1, config.max_model_len)      # a bad name fails here
        capacity = (config.num_gpu_blocks - 1) * config.block_size
        # Bytes per token only scale the usage report; 1 keeps it in tokens.
        self.alloc = ContiguousAllocator(capacity, 1)
        self.num_usable_blocks = capacity // config.block_size
        self.waiting = FcfsQueue()
        self.running: list[Request] = []

    # ------------------------------------------------------------ protocol

    def num_free_blocks(self) -> int:
        return self.alloc.usage().free_bytes // self.config.block_size

    def kv_cache_usage(self) -> float:
        # In block units, as the step records of decode runs count it.
        return 1.0 - self.num_free_blocks() / self.num_usable_blocks

    def prefix_hit_blocks(self, block_hashes) -> int:
        return 0                                  # no prefix cache

    def next_wakeup_time(self) -> float:
        return float("inf")                       # nothing happens outside the steps

    def pop_unschedulable(self) -> Request | None:
        return self.waiting.pop() if len(self.waiting) else None

    def stats(self) -> dict[str, float]:
        return {}

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        for req in self.running:
            plan.scheduled.append((req, 1, req.num_computed_tokens))
        while len(self.waiting):
            req = self.waiting.peek()
            if not self._can_admit(req):
                break
            self.waiting.pop()
            self.alloc.allocate(req.request_id, self._slab(req), req.final_num_tokens)
            self.running.append(req)
            record_admission(plan, req, 0, req.num_tokens)
        commit_scheduled(plan)
        return plan

    def update_from_output(self, plan: StepPlan, now: float) -> list[Request]:
        finished = sample_tokens(plan, now)
        for req, _, _ in plan.scheduled:
            self.alloc.set_used(req.request_id, req.num_computed_tokens)
        return self._finish(finished, now)

    # ---------------------------------------------------------- decode runs

    def plan_decode_run(self) -> DecodeRun | None:
        """Decode steps that go the same way through ``schedule()``.

        Every running request decodes; slabs only change when a request is
        admitted or finishes, and the run ends with the first finish, so a
        waiting head that does not fit now does not fit during the run.
        """
        if not self.running or (len(self.waiting) and self._can_admit(self.waiting.peek())):
            return None
        min_remaining, context_sum = 1 << 62, 0
        for r in self.running:
            if r.num_output_tokens == 0 or r.num_tokens - r.num_computed_tokens != 1:
                return None                       # not possible: prompts run whole; kept safe
            min_remaining = min(min_remaining, r.final_num_tokens - r.num_tokens)
            context_sum += r.num_computed_tokens
        if min_remaining < 1:
            return None
        return DecodeRun(num_seqs=len(self.running), context_token_sum=context_sum,
                         max_steps=min_remaining, requests=list(self.running),
                         num_computed=[], first_allocations=[],
                         num_free_blocks=self.num_free_blocks())

    def sync_decode_run(self, run: DecodeRun, num_started: int) -> None:
        run.steps_allocated = max(run.steps_allocated, num_started)   # slabs are reserved: nothing to do

    def apply_decode_run(self, run: DecodeRun, num_steps: int,
                         token_times: Sequence[float]) -> list[Request]:
        if not 1 <= num_steps <= run.max_steps or len(token_times) != num_steps:
            raise ValueError(f"apply_decode_run: {num_steps} steps of a run of {run.max_steps} "
                             f"with {len(token_times)} token times")
        finished = []
        times = array("d", token_times)         # converted once (Request.token_times)
        for r in run.requests:
            r.num_computed_tokens += num_steps
            r.num_output_tokens += num_steps
            r.token_times.extend(times)
            self.alloc.set_used(r.request_id, r.num_computed_tokens)
            if r.num_tokens >= r.final_num_tokens:
                finished.append(r)
        run.free_after = [run.num_free_blocks] * num_steps
        return self._finish(finished, token_times[-1])

    # ------------------------------------------------------------ private

    def _slab(self, req: Request) -> int:
        return reservation_tokens(self.policy, req.final_num_tokens, self.config.max_model_len)

    def _can_admit(self, req: Request) -> bool:
        """The slab fits a free gap (first fit) and ``max_num_seqs`` is not reached."""
        return (len(self.running) + 1 <= self.config.max_num_seqs
                and self.alloc.can_allocate(self._slab(req)))

    def _finish(self, finished: list[Request], now: float) -> list[Request]:
        for req in finished:
            req.status = RequestStatus.FINISHED
            req.finish_time = now
            self.running.remove(req)
            self.alloc.free(req.request_id)
        return finished
