"""Many replicas in one SimPy environment, fed through a router.

::

    workload specs ──> front end ──submit──> Fleet: router ──> replica k (scheduler + KV + cost)
                          ^                                        │
                          └────────────── on_done(req) ────────────┘

``Fleet`` looks to a front end like one engine: ``submit(spec)`` routes the
request at that instant (the router reads the replicas' ``ReplicaState``) and
hands it to the chosen replica; ``on_done`` reports every finished or failed
request, whichever replica ran it; ``close()`` says nothing more will come.
Replicas never talk to each other.

The front end releases each request at its arrival time, a later turn
``think_time_s`` after its previous turn finishes, a closed-loop client's next
request when its last one finishes. The lead's engine rewrite (#12) moves
those rules out of ``Engine`` into ``kvsim/sim/frontend.py``, which will drive
a ``Fleet`` as it drives an engine; until then ``FrontEnd`` below is a copy of
the engine's rules (URGENT arrival events, so a request arriving at a step
boundary is seen by that step), so that a one-replica fleet reproduces
``kvsim.simulate`` exactly (tests/test_fleet_runner.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import count

import numpy as np
import simpy

from kvsim.fleet.config import ClusterConfig
from kvsim.fleet.replica import PoolPlan, PrototypeReplica, make_replica
from kvsim.fleet.routers import Router, build_router
from kvsim.fleet.state import ReplicaInfo, route_request
from kvsim.sched.request import Request
from kvsim.sim.engine import _ArrivalTimeout
from kvsim.workload.request import RequestSpec

# The router's random stream is its own: the workload draws from the run's
# generator first, and a router that draws must not change the workload.
ROUTER_STREAM = 0x524F55544552          # "ROUTER"

# Policies and scorers that read the prompt's block hashes.
_HASHING_POLICIES = {"prefix_aware", "kv_router"}
_HASHING_SCORERS = {"prefix_cache", "precise_prefix_cache"}


def router_needs_hashes(router_cfg) -> bool:
    if router_cfg.policy in _HASHING_POLICIES:
        return True
    return router_cfg.policy == "weighted" and bool(_HASHING_SCORERS & set(router_cfg.scorers))


@dataclass
class FleetRun:
    """What a fleet run produced: every replica with its records, in pool order."""

    replicas: list[PrototypeReplica]
    infos: list[ReplicaInfo]
    router: Router
    num_routed: list[int]


class Fleet:
    """Replicas of mixed pools behind one router (P/D pools: docs/fleet.md, not yet run)."""

    def __init__(self, pools: Sequence[PoolPlan], cluster: ClusterConfig, *, seed: int,
                 env: simpy.Environment | None = None, fast_path: bool = True) -> None:
        if any(p.role != "mixed" for p in pools):
            raise NotImplementedError(
                "cluster.pools: prefill/decode pools need the engine's remote-KV admission "
                "(WAITING_FOR_REMOTE_KVS), which lands with the engine rewrite (#12); "
                "see docs/fleet.md")
        self.env = env if env is not None else simpy.Environment(initial_time=0.0)
        self.on_done: Callable[[Request], None] | None = None
        next_index = count().__next__
        self.replicas: list[PrototypeReplica] = []
        self.infos: list[ReplicaInfo] = []
        for pool in pools:
            for k in range(pool.replicas):
                name = f"{pool.name}-{k}"
                self.replicas.append(make_replica(self.env, name, pool, on_done=self._replica_done,
                                                  next_index=next_index, fast_path=fast_path))
                self.infos.append(ReplicaInfo(name, pool.name, pool.role, pool.sched_config.block_size,
                                              pool.sched_config.num_gpu_blocks - 1))
        self.block_size = self.infos[0].block_size
        self.router = build_router(cluster.router, self.infos, np.random.default_rng([seed, ROUTER_STREAM]))
        self._hash = router_needs_hashes(cluster.router)
        self.num_routed = [0] * len(self.replicas)

    # ------------------------------------------------ what a front end drives

    def submit(self, spec: RequestSpec, arrival_time: float | None = None) -> None:
        """Route ``spec`` now and hand it to the chosen replica."""
        req = route_request(spec, self.block_size, hash_blocks=self._hash)
        index = self.router.route(req, self.replicas, self.env.now)
        self.num_routed[index] += 1
        self.replicas[index].submit(spec, arrival_time)

    def start(self) -> None:
        for replica in self.replicas:
            replica.start()

    def close(self) -> None:
        for replica in self.replicas:
            replica.close()

    def _replica_done(self, replica: PrototypeReplica, req: Request) -> None:
        if self.on_done is not None:
            self.on_done(req)

    # ------------------------------------------------------------------ run

    def run(self, specs: Iterable[RequestSpec], *, concurrency: int | None = None) -> FleetRun:
        FrontEnd(self.env, self).run(specs, concurrency=concurrency)
        return FleetRun(self.replicas, self.infos, self.router, self.num_routed)


class FrontEnd:
    """Releases requests to a target (``submit``/``start``/``close``/``on_done``) by the engine's rules.

    A copy of ``Engine._arrivals``/``_park``/``_schedule_release`` and the
    closed loop, standing in for the lead's ``kvsim/sim/frontend.py``.
    """

    def __init__(self, env: simpy.Environment, target) -> None:
        self.env = env
        self.target = target
        target.on_done = self._on_done
        self._specs: Iterator[RequestSpec] = iter(())
        self._concurrency: int | None = None
        self._arrivals_done = self._exhausted = self._closed = False
        self._parked: dict[str, list[RequestSpec]] = {}
        self._finished_at: dict[str, float] = {}
        self._num_pending_releases = 0

    def run(self, specs: Iterable[RequestSpec], *, concurrency: int | None = None) -> None:
        self._specs = iter(specs)
        self._concurrency = concurrency
        if concurrency:
            for _ in range(concurrency):
                self._release_next_closed_loop()
            self._arrivals_done = True
            self._maybe_close()
        else:
            self.env.process(self._arrivals())
        self.target.start()                  # after the arrivals process, as Engine.run orders them
        self.env.run()
        stuck = sum(len(v) for v in self._parked.values())
        if stuck:
            raise RuntimeError(f"{stuck} requests wait on requests that never arrived")

    def _arrivals(self):
        env = self.env
        for spec in self._specs:
            if spec.after_request_id is not None:
                self._park(spec)
                continue
            delay = spec.arrival_time_s - env.now
            if delay > 0:
                yield _ArrivalTimeout(env, delay)
            self.target.submit(spec, max(spec.arrival_time_s, env.now))
        self._exhausted = self._arrivals_done = True
        self._maybe_close()

    def _on_done(self, req: Request) -> None:
        self._finished_at[req.request_id] = req.finish_time
        for spec in self._parked.pop(req.request_id, ()):
            self._schedule_release(spec, req.finish_time + spec.think_time_s)
        if self._concurrency:
            self._release_next_closed_loop()
        self._maybe_close()

    def _park(self, spec: RequestSpec) -> None:
        dep = spec.after_request_id
        if dep in self._finished_at:
            self._schedule_release(spec, self._finished_at[dep] + spec.think_time_s)
        else:
            self._parked.setdefault(dep, []).append(spec)

    def _schedule_release(self, spec: RequestSpec, at: float) -> None:
        if at <= self.env.now:
            self.target.submit(spec, self.env.now)
            return
        self._num_pending_releases += 1

        def release(_event, spec=spec, at=at):
            self._num_pending_releases -= 1
            self.target.submit(spec, at)
            self._maybe_close()

        ev = _ArrivalTimeout(self.env, max(0.0, at - self.env.now))
        ev.callbacks.append(release)

    def _release_next_closed_loop(self) -> None:
        spec = next(self._specs, None)
        if spec is None:
            self._exhausted = True
        else:
            self._schedule_release(spec, self.env.now)

    def _maybe_close(self) -> None:
        """Tell the target no more requests will come, once that is so."""
        if self._closed or not self._arrivals_done or self._num_pending_releases:
            return
        if any(self._parked.values()) or not self._exhausted:
            return
        self._closed = True
        self.target.close()
