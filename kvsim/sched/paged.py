"""What the paged schedulers (``chunked``, ``continuous``) share.

The KV manager, the running list, the state queries the engine and routers
read, finishing requests, and the mechanics of a decode run: while every
running request only decodes, consecutive steps differ only in their context
lengths and in the blocks taken at block boundaries, so the scheduler can say
up front how many steps the batch runs unchanged and then apply them in one
go. *Which* steps may be skipped is each scheduler's own rule
(``plan_decode_run``); the blocks and the caching are the KV manager's
(``decode_run_allocations``, ``allocate_decode_steps``).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from kvsim.sched.base import DecodeRun, sample_token
from kvsim.sched.config import SchedulerConfig
from kvsim.sched.queues import QueuedRequests
from kvsim.sched.request import Request, RequestStatus


class PagedScheduler(QueuedRequests):
    """Base of the schedulers that use the paged ``KVCacheManager``."""

    decodes_at_once = False          # the Scheduler protocol; only chunked uses it

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.kv = config.make_kv_manager()
        self.running: list[Request] = []

    # ------------------------------------------------------- state queries

    @property
    def num_usable_blocks(self) -> int:
        return self.kv.num_usable_blocks

    def num_free_blocks(self) -> int:
        return self.kv.get_num_free_blocks()

    def kv_cache_usage(self) -> float:
        return self.kv.usage

    def prefix_hit_blocks(self, block_hashes) -> int:
        return self.kv.num_cached_prefix_blocks(block_hashes)

    def stats(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        self.kv.close()

    # ------------------------------------------------------------ finishing

    def finish_requests(self, finished: list[Request], now: float) -> list[Request]:
        """Free finished requests at once, in scheduled order, tail block first (S7, B6)."""
        for req in finished:
            req.status = RequestStatus.FINISHED
            req.finish_time = now
            self.running.remove(req)
            self._free_finished(req)
        return finished

    def _free_finished(self, req: Request) -> None:
        self.kv.free(req, finished=True)

    def _after_step(self, now: float) -> None:
        """What happens at the end of every step, run or single (nothing here)."""

    def next_wakeup_time(self) -> float:
        """When something outside the steps (a KV transfer) next changes the state."""
        return float("inf")

    # ---------------------------------------------------------- decode runs

    def _decoding_batch(self) -> tuple[int, int, list[int]] | None:
        """(steps until the first request finishes, context sum, each request's
        computed tokens) if every running request decodes exactly one token per
        step; else None.

        The run ends with the step in which some request emits its last token:
        it finishes, and the batch changes after it. A request that reaches
        max_model_len stops there too (its final length is capped).
        """
        running = self.running
        if not running or not _decodes_one_token(running[-1]):
            return None                           # (the newest first: most likely still prefilling)
        min_remaining = 1 << 62
        computed = []
        for r in running:
            c = r.num_computed_tokens
            out = r.num_output_tokens
            if out == 0 or r.prompt_len + out - c != 1:     # _decodes_one_token, inlined
                return None                       # a prefill chunk is pending
            rem = r.final_num_tokens - r.prompt_len - out
            if rem < min_remaining:
                min_remaining = rem
            computed.append(c)
        return min_remaining, sum(computed), computed

    def _leading_decodes(self) -> list[int]:
        """The computed tokens of the running requests, from the first on, that
        each decode exactly one token (as ``_decoding_batch`` asks of all),
        up to the first that does not (a prefill chunk pending)."""
        computed = []
        for r in self.running:
            c = r.num_computed_tokens
            out = r.num_output_tokens
            if out == 0 or r.prompt_len + out - c != 1:     # _decodes_one_token, inlined
                break
            computed.append(c)
        return computed

    def _make_run(self, max_steps: int, context_sum: int, computed: list[int],
                  steps_that_fit) -> DecodeRun | None:
        """A run of at most ``max_steps``, cut where blocks run out.

        ``steps_that_fit(nth_allocation, num_free, num_seqs, max_steps)`` is the
        scheduler's rule for how many steps the free blocks carry (the step
        after them would preempt); ``nth_allocation(n)`` is the (step, batch
        index) of the run's n-th block, or None.
        """
        if max_steps < 1:
            return None
        kv = self.kv
        reqs = list(self.running)
        first = kv.decode_run_first_allocations(reqs, computed)
        if first is None:
            return None
        free = kv.get_num_free_blocks()
        k = steps_that_fit(lambda n: kv.nth_decode_run_allocation(first, n, max_steps),
                           free, len(reqs), max_steps)
        if k < 1:
            return None
        return DecodeRun(num_seqs=len(reqs), context_token_sum=context_sum, max_steps=k,
                         requests=reqs, num_computed=computed, first_allocations=first,
                         num_free_blocks=free)

    def sync_decode_run(self, run: DecodeRun, num_started: int) -> None:
        if num_started > run.steps_allocated:
            # A chunk run's sizes only to the manager that plans them (kv/chunk_runs.py).
            chunk = {"chunk": run.chunk, "chunk_left": run.chunk_left} if run.chunk else {}
            run.free_after += self.kv.allocate_decode_steps(
                run.requests, run.num_computed, run.first_allocations, run.steps_allocated + 1,
                num_started, **chunk)
            run.steps_allocated = num_started

    def apply_decode_run(self, run: DecodeRun, num_steps: int,
                         token_times: Sequence[float]) -> list[Request]:
        """S6-S7 of ``num_steps`` one-token steps, for every request of the batch."""
        if (not run.steps_allocated <= num_steps <= run.max_steps or num_steps < 1
                or len(token_times) != num_steps):
            raise ValueError(f"apply_decode_run: {num_steps} steps of a run of {run.max_steps} "
                             f"with {len(token_times)} token times")
        self.sync_decode_run(run, num_steps)
        finished = []
        k = num_steps
        times = array("d", token_times)         # converted once: each request copies the doubles
        reqs = run.requests
        if run.chunk:
            reqs = reqs[:-1]                     # the last one prefills (a chunk run)
        for r in reqs:
            r.num_computed_tokens += k
            r.num_output_tokens = out = r.num_output_tokens + k
            r.token_times.extend(times)
            if r.prompt_len + out >= r.final_num_tokens:      # is_finished
                finished.append(r)
        if run.chunk:
            r = run.requests[-1]
            r.num_computed_tokens += min(k * run.chunk, run.chunk_left)
            if k == run.chunk_end_step and sample_token(r, token_times[-1]):   # its last chunk (S7)
                finished.append(r)
        finished = self.finish_requests(finished, token_times[-1])
        self._after_step(token_times[-1])
        return finished


def _decodes_one_token(r) -> bool:
    """The request has sampled and has exactly one token not computed: a
    plain decode this step (no prefill chunk pending)."""
    out = r.num_output_tokens
    return out != 0 and r.prompt_len + out - r.num_computed_tokens == 1
