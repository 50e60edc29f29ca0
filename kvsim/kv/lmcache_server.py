"""The LMCache server's store, as ``LMCacheMPConnector`` sees it: an L1 (CPU) pool of chunks.

vLLM 0.33's ``--kv-offloading-backend lmcache`` talks to a standalone LMCache
server (multi-process mode, ``lmcache/v1/multiprocess/server.py``); the store
behind it is LMCache's distributed ``StorageManager``
(``lmcache/v1/distributed/storage_manager.py``, read in LMCache 0.5.6). What
kvsim reproduces of it:

* **Chunks** of ``chunk_size`` tokens (``MPServerConfig.chunk_size`` 256,
  ``--chunk-size``), keyed by the prefix they end (kvsim: the chained block
  hash at the chunk's end, ``offload.chunk_keys``). One chunk's bytes are every
  TP rank's share (the server keys each worker's KV apart), each rounded up to
  ``--l1-align-bytes`` 4096.
* **Capacity**: ``--l1-size-gb`` (``int(l1_size_gb * (1 << 30))`` bytes,
  ``distributed/config.py``) held as whole chunks.
* **Writes** (``StorageManager.reserve_write``): a key already held (or being
  written) is not written again (``KEY_NOT_WRITABLE``); a key that finds no
  free memory is dropped (``OUT_OF_MEMORY``): L1 does **not** evict to make
  room. A written chunk is readable once its copy is done
  (``finish_write``), and becomes the most recently used then, the batch's
  first key most recent (``LRUEvictionPolicy.on_keys_created`` walks the keys
  reversed, moving each to the end).
* **Eviction** (``storage_controllers/eviction_controller.py``
  ``L1EvictionController.eviction_loop``): every second (``time.sleep(1)``)
  the loop reads the memory in use (written and being written); at or above
  ``--eviction-trigger-watermark`` (0.8) of the pool it evicts
  ``int(tracked * --eviction-ratio)`` (0.2; at least one) of the tracked
  (written) keys, least recently used first, skipping locked ones
  (``LRUEvictionPolicy.get_eviction_actions``, ``is_key_evictable``).
  kvsim ticks at t = 1, 2, 3, ... s of simulated time.
* **Lookups** find the leading run of written chunks and **lock** them (the
  connector's note: "submitting a look up request ... will essentially 'lock'
  the KV cache chunks"); a lock ends when the retrieve that reads the chunk
  is done, or when the connector frees it (``free_lookup_locks``). A hit is a
  read: the chunks are touched (most recent, head first, ``on_keys_touched``).

Not modelled (docs/kv_tiers.md, "LMCache in a run"): L2 adapters (disk,
remote; ``--l2-*``), ARC / IsolatedLRU, lock TTLs (300 s), lazy allocation,
CacheBlend, P2P. The transfers' timing is the connector's
(kv/lmcache_connector.py); this class keeps *what* is stored, in time order.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

from kvsim.kv.offload import OffloadTier
from kvsim.kv.offload_stack import OffloadTiers

EVICTION_INTERVAL_S = 1.0      # L1EvictionController.eviction_loop: time.sleep(1)


class LMCacheServer:
    """LMCache's L1 store with its eviction loop, advanced in simulated time (module doc)."""

    def __init__(self, l1: OffloadTier, *, trigger_watermark: float = 0.8,
                 eviction_ratio: float = 0.2, eviction_interval_s: float = EVICTION_INTERVAL_S) -> None:
        if not 0 < trigger_watermark <= 1:
            raise ValueError(f"trigger_watermark must be in (0, 1], got {trigger_watermark!r}")
        if not 0 < eviction_ratio <= 1:
            raise ValueError(f"eviction_ratio must be in (0, 1], got {eviction_ratio!r}")
        if eviction_interval_s <= 0:
            raise ValueError(f"eviction_interval_s must be > 0, got {eviction_interval_s!r}")
        self.l1 = l1
        self.tiers = OffloadTiers([l1], semantics="lmcache")
        self.trigger_watermark = trigger_watermark
        self.eviction_ratio = eviction_ratio
        self.interval_s = eviction_interval_s
        self._tick = 1                              # the next loop tick is at _tick * interval
        self._writes: list[tuple[float, int, tuple[int, ...]]] = []   # (done, seq, keys) heap
        self._seq = 0
        self.now = 0.0
        self.num_out_of_memory = 0                  # chunks a write dropped (no free L1 memory)
        self.num_eviction_rounds = 0                # loop ticks at or above the watermark

    # ---------------------------------------------------------------- time

    def advance(self, t: float) -> None:
        """Apply, in time order, the writes done and the eviction-loop ticks up to ``t``
        (a write done at a tick's time counts before the tick)."""
        if t < self.now:
            raise ValueError(f"LMCacheServer.advance: {t} is before {self.now}")
        writes, l1 = self._writes, self.l1
        while True:
            tick = self._tick * self.interval_s
            done = writes[0][0] if writes else math.inf
            if done <= t and done <= tick:
                _, _, keys = heapq.heappop(writes)
                l1.complete_store(keys)
                l1.touch(keys)                      # on_keys_created: most recent, head first
            elif tick <= t:
                if len(l1) >= self.trigger_watermark * l1.capacity_chunks:
                    self._evict()
                    self._tick += 1
                else:
                    # Below the watermark only a write can change that: skip the
                    # idle ticks up to the next write or ``t``.
                    until = min(done, t)
                    self._tick = max(self._tick + 1, math.ceil(until / self.interval_s))
            else:
                break
        self.now = t

    def next_write_done(self) -> float:
        return self._writes[0][0] if self._writes else math.inf

    # ---------------------------------------------------------- operations

    def lookup(self, keys: Sequence[int]) -> list[int]:
        """The leading written chunks of ``keys``, locked and touched (module doc)."""
        n = self.tiers.lookup(keys).num_chunks
        hit = list(keys[:n])
        if hit:
            self.l1.prepare_load(hit)               # the lock: not evictable until freed
            self.l1.touch(hit)
        return hit

    def unlock(self, keys: Sequence[int]) -> None:
        if keys:
            self.l1.complete_load(keys)

    def reserve_write(self, keys: Sequence[int]) -> list[int]:
        """The chunks of ``keys`` this write copies: not held yet and fitting in the
        free memory, in order; the rest that are new are dropped (OUT_OF_MEMORY)."""
        l1 = self.l1
        new = [k for k in keys if k not in l1]
        room = max(0, l1.capacity_chunks - len(l1))
        taken = new[:room]
        self.num_out_of_memory += len(new) - len(taken)
        if taken:
            l1.prepare_store(taken)                 # fits: nothing is evicted here
        return taken

    def finish_write(self, keys: Sequence[int], done: float) -> None:
        """The copy of ``keys`` ends at ``done``: readable from then (``advance``)."""
        if keys:
            self._seq += 1
            heapq.heappush(self._writes, (done, self._seq, tuple(keys)))

    # ------------------------------------------------------------- private

    def _evict(self) -> None:
        """One round of ``eviction_loop`` above the watermark (module doc)."""
        self.num_eviction_rounds += 1
        tracked = self.l1.num_ready()
        target = int(tracked * self.eviction_ratio)
        if target == 0 and tracked:
            target = 1
        self.l1.evict_lru(target)

