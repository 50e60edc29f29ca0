"""``BlockPool`` against a plain reference pool (kv-semantics B1-B8).

``RefPool`` below is the textbook structure vLLM uses: a doubly linked free
queue and an exact hash map, written for clarity, not speed. Seeded random
sequences of pool calls (allocation, frees in any order, caching with repeated
hashes, prefix-hit touches of free and held blocks, the odd touch of an
unhashed free block) run on both pools; after every call the popped blocks,
free queues, ref counts, block hashes, hash map and lookups must be equal.
"""

from __future__ import annotations

import random

import pytest

from kvsim.kv.block_pool import NULL_BLOCK_ID, BlockPool


class RefPool:
    """vLLM V1's BlockPool + FreeKVCacheBlockQueue, one block at a time."""

    def __init__(self, n: int, *, lifo_unhashed: bool) -> None:
        self.lifo_unhashed = lifo_unhashed
        self.ref_cnt = [0] * n
        self.block_hash: list[int | None] = [None] * n
        self.head, self.tail = n, n + 1              # sentinels
        self.prev = [-1] * (n + 2)
        self.next = [-1] * (n + 2)
        self.next[self.head], self.prev[self.tail] = self.tail, self.head
        self.in_free = [False] * n
        self.cached: dict[int, dict[int, None]] = {}  # hash -> blocks, first stored first
        for b in range(n):
            self._insert_before(self.tail, b)
        self._unlink(NULL_BLOCK_ID)                   # B2

    def free_queue(self) -> list[int]:
        out, b = [], self.next[self.head]
        while b != self.tail:
            out.append(b)
            b = self.next[b]
        return out

    def get_cached_block(self, h: int) -> int | None:
        blocks = self.cached.get(h)
        return next(iter(blocks)) if blocks else None

    def get_new_blocks(self, n: int) -> list[int]:    # B4
        out = self.free_queue()[:n]
        for b in out:
            self._unlink(b)
            h = self.block_hash[b]
            if h is not None:
                del self.cached[h][b]
                if not self.cached[h]:
                    del self.cached[h]
                self.block_hash[b] = None
            self.ref_cnt[b] = 1
        return out

    def touch(self, blocks) -> None:                 # B5
        for b in blocks:
            if self.ref_cnt[b] == 0 and self.in_free[b]:
                self._unlink(b)
            self.ref_cnt[b] += 1

    def free_blocks(self, ordered) -> None:          # B6, B7
        to_head = []
        for b in ordered:
            if b == NULL_BLOCK_ID:
                continue
            self.ref_cnt[b] -= 1
            if self.ref_cnt[b] == 0:
                if self.lifo_unhashed and self.block_hash[b] is None:
                    to_head.append(b)
                else:
                    self._insert_before(self.tail, b)
        for b in reversed(to_head):
            self._insert_before(self.next[self.head], b)

    def cache_full_blocks(self, blocks, hashes, lo: int, hi: int) -> None:   # A4, B8
        for i in range(lo, hi):
            b = blocks[i]
            if b != NULL_BLOCK_ID:
                self.block_hash[b] = hashes[i]
                self.cached.setdefault(hashes[i], {})[b] = None

    def _insert_before(self, at: int, b: int) -> None:
        p = self.prev[at]
        self.next[p], self.prev[b], self.next[b], self.prev[at] = b, p, at, b
        self.in_free[b] = True

    def _unlink(self, b: int) -> None:
        p, n = self.prev[b], self.next[b]
        self.next[p], self.prev[n] = n, p
        self.in_free[b] = False


def _hash_map(pool: BlockPool) -> dict[int, list[int]]:
    return {h: [e] if type(e) is int else list(e) for h, e in pool._cached.items()}


def _assert_same(pool: BlockPool, ref: RefPool, num_hashes: int) -> None:
    assert pool.free_queue() == ref.free_queue()
    assert pool.get_num_free_blocks() == len(ref.free_queue())
    assert list(pool.ref_cnt)[1:] == ref.ref_cnt[1:]
    assert pool.block_hash == ref.block_hash
    assert [pool.is_free(b) for b in range(len(ref.in_free))] == ref.in_free
    assert _hash_map(pool) == {h: list(bs) for h, bs in ref.cached.items()}
    assert pool.num_cached_hashes() == len(ref.cached)
    for h in range(num_hashes):
        assert pool.get_cached_block(h) == ref.get_cached_block(h)
    for hashes in ([], [0, 1, 2, 3], list(range(num_hashes))[::-1]):
        prefix = []
        for h in hashes[:3]:
            if ref.get_cached_block(h) is None:
                break
            prefix.append(ref.get_cached_block(h))
        assert pool.get_cached_prefix(hashes, 3) == prefix


def _run(seed: int, steps: int = 250) -> None:
    rng = random.Random(seed)
    n = rng.randint(2, 40)
    lifo = rng.random() < 0.7
    num_hashes = rng.randint(1, 30)                  # few hashes: duplicates (B8) are common
    pool, ref = BlockPool(n, lifo_unhashed=lifo), RefPool(n, lifo_unhashed=lifo)
    held: list[list[int]] = []                       # block tables, one per "request"
    for _ in range(steps):
        op = rng.random()
        if op < 0.35:
            k = rng.randint(0, min(len(ref.free_queue()), rng.choice([1, 2, 5, 40])))
            got = pool.get_new_blocks(k)
            assert got == ref.get_new_blocks(k)
            if got:
                held.append(got)
        elif op < 0.55 and held:
            blocks = held.pop(rng.randrange(len(held)))
            order = blocks[::-1] if rng.random() < 0.8 else list(blocks)
            if rng.random() < 0.1:
                order.append(NULL_BLOCK_ID)
            unhashed = [ref.block_hash[b] is None for b in order]
            k = unhashed.index(False) if False in unhashed else len(order)
            if not any(unhashed[k:]) and rng.random() < 0.5:
                # A request's blocks, the unhashed first (A4): some may be shared.
                pool.free_request_blocks(order, k)
            else:
                pool.free_blocks(iter(order) if rng.random() < 0.5 else order)
            ref.free_blocks(order)
        elif op < 0.75 and held:
            blocks = held[rng.randrange(len(held))]
            lo = rng.randint(0, len(blocks))
            hi = rng.randint(lo, len(blocks))
            hashes = [rng.randrange(num_hashes) for _ in blocks]
            if all(ref.block_hash[b] is None for b in blocks[lo:hi]):   # A4 caches new blocks only
                pool.cache_full_blocks(blocks, hashes, lo, hi)
                ref.cache_full_blocks(blocks, hashes, lo, hi)
        elif op < 0.83 and held:
            # A request that hit another's prefix, then took new blocks: freed, its
            # new blocks reach 0 and the prefix, still held by the other, does not.
            prefix = held[rng.randrange(len(held))]
            prefix = prefix[:rng.randint(1, len(prefix))]
            k = rng.randint(0, min(len(ref.free_queue()), 6))
            pool.touch(prefix)
            ref.touch(prefix)
            got = pool.get_new_blocks(k)
            assert got == ref.get_new_blocks(k)
            held.append(prefix + got)
        elif op < 0.9:
            # A prefix hit: touch the block found for a hash plus other hashed blocks.
            b = ref.get_cached_block(rng.randrange(num_hashes))
            if b is not None:
                hits = [b] + [x for x in range(1, n) if x != b and ref.block_hash[x] is not None
                              and rng.random() < 0.2]
                pool.touch(hits)
                ref.touch(hits)
                held.append(hits)
        elif rng.random() < 0.3:
            free = ref.free_queue()
            if free:
                b = rng.choice(free)                 # may be unhashed: not a prefix hit
                pool.touch([b])
                ref.touch([b])
                held.append([b])
        elif held:
            blocks = list(held[rng.randrange(len(held))])
            pool.touch(blocks)                       # a second holder of held blocks
            ref.touch(blocks)
            held.append(blocks)
        _assert_same(pool, ref, num_hashes)


@pytest.mark.parametrize("chunk", range(4))
def test_block_pool_matches_the_linked_list_reference(chunk):
    for seed in range(chunk * 100, (chunk + 1) * 100):
        _run(seed)


def test_reviving_free_blocks_over_and_over_keeps_the_queue_exact():
    # Touching free cached blocks unlinks them from the middle of the queue (B5).
    pool, ref = BlockPool(6, lifo_unhashed=True), RefPool(6, lifo_unhashed=True)
    blocks = pool.get_new_blocks(5)
    ref.get_new_blocks(5)
    pool.cache_full_blocks(blocks, [10, 11, 12, 13, 14], 0, 5)
    ref.cache_full_blocks(blocks, [10, 11, 12, 13, 14], 0, 5)
    for _ in range(20):
        for p in (pool, ref):
            p.free_blocks(blocks[::-1])
            p.touch(blocks[1:4])
            p.free_blocks(blocks[3:0:-1])
            p.touch(blocks)                          # all five are free again: revive them
        _assert_same(pool, ref, 16)
    for p in (pool, ref):
        p.free_blocks(blocks[::-1])
    assert pool.get_new_blocks(5) == ref.get_new_blocks(5)
    _assert_same(pool, ref, 16)


def test_blocks_freed_as_unshared_go_where_the_checked_free_puts_them():
    # free_request_blocks(unshared=True) skips the ref_cnt look (a private request's
    # blocks: no other request holds them): the queue ends the same; debug mode checks the claim.
    pools = [BlockPool(12), BlockPool(12)]
    for pool in pools:
        blocks = pool.get_new_blocks(7)
        pool.cache_full_blocks(blocks, [20, 21, 22, 23], 0, 4)
    pools[0].free_request_blocks(blocks[::-1], 3)
    pools[1].free_request_blocks(blocks[::-1], 3, unshared=True)
    assert pools[0].get_new_blocks(11) == pools[1].get_new_blocks(11)
    debug = BlockPool(12, debug=True)
    blocks = debug.get_new_blocks(3)
    debug.touch(blocks[:1])                      # a second holder: not unshared
    with pytest.raises(AssertionError, match="unshared"):
        debug.free_request_blocks(blocks[::-1], 3, unshared=True)
