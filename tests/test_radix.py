"""SGLang's radix cache in kvsim (kv/radix.py, kv/radix_pool.py): vectors and invariants.

TV15 is kv-semantics.md's vector (run on SGLang 0.4.6.post5's code); the
``test_sglang_unit_*`` vectors are SGLang's own unit tests
(test/srt/test_radix_cache.py, test/srt/test_radix_cache_unit.py in
sgl-project/sglang), with 0.4.6's tree (an evicted node leaves the tree; it
is not marked ``value=None`` as in later versions).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sglang_oracle.scripts import Kvsim, make_script

from kvsim.kv.radix import RadixCache
from kvsim.kv.radix_pool import PagedSlotAllocator, RadixKVPool, RadixRequest, TokenSlotAllocator


class RecordingAllocator:
    def __init__(self):
        self.freed: list[list[int]] = []

    def free(self, slots):
        if len(slots):
            self.freed.append(list(slots))


def finished(pool: RadixKVPool, rid, prompt, outputs) -> RadixRequest:
    """A request that ran alone to its finish, inserted only then (as TV15 does)."""
    req = RadixRequest(rid, list(prompt))
    pool.match(req)
    pool.admit([req])
    req.output_ids = list(outputs)
    req.kv_indices += pool.allocator.alloc(len(outputs) - 1)
    pool.finish(req)
    return req


def path_keys(tree: RadixCache, node) -> list[int]:
    keys = []
    while node is not tree.root_node:
        keys[:0] = node.key
        node = node.parent
    return keys


# ------------------------------------------------------------------ TV15


def test_tv15_sglang_radix_cache():
    pool = RadixKVPool(16)
    tree = pool.tree
    # 1. A (prompt 1..6, outputs 60, 61) finishes: [1..6, 60] on slots 1..7.
    finished(pool, "A", range(1, 7), [60, 61])
    assert tree.snapshot() == [[], [], 1, [[[1, 2, 3, 4, 5, 6, 60], [1, 2, 3, 4, 5, 6, 7], 0, []]]]
    assert tree.evictable_size() == 7
    # 2. B = [1,2,3,9,9]: match_prefix([1,2,3,9]) hits 3 and splits; B's lock protects 3.
    b = RadixRequest("B", [1, 2, 3, 9, 9])
    assert pool.match(b) == 3
    assert tree.snapshot()[3][0][:2] == [[1, 2, 3], [1, 2, 3]]
    assert tree.snapshot()[3][0][3][0][:2] == [[4, 5, 6, 60], [4, 5, 6, 7]]
    # 3. B allocates slots 8 and 9, finishes after 1 output: a new leaf [9, 9].
    assert pool.admit([b]) == [8, 9]
    assert (tree.protected_size(), tree.evictable_size()) == (3, 4)
    b.output_ids.append(70)
    pool.finish(b)
    assert tree.evictable_size() == 9
    assert [c[0] for c in tree.snapshot()[3][0][3]] == [[4, 5, 6, 60], [9, 9]]
    # 4. evict(2) frees the whole LRU leaf [4,5,6,60]: slots 4..7 go back.
    assert tree.evict(2) == 4
    assert pool.allocator.free_slots() == [10, 11, 12, 13, 14, 15, 16, 4, 5, 6, 7]
    assert tree.snapshot() == [[], [], 1, [[[1, 2, 3], [1, 2, 3], 0, [[[9, 9], [8, 9], 0, []]]]]]


def test_tv15_with_the_05_prompt_split_evicts_the_output_first():
    """SGLang 0.5.x also inserts the prompt at a finish: a node ends at the prompt."""
    pool = RadixKVPool(16, split_prompt=True)
    tree = pool.tree
    finished(pool, "A", range(1, 7), [60, 61])
    assert tree.snapshot() == [[], [], 1, [[[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6], 0,
                                             [[[60], [7], 0, []]]]]]
    b = RadixRequest("B", [1, 2, 3, 9, 9])
    pool.match(b)
    pool.admit([b])
    b.output_ids.append(70)
    pool.finish(b)
    # Leaf [60] is the oldest; its parent [4,5,6] (touched by B's match) goes next.
    assert tree.evict(2) == 4
    assert pool.allocator.free_slots() == [10, 11, 12, 13, 14, 15, 16, 7, 4, 5, 6]


# ---------------------------------------------------- SGLang's unit tests


def test_sglang_unit_insert_and_match():
    tree = RadixCache(RecordingAllocator())
    tree.insert([1, 2, 3, 4], [1, 2, 3, 4])
    value, node = tree.match_prefix([1, 2, 3, 4])
    assert value == [1, 2, 3, 4]
    assert node.key == [1, 2, 3, 4]


def test_sglang_unit_evict_removes_evicted_node():
    alloc = RecordingAllocator()
    tree = RadixCache(alloc)
    tree.insert([10, 20, 30], [10, 20, 30])
    assert tree.evictable_size() == 3
    tree.evict(3)
    assert tree.evictable_size() == 0
    assert alloc.freed == [[10, 20, 30]]


def test_sglang_unit_lock_ref_prevents_eviction():
    tree = RadixCache(RecordingAllocator())
    tree.insert([100, 101, 102], [100, 101, 102])
    _, node = tree.match_prefix([100, 101, 102])
    tree.inc_lock_ref(node)
    tree.evict(3)
    assert node.parent.children == {100: node}
    assert tree.evictable_size() == 0
    tree.dec_lock_ref(node)
    tree.evict(3)
    assert tree.root_node.children == {}
    assert tree.evictable_size() == 0


def test_sglang_unit_evict_heap_promotion_of_parent():
    tree = RadixCache(RecordingAllocator())
    tree.insert([1, 2], [1, 2])
    tree.insert([1, 2, 3], [1, 2, 3])
    _, child = tree.match_prefix([1, 2, 3])
    parent = child.parent
    tree.inc_lock_ref(child)
    assert (tree.protected_size(), tree.evictable_size()) == (3, 0)
    tree.dec_lock_ref(child)
    assert (tree.protected_size(), tree.evictable_size()) == (0, 3)
    tree.evict(3)                          # [3], then its parent [1, 2] once childless
    assert tree.root_node.children == {}
    assert parent.children == {}
    assert tree.evictable_size() == 0


@pytest.mark.parametrize("page_size, length, matched", [(1, 5, 5), (2, 5, 4), (4, 6, 4)])
def test_sglang_unit_page_alignment_boundary(page_size, length, matched):
    tree = RadixCache(RecordingAllocator(), page_size)
    tokens = list(range(length))
    tree.insert(tokens, tokens)
    value, _ = tree.match_prefix(tokens)
    assert len(value) == matched


def test_sglang_unit_total_size():
    tree = RadixCache(RecordingAllocator())
    tree.insert([1, 2, 3], [10, 20, 30])
    assert tree.total_size() == 3
    tree.insert([4, 5], [40, 50])
    assert tree.total_size() == 5


# ------------------------------------------------------------ mechanics


def test_insert_returns_the_shared_prefix_and_keeps_only_new_slots():
    tree = RadixCache(RecordingAllocator())
    assert tree.insert([1, 2, 3], [11, 12, 13]) == 0
    assert tree.insert([1, 2, 4, 5], [21, 22, 23, 24]) == 2
    assert tree.snapshot() == [[], [], 1, [[[1, 2], [11, 12], 0, [[[3], [13], 0, []],
                                                                  [[4, 5], [23, 24], 0, []]]]]]


def test_finish_frees_the_requests_own_slots_for_tokens_already_in_the_tree():
    """Dedup (G3): two identical prompts computed side by side; the second's copy is freed."""
    pool = RadixKVPool(32)
    a, b = RadixRequest("a", [1, 2, 3, 4]), RadixRequest("b", [1, 2, 3, 4])
    pool.match(a)
    pool.match(b)
    assert pool.admit([a, b]) == [1, 2, 3, 4, 5, 6, 7, 8]
    for r in (a, b):
        r.output_ids.append(9)
        pool.finish(r)                     # inserts [1, 2, 3, 4]
    assert pool.tree.total_size() == 4
    assert pool.allocator.free_slots()[-4:] == [5, 6, 7, 8]


def test_a_hit_is_at_most_len_minus_one_tokens():
    pool = RadixKVPool(32)
    finished(pool, "a", [1, 2, 3, 4], [9, 10])
    assert pool.match(RadixRequest("b", [1, 2, 3, 4])) == 3


def test_eviction_skips_locked_leaves_and_may_overshoot():
    pool = RadixKVPool(32)
    finished(pool, "a", [1, 2, 3, 4, 5], [6, 7])         # leaf of 6 tokens
    finished(pool, "b", [8, 9], [10, 11])                # leaf of 3 tokens, newer
    c = RadixRequest("c", [1, 2, 3, 4, 5, 6, 50])
    pool.match(c)
    pool.admit([c])                                        # locks [1..6]
    assert pool.tree.evict(1) == 3                         # the whole unlocked leaf
    assert pool.tree.evict(100) == 0                       # the rest is locked


def test_alloc_token_slots_evicts_the_request_size_not_the_shortfall():
    """schedule_batch.py alloc_token_slots: evict(num_tokens) when short."""
    pool = RadixKVPool(8)
    for rid, first in (("a", 1), ("b", 4), ("c", 7)):
        finished(pool, rid, [first], [first + 1, first + 2])      # 3 leaves of 2 tokens
    assert pool.allocator.available_size() == 2
    d = RadixRequest("d", [40, 41, 42])
    pool.match(d)
    pool.admit([d])                       # 1 short; evict(3) frees two leaves, not one
    assert [c[0] for c in pool.tree.snapshot()[3]] == [[7, 8]]
    assert pool.allocator.available_size() == 3


def test_paged_free_puts_sorted_pages_in_front():
    alloc = PagedSlotAllocator(16, 4)                      # pages 1..4
    assert alloc.alloc(8) == [4, 5, 6, 7, 8, 9, 10, 11]
    alloc.free([9, 8, 5])
    assert alloc.free_pages() == [1, 2, 3, 4]


def test_paged_alloc_extend_fills_the_last_page_first():
    alloc = PagedSlotAllocator(32, 4)
    assert alloc.alloc_extend([0], [6], [-1]) == [4, 5, 6, 7, 8, 9]
    # The next 5 tokens: 2 in page 2 after slot 9, then page 3.
    assert alloc.alloc_extend([6], [11], [9]) == [10, 11, 12, 13, 14]


def test_token_allocator_reuses_freed_slots_last():
    alloc = TokenSlotAllocator(4)
    assert alloc.alloc(2) == [1, 2]
    alloc.free([2, 1])
    assert alloc.free_slots() == [3, 4, 2, 1]
    assert alloc.alloc(5) is None


def test_lfu_evicts_the_least_hit_leaf():
    pool = RadixKVPool(32, eviction_policy="lfu")
    finished(pool, "a", [1, 2, 3], [4, 5])                 # leaf [1..4], 1 hit
    finished(pool, "b", [7, 8], [9, 10])                   # leaf [7..9]
    finished(pool, "a2", [1, 2, 3], [4, 5])                # [1..4] again: 2 hits
    assert pool.tree.evict(1) == 3
    assert list(pool.tree.root_node.children) == [1]


@pytest.mark.parametrize("bad", [{"page_size": 0}, {"eviction_policy": "lru2"}])
def test_bad_radix_parameters_are_named(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        RadixCache(RecordingAllocator(), **bad)


# ------------------------------------------------------------ invariants


def check_invariants(world: Kvsim) -> None:
    pool = world.pool
    tree = pool.tree
    ps = pool.page_size
    nodes, stack = [], [tree.root_node]
    while stack:
        n = stack.pop()
        nodes.append(n)
        stack.extend(n.children.values())
    tree_slots = [s for n in nodes for s in n.value]
    live = [r for r in world.reqs.values() if r.holds_lock]
    # Sizes: every cached token is either evictable or protected.
    assert tree.evictable_size() + tree.protected_size() == tree.total_size() == len(tree_slots)
    assert tree.protected_size() == sum(len(n.value) for n in nodes if n.lock_ref > 0 and n is not tree.root_node)
    # Locks: each node is locked once per live request whose last node lies below it.
    for n in nodes:
        if n is tree.root_node:
            continue
        holders = 0
        for r in live:
            m = r.last_node
            while m is not None and m is not n:
                m = m.parent
            holders += m is n
        assert n.lock_ref == holders
    # Slots: conserved. Token-granular: free, tree and request-owned slots partition 1..size.
    pending = pool.allocator._group or []      # freed inside a free group, not yet queued
    if ps == 1:
        owned = [s for r in live for s in r.kv_indices[len(r.prefix_indices):]]
        everything = pool.allocator.free_slots() + pending + tree_slots + owned
        assert sorted(everything) == list(range(1, pool.allocator.size + 1))
    else:
        free = set(pool.allocator.free_pages()) | {s // ps for s in pending}
        used = {s // ps for s in tree_slots} | {s // ps for r in live for s in r.kv_indices}
        assert not free & used
        assert free | used == set(range(1, pool.allocator.num_pages + 1))
    # A hit returns exactly the requested tokens: the path's keys are the prefix.
    for r in live:
        hit = path_keys(tree, r.last_node)
        assert hit == r.fill_ids[:len(hit)]


@settings(max_examples=80, deadline=None)
@given(data=st.data(), page_size=st.sampled_from([1, 1, 2, 4]), size=st.integers(8, 48),
       clock=st.sampled_from(["counter", "step"]))
def test_radix_invariants_hold_after_every_operation(data, page_size, size, clock):
    size = max(size, 3 * page_size)
    case = make_script(lambda n: data.draw(st.integers(0, n - 1)), size=size,
                       page_size=page_size, clock=clock, num_ops=40)
    world = Kvsim(case)
    for o in case["ops"]:
        world.apply(o)
        check_invariants(world)
