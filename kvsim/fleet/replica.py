"""One replica of a fleet: an engine in the fleet's SimPy environment.

The lead's engine rewrite (#12) gives ``Engine(env=..., name=...)``,
``engine.submit(spec)`` and an ``on_done(req)`` callback, and the replica
state routers read (kvsim/fleet/state.py). Until it lands, ``PrototypeReplica``
gets the same interface by subclassing today's ``Engine`` without changing
it: it swaps in the shared environment, starts only the engine process (the
fleet's front end does arrivals), and admits through ``Engine._admit``.
``make_replica`` is the one place that knows which of the two is in use.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import count

import simpy

from kvsim.cost.base import CostModel
from kvsim.sched.config import SchedulerConfig
from kvsim.sched.request import Request
from kvsim.sim.engine import Engine
from kvsim.sim.run import make_scheduler, request_problem
from kvsim.workload.request import RequestSpec


@dataclass(frozen=True)
class PoolPlan:
    """A resolved pool: what every replica of it runs (the scenario layer fills it in)."""

    name: str
    role: str                       # mixed | prefill | decode
    replicas: int
    scheduler: str                  # chunked | continuous | static
    sched_config: SchedulerConfig
    cost_model: CostModel
    tp: int = 1
    block_bytes_per_rank: int = 0   # one KV block on one TP rank (P/D transfers)
    kv_replicated: bool = False     # MLA: every rank holds the whole latent KV


class PrototypeReplica(Engine):
    """Today's ``Engine`` driven by a fleet: shared environment, ``submit``, ``on_done``."""

    def __init__(self, env: simpy.Environment, name: str, pool: PoolPlan, *,
                 on_done: Callable[[PrototypeReplica, Request], None],
                 next_index: Callable[[], int], fast_path: bool = True) -> None:
        config = pool.sched_config

        def make(spec: RequestSpec, _local_index: int, arrival: float) -> Request:
            # One index sequence for the whole fleet, so the fresh output ids of
            # requests on different replicas never coincide.
            return Request(spec, next_index(), block_size=config.block_size,
                           max_model_len=config.max_model_len, arrival_time=arrival,
                           hash_blocks=config.enable_prefix_caching, keep_tokens=config.debug)

        super().__init__(make_scheduler(pool.scheduler, config), pool.cost_model,
                         make_request=make, check_request=lambda r: request_problem(r, config),
                         fast_path=fast_path)
        self.env = env
        self.name = name
        self.pool = pool
        self._done_callback = on_done
        self._kv_pool = getattr(self.scheduler.kv, "pool", None)

    # ------------------------------------------------------------ driving

    def start(self) -> None:
        """Start the engine process (after the front end's, as ``Engine.run`` orders them)."""
        self.env.process(self._engine())

    def submit(self, spec: RequestSpec, arrival_time: float | None = None) -> None:
        """Hand ``spec`` to this replica now (its arrival time defaults to now)."""
        self._admit(spec, self.env.now if arrival_time is None else arrival_time)

    def close(self) -> None:
        """No more submissions: the engine process ends once the replica is idle."""
        self._arrivals_done = True
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _on_done(self, req: Request) -> None:
        super()._on_done(req)
        self._done_callback(self, req)

    # ---------------------------------------------------- ReplicaState

    @property
    def num_running(self) -> int:
        return self.scheduler.get_request_counts()[0]

    @property
    def num_waiting(self) -> int:
        return self.scheduler.get_request_counts()[1] + len(self._inbox)

    def kv_cache_usage(self) -> float:
        return self.scheduler.kv.usage

    def prefix_hit_blocks(self, block_hashes: Sequence[int]) -> int:
        pool = self._kv_pool
        if pool is None or not pool.enable_caching or not block_hashes:
            return 0
        return len(pool.get_cached_prefix(block_hashes, len(block_hashes)))


def make_replica(env: simpy.Environment, name: str, pool: PoolPlan, *,
                 on_done: Callable, next_index: Callable[[], int] | None = None,
                 fast_path: bool = True) -> PrototypeReplica:
    """A replica of ``pool`` named ``name`` in ``env`` (prototype until #12's Engine lands)."""
    if next_index is None:
        next_index = count().__next__
    return PrototypeReplica(env, name, pool, on_done=on_done, next_index=next_index,
                            fast_path=fast_path)
