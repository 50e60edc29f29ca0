"""Requests submitted to an engine that its scheduler has not seen yet, and when it will.

vLLM's engine core adds the requests in its input queue to the scheduler
before each ``schedule()`` (``vllm/v1/engine/core.py``, ``EngineCoreProc.run_busy_loop``:
``_process_input_queue`` then ``_process_engine_step``). Synchronously, the
next ``schedule()`` runs when the step in flight has ended, so it sees every
request submitted before then.

With ``async_scheduling`` (``EngineCore.step_with_batch_queue``, a batch
queue of two), step N+1 is scheduled right after step N is launched, while N
runs, and the input queue is read again only after N's outputs are in. A
request submitted while step N runs is therefore first scheduled in step
N+2: the ``schedule()`` due when N ends saw only the requests submitted up to
N's start. After an idle engine, or a step that scheduled nothing (an empty
batch costs the loop no time), nothing is ahead, and every request is seen.
"""

from __future__ import annotations

from kvsim.sched.request import Request


class Inbox:
    """FIFO of submitted requests, with each one's submit time."""

    def __init__(self, async_scheduling: bool = False) -> None:
        self.async_scheduling = async_scheduling
        self._reqs: list[Request] = []
        self._times: list[float] = []
        # Start of the step during which the next schedule() was made (async only).
        self._scheduled_at: float | None = None

    def __len__(self) -> int:
        return len(self._reqs)

    @property
    def scheduled_ahead(self) -> bool:
        """Whether the next ``schedule()`` was already made (during the last step)."""
        return self._scheduled_at is not None

    def add(self, req: Request, now: float) -> None:
        self._reqs.append(req)
        self._times.append(now)

    def step_started(self, start: float) -> None:
        """A step that schedules work began at ``start``: the next schedule() happens then."""
        if self.async_scheduling:
            self._scheduled_at = start

    def nothing_ahead(self) -> None:
        """The engine idled, or a step scheduled nothing: the next schedule() sees everything."""
        self._scheduled_at = None

    def take(self, now: float) -> list[Request]:
        """The requests the next ``schedule()`` sees, removed from the inbox.

        Each gets its ``queued_time``, when vLLM's engine core read it from the
        input queue (the ``QUEUED`` event, ``queued_ts``): now; or, when the
        schedule due now was made during the last step, the start of that
        step: the engine core read these requests (submitted during the step
        before it) once that earlier step's outputs were in.
        """
        if not self._reqs:
            return []                     # the usual case: nothing was submitted
        cutoff = self._scheduled_at
        n = len(self._reqs)
        if cutoff is not None:
            n = 0
            while n < len(self._times) and self._times[n] <= cutoff:
                n += 1
        taken = self._reqs[:n]
        queued = now if cutoff is None else cutoff
        for req in taken:
            req.queued_time = queued
        del self._reqs[:n], self._times[:n]
        return taken

    def take_all(self, now: float) -> list[Request]:
        self.nothing_ahead()
        return self.take(now)
