"""The contiguous (pre-paging) allocator and the paged waste accounting."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.kv.contiguous import (
    ContiguousAllocationError,
    ContiguousAllocator,
    ContiguousUsage,
    paged_usage,
)


def fields_sum(u: ContiguousUsage) -> int:
    return (u.used_bytes + u.reserved_unused_bytes + u.internal_fragmentation_bytes
            + u.external_fragmentation_bytes + u.free_bytes)


def test_first_request_starts_at_offset_zero():
    a = ContiguousAllocator(100, 2)
    assert a.allocate("A", 30) == 0


def test_next_request_goes_right_after_the_previous_slab():
    a = ContiguousAllocator(100, 2)
    a.allocate("A", 30)
    assert a.allocate("B", 20) == 30


def test_first_fit_reuses_the_lowest_gap_that_is_large_enough():
    a = ContiguousAllocator(100, 1)
    a.allocate("A", 10)    # [0, 10)
    a.allocate("B", 30)    # [10, 40)
    a.allocate("C", 10)    # [40, 50)
    a.free("A")            # gap [0, 10)
    a.free("C")            # gap [40, 100)
    assert a.allocate("D", 20) == 40   # [0,10) is too small
    assert a.allocate("E", 5) == 0     # the lowest gap fits


def test_cannot_allocate_when_no_single_gap_is_large_enough():
    a = ContiguousAllocator(100, 1)
    a.allocate("A", 40)
    a.allocate("B", 20)
    a.allocate("C", 40)
    a.free("A")
    a.free("C")            # 80 slots free, but in two gaps of 40
    assert not a.can_allocate(50)
    with pytest.raises(ContiguousAllocationError, match="largest gap is 40"):
        a.allocate("D", 50)


def test_failed_allocate_changes_nothing():
    a = ContiguousAllocator(10, 1)
    with pytest.raises(ContiguousAllocationError):
        a.allocate("A", 11)
    assert a.num_requests == 0 and a.free_gaps() == [(0, 10)]


def test_free_makes_the_space_reusable():
    a = ContiguousAllocator(50, 1)
    a.allocate("A", 50)
    assert not a.can_allocate(1)
    a.free("A")
    assert a.allocate("B", 50) == 0


def test_usage_splits_used_and_reservation():
    a = ContiguousAllocator(100, 4)
    a.allocate("A", 40)
    a.set_used("A", 10)
    u = a.usage()
    assert u == ContiguousUsage(used_bytes=40, reserved_unused_bytes=120,
                                internal_fragmentation_bytes=0,
                                external_fragmentation_bytes=0, free_bytes=240, total_bytes=400)


def test_known_final_length_turns_the_tail_into_internal_fragmentation():
    # Reserved for 40 tokens, will stop at 25, holds 10 now (vLLM paper Fig. 2).
    a = ContiguousAllocator(100, 1)
    a.allocate("A", 40, final_tokens=25)
    a.set_used("A", 10)
    u = a.usage()
    assert (u.used_bytes, u.reserved_unused_bytes, u.internal_fragmentation_bytes) == (10, 15, 15)


def test_gaps_smaller_than_the_next_request_are_external_fragmentation():
    a = ContiguousAllocator(100, 1)
    a.allocate("A", 10)
    a.allocate("B", 50)
    a.free("A")            # gap [0,10), tail gap [60,100)
    u = a.usage(next_request_tokens=20)
    assert u.external_fragmentation_bytes == 10
    assert u.free_bytes == 40


def test_no_next_request_means_no_external_fragmentation_claimed():
    a = ContiguousAllocator(100, 1)
    a.allocate("A", 10)
    a.allocate("B", 50)
    a.free("A")
    assert a.usage().external_fragmentation_bytes == 0


def test_set_used_beyond_the_slab_is_rejected():
    a = ContiguousAllocator(100, 1)
    a.allocate("A", 10)
    with pytest.raises(ValueError, match="exceeds the 10 slots reserved"):
        a.set_used("A", 11)


def test_double_allocate_and_unknown_free_are_rejected():
    a = ContiguousAllocator(100, 1)
    a.allocate("A", 10)
    with pytest.raises(ValueError, match="already holds a slab"):
        a.allocate("A", 10)
    with pytest.raises(ValueError, match="holds no slab"):
        a.free("B")


@pytest.mark.parametrize("capacity,bpt", [(0, 1), (10, 0), (-1, 2)])
def test_nonpositive_sizes_are_rejected(capacity, bpt):
    with pytest.raises(ValueError, match="must be an integer >= 1"):
        ContiguousAllocator(capacity, bpt)


def test_final_longer_than_reservation_is_rejected():
    with pytest.raises(ValueError, match="exceeds reserved_tokens"):
        ContiguousAllocator(100, 1).allocate("A", 10, final_tokens=11)


# ------------------------------------------------------------------ paged comparison
def test_paged_internal_fragmentation_is_the_tail_of_each_last_block():
    u = paged_usage([10, 16, 17], block_size=16, bytes_per_token=2, total_blocks=10)
    # blocks held: 1 + 1 + 2 = 4 -> 64 slots, 43 used
    assert u == ContiguousUsage(used_bytes=86, reserved_unused_bytes=0,
                                internal_fragmentation_bytes=42,
                                external_fragmentation_bytes=0, free_bytes=192, total_bytes=320)


def test_paged_usage_rejects_more_blocks_than_the_pool():
    with pytest.raises(ValueError, match="hold 3 blocks but the pool has 2"):
        paged_usage([48], block_size=16, bytes_per_token=1, total_blocks=2)


def test_paging_wastes_less_than_max_length_reservation():
    # Three requests that will reach 100 tokens, 40 generated so far, each
    # reserved for a 512-token maximum in the contiguous baseline.
    c = ContiguousAllocator(2048, 1)
    for rid in "ABC":
        c.allocate(rid, 512, final_tokens=100)
        c.set_used(rid, 40)
    p = paged_usage([40, 40, 40], block_size=16, bytes_per_token=1, total_blocks=128)
    assert p.used_bytes == c.usage().used_bytes
    assert p.wasted_bytes < c.usage().wasted_bytes


# ------------------------------------------------------------------ properties
ops = st.lists(st.tuples(st.sampled_from(["alloc", "free", "use"]),
                         st.integers(0, 7), st.integers(1, 40)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(ops=ops, next_len=st.integers(1, 50))
def test_slabs_never_overlap_and_bytes_add_up(ops, next_len):
    a = ContiguousAllocator(128, 3)
    for op, rid, n in ops:
        if op == "alloc" and rid not in a:
            if a.can_allocate(n):
                start = a.allocate(rid, n, final_tokens=n // 2)
                assert 0 <= start and start + n <= 128
            else:
                with pytest.raises(ContiguousAllocationError):
                    a.allocate(rid, n)
        elif op == "free" and rid in a:
            a.free(rid)
        elif op == "use" and rid in a:
            a.set_used(rid, min(n, a.slab(rid)[1]))
        spans = sorted(a.slab(r) for r in range(8) if r in a)
        for (s1, n1), (s2, _) in zip(spans, spans[1:]):
            assert s1 + n1 <= s2
        u = a.usage(next_request_tokens=next_len)
        assert fields_sum(u) == u.total_bytes == 128 * 3
        assert min(u.used_bytes, u.reserved_unused_bytes, u.internal_fragmentation_bytes,
                   u.external_fragmentation_bytes, u.free_bytes) >= 0


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(1, 30), min_size=1, max_size=10))
def test_freeing_everything_restores_one_full_gap(sizes):
    a = ContiguousAllocator(400, 1)
    for i, n in enumerate(sizes):
        a.allocate(i, n)
    for i in range(len(sizes)):
        a.free(i)
    assert a.free_gaps() == [(0, 400)]
    assert a.allocate("big", 400) == 0


@settings(max_examples=100, deadline=None)
@given(used=st.lists(st.integers(0, 100), max_size=12), bs=st.sampled_from([1, 4, 16]))
def test_paged_bytes_add_up(used, bs):
    u = paged_usage(used, block_size=bs, bytes_per_token=2, total_blocks=2000)
    assert fields_sum(u) == u.total_bytes
    assert 0 <= u.internal_fragmentation_bytes < 2 * bs * max(len(used), 1)
