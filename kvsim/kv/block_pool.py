"""The paged KV block pool: blocks, the free queue and the prefix-cache map.

This reproduces vLLM V1's ``BlockPool`` + ``FreeKVCacheBlockQueue``
(kv-semantics.md section 1; ``vllm/v1/core/block_pool.py``,
``vllm/v1/core/kv_cache_utils.py``). Blocks are plain integers ``0..N-1``;
their state lives in parallel lists (``ref_cnt``, ``block_hash``). A block
other than the null block is free exactly when its ``ref_cnt`` is 0.

vLLM keeps the free queue as a doubly linked list with sentinels. kvsim keeps
it in an ``OrderedDict`` (block id -> None), which *is* a doubly linked list
implemented in C, with every operation the pool needs in O(1)::

    free queue, head on the left

      [b4 b5 b2 b9 b7 b3 b8 b1]
       ^ get_new_blocks pops here     ^ free_blocks appends hashed blocks here
       ^ free_blocks prepends unhashed blocks here (B7)
             touch() unlinks a cached block from anywhere (B5)

Eviction order is the free-queue order (B4): a popped block that still holds
a hash leaves the hash map then.

The hash map is ``hash -> block``, or ``hash -> {block: None}`` when several
blocks hold the same content: vLLM does not de-duplicate (B8), and a lookup
returns the first block stored under the hash.

Block 0 is the null block: never queued, never freed, never cached
(kv-semantics B2), so ``num_usable_blocks = N - 1``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

NULL_BLOCK_ID = 0


class BlockPool:
    """Ref-counted KV blocks with an LRU free queue and a hash -> block map.

    ``lifo_unhashed`` selects the current vLLM rule (kv-semantics B7, [new]):
    freed blocks without a hash go to the *head* of the free queue so that the
    next allocation reuses them first; with ``False`` every freed block is
    appended to the tail (vLLM 0.11). ``debug`` keeps the tokens each cached
    block holds, so that every prefix hit can be checked against them.
    """

    def __init__(self, num_gpu_blocks: int, *, enable_caching: bool = True,
                 lifo_unhashed: bool = True, debug: bool = False) -> None:
        if num_gpu_blocks < 2:
            raise ValueError(f"num_gpu_blocks must be >= 2 (one is the null block), got {num_gpu_blocks}")
        self.num_gpu_blocks = n = num_gpu_blocks
        self.enable_caching = enable_caching
        self.lifo_unhashed = lifo_unhashed
        self.debug = debug
        self.ref_cnt: list[int] = [0] * n
        self.block_hash: list[int | None] = [None] * n
        # Every block in id order, less the null block (B2).
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, n))
        self._cached: dict[int, int | dict[int, None]] = {}
        self.block_tokens: list[tuple | None] = [None] * n

    # ------------------------------------------------------------- queries

    @property
    def num_usable_blocks(self) -> int:
        return self.num_gpu_blocks - 1

    def get_num_free_blocks(self) -> int:
        """Blocks in the free queue, evictable cached blocks included (B3)."""
        return len(self._free)

    def get_usage(self) -> float:
        """Fraction of usable blocks not in the free queue (B2)."""
        return 1.0 - len(self._free) / self.num_usable_blocks

    def free_queue(self) -> list[int]:
        """The free queue from head to tail (for tests and debugging)."""
        return list(self._free)

    def get_cached_block(self, block_hash: int) -> int | None:
        """The first block stored under ``block_hash``, or None (B8)."""
        entry = self._cached.get(block_hash)
        if entry is None or type(entry) is int:
            return entry
        return next(iter(entry))

    def get_cached_prefix(self, block_hashes: Sequence[int], max_blocks: int) -> list[int]:
        """The blocks of the longest cached prefix of ``block_hashes[:max_blocks]`` (H3, B8).

        ``get_cached_block`` for each hash in turn, stopping at the first miss.
        """
        cached = self._cached
        hits: list[int] = []
        for i in range(min(max_blocks, len(block_hashes))):
            entry = cached.get(block_hashes[i])
            if entry is None:
                break
            hits.append(entry if type(entry) is int else next(iter(entry)))
        return hits

    def num_cached_hashes(self) -> int:
        return len(self._cached)

    def is_free(self, block_id: int) -> bool:
        return self.ref_cnt[block_id] == 0 and block_id != NULL_BLOCK_ID

    # ----------------------------------------------------------- mutations

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        """Pop ``num_blocks`` from the head; evict their hashes; ref_cnt = 1 (B4)."""
        free = self._free
        if num_blocks > len(free):
            raise ValueError(f"cannot get {num_blocks} blocks: only {len(free)} free")
        pop = free.popitem
        out = [pop(last=False)[0] for _ in range(num_blocks)]
        ref, block_hash = self.ref_cnt, self.block_hash
        for b in out:
            ref[b] = 1
            if block_hash[b] is not None:
                self._evict(b)
        return out

    def touch(self, blocks: Iterable[int]) -> None:
        """Take a reference on prefix-hit blocks, reviving free ones (B5)."""
        ref, free = self.ref_cnt, self._free
        for b in blocks:
            if ref[b] == 0 and b != NULL_BLOCK_ID:
                del free[b]
            ref[b] += 1

    def free_blocks(self, ordered_blocks: Iterable[int]) -> None:
        """Drop one reference from each block, in order; queue those at 0 (B6, B7).

        Callers pass a request's blocks reversed, so its tail block is evicted
        first. Blocks that reached 0 with a hash are appended to the tail (LRU);
        with ``lifo_unhashed`` the ones without a hash are prepended to the head,
        keeping their order, so they are reused first (vLLM PR #42656).
        """
        ref, block_hash, free = self.ref_cnt, self.block_hash, self._free
        to_head: list[int] = []
        for b in ordered_blocks:
            if b == NULL_BLOCK_ID:
                continue
            c = ref[b] - 1
            if c < 0:
                raise AssertionError(f"block {b}: ref_cnt went negative")
            ref[b] = c
            if c == 0:
                if self.lifo_unhashed and block_hash[b] is None:
                    to_head.append(b)
                else:
                    free[b] = None
        for b in reversed(to_head):
            free[b] = None
            free.move_to_end(b, last=False)

    def cache_full_blocks(self, blocks: Sequence[int], block_hashes: Sequence[int],
                          num_cached_blocks: int, num_full_blocks: int,
                          tokens: Sequence | None = None, block_size: int = 0) -> None:
        """Give blocks ``[num_cached_blocks, num_full_blocks)`` their hash (A4).

        Runs at schedule time, before the forward pass, so a request scheduled
        later in the same step can already hit these blocks (TV5). ``tokens``
        (debug mode) are the request's token ids, kept per block to check hits.
        """
        cached, block_hash = self._cached, self.block_hash
        for i in range(num_cached_blocks, num_full_blocks):
            b = blocks[i]
            if b == NULL_BLOCK_ID:
                continue
            h = block_hashes[i]
            block_hash[b] = h
            if cached.setdefault(h, b) != b:
                self._add_duplicate(h, b)
            if tokens is not None and self.debug:
                self.block_tokens[b] = tuple(tokens[i * block_size:(i + 1) * block_size])

    # ------------------------------------------------------------- private

    def _add_duplicate(self, h: int, b: int) -> None:
        """Store ``b`` under ``h`` after the blocks already there (B8: no dedup)."""
        entry = self._cached[h]
        if type(entry) is int:
            self._cached[h] = {entry: None, b: None}
        else:
            entry[b] = None

    def _evict(self, b: int) -> None:
        """Drop block ``b`` from the hash map; the first remaining block stays first."""
        h = self.block_hash[b]
        entry = self._cached[h]
        if type(entry) is int:
            del self._cached[h]
        else:
            del entry[b]
            if len(entry) == 1:
                self._cached[h] = next(iter(entry))
        self.block_hash[b] = None
        self.block_tokens[b] = None
