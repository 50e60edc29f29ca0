"""The paged KV block pool: blocks, the free queue and the prefix-cache map.

This reproduces vLLM V1's ``BlockPool`` + ``FreeKVCacheBlockQueue``
(kv-semantics.md section 1; ``vllm/v1/core/block_pool.py``,
``vllm/v1/core/kv_cache_utils.py``). Blocks are plain integers ``0..N-1``;
their state lives in parallel lists (``ref_cnt``, ``block_hash``). A block
other than the null block is free exactly when its ``ref_cnt`` is 0.

vLLM keeps the free queue as a doubly linked list with sentinels. kvsim keeps
the same order in one Python list read from a head index, so that popping,
appending and prepending many blocks are list slices, not a link update per
block::

    free queue storage

      [x x x x|b4 b5 b2 b9 b7 b3 b8 b1]
              ^ _head: get_new_blocks pops here; free_blocks prepends unhashed
                blocks into the popped slots x (B7)
                                        ^ free_blocks appends hashed blocks (B6)

``touch`` (B5) takes a free block out of the *middle*. Instead of searching
for its entry, kvsim leaves it where it is and counts it as dead in
``_stale[block]``; the head skips dead entries when it reaches them. This is
exact because a block's dead entries always lie before its live one: only
hashed blocks are revived by a prefix hit, a hashed block keeps its hash
until it is popped, so it can only re-enter the queue at the tail. (The odd
touch of an unhashed free block rebuilds the queue at once.) Popped slots
are dropped once they are half the list: every operation is O(1) amortised
per block. (An ``OrderedDict`` version was simpler but ran ~16% more
instructions on W1: two dict lookups and a node per block.)

Eviction order is the free-queue order (B4): a popped block that still holds
a hash leaves the hash map then.

The hash map is ``hash -> block``, or ``hash -> {block: None}`` when several
blocks hold the same content: vLLM does not de-duplicate (B8), and a lookup
returns the first block stored under the hash. While no hash has several
blocks (the common case), eviction and caching touch the map in bulk.

Block 0 is the null block: never queued, never freed, never cached
(kv-semantics B2), so ``num_usable_blocks = N - 1``.

**Private blocks.** A block filled by a request whose keys no other request
can hold (a fresh prompt of one sample: ``Request.private_keys``) can be
looked up only by that request, and only after it was freed unfinished (a
preemption: it looks its prefix up again when it is rescheduled). The KV
manager counts such a block cached (A4) but gives the pool no hash for it:
it never enters the map, and its eviction has nothing to clear (B4). Its
place in the free queue is a hashed block's all the same (B6, B7), because
the manager frees a request's blocks with ``free_request_blocks``, which
takes the hashed ones from the manager's count, and none of a private
request's blocks is shared. When its request is freed unfinished, its
private blocks enter the map under their keys (``publish``), which leaves
the map as it would be had they entered it when filled: no other request
looks their keys up, and keys that no other block holds have no order among
duplicates (B8). W1 fills and evicts ~900,000 blocks, none of which is ever
looked up.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from operator import itemgetter

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
        # The free queue: every block in id order, less the null block (B2).
        self._queue: list[int] = list(range(1, n))
        self._head = 0                # index of the head entry in _queue
        self._num_free = n - 1
        self._stale: dict[int, int] = {}    # block -> dead entries it has in the queue
        self._cached: dict[int, int | dict[int, None]] = {}
        self._num_multi = 0           # hashes held by several blocks (dict entries)
        self.block_tokens: list[tuple | None] = [None] * n

    # ------------------------------------------------------------- queries

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
        for b in self._queue[self._head:]:
            k = dead.get(b)
            if k:
                dead[b] = k - 1          # a dead entry: skipped, as the head would
            else:
                out.append(b)
        return out

    def iter_free_queue(self):
        """The free queue from head to tail, lazily (``free_queue`` without the
        list; the hybrid KV manager's decode runs read only its front)."""
        dead = dict(self._stale) if self._stale else None
        queue = self._queue
        for i in range(self._head, len(queue)):
            b = queue[i]
            if dead:
                k = dead.get(b)
                if k:
                    dead[b] = k - 1
                    continue
            yield b

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
        if num_blocks > self._num_free:
            raise ValueError(f"cannot get {num_blocks} blocks: only {self._num_free} free")
        head = self._head
        if num_blocks == 1 and not self._stale:
            # One block: a decoding request crossing a block boundary.
            b = self._queue[head]
            self._head = head + 1
            self._num_free -= 1
            self.ref_cnt[b] = 1
            if self.block_hash[b] is not None:
                self._evict(b)
            return [b]
        out = self._queue[head:head + num_blocks]
        if self._stale and not self._stale.keys().isdisjoint(out):
            out = self._pop_past_dead(num_blocks)     # dead entries in the way
        else:
            self._head = head + num_blocks
        self._num_free -= num_blocks
        ref, block_hash, cached = self.ref_cnt, self.block_hash, self._cached
        if not cached:
            # No block holds a hash (caching off, or nothing cached yet):
            # nothing to evict, no hash to clear.
            for b in out:
                ref[b] = 1
            return self._after_pop(out)
        if self._num_multi:
            # Some hash is held by several blocks: evict block by block.
            for b in out:
                if block_hash[b] is not None:
                    self._evict(b)
                ref[b] = 1
        else:
            for b in out:
                h = block_hash[b]
                if h is not None:                 # eviction: the block leaves the map
                    del cached[h]
                    block_hash[b] = None
                ref[b] = 1
        return self._after_pop(out)

    def _after_pop(self, out: list[int]) -> list[int]:
        """The end of ``get_new_blocks``: debug tokens cleared, popped slots dropped."""
        if self.debug:
            for b in out:
                self.block_tokens[b] = None
        if self._head > 1024 and 2 * self._head > len(self._queue):
            del self._queue[:self._head]              # drop the popped slots
            self._head = 0
        return out

    def touch(self, blocks: Iterable[int]) -> None:
        """Take a reference on prefix-hit blocks, reviving free ones (B5)."""
        ref, stale = self.ref_cnt, self._stale
        rebuild = False
        for b in blocks:
            c = ref[b]
            if c == 0:
                if b == NULL_BLOCK_ID:
                    continue                      # never counted (B2)
                stale[b] = stale.get(b, 0) + 1    # its queue entry is dead now
                self._num_free -= 1
                rebuild = rebuild or self.block_hash[b] is None
            ref[b] = c + 1
        if rebuild or len(self._queue) - self._head > 2 * self.num_gpu_blocks:
            self._compact()

    def free_blocks(self, ordered_blocks: Iterable[int]) -> None:
        """Drop one reference from each block, in order; queue those at 0 (B6, B7).

        Callers pass a request's blocks reversed, so its tail block is evicted
        first. Blocks that reached 0 with a hash are appended to the tail (LRU);
        with ``lifo_unhashed`` the ones without a hash are prepended to the head,
        keeping their order, so they are reused first (vLLM PR #42656).
        """
        to_tail, to_head = self._drop_references(ordered_blocks)
        self._requeue(to_tail, to_head)

    def _drop_references(self, ordered_blocks: Iterable[int]) -> tuple[list[int], list[int]]:
        """``free_blocks``' block-by-block part: each block's ref_cnt less one; those
        that reach 0, in order, for the tail and (unhashed, with ``lifo_unhashed``) the head."""
        ref, block_hash = self.ref_cnt, self.block_hash
        lifo = self.lifo_unhashed
        to_head: list[int] = []
        to_tail: list[int] = []
        for b in ordered_blocks:
            c = ref[b] - 1
            ref[b] = c
            if c == 0:
                if lifo and block_hash[b] is None:
                    to_head.append(b)
                else:
                    to_tail.append(b)
            elif c < 0:
                if b != NULL_BLOCK_ID:
                    raise AssertionError(f"block {b}: ref_cnt went negative")
                ref[b] = 0                        # the null block is never freed nor counted (B2)
        return to_tail, to_head

    def free_request_blocks(self, blocks: list[int], num_unhashed: int, unshared: bool = False) -> None:
        """``free_blocks(blocks)`` (B6, B7) for one request's blocks, tail first,
        of which the first ``num_unhashed`` hold no hash and the others do
        (or are private: the module docstring). ``unshared``: the caller
        knows no other request holds any of them (a private request's: no
        other can hit them), so their ref_cnt is 1 without looking (checked
        in debug mode).

        The manager knows the split: a request's blocks are hashed from its
        first on (A4, ``num_cached_block``). When no block is shared (every
        ref_cnt is 1), all of them reach 0 and go to the queue as two slices,
        the unhashed to the head (with ``lifo_unhashed``) and the rest to the
        tail, which is what the block-by-block loop does; otherwise
        ``_free_partly_shared`` (never for a private request's blocks: none is shared).
        """
        n = len(blocks)
        if n == 0:
            return
        ref = self.ref_cnt
        if not unshared or self.debug:
            refs = (ref[blocks[0]],) if n == 1 else itemgetter(*blocks)(ref)   # (one: itemgetter's scalar)
            if refs.count(1) != n:
                if unshared:
                    raise AssertionError(f"free_request_blocks: blocks {blocks} said unshared "
                                         f"have ref_cnt {refs}")
                self._free_partly_shared(blocks, num_unhashed, refs)
                return
        if self.debug:
            # (Debug mode hashes a private request's blocks too: KVCacheManager.)
            block_hash = self.block_hash
            if any((block_hash[b] is None) != (i < num_unhashed) for i, b in enumerate(blocks)):
                raise AssertionError(f"free_request_blocks: the first {num_unhashed} of "
                                     f"{blocks} are not exactly the unhashed ones")
        for b in blocks:
            ref[b] = 0
        if self.lifo_unhashed and num_unhashed:
            self._requeue(blocks[num_unhashed:], blocks[:num_unhashed])
        else:
            self._requeue(blocks, ())

    def _free_partly_shared(self, blocks: list[int], num_unhashed: int, refs: tuple) -> None:
        """``free_blocks(blocks)`` (B6, B7) for a request's blocks of which some are held by
        another request too (``refs``: their ref_cnt). Those are its prefix, the
        end of the reversed list (prefix hits): the blocks before the first one
        whose ref_cnt is not 1 all reach 0 and go to the queue as the slices of
        ``free_request_blocks``' unshared case; the loop takes the rest, all
        hashed (the unhashed are the first ``num_unhashed``: when the first held
        block lies among them, the loop takes every block)."""
        j = list(map((1).__eq__, refs)).index(False)           # the first block held by another (in C)
        if j < num_unhashed or self.debug:
            self.free_blocks(blocks)
            return
        ref = self.ref_cnt
        for b in blocks[:j]:
            ref[b] = 0
        rest_tail, rest_head = self._drop_references(blocks[j:])   # (rest_head: empty)
        if self.lifo_unhashed and num_unhashed:
            self._requeue(blocks[num_unhashed:j] + rest_tail, blocks[:num_unhashed] + rest_head)
        else:
            self._requeue(blocks[:j] + rest_tail, rest_head)

    def _requeue(self, to_tail: list[int], to_head) -> None:
        """Blocks that reached ref_cnt 0: hashed ones to the tail (B6), unhashed
        ones to the head with ``lifo_unhashed`` (B7), each keeping its order."""
        if to_tail:
            self._queue += to_tail
        if to_head:
            self._prepend(to_head)
        self._num_free += len(to_tail) + len(to_head)

    def cache_full_blocks(self, blocks: Sequence[int], block_hashes: Sequence[int],
                          num_cached_blocks: int, num_full_blocks: int,
                          tokens: Sequence | None = None, block_size: int = 0) -> None:
        """Give blocks ``[num_cached_blocks, num_full_blocks)`` their hash (A4).

        Runs at schedule time, before the forward pass, so a request scheduled
        later in the same step can already hit these blocks (TV5). ``tokens``
        (debug mode) are the request's token ids, kept per block to check hits.
        """
        cached, block_hash = self._cached, self.block_hash
        if num_full_blocks - num_cached_blocks == 1 and not self.debug:
            # One block: the common call (a decoding request fills a block).
            b = blocks[num_cached_blocks]
            if b != NULL_BLOCK_ID:
                h = block_hashes[num_cached_blocks]
                block_hash[b] = h
                if cached.setdefault(h, b) != b:
                    self._add_duplicate(h, b)
            return
        new = blocks[num_cached_blocks:num_full_blocks]
        hashes = block_hashes[num_cached_blocks:num_full_blocks]
        if NULL_BLOCK_ID in new:
            for b, h in zip(new, hashes):
                if b == NULL_BLOCK_ID:
                    continue
                block_hash[b] = h
                if cached.setdefault(h, b) != b:
                    self._add_duplicate(h, b)
        else:
            self._store(new, hashes)
        if tokens is not None and self.debug:
            for i in range(num_cached_blocks, num_full_blocks):
                self.block_tokens[blocks[i]] = tuple(tokens[i * block_size:(i + 1) * block_size])

    def publish(self, blocks: Sequence[int], block_hashes: Sequence[int]) -> None:
        """The private ones of a request's cached ``blocks`` (those without a
        hash, module docstring) enter the map under their ``block_hashes``: the
        request is freed unfinished and may look them up again."""
        cached, block_hash = self._cached, self.block_hash
        for b, h in zip(blocks, block_hashes):
            if block_hash[b] is None:
                block_hash[b] = h
                if cached.setdefault(h, b) != b:
                    self._add_duplicate(h, b)

    def cache_blocks_in_order(self, blocks: Sequence[int], block_hashes: Sequence[int]) -> None:
        """Give each block its hash, in this order (A4, B8): what
        ``cache_full_blocks`` does for one block per call, for many calls (a
        decode run's fills, kv/manager.py ``_cache_decode_steps``)."""
        if NULL_BLOCK_ID not in blocks:
            self._store(blocks, block_hashes)
            return
        cached, block_hash = self._cached, self.block_hash
        for b, h in zip(blocks, block_hashes):
            if b != NULL_BLOCK_ID:
                block_hash[b] = h
                if cached.setdefault(h, b) != b:
                    self._add_duplicate(h, b)

    # ------------------------------------------------------------- private

    def _store(self, blocks: Sequence[int], hashes: Sequence[int]) -> None:
        """Each block gets its hash and its place in the map, in order (A4):
        the block-by-block ``setdefault`` sequence, called from C. A hash
        already stored keeps its first block and this one joins it (B8); the
        joins are made after the calls, which leaves the same entries, since a
        join never changes which block ``setdefault`` finds first."""
        cached, block_hash = self._cached, self.block_hash
        found = list(map(cached.setdefault, hashes, blocks))
        for b, h in zip(blocks, hashes):
            block_hash[b] = h
        if found != blocks:
            for b, h, f in zip(blocks, hashes, found):
                if f != b:
                    self._add_duplicate(h, b)

    def _prepend(self, blocks: list[int]) -> None:
        """Queue ``blocks`` at the head, in order, in slots already popped."""
        k = len(blocks)
        if self._head < k:
            gap = max(k, len(self._queue) // 2, 16)   # open popped slots in front
            self._queue[:0] = [NULL_BLOCK_ID] * gap
            self._head += gap
        self._head -= k
        self._queue[self._head:self._head + k] = blocks

    def _pop_past_dead(self, n: int) -> list[int]:
        """The first ``n`` live entries, taken off the queue, dead ones skipped."""
        queue, stale = self._queue, self._stale
        out: list[int] = []
        i = self._head
        while len(out) < n:
            b = queue[i]
            i += 1
            k = stale.get(b)
            if k:
                if k == 1:
                    del stale[b]
                else:
                    stale[b] = k - 1
            else:
                out.append(b)
        self._head = i
        return out

    def _compact(self) -> None:
        """Rebuild the queue without its dead entries."""
        self._queue, self._head = self.free_queue(), 0
        self._stale.clear()

    def _evict(self, b: int) -> None:
        """B4: block ``b`` leaves the hash map; the other blocks stored under its
        hash stay, the first one first (B8)."""
        h = self.block_hash[b]
        entry = self._cached.pop(h)
        if type(entry) is not int:
            del entry[b]
            if len(entry) == 1:
                entry = next(iter(entry))
                self._num_multi -= 1
            self._cached[h] = entry
        self.block_hash[b] = None
        self.block_tokens[b] = None

    def _add_duplicate(self, h: int, b: int) -> None:
        """Store ``b`` under ``h`` after the blocks already there (B8: no dedup)."""
        entry = self._cached[h]
        if type(entry) is int:
            self._cached[h] = {entry: None, b: None}
            self._num_multi += 1
        else:
            entry[b] = None

