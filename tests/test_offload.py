"""Offload tiers (kv/offload.py): vLLM 0.33 native CPU offloading and LMCache semantics.

Exact vectors follow vLLM's CPUOffloadingManager + LRUCachePolicy
(vllm/v1/kv_offload/cpu/) and TieringOffloadingManager (tiering/manager.py),
and LMCache's StorageManager (lmcache/v1/storage_backend/storage_manager.py).
The state machine checks the exactness rules of issue #15: chunks conserved
in every tier, no tier over capacity, a hit returns exactly the requested
tokens, pinned and pending chunks never evicted.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvsim.kv.hashing import block_hashes
from kvsim.kv.offload import HIT, MISS, PENDING, OffloadTier, TierSpec, chunk_keys
from kvsim.kv.offload_stack import OffloadTiers, PrefixHit

CHUNK = 1000          # bytes per chunk in these tests


def tier(name="cpu", medium="cpu", chunks=4, bw=25.0, lat=0.0) -> OffloadTier:
    return OffloadTier(TierSpec(name, medium, chunks * CHUNK, bw, lat), CHUNK)


def stored(t: OffloadTier, keys, rid=None, positions=None):
    res = t.prepare_store(keys, rid, positions)
    assert res is not None
    t.complete_store(res.stored)
    return res


# ------------------------------------------------------------- one tier


def test_chunk_keys_are_the_hash_of_each_chunks_last_block():
    assert chunk_keys([11, 12, 13, 14, 15], 2) == [12, 14]
    assert chunk_keys([11, 12, 13], 1) == [11, 12, 13]


def test_a_store_is_pending_until_complete():
    t = tier()
    res = t.prepare_store([1, 2])
    assert res.stored == (1, 2) and res.evicted == ()
    assert (t.lookup(1), t.lookup(3)) == (PENDING, MISS)
    t.complete_store([1, 2])
    assert t.lookup(1) == HIT


def test_chunks_already_held_are_not_stored_again():
    t = tier()
    stored(t, [1, 2])
    res = t.prepare_store([1, 2, 3])
    assert res.stored == (3,)
    assert t.bytes_written == 3 * CHUNK


def test_lru_evicts_the_oldest_request_tail_first():
    """A request's chunks share a rank, tail before head (LRUCachePolicy.insert)."""
    t = tier(chunks=4)
    stored(t, [1, 2], "a", [16, 32])
    stored(t, [3, 4], "b", [16, 32])
    assert t.lru_order() == [2, 1, 4, 3]
    res = t.prepare_store([5], "c", [16])
    assert res.evicted == (2,)


def test_finishing_a_request_makes_its_head_most_recent():
    t = tier(chunks=4)
    stored(t, [1, 2], "a", [16, 32])
    stored(t, [3, 4], "b", [16, 32])
    t.request_finished("a")                 # fresh ranks, tail first
    assert t.lru_order() == [4, 3, 2, 1]


def test_store_fails_whole_when_room_cannot_be_made():
    t = tier(chunks=2)
    res = t.prepare_store([1, 2])            # both pending: not evictable
    assert t.prepare_store([3]) is None
    assert len(t) == 2 and t.num_failed == 1
    t.complete_store(res.stored)
    assert t.prepare_store([3]).evicted == (1,)


def test_pinned_chunks_are_not_evicted_and_offered_ones_are_protected():
    t2 = tier(chunks=2)
    stored(t2, [1, 2])
    t2.prepare_load([1])
    assert t2.prepare_store([2, 3]) is None   # 1 pinned, 2 offered: nothing to evict
    t2.complete_load([1])
    assert t2.prepare_store([2, 3]).evicted == (1,)


def test_failed_write_drops_the_chunk():
    t = tier()
    t.prepare_store([1])
    t.complete_store([1], success=False)
    assert t.lookup(1) == MISS and len(t) == 0


def test_transfer_time_is_latency_plus_bytes_over_bandwidth():
    spec = TierSpec("disk", "disk", 10 ** 12, 5.0, 100.0)
    assert spec.transfer_time_s(10 ** 9) == pytest.approx(1e-4 + 0.2)
    assert spec.transfer_time_s(10 ** 9, num_transfers=4) == pytest.approx(4e-4 + 0.2)
    assert spec.transfer_time_s(0) == 0.0


@pytest.mark.parametrize("kwargs, key", [
    ({"capacity_bytes": 0}, "capacity_bytes"), ({"capacity_bytes": -5}, "capacity_bytes"),
    ({"bandwidth_gbps": 0}, "bandwidth_gbps"), ({"bandwidth_gbps": None}, "bandwidth_gbps"),
    ({"medium": "tape"}, "medium"), ({"latency_us": -1}, "latency_us"),
])
def test_bad_tier_specs_name_the_field(kwargs, key):
    base = {"name": "t", "medium": "disk", "capacity_bytes": 10 ** 9, "bandwidth_gbps": 2.0}
    with pytest.raises(ValueError, match=key):
        TierSpec(**(base | kwargs))


def test_a_tier_smaller_than_a_chunk_is_refused():
    with pytest.raises(ValueError, match="holds no chunk"):
        OffloadTier(TierSpec("cpu", "cpu", 999, 25.0), 1000)


# ------------------------------------------------------------ tier stacks


def stack(semantics):
    return OffloadTiers([tier("cpu", "cpu", 4), tier("disk", "disk", 8, bw=5.0)], semantics=semantics)


def test_vllm_a_chunk_only_on_disk_is_pending_until_promoted():
    s = stack("vllm")
    for res in s.store([1, 2, 3]).values():
        assert res.stored == (1, 2, 3)
    s.complete_store([1, 2, 3])
    cpu = s.by_name["cpu"]
    cpu.touch([3])
    stored(cpu, [7, 8])                            # evicts 1 (the oldest) ...
    stored(cpu, [9])                               # ... then 2; 3 was touched
    assert sorted(cpu.lru_order()) == [3, 7, 8, 9]
    assert s.lookup([1, 2, 3, 4]) == PrefixHit(3, (("disk", 2), ("cpu", 1)), pending=True)
    plan = s.plan_load([1, 2, 3, 4], 0, s.lookup([1, 2, 3, 4]))
    assert plan.reads == {"disk": [1, 2], "cpu": [3]} and plan.promotions == [1, 2]


def test_vllm_all_in_cpu_is_a_ready_hit_from_the_first_tier():
    s = stack("vllm")
    s.store([1, 2])
    s.complete_store([1, 2])
    assert s.lookup([1, 2, 3]) == PrefixHit(2, (("cpu", 2),), pending=False)
    assert s.lookup([1, 2, 3], start=1) == PrefixHit(1, (("cpu", 1),), pending=False)


def test_lmcache_serves_the_prefix_tier_by_tier():
    """storage_manager.py async_lookup_and_prefetch: tier 0 covers 0..t1, tier 1 continues."""
    s = stack("lmcache")
    s.store([1, 2, 3, 4])
    s.complete_store([1, 2, 3, 4])
    cpu = s.by_name["cpu"]
    stored(cpu, [7, 8, 9])                        # evicts 1..3 from the CPU (LRU)
    assert 4 in cpu and 1 not in cpu
    # CPU misses chunk 1 at once, so disk serves from the start; CPU's 4 is not reached.
    assert s.lookup([1, 2, 3, 4, 5]) == PrefixHit(4, (("disk", 4),))
    stored(cpu, [1])
    assert s.lookup([1, 2, 3, 4, 5]) == PrefixHit(4, (("cpu", 1), ("disk", 3)))


def test_tier_stack_errors():
    with pytest.raises(ValueError, match="at least one tier"):
        OffloadTiers([])
    with pytest.raises(ValueError, match="semantics"):
        OffloadTiers([tier()], semantics="mooncake")
    with pytest.raises(ValueError, match="names must differ"):
        OffloadTiers([tier("a"), tier("a", "disk")])


def test_a_shared_tier_serves_a_chunk_another_replica_stored():
    remote = OffloadTier(TierSpec("store", "remote", 16 * CHUNK, 12.5, 50.0, shared=True), CHUNK)
    r0 = OffloadTiers([tier("cpu0"), remote])
    r1 = OffloadTiers([tier("cpu1"), remote])
    r0.store([5, 6])
    r0.complete_store([5, 6])
    assert r1.lookup([5, 6]) == PrefixHit(2, (("store", 2),), pending=True)


# ----------------------------------------------------------- state machine


def token_runs(draw_prefix: int, length: int, salt: int) -> np.ndarray:
    """A token sequence that shares its first ``draw_prefix`` tokens with every other one."""
    shared = np.arange(1, draw_prefix + 1)
    own = 1000 * (salt + 1) + np.arange(length - draw_prefix)
    return np.concatenate([shared, own]).astype(np.int64)


BLOCK, BPC = 4, 2


class TierMachine(RuleBasedStateMachine):
    """Random stores, completions, loads and lookups on a 3-tier stack."""

    def __init__(self):
        super().__init__()
        self.semantics = "vllm"
        self.tiers = None
        self.tokens: dict[int, tuple] = {}       # chunk key -> the tokens it holds
        self.pending: list[tuple[str, tuple]] = []
        self.loading: list[tuple[str, tuple]] = []
        self.num = 0

    @rule(semantics=st.sampled_from(["vllm", "lmcache"]), sizes=st.tuples(
        st.integers(1, 4), st.integers(1, 6), st.integers(2, 10)))
    @precondition(lambda self: self.tiers is None)
    def build(self, semantics, sizes):
        names = ("cpu", "disk", "remote")
        self.semantics = semantics
        self.tiers = OffloadTiers([tier(n, n, c) for n, c in zip(names, sizes)], semantics=semantics)

    def _keys(self, prefix, length, salt):
        toks = token_runs(prefix, length, salt)
        keys = chunk_keys(block_hashes(toks, BLOCK), BPC)
        for i, k in enumerate(keys):
            want = tuple(toks[:(i + 1) * BLOCK * BPC])
            assert self.tokens.setdefault(k, want) == want          # the hash is injective here
        return toks, keys

    @rule(prefix=st.integers(0, 24), length=st.integers(8, 40), salt=st.integers(0, 5),
          tier_index=st.integers(0, 2))
    @precondition(lambda self: self.tiers is not None)
    def store(self, prefix, length, salt, tier_index):
        _, keys = self._keys(min(prefix, length), length, salt)
        self.num += 1
        t = self.tiers.tiers[tier_index % len(self.tiers.tiers)]
        res = t.prepare_store(keys, f"r{self.num}", [(i + 1) * BLOCK * BPC for i in range(len(keys))])
        if res is not None and res.stored:
            self.pending.append((t.name, res.stored))

    @rule(data=st.data(), ok=st.booleans())
    @precondition(lambda self: self.pending)
    def complete(self, data, ok):
        name, keys = self.pending.pop(data.draw(st.integers(0, len(self.pending) - 1)))
        self.tiers.by_name[name].complete_store(keys, success=ok or self.semantics == "lmcache")

    @rule(prefix=st.integers(0, 24), length=st.integers(8, 40), salt=st.integers(0, 5))
    @precondition(lambda self: self.tiers is not None)
    def lookup_and_load(self, prefix, length, salt):
        toks, keys = self._keys(min(prefix, length), length, salt)
        hit = self.tiers.lookup(keys)
        assert hit.num_chunks == sum(n for _, n in hit.tiers) <= len(keys)
        # A hit returns exactly the requested tokens: each chunk is in the tier
        # named for it and holds this request's tokens for that chunk.
        plan = self.tiers.plan_load(keys, 0, hit)
        # The plan reads each run from its tier, in prefix order; lower tiers are promoted.
        taken: dict[str, int] = {}
        in_order = []
        for name, n in hit.tiers:
            start = taken.get(name, 0)
            in_order += plan.reads[name][start:start + n]
            taken[name] = start + n
        assert in_order == keys[:hit.num_chunks]
        assert plan.promotions == [k for k, (name, _) in zip(in_order, [
            run for run in hit.tiers for _ in range(run[1])]) if name != self.tiers.first.name]
        i = 0
        for name, n in hit.tiers:
            for k in keys[i:i + n]:
                assert self.tiers.by_name[name].lookup(k) != MISS
                assert self.tokens[k] == tuple(toks[:len(self.tokens[k])])
            i += n
        if not hit.pending:
            for name, ks in plan.reads.items():
                ks = [k for k in ks if self.tiers.by_name[name].lookup(k) == HIT]
                self.tiers.by_name[name].prepare_load(ks)
                self.loading.append((name, tuple(ks)))

    @rule(data=st.data())
    @precondition(lambda self: self.loading)
    def finish_load(self, data):
        name, keys = self.loading.pop(data.draw(st.integers(0, len(self.loading) - 1)))
        self.tiers.by_name[name].complete_load(keys)

    @invariant()
    def tiers_conserve_chunks_and_respect_capacity(self):
        if self.tiers is None:
            return
        pending = {(n, k) for n, ks in self.pending for k in ks}
        pins: dict[tuple, int] = {}
        for n, ks in self.loading:
            for k in ks:
                pins[(n, k)] = pins.get((n, k), 0) + 1
        for t in self.tiers.tiers:
            assert len(t) <= t.capacity_chunks
            assert t.num_stored - t.num_evicted == len(t)
            for (n, k) in pending:
                if n == t.name:
                    assert t.state(k) == -1                 # a pending chunk is never evicted
            for (n, k), c in pins.items():
                if n == t.name:
                    assert t.state(k) == c                  # a pinned chunk is never evicted
            for k in t.lru_order():
                assert t.state(k) == 0


TestTierMachine = TierMachine.TestCase
TestTierMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
