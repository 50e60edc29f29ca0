"""What every scheduler gives the engine loop, and the queues they share."""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from kvsim.sched.request import Request, RequestStatus


@dataclass
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
    num_sampled: int = 0
    failed: list[Request] = field(default_factory=list)   # rejected for good (e.g. V0 "ignored")

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler(Protocol):
    """The one protocol the engine loop drives (DESIGN.md: policy lives here)."""

    def add_request(self, req: Request) -> None: ...

    def schedule(self) -> StepPlan: ...

    def update_from_output(self, plan: StepPlan, now: float) -> list[Request]:
        """Apply the step's outputs at time ``now``; return the finished requests."""
        ...

    def has_requests(self) -> bool: ...

    def get_request_counts(self) -> tuple[int, int]:
        """(running, waiting) after the step, as vLLM counts them."""
        ...


class FcfsQueue:
    """The waiting queue under FCFS: a deque; preempted requests go to the front (S8)."""

    def __init__(self) -> None:
        self._q: deque[Request] = deque()

    def add(self, req: Request) -> None:
        self._q.append(req)

    def prepend(self, req: Request) -> None:
        self._q.appendleft(req)

    def peek(self) -> Request:
        return self._q[0]

    def pop(self) -> Request:
        return self._q.popleft()

    def remove(self, req: Request) -> None:
        self._q.remove(req)

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self):
        return iter(self._q)


class PriorityQueue:
    """The waiting queue under ``policy=priority``: a heap (S8).

    vLLM orders requests by (priority, arrival_time, request_id) — the id is
    compared as a string, so "r10" comes before "r2" — and ``prepend`` just
    re-inserts into the heap.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, str, Request]] = []

    def add(self, req: Request) -> None:
        heapq.heappush(self._heap, (req.priority, req.arrival_time, req.request_id, req))

    prepend = add

    def peek(self) -> Request:
        return self._heap[0][3]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[3]

    def remove(self, req: Request) -> None:
        self._heap = [e for e in self._heap if e[3] is not req]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self):
        return (e[3] for e in sorted(self._heap, key=lambda e: e[:3]))


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
        if req.num_computed_tokens < req.prompt_len + out:     # num_tokens
            continue
        req.num_output_tokens = out = out + 1
        req.token_times.append(now)
        if len(req.token_times) == 1:
            req.first_token_time = now
        if req.prompt_len + out >= req.final_num_tokens:      # is_finished
            finished.append(req)
    return finished


def make_waiting_queue(policy: str):
    if policy == "fcfs":
        return FcfsQueue()
    if policy == "priority":
        return PriorityQueue()
    raise ValueError(f"engine.policy: {policy!r} is not one of 'fcfs', 'priority'")
