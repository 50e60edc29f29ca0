"""llm-d's scorers: each gives every candidate replica a score in [0, 1].

A weighted router (routers.WeightedRouter) adds them up with their weights
and picks the highest, as an llm-d scheduling profile with the max-score
picker does. Each scorer reads the replicas' state at the arrival instant
(``ReplicaState``) or keeps router-side state it updates in ``on_routed``.

Sources (llm-d/llm-d-inference-scheduler and
kubernetes-sigs/gateway-api-inference-extension, pkg/epp/.../plugins):

* ``queue``: ``scorer/queue.go``, min-max normalised waiting-queue depth;
* ``kv_cache_utilization``: ``scorer/kvcache_utilization.go``, 1 - usage;
* ``prefix_cache``: ``multi/prefix/plugin.go`` + ``indexer.go``, the
  approximate scorer: per replica an LRU of the block hashes routed there;
* ``precise_prefix_cache``: ``scorer/preciseprefixcache`` with llm-d-kv-cache's
  ``LongestPrefixScorer``, the replicas' real cached blocks (kept current by
  vLLM's KV events; kvsim reads them directly);
* ``session_affinity``: ``scorer/session_affinity``, 1 for the replica that
  served the session's previous request.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence

from kvsim.fleet import config
from kvsim.fleet.state import ReplicaState, RouteRequest


class Scorer:
    """One scorer of a weighted router."""

    def score(self, req: RouteRequest, replicas: Sequence[ReplicaState], now: float) -> list[float]:
        raise NotImplementedError

    def on_routed(self, req: RouteRequest, index: int, now: float) -> None:
        """The request went to replica ``index`` (router-side bookkeeping)."""


class QueueScorer(Scorer):
    """(max - q) / (max - min) of the waiting-queue sizes; all equal -> 1.0 (queue.go)."""

    def score(self, req, replicas, now):
        waiting = [r.num_waiting for r in replicas]
        lo, hi = min(waiting), max(waiting)
        if hi == lo:
            return [1.0] * len(waiting)
        return [(hi - q) / (hi - lo) for q in waiting]


class KvCacheUtilizationScorer(Scorer):
    """1 - KV-cache usage (kvcache_utilization.go)."""

    def score(self, req, replicas, now):
        return [1.0 - r.kv_cache_usage() for r in replicas]


class ApproxPrefixScorer(Scorer):
    """The approximate prefix-cache scorer: matched / total blocks of the prompt.

    The indexer maps a block hash to the replicas it was routed to, and each
    replica has an LRU of at most ``lru_capacity_per_server`` hashes; adding a
    request's hashes refreshes or inserts each one and evicts the oldest
    (indexer.go ``Add``). Matching walks the prompt's hashes while *some*
    replica holds the hash and counts, per replica, the hashes it holds on
    the way (plugin.go ``matchLongestPrefix``). Only the first
    ``max_prefix_blocks_to_match`` blocks count. GIE hashes characters in
    64-character blocks; kvsim uses the engine's token blocks.
    """

    def __init__(self, num_replicas: int, cfg: config.PrefixCacheScorer) -> None:
        self.capacity = cfg.lru_capacity_per_server
        self.max_blocks = cfg.max_prefix_blocks_to_match
        self.lru: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(num_replicas)]
        self.hash_to_replicas: dict[int, set[int]] = {}

    def matches(self, hashes: Sequence[int]) -> dict[int, int]:
        res: dict[int, int] = {}
        for h in hashes[:self.max_blocks]:
            holders = self.hash_to_replicas.get(h)
            if not holders:
                break
            for i in holders:
                res[i] = res.get(i, 0) + 1
        return res

    def score(self, req, replicas, now):
        total = min(len(req.block_hashes), self.max_blocks)
        if total == 0:
            return [0.0] * len(replicas)
        res = self.matches(req.block_hashes)
        return [res.get(i, 0) / total for i in range(len(replicas))]

    def on_routed(self, req, index, now):
        lru, index_map = self.lru[index], self.hash_to_replicas
        for h in req.block_hashes[:self.max_blocks]:
            if h in lru:
                lru.move_to_end(h)
                continue
            lru[h] = None
            index_map.setdefault(h, set()).add(index)
            if len(lru) > self.capacity:
                old, _ = lru.popitem(last=False)
                holders = index_map[old]
                holders.discard(index)
                if not holders:
                    del index_map[old]


class PrecisePrefixScorer(Scorer):
    """Consecutive cached blocks from the start, min-max normalised over the replicas with a hit.

    llm-d-kv-cache ``LongestPrefixScorer`` counts, per pod, the blocks matched
    from block 0 without a gap; ``indexedScoresToNormalizedScoredPods`` then
    gives pods with no hit 0, and the others ``(s - min) / (max - min)`` over
    the pods that hit (1.0 when they all hit equally). With
    ``speculative_ttl_s`` the router also counts, for ``speculative_ttl_s``
    after routing, the blocks it just sent to a replica as cached there
    (``speculativeIndexing``: the gap before the KV events arrive).
    """

    def __init__(self, num_replicas: int, cfg: config.PrecisePrefixCacheScorer) -> None:
        self.max_blocks = cfg.max_prefix_blocks_to_match
        self.ttl = cfg.speculative_ttl_s
        self.speculative: list[dict[int, float]] = [{} for _ in range(num_replicas)]
        # (expiry, hashes) in routing order: expiries never decrease, so the
        # expired entries are always at the front.
        self._added: list[deque] = [deque() for _ in range(num_replicas)]

    def hits(self, req: RouteRequest, replicas: Sequence[ReplicaState], now: float) -> list[int]:
        hashes = req.block_hashes[:self.max_blocks]
        out = []
        for i, r in enumerate(replicas):
            k = r.prefix_hit_blocks(hashes) if hashes else 0
            if self.ttl is not None:
                spec = self.speculative[i]
                while k < len(hashes) and spec.get(hashes[k], -1.0) > now:
                    k += 1
            out.append(k)
        return out

    def score(self, req, replicas, now):
        hits = self.hits(req, replicas, now)
        hit = [h for h in hits if h > 0]
        if not hit:
            return [0.0] * len(hits)
        lo, hi = min(hit), max(hit)
        if hi == lo:
            return [1.0 if h > 0 else 0.0 for h in hits]
        return [(h - lo) / (hi - lo) if h > 0 else 0.0 for h in hits]

    def on_routed(self, req, index, now):
        if self.ttl is None:
            return
        spec, added = self.speculative[index], self._added[index]
        while added and added[0][0] <= now:               # expired: leave the index
            expiry, hashes = added.popleft()
            for h in hashes:
                if spec.get(h) == expiry:
                    del spec[h]
        hashes = req.block_hashes[:self.max_blocks]
        expiry = now + self.ttl
        for h in hashes:
            spec[h] = expiry
        added.append((expiry, hashes))


class SessionAffinityScorer(Scorer):
    """1.0 for the replica that served the session's previous request, else 0.0."""

    def __init__(self) -> None:
        self.served_by: dict[str, int] = {}

    def score(self, req, replicas, now):
        prev = self.served_by.get(req.previous_request_id) if req.previous_request_id else None
        return [1.0 if i == prev else 0.0 for i in range(len(replicas))]

    def on_routed(self, req, index, now):
        self.served_by[req.request_id] = index


def make_scorer(name: str, num_replicas: int, router_cfg) -> Scorer:
    if name == "queue":
        return QueueScorer()
    if name == "kv_cache_utilization":
        return KvCacheUtilizationScorer()
    if name == "prefix_cache":
        return ApproxPrefixScorer(num_replicas, router_cfg.prefix_cache)
    if name == "precise_prefix_cache":
        return PrecisePrefixScorer(num_replicas, router_cfg.precise_prefix_cache)
    if name == "session_affinity":
        return SessionAffinityScorer()
    raise ValueError(f"cluster.router.scorers.{name}: unknown scorer")
