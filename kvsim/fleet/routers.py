"""Routers: which replica serves a request, decided when it arrives.

A router sees the candidate replicas through ``ReplicaState``
(kvsim/fleet/state.py: ``num_running``, ``num_waiting``, ``kv_cache_usage()``,
``prefix_hit_blocks(block_hashes)``) at the arrival instant, plus whatever it
remembers itself (the approximate prefix indexes, sessions, a counter).
``route(req, replicas, now)`` returns the chosen index and records the choice.
Every choice is deterministic: random draws come from the run's seeded
generator and every tie is broken by a stated rule.

============== ======================================================================
policy         rule (source)
============== ======================================================================
round_robin    request k -> replica k mod N (Vidur RoundRobinGlobalScheduler)
random         uniform draw (Vidur RandomGlobalScheduler)
least_loaded   fewest running + waiting, ties to the lowest index (Vidur
               LORGlobalScheduler ``min`` over replicas; SGLang shortest queue)
kv_utilization lowest KV-cache usage, ties to the lowest index
prefix_aware   SGLang cache-aware (sgl-router src/policies/cache_aware.rs), below
session_affinity  the previous turn's replica, else ``fallback``
weighted       sum of weighted llm-d scorers (scorers.py), the highest wins, ties
               uniformly at random (llm-d max-score picker: shuffle, stable sort)
kv_router      NVIDIA Dynamo's KV router cost, below
============== ======================================================================
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from kvsim.fleet import config as cfg
from kvsim.fleet.prefix_tree import ApproxPrefixTree
from kvsim.fleet.scorers import make_scorer
from kvsim.fleet.state import ReplicaInfo, ReplicaState, RouteRequest


class Router:
    """Base class: ``select`` decides, ``on_routed`` remembers."""

    def __init__(self, infos: Sequence[ReplicaInfo], rng: np.random.Generator) -> None:
        self.infos = list(infos)
        self.rng = rng

    def route(self, req: RouteRequest, replicas: Sequence[ReplicaState], now: float) -> int:
        index = self.select(req, replicas, now)
        self.on_routed(req, index, now)
        return index

    def select(self, req: RouteRequest, replicas: Sequence[ReplicaState], now: float) -> int:
        raise NotImplementedError

    def on_routed(self, req: RouteRequest, index: int, now: float) -> None:
        pass

    def choices_ahead(self, count: int, num_replicas: int) -> list[int] | None:
        """The indices ``route`` would return for the next ``count`` requests, taken
        now, when they depend on neither the requests nor the replicas nor the
        time; None otherwise (kvsim/fleet/separate.py then routes one by one)."""
        return None


def load(r: ReplicaState) -> int:
    """Requests on a replica: running + waiting (SGLang ``Worker::load``, Vidur pending)."""
    return r.num_running + r.num_waiting


def argmin_first(values: Sequence[float]) -> int:
    """Index of the smallest value, the first one on ties (Rust ``min_by_key``, Python ``min``)."""
    best = 0
    for i in range(1, len(values)):
        if values[i] < values[best]:
            best = i
    return best


class RoundRobinRouter(Router):
    def __init__(self, infos, rng) -> None:
        super().__init__(infos, rng)
        self.counter = 0

    def select(self, req, replicas, now):
        index = self.counter % len(replicas)
        self.counter += 1
        return index

    def choices_ahead(self, count, num_replicas):
        first = self.counter
        self.counter += count
        return [k % num_replicas for k in range(first, first + count)]


class RandomRouter(Router):
    def select(self, req, replicas, now):
        return int(self.rng.integers(len(replicas)))


class LeastLoadedRouter(Router):
    def select(self, req, replicas, now):
        return argmin_first([load(r) for r in replicas])


class KvUtilizationRouter(Router):
    def select(self, req, replicas, now):
        return argmin_first([r.kv_cache_usage() for r in replicas])


class SessionAffinityRouter(Router):
    """Later turns of a session go to the replica that served the previous turn.

    llm-d's session-affinity scorer reads the replica from the session token
    the previous response carried; kvsim remembers it per request id. A first
    turn (or a previous turn kvsim did not route) goes to the fallback policy.
    """

    def __init__(self, infos, rng, fallback: Router) -> None:
        super().__init__(infos, rng)
        self.fallback = fallback
        self.served_by: dict[str, int] = {}

    def select(self, req, replicas, now):
        prev = self.served_by.get(req.previous_request_id) if req.previous_request_id else None
        if prev is not None:
            return prev
        return self.fallback.route(req, replicas, now)

    def on_routed(self, req, index, now):
        self.served_by[req.request_id] = index


class WeightedRouter(Router):
    """llm-d scheduling profile: ``sum(weight * scorer)``, max-score picker."""

    def __init__(self, infos, rng, config: cfg.WeightedRouter) -> None:
        super().__init__(infos, rng)
        n = len(self.infos)
        self.scorers = [(make_scorer(name, n, config), w) for name, w in config.scorers.items()]

    def scores(self, req, replicas, now) -> list[float]:
        total = [0.0] * len(replicas)
        for scorer, weight in self.scorers:
            for i, s in enumerate(scorer.score(req, replicas, now)):
                total[i] += weight * s
        return total

    def select(self, req, replicas, now):
        total = self.scores(req, replicas, now)
        best = max(total)
        ties = [i for i, s in enumerate(total) if s == best]
        return ties[0] if len(ties) == 1 else ties[int(self.rng.integers(len(ties)))]

    def on_routed(self, req, index, now):
        for scorer, _ in self.scorers:
            scorer.on_routed(req, index, now)


class PrefixAwareRouter(Router):
    """SGLang's cache-aware policy (sgl-router ``CacheAwarePolicy::select_worker``).

    1. Imbalanced (``max_load - min_load > balance_abs_threshold`` and
       ``max_load > min_load * balance_rel_threshold``, loads = running +
       waiting): the least loaded replica (first on ties). The tree still
       records the request under it.
    2. Otherwise the replica with the longest cached prefix when its match
       rate (matched prompt tokens / prompt tokens) exceeds
       ``cache_threshold``;
    3. else, ``approximate``: the replica with the smallest tree (the most
       room, SGLang's ``get_smallest_tenant``); ``precise``: the least loaded.

    ``approximate`` matches against the router's own tree of routed prompts
    (prefix_tree.py), evicted every ``eviction_interval_s`` of simulated time
    down to ``max_tree_size`` tokens per replica, as SGLang's eviction thread
    does. ``precise`` matches against the replicas' real caches
    (``prefix_hit_blocks``; longest wins, first on ties) and keeps no tree:
    SGLang's rule fed with what llm-d's precise scorer or Dynamo's KV events
    know.
    """

    def __init__(self, infos, rng, config: cfg.PrefixAwareRouter) -> None:
        super().__init__(infos, rng)
        self.config = config
        self.tree = ApproxPrefixTree(len(self.infos)) if config.mode == "approximate" else None
        self.next_eviction_s = config.eviction_interval_s
        self.num_load_balanced = 0           # decisions taken by rule 1 (SGLang's metric)

    def _imbalanced(self, loads: list[int]) -> bool:
        hi, lo = max(loads), min(loads)
        c = self.config
        return hi - lo > c.balance_abs_threshold and hi > lo * c.balance_rel_threshold

    def select(self, req, replicas, now):
        if self.tree is not None and now >= self.next_eviction_s:
            interval = self.config.eviction_interval_s
            block = self.infos[0].block_size
            self.tree.evict(self.config.max_tree_size // block)
            self.next_eviction_s = (math.floor(now / interval) + 1) * interval
        loads = [load(r) for r in replicas]
        if self._imbalanced(loads):
            self.num_load_balanced += 1
            return argmin_first(loads)
        if self.tree is not None:
            matched, best = self.tree.prefix_match(req.block_hashes, now)
        else:
            hits = [r.prefix_hit_blocks(req.block_hashes) if req.block_hashes else 0
                    for r in replicas]
            best = argmin_first([-h for h in hits])
            matched = hits[best]
        rate = matched * req.block_size / req.num_prompt_tokens if req.num_prompt_tokens else 0.0
        if best is not None and rate > self.config.cache_threshold:
            return best
        if self.tree is not None:
            return self.tree.smallest_tenant()
        return argmin_first(loads)

    def on_routed(self, req, index, now):
        if self.tree is not None:
            self.tree.insert(req.block_hashes, index, now)


class KvRouter(Router):
    """NVIDIA Dynamo's KV router (lib/llm/src/kv_router/scheduler.rs ``DefaultWorkerSelector``).

    ``logit = overlap_score_weight * prefill_blocks + decode_blocks`` per
    replica, the lowest wins; with ``temperature > 0`` the logits are
    min-max normalised and sampled by softmax of ``-logit / temperature``.
    ``prefill_blocks`` = the prompt's blocks this replica would compute
    (prompt tokens less its cached prefix, over the block size);
    ``decode_blocks`` = the KV blocks it holds now plus the request's new
    blocks. Dynamo also counts the prefill tokens of requests it routed there
    that have not produced their first token; kvsim's routers are not told
    when a first token appears, so that term is left out (as Vidur's
    DynamoStyleKVGlobalScheduler does). Temperature 0 ties: uniformly at
    random (Dynamo returns every tied worker and picks one).
    """

    def __init__(self, infos, rng, config: cfg.KvRouter) -> None:
        super().__init__(infos, rng)
        self.config = config

    def logits(self, req, replicas) -> list[float]:
        out = []
        bs = req.block_size
        for info, r in zip(self.infos, replicas):
            hit = r.prefix_hit_blocks(req.block_hashes) if req.block_hashes else 0
            prefill_blocks = max(req.num_prompt_tokens - hit * bs, 0) / bs
            active = round(r.kv_cache_usage() * info.num_usable_blocks)
            decode_blocks = active + req.num_prompt_blocks - hit
            out.append(self.config.overlap_score_weight * prefill_blocks + decode_blocks)
        return out

    def select(self, req, replicas, now):
        logits = self.logits(req, replicas)
        t = self.config.temperature
        if t == 0.0:
            best = min(logits)
            ties = [i for i, v in enumerate(logits) if v == best]
            return ties[0] if len(ties) == 1 else ties[int(self.rng.integers(len(ties)))]
        lo, hi = min(logits), max(logits)
        if hi == lo:
            return int(self.rng.integers(len(logits)))
        z = -(np.asarray(logits) - lo) / (hi - lo) / t
        p = np.exp(z - z.max())
        return int(self.rng.choice(len(logits), p=p / p.sum()))


_SIMPLE = {"round_robin": RoundRobinRouter, "random": RandomRouter,
           "least_loaded": LeastLoadedRouter, "kv_utilization": KvUtilizationRouter}


def build_router(config, infos: Sequence[ReplicaInfo], rng: np.random.Generator) -> Router:
    """The router a ``cluster.router`` (or ``decode_router``) section asks for."""
    policy = config.policy
    if policy in _SIMPLE:
        return _SIMPLE[policy](infos, rng)
    if policy == "session_affinity":
        return SessionAffinityRouter(infos, rng, _SIMPLE[config.fallback](infos, rng))
    if policy == "weighted":
        return WeightedRouter(infos, rng, config)
    if policy == "prefix_aware":
        return PrefixAwareRouter(infos, rng, config)
    if policy == "kv_router":
        return KvRouter(infos, rng, config)
    raise ValueError(f"cluster.router.policy: {policy!r} is not one of {', '.join(cfg.POLICIES)}")

