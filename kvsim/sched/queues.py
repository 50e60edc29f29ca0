"""The waiting queues: FCFS (a deque) and priority (a heap), kv-semantics S8."""

from __future__ import annotations

import heapq
from collections import deque

from kvsim.sched.request import Request


class FcfsQueue(deque):
    """The waiting queue under FCFS: a deque; preempted requests go to the front (S8).

    The deque itself, so that ``len``, ``add`` and ``pop`` (the scheduler asks
    for the length several times a step) are C calls, not Python methods.
    """

    __slots__ = ()
    add = deque.append
    prepend = deque.appendleft
    pop = deque.popleft                      # the head (a deque's own pop takes the tail)

    def peek(self) -> Request:
        return self[0]


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


def make_waiting_queue(policy: str):
    if policy == "fcfs":
        return FcfsQueue()
    if policy == "priority":
        return PriorityQueue()
    raise ValueError(f"engine.policy: {policy!r} is not one of 'fcfs', 'priority'")


class QueuedRequests:
    """The protocol's queue methods for a scheduler with a waiting queue
    (``self.waiting``) and a running list (``self.running``)."""

    def add_request(self, req: Request) -> None:
        self.waiting.add(req)

    def has_requests(self) -> bool:
        return bool(self.running) or bool(len(self.waiting))

    def get_request_counts(self) -> tuple[int, int]:
        return len(self.running), len(self.waiting)

    def drop_waiting(self, req: Request) -> bool:
        """Take ``req`` out of the waiting queue, if it waits there (the engine
        gives up on a request that livelocks, ``Engine._break_livelock``)."""
        if req not in self.waiting:
            return False
        self.waiting.remove(req)
        return True

    def close(self) -> None:
        """Nothing held in a cycle (the paged schedulers close their KV manager)."""
