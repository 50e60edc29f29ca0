"""KV offload tiers behind the GPU prefix cache: CPU, disk, a shared remote store.

A standalone, deterministic structure: no clock and no GPU pool. The KV
manager decides *when* to store and load; these classes keep *what* each
tier holds, which chunks a lookup finds where, and how many bytes each
transfer moves (the cost model turns bytes into seconds with
``TierSpec.transfer_time_s``). docs/kv_tiers.md says which engine behaviour
each rule reproduces and how the manager drives it.

The unit is a *chunk*: ``blocks_per_chunk`` consecutive full GPU blocks,
named by the hash of its last block (the chained hash covers the whole
prefix), as vLLM's OffloadingConnector keys them
(``offloading/scheduler.py`` ``RequestOffloadState.update_offload_keys``).
LMCache's 256-token chunk is ``blocks_per_chunk = 256 // block_size``.

One tier (``OffloadTier``) follows vLLM 0.33's ``CPUOffloadingManager`` with
its ``LRUCachePolicy`` (``vllm/v1/kv_offload/cpu/{manager,policies/lru}.py``):

* a chunk is *pending* from ``prepare_store`` until ``complete_store`` (not
  readable: a lookup says so), then *ready*; ``prepare_load`` pins it
  (``ref_cnt`` > 0) until ``complete_load``; only ready, unpinned chunks are
  evicted;
* ``prepare_store`` is all or nothing: it evicts the least recently used
  evictable chunks (never one of the chunks offered) and returns None when
  that cannot make room;
* recency is a rank: a request's chunks share one provisional rank, its tail
  before its head; when it finishes (or on ``touch``) its chunks get fresh
  ranks tail first, so the head is the most recent (as the GPU pool frees
  blocks, kv-semantics B6).

A rank is one int, ``order * RANK_SPAN - position`` (the pair (order,
-position) compared lexicographically, as one number: a heap of ints pops
several times faster than one of nested tuples, and eviction is what an
offloading run spends its time on).

``offload_stack.py`` stacks tiers (CPU, then disk, then a shared store).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

MEDIA = ("cpu", "disk", "remote")
MISS, HIT, PENDING = "miss", "hit", "pending"
RANK_SPAN = 1 << 40      # > any token position: (order, -position) as order * RANK_SPAN - position


@dataclass(frozen=True)
class TierSpec:
    """One tier: where it is, how big, how fast.

    ``bandwidth_gbps`` (GB/s, 1e9 bytes) and ``latency_us`` describe the link
    a chunk crosses to reach host memory from this tier: for ``cpu`` the
    host<->GPU link (PCIe), for ``disk`` the NVMe, for ``remote`` the network.
    ``shared``: one store seen by several replicas (LMCache remote backend,
    Mooncake store); a fleet passes the same ``OffloadTier`` to each.
    """

    name: str
    medium: str
    capacity_bytes: int
    bandwidth_gbps: float
    latency_us: float = 0.0
    shared: bool = False

    def __post_init__(self) -> None:
        if self.medium not in MEDIA:
            raise ValueError(f"tier {self.name!r}: medium {self.medium!r} is not one of {', '.join(MEDIA)}")
        if not self.capacity_bytes or self.capacity_bytes <= 0:
            raise ValueError(f"tier {self.name!r}: capacity_bytes must be > 0, got {self.capacity_bytes!r}")
        if not self.bandwidth_gbps or self.bandwidth_gbps <= 0:
            raise ValueError(f"tier {self.name!r}: bandwidth_gbps must be > 0, got {self.bandwidth_gbps!r}")
        if self.latency_us < 0:
            raise ValueError(f"tier {self.name!r}: latency_us must be >= 0, got {self.latency_us!r}")

    def transfer_time_s(self, num_bytes: int, num_transfers: int = 1) -> float:
        """Seconds to move ``num_bytes`` in ``num_transfers`` requests over this tier's link."""
        if num_bytes <= 0:
            return 0.0
        return num_transfers * self.latency_us * 1e-6 + num_bytes / (self.bandwidth_gbps * 1e9)


@dataclass(frozen=True)
class StoreResult:
    """What one ``prepare_store`` did: chunks now pending, chunks evicted for them."""

    stored: tuple[int, ...]
    evicted: tuple[int, ...]


def chunk_keys(block_hashes: Sequence[int], blocks_per_chunk: int) -> list[int]:
    """The key of each full chunk: the hash of its last block (``update_offload_keys``)."""
    if blocks_per_chunk < 1:
        raise ValueError(f"blocks_per_chunk must be >= 1, got {blocks_per_chunk}")
    return list(block_hashes[blocks_per_chunk - 1::blocks_per_chunk])


class OffloadTier:
    """The chunks one tier holds, up to its capacity, with vLLM's LRU (module doc)."""

    def __init__(self, spec: TierSpec, chunk_bytes: int) -> None:
        if chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be > 0, got {chunk_bytes}")
        capacity = spec.capacity_bytes // chunk_bytes
        if capacity < 1:
            raise ValueError(f"tier {spec.name!r}: capacity_bytes {spec.capacity_bytes} holds no "
                             f"chunk of {chunk_bytes} bytes")
        self.spec = spec
        self.name = spec.name
        self.chunk_bytes = chunk_bytes
        self.capacity_chunks = capacity
        self._ref: dict[int, int] = {}           # -1 pending store, 0 evictable, > 0 pinned by loads
        self._rank: dict[int, int] = {}           # key -> rank (module doc)
        self._heap: list[tuple[int, int]] = []    # (rank, key), lazy: stale entries skipped
        self._next_rank = 0
        self._request_rank: dict[object, int] = {}
        self._seen: dict[object, dict[int, int | None]] = {}    # request -> chunks it used, position
        self.num_stored = self.num_evicted = self.num_failed = 0
        self.bytes_written = self.bytes_read = 0

    # ------------------------------------------------------------ queries

    def __len__(self) -> int:
        return len(self._ref)

    def __contains__(self, key: int) -> bool:
        return key in self._ref

    def lookup(self, key: int) -> str:
        """``hit`` (ready), ``pending`` (store in flight) or ``miss`` (``CPUOffloadingManager.lookup``)."""
        ref = self._ref.get(key)
        if ref is None:
            return MISS
        return PENDING if ref < 0 else HIT

    def num_evictable(self) -> int:
        return sum(1 for r in self._ref.values() if r == 0)

    def state(self, key: int) -> int | None:
        """-1 pending, 0 ready, n > 0 pinned by n loads, None absent."""
        return self._ref.get(key)

    def rank(self, key: int) -> tuple[int, int]:
        """The chunk's rank as vLLM's policy writes it: (order, -position) (module doc)."""
        order = -(-self._rank[key] // RANK_SPAN)
        return order, self._rank[key] - order * RANK_SPAN

    def lru_order(self) -> list[int]:
        """Evictable chunks, next to be evicted first (for tests)."""
        return sorted((k for k, r in self._ref.items() if r == 0), key=self._rank.__getitem__)

    # ---------------------------------------------------------- mutations

    def prepare_store(self, keys: Sequence[int], request_id=None,
                      positions: Sequence[int] | None = None) -> StoreResult | None:
        """Make room for the offered chunks not held yet; they become pending.

        ``positions[i]``: end token of chunk i in its request (its provisional
        rank puts a request's tail before its head). Chunks already held are
        skipped (vLLM dedups stores); the ready ones count as the request's
        use of them. Returns None, changing nothing else, when the evictable
        chunks cannot make room (``CPUOffloadingManager.prepare_store``).
        """
        keys = list(keys)
        positions = list(positions) if positions is not None else [None] * len(keys)
        ref = self._ref
        new = [(k, p) for k, p in zip(keys, positions) if k not in ref]
        self._record_access([(k, p) for k, p in zip(keys, positions)
                             if k not in ref or ref[k] >= 0], request_id)
        if not new:
            return StoreResult((), ())
        shortfall = len(ref) + len(new) - self.capacity_chunks
        evicted: list[int] = []
        if shortfall > 0:
            victims = self._victims(shortfall, protected=set(keys))
            if victims is None:
                self.num_failed += len(new)
                return None
            ranks = self._rank
            for k in victims:
                del ref[k]
                del ranks[k]
            evicted = victims
            self.num_evicted += len(victims)
        self._set_ranks(new, request_id)
        self.num_stored += len(new)
        self.bytes_written += len(new) * self.chunk_bytes
        return StoreResult(tuple(k for k, _ in new), tuple(evicted))

    def complete_store(self, keys: Iterable[int], success: bool = True) -> None:
        """The write finished: pending chunks become ready (or, failed, are dropped)."""
        for k in keys:
            if self._ref.get(k) != -1:
                continue
            if success:
                self._ref[k] = 0
                heapq.heappush(self._heap, (self._rank[k], k))
            else:
                del self._ref[k]
                del self._rank[k]
                self.num_stored -= 1
                self.num_failed += 1

    def prepare_load(self, keys: Sequence[int], request_id=None,
                     positions: Sequence[int] | None = None) -> None:
        """Pin ready chunks for a read (protected from eviction until ``complete_load``)."""
        keys = list(keys)
        for k in keys:
            ref = self._ref.get(k)
            if ref is None or ref < 0:
                raise ValueError(f"tier {self.name!r}: chunk {k} is not ready to load")
        for k in keys:
            self._ref[k] += 1
        self.bytes_read += len(keys) * self.chunk_bytes
        positions = list(positions) if positions is not None else [None] * len(keys)
        self._record_access(list(zip(keys, positions)), request_id)

    def complete_load(self, keys: Iterable[int]) -> None:
        for k in keys:
            ref = self._ref.get(k)
            if ref is None or ref <= 0:
                raise ValueError(f"tier {self.name!r}: chunk {k} is not being loaded")
            self._ref[k] = ref - 1
            if ref == 1:
                heapq.heappush(self._heap, (self._rank[k], k))

    def touch(self, keys: Sequence[int]) -> None:
        """Most recently used, head last: fresh ranks from the tail (``LRUCachePolicy.touch``)."""
        ref, ranks, heap, push = self._ref, self._rank, self._heap, heapq.heappush
        for k in reversed(list(keys)):
            r = ref.get(k)
            if r is not None:
                self._next_rank += 1
                rank = ranks[k] = self._next_rank * RANK_SPAN
                if r == 0:
                    push(heap, (rank, k))

    def num_ready(self) -> int:
        """Chunks whose store is done (pinned ones included)."""
        return sum(1 for r in self._ref.values() if r >= 0)

    def evict_lru(self, n: int) -> list[int]:
        """Evict up to ``n`` evictable chunks, least recently used first; returns them.

        For a store that evicts on its own schedule (LMCache's L1 eviction loop,
        kv/lmcache_server.py) rather than to make room for one store."""
        n = min(n, self.num_evictable())
        if n <= 0:
            return []
        victims = self._victims(n, protected=set())
        for k in victims:
            del self._ref[k]
            del self._rank[k]
        self.num_evicted += len(victims)
        return victims

    def remove(self, keys: Iterable[int]) -> None:
        """Drop ready, unpinned chunks (not an eviction: LMCache's temporary prefetch
        buffers, deleted once read)."""
        for k in keys:
            if self._ref.get(k) == 0:
                del self._ref[k]
                del self._rank[k]

    def request_finished(self, request_id) -> None:
        """Commit the request's recency (``on_request_finished``).

        Every chunk the request stored, loaded or offered again, head to tail
        (by position when all are known), is touched: fresh ranks, tail first.
        """
        self._request_rank.pop(request_id, None)
        seen = self._seen.pop(request_id, None)
        if not seen:
            return
        keys = list(seen)
        if None not in seen.values():
            keys.sort(key=seen.__getitem__)
        self.touch(keys)

    # ------------------------------------------------------------ private

    def _set_ranks(self, new: list[tuple[int, int | None]], request_id) -> None:
        """New pending chunks and their ranks: a fresh rank for a chunk without a
        position (or request), else the request's shared rank less its position."""
        ref, ranks = self._ref, self._rank
        base = None
        for k, p in new:
            ref[k] = -1
            if p is None or request_id is None:
                self._next_rank += 1
                ranks[k] = self._next_rank * RANK_SPAN
            else:
                if base is None:                    # may take the next rank, in chunk order
                    base = self._request_rank_of(request_id) * RANK_SPAN
                ranks[k] = base - p

    def _request_rank_of(self, request_id) -> int:
        """The rank all of a request's chunks share, given at its first access (``_get_request_rank``)."""
        rank = self._request_rank.get(request_id)
        if rank is None:
            self._next_rank += 1
            rank = self._request_rank[request_id] = self._next_rank
        return rank

    def _record_access(self, keyed: list[tuple[int, int | None]], request_id) -> None:
        """A request's first use of each chunk (``_record_request_cache_access``).

        Marks it seen; a chunk already held gets the request's provisional
        rank if that is more recent (``LRUCachePolicy.on_request_access``).
        """
        if request_id is None:
            return
        seen = self._seen.setdefault(request_id, {})
        new = [(k, p) for k, p in keyed if k not in seen]
        if not new:
            return
        request_rank = self._request_rank_of(request_id)
        for k, p in new:
            seen[k] = p
            if p is None or k not in self._ref:
                continue
            rank = request_rank * RANK_SPAN - p
            if self._rank[k] < rank:
                self._rank[k] = rank
                if self._ref[k] == 0:
                    heapq.heappush(self._heap, (rank, k))

    def _victims(self, n: int, protected: set[int]) -> list[int] | None:
        """The ``n`` evictable chunks of lowest rank, not protected; None if there are fewer."""
        out: list[int] = []
        kept: list[tuple[int, int]] = []
        seen: set[int] = set()
        heap, pop, ref, ranks = self._heap, heapq.heappop, self._ref, self._rank
        while heap and len(out) < n:
            rank, k = pop(heap)
            if ref.get(k) != 0 or ranks.get(k) != rank or k in seen:
                continue                            # stale entry
            seen.add(k)
            if k in protected:
                kept.append((rank, k))
                continue
            out.append(k)
        if len(out) < n:
            kept.extend((ranks[k], k) for k in out)     # nothing is evicted: all stay
            out = None
        for entry in kept:                          # (a victim's entry would go stale: dropped)
            heapq.heappush(heap, entry)
        if out is None:
            return None
        if len(heap) > 64 and len(heap) > 4 * len(self._ref):
            self._heap = [(self._rank[k], k) for k, r in self._ref.items() if r == 0]
            heapq.heapify(self._heap)
        return out
