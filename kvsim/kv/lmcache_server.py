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
* **Writes** (``StorageManager.reserve_write``, ``L1Manager.reserve_write``):
  a key already held (or being written) is not written again
  (``KEY_NOT_WRITABLE``); the new keys of one write are allocated together
  (``self._memory_manager.allocate(layout_desc, len(need_to_allocate))``) and
  all dropped when they do not fit (``OUT_OF_MEMORY``): L1 does **not** evict
  to make room. A written chunk is readable once its copy is done
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
* **An L2 adapter** (optional; kvsim: the ``fs`` adapter on a local disk,
  ``--l2-adapter '{"type": "fs", ...}'``): the store controller copies every
  chunk written to L1 to it once the L1 write is done (``--l2-store-policy
  default``: "store all keys to all adapters, keep L1"), over the disk link.
  A lookup (``PrefetchController``: "Plan the needed cells, L1 first, then L2,
  lowest index first") takes the leading chunks held in L1 or, failing that,
  in L2; the L2 ones are read into L1 buffers first, reserved together
  (``_reserve_l1_cells``: one ``reserve_write`` per key group; when it fails
  the replan keeps the L1 part before the first L2 chunk), and the reply
  waits for that read. The buffers are temporary (``DefaultPrefetchPolicy.plan_l1_retention``:
  "every loaded key is temporary"): deleted once read. LMCache's ``fs``
  adapter has no capacity; kvsim's ``capacity_gib`` (optional) evicts LRU to
  make room.

Not modelled (docs/kv_tiers.md, "LMCache in a run"): other L2 adapters,
several of them, ARC / IsolatedLRU, lock TTLs (300 s), lazy allocation,
CacheBlend, P2P. The GPU<->L1 transfers' timing is the connector's
(kv/lmcache_connector.py); this class keeps *what* is stored, in time order,
and the disk link's queue.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

from kvsim.kv.offload import HIT, OffloadTier
from kvsim.kv.offload_engine import book_link
from kvsim.kv.offload_stack import OffloadTiers

EVICTION_INTERVAL_S = 1.0      # L1EvictionController.eviction_loop: time.sleep(1)


class LMCacheServer:
    """LMCache's L1 store with its eviction loop, advanced in simulated time (module doc)."""

    def __init__(self, l1: OffloadTier, *, l2: OffloadTier | None = None, trigger_watermark: float = 0.8,
                 eviction_ratio: float = 0.2, eviction_interval_s: float = EVICTION_INTERVAL_S) -> None:
        if not 0 < trigger_watermark <= 1:
            raise ValueError(f"trigger_watermark must be in (0, 1], got {trigger_watermark!r}")
        if not 0 < eviction_ratio <= 1:
            raise ValueError(f"eviction_ratio must be in (0, 1], got {eviction_ratio!r}")
        if eviction_interval_s <= 0:
            raise ValueError(f"eviction_interval_s must be > 0, got {eviction_interval_s!r}")
        self.l1, self.l2 = l1, l2
        self.tiers = OffloadTiers([l1] + ([l2] if l2 is not None else []), semantics="lmcache")
        self.trigger_watermark = trigger_watermark
        self.eviction_ratio = eviction_ratio
        self.interval_s = eviction_interval_s
        self._tick = 1                              # the next loop tick is at _tick * interval
        self._events: list[tuple[float, int, str, tuple[int, ...]]] = []   # (done, seq, kind, keys)
        self._seq = 0
        self._disk_free: dict[str, float] = {}      # the L2 link's FIFO queue
        self._temporary: set[int] = set()           # L1 buffers of chunks read from L2
        self.now = 0.0
        self.num_out_of_memory = 0                  # chunks a write dropped (no free L1 memory)
        self.num_eviction_rounds = 0                # loop ticks at or above the watermark
        self.l2_bytes = {"store": 0, "prefetch": 0}
        self.l2_busy_s = {"store": 0.0, "prefetch": 0.0}
        self.num_l2_store_failures = 0              # chunks L2 found no room for

    # ---------------------------------------------------------------- time

    def advance(self, t: float) -> None:
        """Apply, in time order, the writes done and the eviction-loop ticks up to ``t``
        (a write done at a tick's time counts before the tick)."""
        if t < self.now:
            raise ValueError(f"LMCacheServer.advance: {t} is before {self.now}")
        events, l1 = self._events, self.l1
        while True:
            tick = self._tick * self.interval_s
            done = events[0][0] if events else math.inf
            if done <= t and done <= tick:
                at, _, kind, keys = heapq.heappop(events)
                if kind == "l1":
                    l1.complete_store(keys)
                    l1.touch(keys)                  # on_keys_created: most recent, head first
                    if self.l2 is not None:
                        self._store_l2(keys, at)
                elif kind == "l2":
                    self.l2.complete_store(keys)
                    self.l2.touch(keys)
                else:                               # a prefetch read into L1 buffers is done
                    l1.complete_store(keys)
                    l1.prepare_load(keys)           # locked for the request's retrieve
                    self.l2.complete_load(keys)
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

    # ---------------------------------------------------------- operations

    def lookup(self, keys: Sequence[int]) -> tuple[list[int], float]:
        """(the leading chunks of ``keys`` the store can serve, when the reply is ready):
        L1 chunks locked and touched now, L2 chunks read into L1 buffers first
        (the reply waits for that read; module doc)."""
        l1, l2 = self.l1, self.l2
        hit, from_l2 = [], []
        for k in keys:
            if l1.lookup(k) == HIT:
                hit.append(k)
            elif l2 is not None and l2.lookup(k) == HIT:
                hit.append(k)
                from_l2.append(k)
            else:
                break                               # a miss: the prefix ends
        if len(from_l2) > l1.capacity_chunks - len(l1):
            # The L1 buffers are allocated together: none. The L1 part before
            # the first L2 chunk is what is left.
            hit = hit[:hit.index(from_l2[0])]
            from_l2 = []
        in_l1 = [k for k in hit if l1.lookup(k) == HIT]
        if in_l1:
            l1.prepare_load(in_l1)                  # the lock: not evictable until freed
            l1.touch(in_l1)
        ready = self.now
        if from_l2:
            l1.prepare_store(from_l2)               # the buffers (they fit: ``room``)
            l2.prepare_load(from_l2)
            l2.touch(from_l2)
            ready = self._disk("prefetch", len(from_l2) * l1.chunk_bytes, self.now)
            self._push(ready, "prefetch", from_l2)
            self._temporary.update(from_l2)
        return hit, ready

    def unlock(self, keys: Sequence[int]) -> None:
        """The locks end; a temporary buffer read by its last reader is deleted."""
        if not keys:
            return
        self.l1.complete_load(keys)
        done = [k for k in keys if k in self._temporary and self.l1.state(k) == 0]
        if done:
            self.l1.remove(done)
            self._temporary.difference_update(done)

    def reserve_write(self, keys: Sequence[int]) -> list[int]:
        """The chunks of ``keys`` this write copies: those not held yet, if they all
        fit in the free memory; else none (OUT_OF_MEMORY for all of them)."""
        l1 = self.l1
        new = [k for k in keys if k not in l1]
        if len(new) > l1.capacity_chunks - len(l1):
            self.num_out_of_memory += len(new)
            return []
        if new:
            l1.prepare_store(new)                   # fits: nothing is evicted here
        return new

    def finish_write(self, keys: Sequence[int], done: float) -> None:
        """The copy of ``keys`` ends at ``done``: readable from then (``advance``)."""
        if keys:
            self._push(done, "l1", keys)

    def next_event(self) -> float:
        return self._events[0][0] if self._events else math.inf

    # ------------------------------------------------------------- private

    def _push(self, done: float, kind: str, keys) -> None:
        self._seq += 1
        heapq.heappush(self._events, (done, self._seq, kind, tuple(keys)))

    def _disk(self, kind: str, nbytes: int, at: float) -> float:
        """Book the L2 link (one FIFO queue, reads and writes) from ``at``; when it ends."""
        start, end = book_link(self._disk_free, "disk", at, self.l2.spec.transfer_time_s(nbytes))
        self.l2_bytes[kind] += nbytes
        self.l2_busy_s[kind] += end - start
        return end

    def _store_l2(self, keys: Sequence[int], at: float) -> None:
        """The store controller copies an L1 write to L2 (module doc)."""
        new = [k for k in keys if k not in self.l2]
        if not new:
            return
        if self.l2.prepare_store(new) is None:
            self.num_l2_store_failures += len(new)
            return
        # The copy starts when the L1 write is done.
        self._push(self._disk("store", len(new) * self.l1.chunk_bytes, at), "l2", new)

    def _evict(self) -> None:
        """One round of ``eviction_loop`` above the watermark (module doc)."""
        self.num_eviction_rounds += 1
        tracked = self.l1.num_ready()
        target = int(tracked * self.eviction_ratio)
        if target == 0 and tracked:
            target = 1
        self.l1.evict_lru(target)

