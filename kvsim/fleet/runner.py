"""Many replicas in one SimPy environment, fed through a router.

::

    workload specs ──> Frontend ──submit──> Fleet: router ──> replica k (Engine)
                          ^                                       │
                          └──────────── on_done(req) ─────────────┘

The front end (kvsim/sim/frontend.py) sends each request at its arrival time,
a later turn ``think_time_s`` after the previous one finishes, a closed-loop
client's next request when its last one is done, exactly as for one engine.
``Fleet.submit`` takes the engine's place: it asks the router for a replica
at that instant (the router reads the replicas' ``ReplicaState``) and hands
the request to it. Every replica reports to the same front end. Replicas
never talk to each other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import simpy

from kvsim.fleet.config import ClusterConfig
from kvsim.fleet.replica import PoolPlan, make_replica
from kvsim.fleet.routers import Router, build_router
from kvsim.fleet.state import ReplicaInfo, route_request
from kvsim.sim.engine import Engine
from kvsim.sim.frontend import Frontend
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


def _named_trace(trace, name: str):
    """A replica's step records, each with its ``replica`` name, to the run's trace."""
    if trace is None:
        return None
    return lambda record: trace({"replica": name, **record})


@dataclass
class FleetRun:
    """What a fleet run produced: every replica with its records, in pool order."""

    replicas: list[Engine]
    infos: list[ReplicaInfo]
    pools: list[PoolPlan]
    router: Router
    num_routed: list[int]


class Fleet:
    """Replicas of mixed pools behind one router (P/D pools: docs/fleet.md, not yet run)."""

    def __init__(self, pools: Sequence[PoolPlan], cluster: ClusterConfig, *, seed: int,
                 env: simpy.Environment | None = None, fast_path: bool = True,
                 trace: Callable[[dict], None] | None = None,
                 progress: Callable[[float, int], None] | None = None) -> None:
        if any(p.role != "mixed" for p in pools):
            raise NotImplementedError(
                "cluster.pools: prefill/decode pools need the engine's remote-KV admission "
                "(WAITING_FOR_REMOTE_KVS) and held prefill blocks, not in the engine yet; "
                "see docs/fleet.md")
        self.env = env if env is not None else simpy.Environment(initial_time=0.0)
        self.frontend: Frontend | None = None
        self.replicas: list[Engine] = []
        self.infos: list[ReplicaInfo] = []
        self.pools = list(pools)
        self._progress = progress
        shared_kv: dict = {}        # a KV store the replicas share (kvtiers: kv/offload_engine.py)
        for pool in pools:
            for k in range(pool.replicas):
                name = f"{pool.name}-{k}"
                self.replicas.append(make_replica(
                    self.env, name, pool, on_done=self._on_done, more_input=self._more_input,
                    fast_path=fast_path, trace=_named_trace(trace, name),
                    progress=self._report if progress is not None else None, shared_kv=shared_kv))
                self.infos.append(ReplicaInfo(name, pool.name, pool.role, pool.sched_config.block_size,
                                              pool.sched_config.num_gpu_blocks - 1))
        self.block_size = self.infos[0].block_size
        self.router = build_router(cluster.router, self.infos, np.random.default_rng([seed, ROUTER_STREAM]))
        self._hash = router_needs_hashes(cluster.router)
        self.num_routed = [0] * len(self.replicas)

    def submit(self, spec: RequestSpec, arrival_time: float, index: int) -> None:
        """Route ``spec`` now and hand it to the chosen replica (the front end's target)."""
        req = route_request(spec, self.block_size, hash_blocks=self._hash)
        k = self.router.route(req, self.replicas, self.env.now)
        self.num_routed[k] += 1
        self.replicas[k].submit(spec, arrival_time, index)

    def _on_done(self, req) -> None:
        self.frontend.on_done(req.request_id, req.finish_time)

    def _more_input(self) -> bool:
        return self.frontend.has_more_input()

    def _report(self, now_s: float, _num_done: int) -> None:
        # Each replica calls this every 256 of its steps; the count is the fleet's.
        self._progress(now_s, sum(r.num_done for r in self.replicas))

    def run(self, specs: Iterable[RequestSpec], *, concurrency: int | None = None) -> FleetRun:
        self.frontend = Frontend(self.env, specs, self.submit, concurrency=concurrency)
        self.frontend.start()
        for replica in self.replicas:
            replica.start()
        self.env.run()
        for replica in self.replicas:
            replica.close()
        self.frontend.check_all_sent()
        return FleetRun(self.replicas, self.infos, self.pools, self.router, self.num_routed)
