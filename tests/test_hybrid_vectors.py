"""Test vectors from vLLM's own tests, run on kvsim's hybrid KV manager.

From ``tests/v1/core/test_single_type_kv_cache_manager.py`` (the sliding-window
and chunked-local prefix hits, dropping blocks out of the window, the blocks
an allocation needs) and the hybrid parts of ``tests/v1/core/test_prefix_caching.py``
(``test_prefill_hybrid_model``: one full + two sliding groups, block ids,
hits with nulls, partial evictions; ``test_prefill_hybrid_model_combinations``).
vLLM's hashes are sha256 and kvsim's BLAKE2b; the tests compare what the
hashes select, never their values. EAGLE, fine-grained hits, external
(connector) tokens and R-SWA are not modelled, and their vectors are left out.
"""

from __future__ import annotations

import pytest

from helpers import spec
from kvsim.kv.block_pool import BlockPool
from kvsim.kv.hybrid import HybridKVCacheManager
from kvsim.kv.single_type import (ChunkedLocalAttentionManager, SlidingWindowManager,
                                  admission_cap)
from kvsim.sched.request import Request
from kvsim.specs.kv_groups import (CHUNKED, FULL, MAMBA, SLIDING, KVCacheGroup, KVCacheGroups,
                                   LayerKVSpec)

NULL = 0


def sliding(block_size: int, window: int) -> LayerKVSpec:
    return LayerKVSpec(SLIDING, block_size, 8 * block_size, sliding_window=window)


def chunked(block_size: int, chunk: int) -> LayerKVSpec:
    return LayerKVSpec(CHUNKED, block_size, 8 * block_size, attention_chunk_size=chunk)


def full(block_size: int) -> LayerKVSpec:
    return LayerKVSpec(FULL, block_size, 8 * block_size)


def mamba(block_size: int) -> LayerKVSpec:
    return LayerKVSpec(MAMBA, block_size, 8 * block_size, mamba_cache_mode="align")


def manager_of(cls, layer_spec, pool, caching=True, cap=None):
    return cls(layer_spec, pool, 0, enable_caching=caching, admission_cap=cap)


def hybrid(specs: list[LayerKVSpec], num_blocks: int) -> HybridKVCacheManager:
    groups = KVCacheGroups(tuple(KVCacheGroup((i,), s, (s.page_size_bytes,))
                                 for i, s in enumerate(specs)), specs[0].page_size_bytes)
    return HybridKVCacheManager(groups, num_blocks, max_model_len=8192, max_num_batched_tokens=8192)


def request(rid: str, tokens, block_size: int = 16) -> Request:
    return Request(spec(rid, tokens, max_tokens=17), 0, block_size=block_size, max_model_len=8192)


def cache(pool: BlockPool, block_hash, group: int, block: int) -> None:
    """Put ``block`` in the prefix cache under ``block_hash`` (vLLM tests insert directly)."""
    pool._cached[(block_hash, group)] = block


# ------------------------------------------------ test_single_type_kv_cache_manager.py
@pytest.mark.parametrize("cached, expect", [
    ([False] * 10, 0), ([True], 1), ([True, False], 1), ([True, True], 2),
    ([True, True, False], 2), ([True, True, True], 3), ([True, True, True, False], 3),
    ([True, True, False, True, False, False, True, True, False, True, True, True], 12),
    ([True, True, False, True, False, False, True, True, False, False, False], 8),
    ([True, True, False, True, False, False, True, True, False, False, False, True], 8),
])
def test_sliding_window_possible_cached_prefix(cached, expect):
    """block 2, window 4: a hit needs cdiv(3, 2) = 2 cached blocks at its end."""
    pool = BlockPool(100)
    layer = sliding(2, 4)
    for i, hit in enumerate(cached):
        if hit:
            cache(pool, i, 0, i + 10)
    (blocks,), length = SlidingWindowManager.find_longest_cache_hit(
        pool, list(range(len(cached))), len(cached) * 2, [0], layer)
    assert length == expect * 2 and len(blocks) == expect
    assert all(b == NULL for b in blocks[:expect - 2])
    for i in range(min(2, expect)):
        assert blocks[expect - i - 1] == expect - i - 1 + 10


@pytest.mark.parametrize("cached, tail, expect", [
    ([True], 0, 1), ([True], 1, 1), ([True, False], 0, 2), ([True, False], 1, 2),
    ([True, True], 0, 2), ([True, True], 1, 2), ([True, True, False], 0, 2),
    ([True, True, False], 1, 2), ([True, True, True], 0, 3), ([True, True, True], 1, 3),
    ([True, True, True, False], 0, 4), ([True, True, True, False], 1, 4),
    ([False] * 8 + [True], 1, 9), ([True] * 8 + [False], 1, 8),
    ([False] * 8 + [True, True], 1, 10), ([True] * 8 + [True, False], 0, 10),
    ([False] * 8 + [True, False], 1, 10), ([True] * 8 + [False, True], 0, 10),
    ([False] * 8 + [False, True], 1, 10), ([True] * 8 + [False, False], 0, 10),
    ([False] * 8 + [False, False], 1, 10),
])
def test_chunked_local_attention_possible_cached_prefix(cached, tail, expect):
    """block 2, chunk 4: blocks before the chunk of the next token are nulls (hits)."""
    pool = BlockPool(100)
    layer = chunked(2, 4)
    for i, hit in enumerate(cached):
        if hit:
            cache(pool, i, 0, i + 10)
    (blocks,), length = ChunkedLocalAttentionManager.find_longest_cache_hit(
        pool, list(range(len(cached))), len(cached) * 2 + tail, [0], layer)
    assert len(blocks) == expect and length == expect * 2
    assert all(b == NULL for b in blocks[:(expect - 1) // 2])


def held_table(pool: BlockPool, ids) -> list[int]:
    for b in ids:
        pool.ref_cnt[b] = 1
    return list(ids)


def test_sliding_window_remove_skipped_blocks():
    pool = BlockPool(2000)
    m = manager_of(SlidingWindowManager, sliding(2, 4), pool)
    ids = list(range(1000, 1011))
    m.req_to_blocks["test"] = table = held_table(pool, ids)
    m.remove_skipped_blocks("test", 0)
    assert table == ids
    m.remove_skipped_blocks("test", 4)          # token 0 out; block 1000 still holds token 1
    assert table == ids
    m.remove_skipped_blocks("test", 5)          # tokens 0-1 out
    assert table == [NULL] + ids[1:]
    m.remove_skipped_blocks("test", 6)          # block 1001 still holds token 3
    assert table == [NULL] + ids[1:]
    m.remove_skipped_blocks("test", 7)
    assert table == [NULL] * 2 + ids[2:]
    m.remove_skipped_blocks("test", 11)         # 1003 and 1002 go, the longer prefix first
    assert table == [NULL] * 4 + ids[4:]
    assert pool.free_queue()[:2] == [1003, 1002]     # unhashed: to the head, in that order


def test_chunked_local_attention_remove_skipped_blocks():
    pool = BlockPool(2000)
    m = manager_of(ChunkedLocalAttentionManager, chunked(2, 4), pool)
    ids = list(range(1000, 1011))
    m.req_to_blocks["test"] = table = held_table(pool, ids)
    m.remove_skipped_blocks("test", 0)
    assert table == ids
    m.remove_skipped_blocks("test", 4)          # tokens 0-3 are out of the local window
    assert table[:2] == [NULL] * 2
    m.remove_skipped_blocks("test", 6)
    assert table == [NULL] * 2 + ids[2:]
    m.remove_skipped_blocks("test", 12)         # tokens 0-11 out: 6 blocks
    assert table[:6] == [NULL] * 6 and table[6:] == ids[6:]


@pytest.mark.parametrize("cls, layer", [(SlidingWindowManager, sliding(2, 4)),
                                         (ChunkedLocalAttentionManager, chunked(2, 4))])
def test_get_num_blocks_to_allocate(cls, layer):
    pool = BlockPool(100)
    m = manager_of(cls, layer, pool)
    hits = list(range(1, 11))                    # in the free queue: each costs a block
    assert m.get_num_blocks_to_allocate("1", 40, hits, 0) == 20
    assert m.get_num_blocks_to_allocate("2", 40, [NULL] * 5 + hits[:5], 0) == 15


def test_evictable_cached_blocks_not_double_allocated():
    pool = BlockPool(100)
    m = manager_of(SlidingWindowManager, sliding(2, 4), pool)
    evictable = 1                                 # ref_cnt 0: in the free queue
    assert m.get_num_blocks_to_allocate("req", 4, [evictable], 2) == 2
    m.add_local_computed_blocks("req", [evictable], 2)
    assert len(m.allocate_new_blocks("req", 4)) == 1
    assert len(m.req_to_blocks["req"]) == 2


def test_predictor_matches_allocator_with_admission_cap():
    pool = BlockPool(100)
    m = manager_of(SlidingWindowManager, sliding(2, 8), pool, caching=False, cap=4)
    computed = 0
    for num_tokens in (4, 8, 12, 16):
        m.remove_skipped_blocks("req", computed)
        predicted = m.get_num_blocks_to_allocate("req", num_tokens, [], computed)
        assert predicted == len(m.allocate_new_blocks("req", num_tokens))
        computed = num_tokens


def test_admission_cap_is_vllms_max_admission_blocks_per_request():
    # SlidingWindowSpec: cdiv(min(window - 1 + in flight, max_model_len), bs) + 1
    assert admission_cap(sliding(16, 1024), 8192, 32768) == -(-9215 // 16) + 1
    assert admission_cap(sliding(16, 1024), 8192, 4096) == 4096 // 16 + 1
    # ChunkedLocalAttentionSpec: cdiv(min(chunk + in flight, max_model_len), bs)
    assert admission_cap(chunked(16, 8192), 2048, 131072) == 10240 // 16
    assert admission_cap(full(16), 8192, 4096) is None


# ---------------------------------------------------------- test_prefix_caching.py
def test_prefill_hybrid_model():
    """One full and two sliding (window 2 blocks) groups, 21 blocks, block 16."""
    kv = hybrid([full(16), sliding(16, 32), sliding(16, 32)], 21)
    common = [i for i in range(3) for _ in range(16)]
    req0 = request("0", common + [3] * 7)
    hits, num = kv.get_computed_blocks(req0)
    assert num == 0 and not hits
    assert kv.allocate_slots(req0, 55, 0, hits) is not None
    assert kv.get_blocks("0") == ([1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12])
    pool = kv.pool
    for j, ids in enumerate(((1, 5, 9), (2, 6, 10), (3, 7, 11))):
        for g, b in enumerate(ids):
            assert pool.block_hash[b] == (req0.block_hashes[j], g) and pool.ref_cnt[b] == 1
    assert all(pool.block_hash[b] is None for b in (4, 8, 12))

    req1 = request("1", common + [3] * 5)
    hits, num = kv.get_computed_blocks(req1)
    assert hits == ([1, 2, 3], [0, 6, 7], [0, 10, 11]) and num == 48
    kv.allocate_slots(req1, 53 - 48, num, hits)
    assert [t[len(h):] for t, h in zip(kv.get_blocks("1"), hits)] == [[13], [14], [15]]
    assert all(pool.ref_cnt[b] == 2 for group in hits for b in group if b != NULL)
    kv.free(req0)
    kv.free(req1)

    h = req1.block_hashes
    for rid, evict, expect in [
        ("2", [(h[0], 1), (h[0], 2)], 3),         # below the window: the hit stands
        ("3", [(h[0], 0)], 0),                    # the first full block: a miss
        ("4", [(h[2], 0), (h[2], 1), (h[2], 2)], 2),
        ("5", [(h[2], 0)], 2),
        ("6", [(h[2], 1)], 2),
        ("7", [(h[2], 2)], 2),
        # full hits 1 block, sliding 2 (block 0 gone is below its window): no common hit
        ("8", [(h[2], 0), (h[0], 1), (h[0], 2)], 0),
    ]:
        saved = {key: pool._cached.pop(key) for key in evict}
        req = request(rid, common + [3] * 5)
        hits, num = kv.get_computed_blocks(req)
        assert num == expect * 16, rid
        assert all(len(group) == expect for group in hits) or (expect == 0 and not hits)
        pool._cached.update(saved)


# (hit tokens, hit block ids, free blocks) after one 55-token chunk and after 48 + 7,
# recorded from vLLM 0.33.0 (tests/tools/vllm_hybrid_combinations.py).
COMBINATIONS = {
    ("full", "sliding"): [(48, ([1, 2, 3], [0, 6, 7]), 11), (48, ([1, 2, 3], [0, 5, 6]), 12)],
    ("full", "mamba"): [(0, None, 14), (48, ([1, 2, 3], [0, 0, 4]), 13)],
    ("sliding", "mamba"): [(0, None, 14), (48, ([0, 2, 3], [0, 0, 4]), 14)],
    ("sliding", "sliding_large"): [(48, ([0, 2, 3], [5, 6, 7]), 11), (48, ([0, 2, 3], [4, 5, 6]), 12)],
    ("full", "sliding", "sliding"): [(48, ([1, 2, 3], [0, 6, 7], [0, 10, 11]), 17),
                                     (48, ([1, 2, 3], [0, 5, 6], [0, 8, 9]), 19)],
    ("full", "mamba", "mamba"): [(0, None, 23), (48, ([1, 2, 3], [0, 0, 4], [0, 0, 5]), 21)],
    ("full", "sliding", "mamba"): [(0, None, 20), (48, ([1, 2, 3], [0, 5, 6], [0, 0, 7]), 20)],
    ("full", "sliding", "sliding_large"): [(48, ([1, 2, 3], [0, 6, 7], [9, 10, 11]), 17),
                                           (48, ([1, 2, 3], [0, 5, 6], [7, 8, 9]), 18)],
    ("full", "full", "sliding"): [(48, ([1, 2, 3], [5, 6, 7], [0, 10, 11]), 17),
                                  (48, ([1, 2, 3], [4, 5, 6], [0, 8, 9]), 18)],
    ("full", "full", "mamba"): [(0, None, 20), (48, ([1, 2, 3], [4, 5, 6], [0, 0, 7]), 19)],
    ("full", "sliding", "full", "sliding_large"): [
        (48, ([1, 2, 3], [0, 6, 7], [9, 10, 11], [13, 14, 15]), 23),
        (48, ([1, 2, 3], [0, 5, 6], [7, 8, 9], [10, 11, 12]), 24)],
    ("full", "mamba", "full", "mamba"): [(0, None, 29),
                                         (48, ([1, 2, 3], [0, 0, 4], [5, 6, 7], [0, 0, 8]), 27)],
    ("sliding", "mamba", "sliding_large", "mamba"): [
        (0, None, 29), (48, ([0, 2, 3], [0, 0, 4], [5, 6, 7], [0, 0, 8]), 28)],
    ("full", "full", "sliding", "mamba"): [(0, None, 26),
                                           (48, ([1, 2, 3], [4, 5, 6], [0, 8, 9], [0, 0, 10]), 26)],
}


@pytest.mark.parametrize("kinds", list(COMBINATIONS), ids="+".join)
def test_prefill_hybrid_model_combinations(kinds):
    """vLLM's combinations, with Mamba in "align" mode, as vLLM 0.33 runs them."""
    make = {"full": lambda: full(16), "sliding": lambda: sliding(16, 32),
            "sliding_large": lambda: sliding(16, 64), "mamba": lambda: mamba(16)}
    common = [i for i in range(3) for _ in range(16)]
    for chunks, want in zip(([55], [48, 7]), COMBINATIONS[kinds]):
        kv = hybrid([make[k]() for k in kinds], 10 * len(kinds))
        req0 = request("0", common + [3] * 7)
        hits, num = kv.get_computed_blocks(req0)
        assert num == 0
        for n in chunks:
            assert kv.allocate_slots(req0, n, num, hits) is not None
            req0.num_computed_tokens += n
            hits, num = (), 0
        assert len(kv.get_blocks("0")) == len(kinds)
        kv.new_step_starts()
        req1 = request("1", common + [4] * 5)
        hits, num = kv.get_computed_blocks(req1)
        assert (num, hits if num else None, kv.get_num_free_blocks()) == want
        if num:
            assert kv.allocate_slots(req1, 53 - num, num, hits) is not None
            kv.free(req1)
        kv.free(req0)
        assert kv.get_num_free_blocks() == kv.num_usable_blocks


def test_mamba_state_cached_in_this_step_waits_a_step():
    """vLLM MambaManager: a hit on a state cached in the same step is refused."""
    kv = hybrid([full(16), mamba(16)], 40)
    common = [i for i in range(3) for _ in range(16)]
    req0 = request("0", common + [3] * 7)
    kv.allocate_slots(req0, 48, 0, ())          # the state after 48 tokens is cached now
    req1 = request("1", common + [4] * 5)
    hits, num = kv.get_computed_blocks(req1)
    assert num == 48
    assert kv.num_blocks_to_allocate(req1, 53, hits) > kv.pool.num_gpu_blocks
    kv.new_step_starts()
    assert kv.num_blocks_to_allocate(req1, 53, hits) <= kv.get_num_free_blocks()
