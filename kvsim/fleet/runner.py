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
from dataclasses import dataclass, replace
from functools import partial

import numpy as np
import simpy

from kvsim.fleet.config import ClusterConfig
from kvsim.fleet.links import LinkPorts, load_link
from kvsim.fleet.pd import DecodeSide, PrefillSide, Transfer
from kvsim.fleet.replica import PoolPlan, make_replica
from kvsim.fleet.config import RoundRobinRouter
from kvsim.fleet.routers import Router, build_router
from kvsim.fleet.separate import STATELESS_POLICIES, SeparateRun
from kvsim.fleet.state import ReplicaInfo, route_request
from kvsim.sched.request import RequestStatus
from kvsim.sim.engine import Engine
from kvsim.sim.frontend import Frontend
from kvsim.sim.gc_pause import collector_paused
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


def runs_apart(pools: Sequence[PoolPlan], cluster: ClusterConfig, trace=None) -> bool:
    """Whether the replicas of an independent workload (no request waits on
    another, no closed loop) never affect one another: a router that reads no
    replica state, no trace, no P/D, no KV offloading (separate.py)."""
    return (trace is None and all(p.role == "mixed" for p in pools)
            and cluster.router.policy in STATELESS_POLICIES
            and all(p.connector_factory is None for p in pools))


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
    transfers: dict[str, Transfer] | None = None   # P/D: request id -> its KV move
    prefill_failed: list | None = None              # P/D: requests that failed on a prefill replica


class Fleet:
    """Replicas behind one router; with prefill/decode pools, the P/D flow of kvsim/fleet/pd.py.

    P/D: ``cluster.router`` picks the prefill replica at arrival; the request
    runs there with ``max_tokens=1``; when it finishes, ``decode_router``
    (round robin by default, as vLLM's toy proxy) picks the decode replica,
    which gets the original request and pulls the KV through its connector.
    """

    def __init__(self, pools: Sequence[PoolPlan], cluster: ClusterConfig, *, seed: int,
                 env: simpy.Environment | None = None, fast_path: bool = True,
                 trace: Callable[[dict], None] | None = None,
                 progress: Callable[[float, int], None] | None = None,
                 independent: bool = False, only: Sequence[int] | None = None) -> None:
        """``independent``: the caller promises that no request waits on another
        (no session turns, no closed loop). With a router that reads no replica
        state, no trace, no P/D and no KV offloading, the replicas then never
        affect one another and run each in its own environment (separate.py,
        the same results, faster); ``self.separate`` says whether they do
        (``runs_apart``). ``only``: of such a fleet, the replicas this process
        simulates (the others' requests are routed and dropped; a process of
        kvsim/scenario/cluster_parallel.py); None: all."""
        self.env = env if env is not None else simpy.Environment(initial_time=0.0)
        self.disaggregated = any(p.role != "mixed" for p in pools)
        self.separate = independent and env is None and runs_apart(pools, cluster, trace)
        if only is not None and not self.separate:
            raise ValueError("Fleet(only=...): only replicas that run apart can be simulated apart")
        self._separate_run = SeparateRun(self, only) if self.separate else None
        self.frontend: Frontend | None = None
        self.replicas: list[Engine] = []
        self.infos: list[ReplicaInfo] = []
        self.pools = list(pools)
        self._progress = progress
        self._reported_s = 0.0
        link = load_link(cluster.link) if self.disaggregated else None
        ports = LinkPorts()
        self.connectors: list[PrefillSide | DecodeSide | None] = []
        shared_kv: dict = {}        # a KV store the replicas share (kvtiers: kv/offload_engine.py)
        for pool in pools:
            for k in range(pool.replicas):
                name = f"{pool.name}-{k}"
                conn = (PrefillSide(name, pool) if pool.role == "prefill" else
                        DecodeSide(name, pool, link, ports) if pool.role == "decode" else None)
                env_k = simpy.Environment(initial_time=0.0) if self.separate else self.env
                on_done = (self._on_done if pool.role == "mixed" else
                           partial(self._on_prefill_done, len(self.replicas))
                           if pool.role == "prefill" else partial(self._on_decode_done, len(self.replicas)))
                if self.separate:
                    on_done = _nothing_waits
                more_input = (partial(self._separate_run.more_input, env_k) if self.separate
                              else self._more_input)
                engine = make_replica(
                    env_k, name, pool, on_done=on_done, more_input=more_input,
                    fast_path=fast_path, trace=_named_trace(trace, name),
                    progress=self._report if progress is not None else None, connector=conn,
                    shared_kv=shared_kv, bounded_by_peek=self.separate)
                if isinstance(conn, PrefillSide):
                    conn.engine = engine
                self.replicas.append(engine)
                self.connectors.append(conn)
                self.infos.append(ReplicaInfo(name, pool.name, pool.role, pool.sched_config.block_size,
                                              pool.sched_config.num_gpu_blocks - 1))
        self.block_size = self.infos[0].block_size
        rng = np.random.default_rng([seed, ROUTER_STREAM])
        front = [k for k, i in enumerate(self.infos) if i.role in ("mixed", "prefill")]
        self._front = front
        self._front_replicas = [self.replicas[k] for k in front]
        self._decode_replicas = [self.replicas[k] for k, i in enumerate(self.infos) if i.role == "decode"]
        self.router = build_router(cluster.router, [self.infos[k] for k in front], rng)
        self._hash = router_needs_hashes(cluster.router)
        self._decode = [k for k, i in enumerate(self.infos) if i.role == "decode"]
        self.decode_router = None
        if self._decode:
            dcfg = cluster.decode_router or RoundRobinRouter(policy="round_robin")
            self.decode_router = build_router(dcfg, [self.infos[k] for k in self._decode], rng)
            self._decode_hash = router_needs_hashes(dcfg)
        self.num_routed = [0] * len(self.replicas)
        self.transfers: dict[str, Transfer] = {}
        self.prefill_failed: list = []
        self._specs: dict[str, tuple[RequestSpec, int]] = {}   # in prefill: spec, index
        self._in_prefill = 0

    def submit(self, spec: RequestSpec, arrival_time: float, index: int) -> None:
        """Route ``spec`` now and hand it to the chosen replica (the front end's target)."""
        req = route_request(spec, self.block_size, hash_blocks=self._hash)
        k = self._front[self.router.route(req, self._front_replicas, self.env.now)]
        self.num_routed[k] += 1
        if self.disaggregated:
            # The proxy's prefill request: max_tokens 1, no samples (toy_proxy_server.py).
            self._specs[spec.request_id] = (spec, index)
            self._in_prefill += 1
            spec = replace(spec, max_tokens=1, output_token_ids=None, n=1)
        self.replicas[k].submit(spec, arrival_time, index)

    def _on_prefill_done(self, k_prefill: int, req) -> None:
        """P finished (its one token is the proxy's, dropped): send the request to a decode replica."""
        spec, index = self._specs.pop(req.request_id)
        self._in_prefill -= 1
        if req.status is RequestStatus.FAILED:
            self.prefill_failed.append(req)        # the proxy's prefill call fails: so does the request
            self._on_done(req)
            return
        source = self.connectors[k_prefill]
        route = route_request(spec, self.block_size, hash_blocks=self._decode_hash)
        j = self.decode_router.route(route, self._decode_replicas, self.env.now)
        k = self._decode[j]
        self.num_routed[k] += 1
        transfer = self.transfers[req.request_id] = Transfer(source.name, req.finish_time)
        self.connectors[k].expect(req.request_id, source, transfer)
        self.replicas[k].submit(spec, req.arrival_time, index)   # the client's arrival

    def _on_decode_done(self, k_decode: int, req) -> None:
        self.connectors[k_decode].release(req.request_id)   # refused or failed before pulling: P frees
        self._on_done(req)

    def _on_done(self, req) -> None:
        self.frontend.on_done(req.request_id, req.finish_time)

    def _more_input(self) -> bool:
        return self.frontend.has_more_input() or self._in_prefill > 0

    def _report(self, now_s: float, _num_done: int) -> None:
        # Each replica calls this every 256 of its steps; the count is the fleet's
        # (P/D: a request is done on its decode replica, or failed on its prefill one).
        done = sum(r.num_done for r, i in zip(self.replicas, self.infos) if i.role != "prefill")
        if self.separate:
            # Replicas run one after another (separate.py): never report time going back.
            now_s = self._reported_s = max(self._reported_s, now_s)
        self._progress(now_s, done + len(self.prefill_failed))

    def run(self, specs: Iterable[RequestSpec], *, concurrency: int | None = None) -> FleetRun:
        if self.separate:
            if concurrency:
                raise ValueError("a closed loop (concurrency) is not an independent workload")
            with collector_paused():             # kvsim/sim/gc_pause.py
                self._separate_run.run(specs)
            self._close()
            return FleetRun(self.replicas, self.infos, self.pools, self.router, self.num_routed)
        self.frontend = Frontend(self.env, specs, self.submit, concurrency=concurrency)
        self.frontend.start()
        for replica in self.replicas:
            replica.start()
        with collector_paused():                 # kvsim/sim/gc_pause.py
            self.env.run()
        self.frontend.check_all_sent()
        self._close()
        if not self.disaggregated:
            return FleetRun(self.replicas, self.infos, self.pools, self.router, self.num_routed)
        return FleetRun(self.replicas, self.infos, self.pools, self.router, self.num_routed,
                        transfers=self.transfers, prefill_failed=self.prefill_failed)

    def _close(self) -> None:
        """The run is over: close every replica (Engine.close) and drop the back references
        (the front end's and the separate run's to the fleet, a prefill connector's to its
        engine), so that a finished fleet is freed by reference counting, untraced by the
        collector (kvsim/sim/gc_pause.py)."""
        for replica in self.replicas:
            replica.close()
        for conn in self.connectors:
            if isinstance(conn, PrefillSide):
                conn.engine = None
        self.frontend = self._separate_run = None


def _nothing_waits(_req) -> None:
    """A separate run's on_done: no request waits on another (separate.py)."""
