"""The paged KV block pool: blocks, the free queue and the prefix-cache map.

This reproduces vLLM V1's ``BlockPool`` + ``FreeKVCacheBlockQueue``
(kv-semantics.md section 1). Blocks are plain integers ``0..N-1``; their state
lives in parallel lists so that the hot paths stay cheap::

    free queue (doubly linked, O(1) pop / unlink / append / prepend)

      HEAD <-> b4 <-> b5 <-> b2 <-> b1 <-> TAIL
      ^ popped first by get_new_blocks     ^ freed hashed blocks land here
        (eviction = free-queue order)

Block 0 is the null block: popped at start, never freed, never cached
(kv-semantics B2), so ``num_usable_blocks = N - 1``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

NULL_BLOCK_ID = 0


class BlockPool:
    """Ref-counted KV blocks with an LRU free queue and a hash -> block map.

    ``lifo_unhashed`` selects the current vLLM rule (kv-semantics B7, [new]):
    freed blocks without a hash go to the *head* of the free queue so that the
    next allocation reuses them first; with ``False`` every freed block is
    appended to the tail (vLLM 0.11).
    """

    def __init__(self, num_gpu_blocks: int, *, enable_caching: bool = True,
                 lifo_unhashed: bool = True, debug: bool = False) -> None:
        if num_gpu_blocks < 2:
            raise ValueError(f"num_gpu_blocks must be >= 2 (one is the null block), got {num_gpu_blocks}")
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.lifo_unhashed = lifo_unhashed
        self.debug = debug
        n = num_gpu_blocks
        self.ref_cnt: list[int] = [0] * n
        self.block_hash: list[int | None] = [None] * n
        # Intrusive free list over block ids; n is the head sentinel, n+1 the tail.
        self._head, self._tail = n, n + 1
        self._prev: list[int] = [-1] * (n + 2)
        self._next: list[int] = [-1] * (n + 2)
        self._in_free: list[bool] = [False] * n
        self._num_free = 0
        self._next[self._head] = self._tail
        self._prev[self._tail] = self._head
        for block_id in range(n):
            self._append(block_id)
        # Hash -> block id, or hash -> {block id: None} when several blocks
        # hold the same content: vLLM does not de-duplicate (kv-semantics B8).
        self._cached: dict[int, int | dict[int, None]] = {}
        # Debug mode keeps the tokens each block holds, to check every hit.
        self.block_tokens: list[tuple | None] = [None] * n
        # The null block is taken out at start and never returned (B2).
        self._remove(NULL_BLOCK_ID)

    # ------------------------------------------------------------------ public

    @property
    def num_usable_blocks(self) -> int:
        return self.num_gpu_blocks - 1

    def get_num_free_blocks(self) -> int:
        """Blocks in the free queue, evictable cached blocks included (B3)."""
        return self._num_free

    def get_usage(self) -> float:
        """Fraction of usable blocks not in the free queue (B2)."""
        return 1.0 - self._num_free / self.num_usable_blocks

    def free_queue(self) -> list[int]:
        """The free queue from head to tail (for tests and debugging)."""
        out, b = [], self._next[self._head]
        while b != self._tail:
            out.append(b)
            b = self._next[b]
        return out

    def get_cached_block(self, block_hash: int) -> int | None:
        """The first block stored under ``block_hash``, or None (B8)."""
        entry = self._cached.get(block_hash)
        if entry is None or type(entry) is int:
            return entry
        return next(iter(entry))

    def num_cached_hashes(self) -> int:
        return len(self._cached)

    def is_free(self, block_id: int) -> bool:
        return self._in_free[block_id]

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        """Pop ``num_blocks`` from the head; evict their hashes; ref_cnt = 1 (B4)."""
        if num_blocks > self._num_free:
            raise ValueError(f"cannot get {num_blocks} blocks: only {self._num_free} free")
        out = []
        nxt, prv, head = self._next, self._prev, self._head
        in_free, ref, block_hash, cached = self._in_free, self.ref_cnt, self.block_hash, self._cached
        b = nxt[head]
        for _ in range(num_blocks):
            in_free[b] = False
            h = block_hash[b]
            if h is not None:
                # Eviction (inline _evict): drop this block from the hash map.
                entry = cached[h]
                if type(entry) is int:
                    del cached[h]
                else:
                    del entry[b]
                    if len(entry) == 1:
                        cached[h] = next(iter(entry))
                block_hash[b] = None
                if self.debug:
                    self.block_tokens[b] = None
            ref[b] = 1
            out.append(b)
            b = nxt[b]
        # Unlink the popped run from the head in one go.
        nxt[head] = b
        prv[b] = head
        self._num_free -= num_blocks
        return out

    def touch(self, blocks: Iterable[int]) -> None:
        """Take a reference on prefix-hit blocks, reviving free ones (B5)."""
        ref = self.ref_cnt
        for b in blocks:
            if ref[b] == 0 and self._in_free[b]:
                self._remove(b)
            ref[b] += 1

    def free_blocks(self, ordered_blocks: Iterable[int]) -> None:
        """Drop one reference from each block, in order; return those at 0 (B6, B7).

        Callers pass a request's blocks reversed, so its tail block is evicted
        first. Blocks that reached 0 with a hash are appended to the tail (LRU);
        with ``lifo_unhashed`` the ones without a hash are prepended to the head,
        keeping their order, so they are reused first (vLLM PR #42656).
        """
        ref = self.ref_cnt
        block_hash = self.block_hash
        lifo = self.lifo_unhashed
        to_head = []
        nxt, prv, in_free, tail = self._next, self._prev, self._in_free, self._tail
        for b in ordered_blocks:
            if b == NULL_BLOCK_ID:
                continue
            c = ref[b] - 1
            ref[b] = c
            if c > 0:
                continue
            if c < 0:
                raise AssertionError(f"block {b}: ref_cnt went negative")
            if lifo and block_hash[b] is None:
                to_head.append(b)
            else:
                # _append, inlined: this loop runs for every block ever freed.
                last = prv[tail]
                nxt[last] = b
                prv[b] = last
                nxt[b] = tail
                prv[tail] = b
                in_free[b] = True
                self._num_free += 1
        for b in reversed(to_head):
            self._prepend(b)

    def cache_full_blocks(self, blocks: Sequence[int], block_hashes: Sequence[int],
                          num_cached_blocks: int, num_full_blocks: int,
                          tokens: Sequence | None = None, block_size: int = 0) -> None:
        """Give blocks ``[num_cached_blocks, num_full_blocks)`` their hash (A4).

        Runs at schedule time, before the forward pass, so a request scheduled
        later in the same step can already hit these blocks (TV5).
        """
        cached = self._cached
        block_hash = self.block_hash
        for i in range(num_cached_blocks, num_full_blocks):
            b = blocks[i]
            if b == NULL_BLOCK_ID:
                continue
            h = block_hashes[i]
            block_hash[b] = h
            entry = cached.get(h)
            if entry is None:
                cached[h] = b
            elif type(entry) is int:
                cached[h] = {entry: None, b: None}
            else:
                entry[b] = None
            if self.debug and tokens is not None:
                self.block_tokens[b] = tuple(tokens[i * block_size:(i + 1) * block_size])

    # ----------------------------------------------------------------- private

    def _evict(self, b: int) -> None:
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

    def _append(self, b: int) -> None:
        last = self._prev[self._tail]
        self._next[last] = b
        self._prev[b] = last
        self._next[b] = self._tail
        self._prev[self._tail] = b
        self._in_free[b] = True
        self._num_free += 1

    def _prepend(self, b: int) -> None:
        first = self._next[self._head]
        self._prev[first] = b
        self._next[b] = first
        self._prev[b] = self._head
        self._next[self._head] = b
        self._in_free[b] = True
        self._num_free += 1

    def _remove(self, b: int) -> None:
        p, n = self._prev[b], self._next[b]
        self._next[p] = n
        self._prev[n] = p
        self._in_free[b] = False
        self._num_free -= 1
