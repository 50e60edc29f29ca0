"""What every scheduler gives the engine loop, and the queues they share."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kvsim.sched.request import Request, RequestStatus


@dataclass(slots=True)
class StepPlan:
    """One step's decisions, in the order the scheduler made them.

    ``scheduled`` holds (request, tokens, context tokens before this step);
    ``prefix_hit_tokens`` / ``resume_hit_tokens`` the cached tokens of requests
    admitted in this step for the first time / after a preemption.
    """

    scheduled: list[tuple[Request, int, int]] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    prefix_hit_tokens: dict[str, int] = field(default_factory=dict)
    resume_hit_tokens: dict[str, int] = field(default_factory=dict)
    swap_bytes: int = 0
    kv_wait_s: float = 0.0        # the forward pass waits this long on synchronous KV loads
    num_sampled: int = 0
    failed: list[Request] = field(default_factory=list)   # rejected for good (e.g. V0 "ignored")
    # Speculative decoding (kvsim.sched.spec_decode): drafts scheduled per request
    # (vLLM's scheduled_spec_decode_tokens), the requests the drafter runs on and
    # their context, and the tokens generated (-1: one per sampling request).
    scheduled_drafts: dict[str, int] = field(default_factory=dict)
    num_drafting: int = 0
    drafting_context_tokens: int = 0
    num_generated_tokens: int = -1
    # A multi-step window's step after its first (kvsim.sched.multistep): nothing
    # was scheduled or prepared for it, so the engine costs it without that CPU time.
    continuation: bool = False

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass(slots=True)
class DecodeRun:
    """Up to ``max_steps`` decode steps the batch can run unchanged (the skip-ahead).

    Each step schedules one token for each of the ``num_seqs`` running
    requests, in running order, and every one of them samples (a chunk run:
    but the last, which takes ``chunk`` prompt tokens). Nothing the
    scheduler or the KV manager decides differs between these steps but the
    context lengths (``context_token_sum`` before step 1, then ``num_seqs``
    more per step) and the blocks allocated at block boundaries. The engine
    costs the steps, stops early at the next arrival, and hands the number it
    ran back to ``Scheduler.apply_decode_run``.

    The rest is the scheduler's own bookkeeping: the batch, each request's
    computed tokens before step 1 and the step at which it first needs a
    block, and how many steps' allocations are already applied.
    """

    num_seqs: int
    context_token_sum: int
    max_steps: int
    requests: list = field(repr=False)
    num_computed: list[int] = field(repr=False)
    first_allocations: list[int] = field(repr=False)
    num_free_blocks: int = 0               # before step 1
    steps_allocated: int = 0
    free_after: list[int] = field(default_factory=list, repr=False)
    # The rest of a multi-step window (kvsim.sched.multistep): steps scheduled
    # before they began, costed without scheduling and input preparation.
    continuation: bool = False
    # A chunk run (sched/chunked_runs.py): the last request takes a prefill
    # chunk of this many tokens each step instead of decoding, until
    # ``chunk_left`` tokens are computed; it samples in the step that computes
    # the last of them (``chunk_end_step``, if the run gets there).
    # ``first_allocations`` are the others'. 0: every request decodes.
    chunk: int = 0
    chunk_left: int = 0

    @property
    def chunk_end_step(self) -> int:
        """The step (1-based) whose chunk computes the chunked request's last token."""
        return -(-self.chunk_left // self.chunk)

    def chunk_tokens(self, step: int) -> int:
        """The chunked request's tokens in ``step`` (1-based)."""
        left = self.chunk_left - (step - 1) * self.chunk
        return left if left < self.chunk else self.chunk


class Scheduler(Protocol):
    """Everything the engine loop calls (DESIGN.md: policy lives here).

    One step: ``schedule()`` -> the engine costs the plan and advances the
    clock -> ``update_from_output()``. Between events that change the batch,
    ``plan_decode_run()`` offers a run of identical decode steps, which the
    engine costs in one go and applies with ``apply_decode_run()``; the
    results are those of the same steps taken one by one.
    """

    num_usable_blocks: int
    # Set by the engine on its fast path: ``schedule()`` may then take a batch
    # of plain decodes in one KV call (the decode-run machinery for one step);
    # off, every request goes through the step-by-step rules (the reference).
    decodes_at_once: bool

    def add_request(self, req: Request) -> None: ...

    def schedule(self) -> StepPlan: ...

    def update_from_output(self, plan: StepPlan, now: float) -> list[Request]:
        """Apply the step's outputs at time ``now``; return the finished requests."""
        ...

    def has_requests(self) -> bool: ...

    def get_request_counts(self) -> tuple[int, int]:
        """(running, waiting) after the step, as vLLM counts them."""
        ...

    def num_free_blocks(self) -> int:
        """Free KV blocks now, in the units ``num_usable_blocks`` counts."""
        ...

    def kv_cache_usage(self) -> float:
        """Fraction of the KV cache in use now (vLLM's ``kv_cache_usage_perc`` / 100)."""
        ...

    def prefix_hit_blocks(self, block_hashes) -> int:
        """Leading blocks of ``block_hashes`` cached now (0 without prefix caching)."""
        ...

    def plan_decode_run(self) -> DecodeRun | None:
        """The decode steps the batch can run from now unchanged, or None."""
        ...

    def sync_decode_run(self, run: DecodeRun, num_started: int) -> None:
        """Apply the schedule-time effects (blocks, caching) of the run's first
        ``num_started`` steps, so that the cache looks as the step path's does
        while step ``num_started`` runs (a router reading state mid-run)."""
        ...

    def apply_decode_run(self, run: DecodeRun, num_steps: int, token_times: Sequence[float]) -> list[Request]:
        """The first ``num_steps`` steps of ``run``, ending at ``token_times``;
        returns the requests that finished in the last of them, freed."""
        ...

    def next_wakeup_time(self) -> float:
        """When something outside the steps next changes what can be scheduled
        (a KV transfer completing, sched/connector.py); ``inf`` if nothing is
        pending. No decode run goes past it, and an engine with nothing to
        schedule sleeps until then."""
        ...

    def pop_unschedulable(self) -> Request | None:
        """The waiting head, taken out, when nothing runs and it can never start."""
        ...

    def drop_waiting(self, req: Request) -> bool:
        """Take a preempted request out of the waiting queue (False: it is not
        there); the engine fails it (``Engine._break_livelock``)."""
        ...

    def stats(self) -> dict[str, float]:
        """The scheduler's own counters, for ``Result.stats``."""
        ...

    def close(self) -> None:
        """The run is over (``Engine.close``): let go of what would keep the run's
        objects in reference cycles (the radix cache's tree). The queries above
        still answer; no request is added or scheduled after it."""
        ...


def record_admission(plan: StepPlan, req: Request, num_hit: int, n: int) -> None:
    """S5: a waiting (or preempted) request becomes RUNNING with its prefix hit.

    The caller has already allocated its blocks and moved it to ``running``.
    """
    if req.status is RequestStatus.PREEMPTED:
        plan.resume_hit_tokens[req.request_id] = num_hit
    else:
        plan.prefix_hit_tokens[req.request_id] = num_hit
    if req.num_cached_tokens < 0:
        req.num_cached_tokens = num_hit     # recorded the first time only
    req.status = RequestStatus.RUNNING
    req.num_computed_tokens = num_hit
    plan.scheduled.append((req, n, num_hit))


def commit_scheduled(plan: StepPlan) -> None:
    """S6: computed tokens advance at schedule time, before execution.

    A request whose chunk reaches its last known token will sample one.
    """
    sampled = 0
    for req, n, _ in plan.scheduled:
        req.num_computed_tokens += n
        if req.num_computed_tokens >= req.prompt_len + req.num_output_tokens:   # num_tokens
            sampled += 1
    plan.num_sampled += sampled


def sample_tokens(plan: StepPlan, now: float) -> list[Request]:
    """S7: every request whose chunk reached its last token gets one at ``now``.

    Returns the requests that have now generated all their tokens.
    """
    finished = []
    for req, _, _ in plan.scheduled:
        out = req.num_output_tokens
        if req.num_computed_tokens >= req.prompt_len + out:                    # num_tokens
            # sample_token(req, now), inlined: every decode of a step comes here.
            req.num_output_tokens = out = out + 1
            times = req.token_times
            times.append(now)
            if len(times) == 1:
                req.first_token_time = now
            if req.prompt_len + out >= req.final_num_tokens:                   # is_finished
                finished.append(req)
    return finished


def sample_token(req: Request, now: float) -> bool:
    """S7 for one request that computed its last token: it gets one at ``now``
    (its first sets the first-token time). True if it has now generated all its
    tokens. (A chunk run's request samples so in its last chunk, sched/paged.py.)"""
    req.num_output_tokens = out = req.num_output_tokens + 1
    req.token_times.append(now)
    if len(req.token_times) == 1:
        req.first_token_time = now
    return req.prompt_len + out >= req.final_num_tokens      # is_finished
