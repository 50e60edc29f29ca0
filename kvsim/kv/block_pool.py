"""The paged KV block pool: blocks, the free queue and the prefix-cache map.

This reproduces vLLM V1's ``BlockPool`` + ``FreeKVCacheBlockQueue``
(kv-semantics.md section 1). Blocks are plain integers ``0..N-1``; their state
lives in parallel lists (``ref_cnt``, ``block_hash``). A block other than the
null block is free exactly when its ``ref_cnt`` is 0.

vLLM keeps the free queue as a doubly linked list. kvsim keeps the same order
in a deque of *segments*, plain lists of block ids, so that a call costs a few
list operations per block instead of four link updates::

    free queue (head on the left)

      segment [ids, start]:  ids[:start] popped, ids[start:] still queued

      [x x x|b4 b5 b2]  [b9 b7 b3 b8 b1]
             ^ get_new_blocks slices from here   ^ free_blocks extends the tail
               (eviction = free-queue order)       segment with hashed blocks

* ``get_new_blocks(n)`` takes ``ids[start:start + n]`` and moves ``start``;
* ``free_blocks`` appends the hashed blocks that reached 0 to the last
  segment (a new one if the queue has a single segment, so that the head
  segment cannot grow forever), and puts the unhashed ones (B7) in front of
  the head, in the slots ``x`` already popped when there are enough.

``touch`` (B5) takes a free block out of the *middle* of the queue. Instead of
searching for it, kvsim leaves its entry where it is and counts it as dead in
``_stale[block]``; the head skips dead entries when it reaches them. This is
exact because a block's dead entries always lie before its live one: only
hashed blocks are revived by a prefix hit, a hashed block keeps its hash
until it is popped, and so it can only re-enter the queue at the tail. (The
odd touch of an unhashed free block compacts the queue at once.) Compaction
also bounds the dead entries to ``num_gpu_blocks``.

The hash map is exact (``hash -> block``, or ``hash -> {block: None}`` for
the B8 duplicates); an evicted block leaves it at once. While no hash has
duplicates (``_num_multi == 0``), eviction deletes keys in bulk, and caching
inserts a run of new hashes with one ``dict.update``.

Block 0 is the null block: never queued, never freed, never cached
(kv-semantics B2), so ``num_usable_blocks = N - 1``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from operator import itemgetter

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
        # The free queue: segments [ids, start], head first. At start it holds
        # every block in id order, less the null block (B2).
        self._queue: deque[list] = deque([[list(range(1, n)), 0]])
        self._num_free = n - 1
        # Dead entries left in the queue by touch(): block -> how many.
        self._stale: dict[int, int] = {}
        self._num_stale = 0
        # Hash -> block id, or hash -> {block id: None} when several blocks
        # hold the same content: vLLM does not de-duplicate (kv-semantics B8).
        self._cached: dict[int, int | dict[int, None]] = {}
        self._num_multi = 0           # hashes held by several blocks, i.e. dict entries
        # Debug mode keeps the tokens each block holds, to check every hit.
        self.block_tokens: list[tuple | None] = [None] * n

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
        out = []
        dead = dict(self._stale)
        for ids, start in self._queue:
            for i in range(start, len(ids)):
                b = ids[i]
                k = dead.get(b)
                if k:
                    dead[b] = k - 1          # a dead entry: skipped, as the head would
                else:
                    out.append(b)
        return out

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

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        """Pop ``num_blocks`` from the head; evict their hashes; ref_cnt = 1 (B4)."""
        if num_blocks > self._num_free:
            raise ValueError(f"cannot get {num_blocks} blocks: only {self._num_free} free")
        if num_blocks <= 0:
            return []
        seg = self._queue[0]
        ids, start = seg
        end = start + num_blocks
        if end <= len(ids) and not self._num_stale:
            out = ids[start:end]                # the common case: a slice of the head segment
            if end == len(ids):
                self._queue.popleft()
            else:
                seg[1] = end
        else:
            out = self._pop(num_blocks)
        self._num_free -= num_blocks
        ref, block_hash = self.ref_cnt, self.block_hash
        if num_blocks <= 2:
            # One or two blocks (a decoding request crossing a block boundary).
            for b in out:
                ref[b] = 1
                if block_hash[b] is not None:
                    self._evict(b)
            return out
        hashes = itemgetter(*out)(block_hash)
        if hashes.count(None) == num_blocks:
            for b in out:
                ref[b] = 1
            return out
        # Some popped blocks hold a hash: eviction drops them from the map (B4).
        if self._num_multi:
            for b in out:
                ref[b] = 1
                if block_hash[b] is not None:
                    self._evict(b)
            return out
        # Every map entry is a single block: delete the keys in bulk.
        for b in out:
            ref[b] = 1
            block_hash[b] = None
        cached = self._cached
        for h in hashes:
            if h is not None:
                del cached[h]
        if self.debug:
            for b in out:
                self.block_tokens[b] = None
        return out

    def touch(self, blocks: Iterable[int]) -> None:
        """Take a reference on prefix-hit blocks, reviving free ones (B5)."""
        ref = self.ref_cnt
        for b in blocks:
            c = ref[b]
            if c == 0 and b != NULL_BLOCK_ID:
                # Leave its queue entry in place, counted as dead (see module doc).
                self._num_free -= 1
                self._stale[b] = self._stale.get(b, 0) + 1
                self._num_stale += 1
                ref[b] = 1
                if self.block_hash[b] is None or self._num_stale > self.num_gpu_blocks:
                    self._compact()
            else:
                ref[b] = c + 1

    def free_blocks(self, ordered_blocks: Iterable[int]) -> None:
        """Drop one reference from each block, in order; return those at 0 (B6, B7).

        Callers pass a request's blocks reversed, so its tail block is evicted
        first. Blocks that reached 0 with a hash are appended to the tail (LRU);
        with ``lifo_unhashed`` the ones without a hash are prepended to the head,
        keeping their order, so they are reused first (vLLM PR #42656).
        """
        blocks = ordered_blocks if type(ordered_blocks) is list else list(ordered_blocks)
        if NULL_BLOCK_ID in blocks:
            blocks = [b for b in blocks if b != NULL_BLOCK_ID]
        ref = self.ref_cnt
        to_tail: list[int] = []
        if self.lifo_unhashed:
            block_hash = self.block_hash
            to_head: list[int] = []
            for b in blocks:
                c = ref[b] - 1
                ref[b] = c
                if c == 0:
                    if block_hash[b] is None:
                        to_head.append(b)
                    else:
                        to_tail.append(b)
                elif c < 0:
                    raise AssertionError(f"block {b}: ref_cnt went negative")
            if to_head:
                self._prepend(to_head)
        else:
            for b in blocks:
                c = ref[b] - 1
                ref[b] = c
                if c == 0:
                    to_tail.append(b)
                elif c < 0:
                    raise AssertionError(f"block {b}: ref_cnt went negative")
        if to_tail:
            self._append(to_tail)

    def cache_full_blocks(self, blocks: Sequence[int], block_hashes: Sequence[int],
                          num_cached_blocks: int, num_full_blocks: int,
                          tokens: Sequence | None = None, block_size: int = 0) -> None:
        """Give blocks ``[num_cached_blocks, num_full_blocks)`` their hash (A4).

        Runs at schedule time, before the forward pass, so a request scheduled
        later in the same step can already hit these blocks (TV5).
        """
        if num_full_blocks - num_cached_blocks == 1 and not self.debug:
            # One block, the common call (a decoding request fills a block).
            b = blocks[num_cached_blocks]
            if b != NULL_BLOCK_ID:
                h = block_hashes[num_cached_blocks]
                self.block_hash[b] = h
                if self._cached.setdefault(h, b) != b:
                    self._add_duplicate(h, b)
            return
        cached = self._cached
        block_hash = self.block_hash
        with_tokens = self.debug and tokens is not None
        if num_full_blocks - num_cached_blocks > 2 and not with_tokens:
            # Bulk path: when every hash is new, one dict.update does the map.
            new = blocks[num_cached_blocks:num_full_blocks]
            hashes = block_hashes[num_cached_blocks:num_full_blocks]
            if NULL_BLOCK_ID not in new and cached.keys().isdisjoint(hashes):
                before = len(cached)
                cached.update(zip(hashes, new))
                if len(cached) - before == len(new):
                    for b, h in zip(new, hashes):
                        block_hash[b] = h
                    return
                for h in hashes:                # a hash repeats within the call (B8):
                    cached.pop(h, None)         # undo, and take the block-by-block path
        for i in range(num_cached_blocks, num_full_blocks):
            b = blocks[i]
            if b == NULL_BLOCK_ID:
                continue
            h = block_hashes[i]
            block_hash[b] = h
            if cached.setdefault(h, b) != b:
                self._add_duplicate(h, b)
            if with_tokens:
                self.block_tokens[b] = tuple(tokens[i * block_size:(i + 1) * block_size])

    def cache_blocks(self, blocks: Sequence[int], block_hashes: Sequence[int]) -> None:
        """Give ``blocks[i]`` the hash ``block_hashes[i]``, in order (A4).

        The blocks several decoding requests fill in one go (the fast path),
        stored exactly as one ``cache_full_blocks`` call per block would.
        Not for debug mode, which records each block's tokens.
        """
        block_hash, cached = self.block_hash, self._cached
        for b, h in zip(blocks, block_hashes):
            if b == NULL_BLOCK_ID:
                continue
            block_hash[b] = h
            if cached.setdefault(h, b) != b:
                self._add_duplicate(h, b)

    # ----------------------------------------------------------------- private

    def _add_duplicate(self, h: int, b: int) -> None:
        """Store ``b`` under ``h`` after the blocks already there (B8: no dedup)."""
        entry = self._cached[h]
        if type(entry) is int:
            self._cached[h] = {entry: None, b: None}
            self._num_multi += 1
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
                self._num_multi -= 1
        self.block_hash[b] = None
        self.block_tokens[b] = None

    def _append(self, blocks: list[int]) -> None:
        """Queue ``blocks`` at the tail, in order."""
        queue = self._queue
        if len(queue) > 1:
            queue[-1][0].extend(blocks)         # the tail segment, not the head: nothing popped from it
        else:
            queue.append([blocks, 0])
        self._num_free += len(blocks)

    def _prepend(self, blocks: list[int]) -> None:
        """Queue ``blocks`` at the head, in order."""
        queue = self._queue
        k = len(blocks)
        if queue and queue[0][1] >= k:
            # Reuse the slots already popped from the head segment.
            seg = queue[0]
            start = seg[1] - k
            seg[0][start:start + k] = blocks
            seg[1] = start
        else:
            queue.appendleft([blocks, 0])
        self._num_free += k

    def _pop(self, n: int) -> list[int]:
        """The first ``n`` live entries of the queue, taken off it (n <= free)."""
        queue = self._queue
        out: list[int] = []
        stale = self._stale
        while n:
            seg = queue[0]
            ids, start = seg
            end = min(start + n, len(ids))
            window = ids[start:end]
            if self._num_stale and not stale.keys().isdisjoint(window):
                # Dead entries in the way: walk them one by one.
                i = start
                while n and i < len(ids):
                    b = ids[i]
                    i += 1
                    k = stale.get(b)
                    if k:
                        if k == 1:
                            del stale[b]
                        else:
                            stale[b] = k - 1
                        self._num_stale -= 1
                    else:
                        out.append(b)
                        n -= 1
                end = i
            else:
                out += window
                n -= end - start
            if end == len(ids):
                queue.popleft()
            else:
                seg[1] = end
        return out

    def _compact(self) -> None:
        """Rebuild the queue without its dead entries."""
        live = self.free_queue()
        self._queue = deque([[live, 0]]) if live else deque()
        self._stale.clear()
        self._num_stale = 0
