"""Replicas that cannot affect one another, simulated one at a time (issue 14's speed clause).

A fleet whose router reads no replica state (``round_robin``, ``random``: the
choice depends only on the arrival order and the router's own counter or
random stream) serving requests that wait on no other request (no session
turns, no closed-loop clients) is N engines that never interact: each
replica's events depend only on the requests routed to it, at their arrival
instants, and on when the last request of the whole workload is sent (an
engine that just finished requests takes one more step before it sleeps
while input may still come: ``Engine`` ``more_input``).

Simulating them in one SimPy queue interleaves 16 replicas' steps: every
replica's data leaves the CPU caches between two of its steps, a decode run
cannot be bounded by the replica's own next arrival (the queue's next event
is another replica's), so it is costed to its natural end and then cut by
a submit (``Engine._cut_run``), and each cut is an interrupt. Here each
replica has its own environment: the requests are read in windows of
``WINDOW`` (or fewer holding ``WINDOW_TOKENS`` prompt tokens), routed in
arrival order (the same decisions as the shared queue's front end makes),
scheduled as arrival events in their replica's
environment, and each replica is then advanced, one after the other, through
its events before the window's last arrival. Its decode runs are bounded by
its own next arrival (``env.peek``, as a single engine's are). An event at
the window's last arrival, doing nothing, keeps an engine from moving its
clock in place (``advance_in_place``) past arrivals not read yet.

``only`` (``Fleet(only=...)``) simulates some of the replicas: every request
is still routed, the others' are dropped. A process of
kvsim/scenario/cluster_parallel.py runs its share of the fleet so.

The results are those of the shared queue, bit for bit: within a replica
the events and their order are the same (arrivals are urgent events at
their absolute instants, as ``Frontend`` sends them; same-instant arrivals
keep their order and come before what they cause), and nothing crosses
replicas. tests/test_fleet_separate.py compares the two paths.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial

import simpy

from kvsim.fleet.state import route_request
from kvsim.sim.frontend import AtTime
from kvsim.workload.request import RequestSpec

# Requests read, routed and scheduled before the replicas are advanced: large
# enough that a replica runs many of its steps in a row, small enough that
# few specs (each with its prompt ids) wait in memory. At most WINDOW
# requests and WINDOW_TOKENS prompt tokens (int64 ids: 64 MB), whichever
# comes first: W7 (16 replicas, prompts of ~1,000 tokens) reads ~7,000 at a
# time, a trace of 10,000-token prompts ~800. Measured on W7 (2 workers):
# 1,024 requests a window 32.5-33.3 s of the workers' CPU, 8,192 31.6-31.7 s,
# 16,384 31.2-31.4 s, 32,768 31.7-32.2 s (each replica's data leaves the CPU
# caches less often). The results do not depend on the window.
WINDOW = 8192
WINDOW_TOKENS = 8 << 20

# Routers whose choice reads no replica state (kvsim/fleet/routers.py).
STATELESS_POLICIES = ("round_robin", "random")


class SeparateRun:
    """Feeds a fleet's replicas, each in its own environment, window by window."""

    def __init__(self, fleet, only: Iterable[int] | None = None) -> None:
        self.fleet = fleet
        # The replicas simulated here: every request is still routed (the
        # router's choices depend on all of them), but only these run.
        self.only = None if only is None else frozenset(only)
        self.all_read = False
        self.last_send = 0.0          # when the front end sends its last request

    def more_input(self, env: simpy.Environment) -> bool:
        """The front end's ``has_more_input`` as replica ``env`` would see it in the
        shared queue: until the last request is sent (an urgent event, so a
        replica's step at that instant already sees it sent)."""
        return not self.all_read or env.now < self.last_send

    def run(self, specs: Iterable[RequestSpec]) -> None:
        fleet = self.fleet
        replicas = fleet.replicas
        router, front, block_size = fleet.router, fleet._front, fleet.block_size
        only = self.only
        ours = replicas if only is None else [r for k, r in enumerate(replicas) if k in only]
        it = iter(specs)
        send = 0.0                    # the front end's clock: arrivals in order, never before it
        index = 0                     # request index (fresh token ids), as Frontend._send
        started = False
        while not self.all_read:
            window, self.all_read = _next_window(it)
            # Round robin's choices depend on nothing but its counter: taken at once.
            choices = router.choices_ahead(len(window), len(front))
            for pos, spec in enumerate(window):
                if spec.after_request_id is not None:
                    raise ValueError(f"request {spec.request_id!r} waits on {spec.after_request_id!r}: "
                                     f"a separate fleet run needs requests that wait on none")
                if spec.arrival_time_s > send:
                    send = spec.arrival_time_s
                if choices is None:
                    req = route_request(spec, block_size, hash_blocks=False)
                    k = front[router.route(req, fleet._front_replicas, send)]
                else:
                    k = front[choices[pos]]
                fleet.num_routed[k] += 1
                if only is None or k in only:
                    engine = replicas[k]
                    AtTime(engine.env, send, urgent=True).callbacks.append(
                        partial(_arrive, engine, spec, send, index))
                index += max(spec.n, 1)
            self.last_send = send
            if not started and (send > 0 or self.all_read):
                # Started after every request sent at t=0 is queued: in the
                # shared queue the front end sends those before the engines start.
                for replica in ours:
                    replica.start()
                started = True
            if not self.all_read:
                for replica in ours:
                    env = replica.env
                    # What is fed ends at ``send``: an event there (doing nothing)
                    # keeps the engine from moving its clock past it in place
                    # (``advance_in_place``) before the next window's arrivals are in.
                    AtTime(env, send)
                    while env.peek() < send:
                        env.step()
        for replica in ours:
            replica.env.run()


def _next_window(specs) -> tuple[list[RequestSpec], bool]:
    """The next ``WINDOW`` specs, or fewer holding ``WINDOW_TOKENS`` prompt tokens,
    and whether ``specs`` ran out before the window was full."""
    window: list[RequestSpec] = []
    tokens = 0
    for spec in specs:
        window.append(spec)
        tokens += spec.num_prompt_tokens
        if len(window) >= WINDOW or tokens >= WINDOW_TOKENS:
            return window, False
    return window, True


def _arrive(engine, spec: RequestSpec, at: float, index: int, _event) -> None:
    engine.submit(spec, at, index)
