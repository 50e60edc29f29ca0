"""The clients in front of the engines: when each request is sent.

A request is sent at its arrival time, or ``think_time_s`` after the request
it follows finishes (``after_request_id``: the next turn of a conversation),
or, for a closed-loop client (``concurrency``), as soon as one of its
requests is done. The front end hands each request to one target (an
``Engine``, or a router in front of several) through ``submit(spec,
arrival_time, index)``, and the target reports every finished or failed
request back through ``on_done``.

Every send is an event at an *absolute* time (``AtTime``), never ``now +
delay``: an idle engine then starts its step exactly at the arrival time,
as the real engine does, whatever the rounding of the difference.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator

import simpy
from simpy.core import NORMAL, URGENT
from simpy.events import Event

from kvsim.sched.errors import EngineError
from kvsim.workload.request import RequestSpec

Submit = Callable[[RequestSpec, float, int], None]


class AtTime(Event):
    """An event at an absolute time (not now + delay, which may round differently).

    ``urgent`` events fire before ordinary ones at the same instant: a
    request sent at time t is queued before an engine step that starts at t
    is scheduled. Uses SimPy's event queue directly.
    """

    def __init__(self, env: simpy.Environment, at: float, urgent: bool = False) -> None:
        super().__init__(env)
        self._ok = True
        self._value = None
        heapq.heappush(env._queue, (at, URGENT if urgent else NORMAL, next(env._eid), self))


def advance_in_place(env: simpy.Environment, at: float) -> bool:
    """Move the clock to ``at`` now, without an event, when no event is due before
    or at ``at``; False (nothing changed) when one is, and the caller waits for ``at``.

    What SimPy would do is then the same: the next event it would process is
    the caller's own wake-up at ``at``, so no other process can run, or see
    the state, in between (a tie waits, keeping SimPy's order at ``at``). Only
    the event and the generator switch are saved. Uses SimPy's clock directly,
    as ``AtTime`` its queue.
    """
    queue = env._queue
    if queue and queue[0][0] <= at:
        return False
    env._now = at
    return True


class Frontend:
    """Sends a workload's requests to ``submit`` at the right instants."""

    def __init__(self, env: simpy.Environment, specs: Iterable[RequestSpec], submit: Submit, *,
                 concurrency: int | None = None) -> None:
        self.env = env
        self._submit = submit
        self._specs: Iterator[RequestSpec] = iter(specs)
        self.concurrency = concurrency
        self._arrivals_done = False
        self._index = 0                    # request index: fresh token ids are unique per index
        self._parked: dict[str, list[RequestSpec]] = {}   # waiting on another request
        # Requests a later one may name (RequestSpec.may_be_followed): their
        # finish time, None until they finish. Only those: a run of 10 million
        # single-turn requests would otherwise keep 10 million entries (~1 GiB).
        self._finished_at: dict[str, float | None] = {}
        self._num_pending_releases = 0

    def start(self) -> None:
        if self.concurrency:
            for _ in range(self.concurrency):
                self._release_next_closed_loop()
            self._arrivals_done = True
        else:
            self.env.process(self._arrivals())

    def has_more_input(self) -> bool:
        """Whether any request may still be sent (an engine idles differently at the end)."""
        return not self._arrivals_done or self._num_pending_releases > 0

    def check_all_sent(self) -> None:
        stuck = sum(len(v) for v in self._parked.values())
        if stuck:
            raise EngineError(f"{stuck} requests wait on requests that never arrived")

    def on_done(self, request_id: str, finish_time: float) -> None:
        """A request finished or failed at ``finish_time``: release what waits on it."""
        # Kept for every request that may be followed: a later turn may name one
        # that finished (or failed on arrival) before the turn itself was read.
        if request_id in self._finished_at:
            self._finished_at[request_id] = finish_time
        for spec in self._parked.pop(request_id, ()):
            self._schedule_release(spec, finish_time + spec.think_time_s)
        if self.concurrency:
            self._release_next_closed_loop()

    # ------------------------------------------------------------ private

    def _arrivals(self):
        env = self.env
        for spec in self._specs:
            if spec.after_request_id is not None:
                self._park(spec)
                continue
            if spec.arrival_time_s > env.now:
                yield AtTime(env, spec.arrival_time_s, urgent=True)
            self._send(spec, max(spec.arrival_time_s, env.now))
        self._arrivals_done = True

    def _send(self, spec: RequestSpec, arrival_time: float) -> None:
        index = self._index
        self._index += max(spec.n, 1)      # n > 1: one index per sample
        if spec.may_be_followed:           # before submit: a refused request is done at once
            self._finished_at.setdefault(spec.request_id, None)
        self._submit(spec, arrival_time, index)

    def _park(self, spec: RequestSpec) -> None:
        dep = spec.after_request_id
        finished = self._finished_at.get(dep)
        if finished is not None:
            self._schedule_release(spec, finished + spec.think_time_s)
        else:
            self._parked.setdefault(dep, []).append(spec)

    def _schedule_release(self, spec: RequestSpec, at: float) -> None:
        if at <= self.env.now:
            # Due now: it must be visible to the step that starts now.
            self._send(spec, self.env.now)
            return
        self._num_pending_releases += 1

        def release(_event, spec=spec, at=at):
            self._num_pending_releases -= 1
            self._send(spec, at)

        AtTime(self.env, at, urgent=True).callbacks.append(release)

    def _release_next_closed_loop(self) -> None:
        """A client is free: it sends its next request, not before that request's
        own send time (``vllm bench serve --max-concurrency`` with a request rate:
        a semaphore around timed sends)."""
        spec = next(self._specs, None)
        if spec is not None:
            self._schedule_release(spec, max(self.env.now, spec.arrival_time_s))
