"""Routers and scorers against fake replicas: each rule, its tie-break, its source's numbers."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.fleet.config import parse_cluster_config
from kvsim.fleet.prefix_tree import ApproxPrefixTree
from kvsim.fleet.routers import build_router
from kvsim.fleet.scorers import (ApproxPrefixScorer, KvCacheUtilizationScorer, PrecisePrefixScorer,
                                 QueueScorer, SessionAffinityScorer)
from kvsim.fleet.state import ReplicaInfo, RouteRequest, route_request
from kvsim.sched.request import Request
from kvsim.workload.request import RequestSpec


@dataclass
class Fake:
    """A replica as routers see it (kvsim/fleet/state.py ReplicaState)."""

    num_running: int = 0
    num_waiting: int = 0
    usage: float = 0.0
    cached: set = field(default_factory=set)

    def kv_cache_usage(self) -> float:
        return self.usage

    def prefix_hit_blocks(self, block_hashes) -> int:
        k = 0
        while k < len(block_hashes) and block_hashes[k] in self.cached:
            k += 1
        return k


def infos(n, *, block_size=16, usable=1000):
    return [ReplicaInfo(f"replica-{i}", "replica", "mixed", block_size, usable) for i in range(n)]


def router(policy, n=3, seed=0, **kw):
    cfg = parse_cluster_config({"replicas": n, "router": {"policy": policy, **kw}}).router
    return build_router(cfg, infos(n), np.random.default_rng(seed))


def req(rid="r", hashes=(), tokens=None, prev=None, block_size=16):
    hashes = list(hashes)
    return RouteRequest(rid, tokens if tokens is not None else max(len(hashes) * block_size, 1),
                        block_size, hashes, prev)


# --- simple policies --------------------------------------------------------------------------

def test_round_robin_cycles_through_replicas_in_order():
    r = router("round_robin", n=3)
    reps = [Fake(), Fake(), Fake()]
    assert [r.route(req(str(k)), reps, 0.0) for k in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_round_robins_choices_taken_ahead_are_its_next_routes_and_advance_it():
    # kvsim/fleet/separate.py takes a window's choices at once; one by one must agree.
    reps = [Fake(), Fake(), Fake()]
    ahead, one_by_one = router("round_robin", n=3), router("round_robin", n=3)
    got = ahead.choices_ahead(4, 3) + [ahead.route(req("x"), reps, 0.0)] + ahead.choices_ahead(5, 3)
    assert got == [one_by_one.route(req(str(k)), reps, 0.0) for k in range(10)]
    assert ahead.choices_ahead(0, 3) == []


@pytest.mark.parametrize("policy", ["random", "least_loaded", "kv_utilization", "prefix_aware"])
def test_routers_whose_choice_reads_anything_else_take_none_ahead(policy):
    assert router(policy).choices_ahead(4, 3) is None


def test_random_is_uniform_and_reproducible_from_the_seed():
    reps = [Fake() for _ in range(4)]
    r1, r2, r3 = (router("random", n=4, seed=s) for s in (7, 7, 8))
    seq1 = [r1.route(req(str(k)), reps, 0.0) for k in range(400)]
    seq2 = [r2.route(req(str(k)), reps, 0.0) for k in range(400)]
    seq3 = [r3.route(req(str(k)), reps, 0.0) for k in range(400)]
    assert seq1 == seq2 and seq1 != seq3
    assert np.bincount(seq1, minlength=4).min() > 70      # each about 100


def test_least_loaded_counts_running_plus_waiting_and_breaks_ties_to_the_lowest_index():
    r = router("least_loaded")
    assert r.route(req(), [Fake(3, 1), Fake(1, 2), Fake(0, 3)], 0.0) == 1     # 4, 3, 3 -> first 3
    assert r.route(req(), [Fake(0, 0), Fake(0, 0), Fake(0, 0)], 0.0) == 0


def test_kv_utilization_picks_the_emptiest_cache():
    r = router("kv_utilization")
    assert r.route(req(), [Fake(usage=0.5), Fake(usage=0.2), Fake(usage=0.2)], 0.0) == 1


def test_session_affinity_sends_a_later_turn_where_the_previous_turn_went():
    r = router("session_affinity", fallback="round_robin")
    reps = [Fake(), Fake(), Fake()]
    assert r.route(req("s0-t0"), reps, 0.0) == 0
    assert r.route(req("s1-t0"), reps, 0.0) == 1
    assert r.route(req("s0-t1", prev="s0-t0"), reps, 1.0) == 0
    assert r.route(req("s1-t1", prev="s1-t0"), reps, 1.0) == 1
    assert r.route(req("s0-t2", prev="s0-t1"), reps, 2.0) == 0
    assert r.route(req("orphan", prev="never-routed"), reps, 2.0) == 2      # fallback


# --- llm-d scorers -------------------------------------------------------------------------------

def test_queue_scorer_is_min_max_normalised_and_neutral_when_equal():
    s = QueueScorer()
    assert s.score(req(), [Fake(num_waiting=q) for q in (0, 5, 10)], 0.0) == [1.0, 0.5, 0.0]
    assert s.score(req(), [Fake(num_waiting=3)] * 2, 0.0) == [1.0, 1.0]


def test_kv_cache_utilization_scorer_is_one_minus_usage():
    assert KvCacheUtilizationScorer().score(req(), [Fake(usage=0.25), Fake(usage=1.0)], 0.0) == [0.75, 0.0]


def test_approximate_prefix_scorer_scores_matched_over_total_blocks_of_what_was_routed():
    cfg = parse_cluster_config({"replicas": 2, "router": {"policy": "weighted",
                                                          "scorers": {"prefix_cache": 1}}}).router
    s = ApproxPrefixScorer(2, cfg.prefix_cache)
    reps = [Fake(), Fake()]
    s.on_routed(req(hashes=[1, 2, 3]), 0, 0.0)
    s.on_routed(req(hashes=[1, 2, 9, 10]), 1, 0.0)
    assert s.score(req(hashes=[1, 2, 3, 4]), reps, 0.0) == [0.75, 0.5]
    assert s.score(req(hashes=[7]), reps, 0.0) == [0.0, 0.0]
    assert s.score(req(hashes=[]), reps, 0.0) == [0.0, 0.0]


def test_approximate_prefix_scorer_forgets_the_least_recently_routed_hashes():
    cfg = parse_cluster_config({"replicas": 1, "router": {
        "policy": "weighted", "scorers": {"prefix_cache": 1},
        "prefix_cache": {"lru_capacity_per_server": 3}}}).router
    s = ApproxPrefixScorer(1, cfg.prefix_cache)
    s.on_routed(req(hashes=[1, 2, 3]), 0, 0.0)
    s.on_routed(req(hashes=[1]), 0, 0.0)                  # 1 is now the newest
    s.on_routed(req(hashes=[4]), 0, 0.0)                  # evicts 2, the oldest
    assert list(s.lru[0]) == [3, 1, 4]
    assert 2 not in s.hash_to_replicas
    assert s.matches([1, 2, 3]) == {0: 1}                 # stops at 2: nobody holds it


def test_approximate_prefix_scorer_caps_the_blocks_it_matches():
    cfg = parse_cluster_config({"replicas": 1, "router": {
        "policy": "weighted", "scorers": {"prefix_cache": 1},
        "prefix_cache": {"max_prefix_blocks_to_match": 2}}}).router
    s = ApproxPrefixScorer(1, cfg.prefix_cache)
    s.on_routed(req(hashes=[1, 2, 3]), 0, 0.0)
    assert list(s.lru[0]) == [1, 2]
    assert s.score(req(hashes=[1, 2, 3]), [Fake()], 0.0) == [1.0]


def test_precise_prefix_scorer_normalises_over_the_replicas_that_hit():
    cfg = parse_cluster_config({"replicas": 4, "router": {
        "policy": "weighted", "scorers": {"precise_prefix_cache": 1}}}).router
    s = PrecisePrefixScorer(4, cfg.precise_prefix_cache)
    reps = [Fake(cached={1}), Fake(cached={1, 2, 3}), Fake(), Fake(cached={1, 2})]
    assert s.score(req(hashes=[1, 2, 3, 4]), reps, 0.0) == [0.0, 1.0, 0.0, 0.5]
    only = [Fake(cached={1}), Fake()]
    assert PrecisePrefixScorer(2, cfg.precise_prefix_cache).score(req(hashes=[1, 2]), only, 0.0) == [1.0, 0.0]
    assert s.score(req(hashes=[9]), reps, 0.0) == [0.0] * 4


def test_speculative_indexing_counts_just_routed_blocks_until_the_ttl_ends():
    cfg = parse_cluster_config({"replicas": 2, "router": {
        "policy": "weighted", "scorers": {"precise_prefix_cache": 1},
        "precise_prefix_cache": {"speculative_ttl_s": 2.0}}}).router
    s = PrecisePrefixScorer(2, cfg.precise_prefix_cache)
    reps = [Fake(cached={1}), Fake()]
    s.on_routed(req(hashes=[1, 2, 3]), 1, 10.0)
    assert s.hits(req(hashes=[1, 2, 3]), reps, 11.0) == [1, 3]
    assert s.hits(req(hashes=[1, 2, 3]), reps, 12.0) == [1, 0]          # expired at 12.0
    s.on_routed(req(hashes=[5]), 1, 13.0)                               # drops the expired entries
    assert set(s.speculative[1]) == {5}


def test_session_affinity_scorer_marks_the_previous_turns_replica():
    s = SessionAffinityScorer()
    s.on_routed(req("a"), 2, 0.0)
    assert s.score(req("b", prev="a"), [Fake()] * 3, 1.0) == [0.0, 0.0, 1.0]
    assert s.score(req("c"), [Fake()] * 3, 1.0) == [0.0, 0.0, 0.0]


def test_weighted_router_adds_weighted_scores_and_picks_the_highest():
    r = router("weighted", n=3, scorers={"queue": 1.0, "kv_cache_utilization": 2.0})
    reps = [Fake(num_waiting=0, usage=0.9), Fake(num_waiting=4, usage=0.1), Fake(num_waiting=2, usage=0.5)]
    # queue: 1, 0, 0.5; kv: 0.1, 0.9, 0.5 -> 1.2, 1.8, 1.5
    assert r.scores(req(), reps, 0.0) == pytest.approx([1.2, 1.8, 1.5])
    assert r.route(req(), reps, 0.0) == 1


def test_weighted_router_breaks_ties_at_random_from_its_seed():
    reps = [Fake(), Fake(), Fake()]
    picks = [router("weighted", n=3, seed=s, scorers={"queue": 1}).route(req(), reps, 0.0)
             for s in range(30)]
    assert set(picks) == {0, 1, 2}
    again = [router("weighted", n=3, seed=s, scorers={"queue": 1}).route(req(), reps, 0.0)
             for s in range(30)]
    assert picks == again


# --- SGLang cache-aware ------------------------------------------------------------------------

def test_prefix_aware_load_balances_when_both_imbalance_thresholds_hold():
    r = router("prefix_aware", n=2, balance_abs_threshold=4, balance_rel_threshold=1.5)
    r.route(req("a", hashes=[1, 2, 3, 4]), [Fake(), Fake()], 0.0)       # tree: [1..4] on 0
    busy = [Fake(num_running=10), Fake(num_running=5)]                  # 10 - 5 > 4, 10 > 7.5
    assert r.route(req("b", hashes=[1, 2, 3, 4]), busy, 1.0) == 1
    assert r.num_load_balanced == 1
    close = [Fake(num_running=8), Fake(num_running=5)]                  # 8 - 5 <= 4: balanced
    assert r.route(req("c", hashes=[1, 2, 3, 4]), close, 2.0) == 0      # the lowest tenant holding it
    ratio = [Fake(num_running=110), Fake(num_running=100)]              # 110 > 100 * 1.5 fails
    assert r.route(req("d", hashes=[1, 2, 3, 4]), ratio, 3.0) == 0


def test_prefix_aware_follows_the_longest_routed_prefix_above_the_cache_threshold():
    r = router("prefix_aware", n=3, cache_threshold=0.5)
    reps = [Fake(), Fake(), Fake()]
    assert r.route(req("a", hashes=[1, 2, 3, 4]), reps, 0.0) == 0       # empty tree: smallest (all 0)
    assert r.route(req("b", hashes=[7, 8, 9, 10]), reps, 0.0) == 1      # no match: smallest tree
    assert r.route(req("c", hashes=[7, 8, 9, 11]), reps, 0.0) == 1      # 3/4 > 0.5
    assert r.route(req("d", hashes=[1, 2, 5, 6]), reps, 0.0) == 2       # 2/4 not > 0.5: smallest
    assert r.tree.size == [4, 5, 4]


def test_prefix_aware_match_rate_counts_prompt_tokens_including_the_partial_block():
    r = router("prefix_aware", n=2, cache_threshold=0.5)
    reps = [Fake(), Fake()]
    r.route(req("a", hashes=[1, 2]), reps, 0.0)                         # on 0
    r.route(req("x", hashes=[5, 6, 7]), reps, 0.0)                      # on 1 (smaller tree)
    # 2 blocks of 16 matched out of 70 prompt tokens: 0.457 -> smallest tree (0 has 2, 1 has 3)
    assert r.route(req("b", hashes=[1, 2, 3, 4], tokens=70), reps, 0.0) == 0
    r2 = router("prefix_aware", n=2, cache_threshold=0.4)
    r2.route(req("a", hashes=[1, 2]), reps, 0.0)
    r2.route(req("x", hashes=[5]), reps, 0.0)
    assert r2.route(req("b", hashes=[1, 2, 3, 4], tokens=70), reps, 0.0) == 0   # 0.457 > 0.4


def test_prefix_aware_precise_reads_the_replicas_caches():
    r = router("prefix_aware", n=3, mode="precise", cache_threshold=0.3)
    reps = [Fake(num_running=1, cached={1}), Fake(num_running=2, cached={1, 2, 3}), Fake()]
    assert r.route(req(hashes=[1, 2, 3, 4]), reps, 0.0) == 1            # 3/4 blocks
    assert r.route(req(hashes=[1, 9, 9, 9]), reps, 0.0) == 2            # 1/4 < 0.3: least loaded
    assert r.tree is None


def test_prefix_aware_evicts_the_tree_on_its_interval_in_simulated_time():
    r = router("prefix_aware", n=1, eviction_interval_s=10.0, max_tree_size=32)   # 2 blocks
    reps = [Fake()]
    r.route(req("a", hashes=[1, 2, 3]), reps, 1.0)
    r.route(req("b", hashes=[4, 5]), reps, 2.0)
    assert r.tree.size == [5]
    r.route(req("c", hashes=[9]), reps, 10.5)            # eviction first (down to 2), then insert
    assert r.tree.size == [3]
    assert r.next_eviction_s == 20.0


# --- Dynamo KV router ----------------------------------------------------------------------------

def test_kv_router_cost_is_weighted_prefill_blocks_plus_decode_blocks():
    r = router("kv_router", n=2, overlap_score_weight=2.0)
    reps = [Fake(usage=0.1, cached={1, 2}), Fake(usage=0.0)]
    request = req(hashes=[1, 2, 3], tokens=50)            # 4 blocks incl. the partial one
    # replica 0: prefill (50 - 32) / 16 = 1.125, decode 100 + 4 - 2 = 102 -> 104.25
    # replica 1: prefill 50 / 16 = 3.125, decode 0 + 4 = 4 -> 10.25
    assert r.logits(request, reps) == pytest.approx([104.25, 10.25])
    assert r.route(request, reps, 0.0) == 1


def test_kv_router_with_temperature_samples_lower_costs_more_often():
    reps = [Fake(usage=0.0), Fake(usage=0.5)]
    picks = [router("kv_router", n=2, seed=s, temperature=0.5).route(req(tokens=16), reps, 0.0)
             for s in range(200)]
    assert 0.75 < picks.count(0) / 200 < 0.98             # softmax(-[0, 1] / 0.5): 0.88


# --- the approximate tree ------------------------------------------------------------------------

def test_tree_splits_a_node_where_two_prompts_diverge():
    t = ApproxPrefixTree(2)
    t.insert([1, 2, 3, 4], 0, 1.0)
    t.insert([1, 2, 7], 1, 2.0)
    assert t.num_nodes() == 3                            # [1 2] -> [3 4], [7]
    assert t.size == [4, 3]
    assert t.prefix_match([1, 2, 3, 9], 3.0) == (3, 0)
    assert t.prefix_match([1, 2, 8], 3.0) == (2, 0)      # both hold [1 2]: the lowest tenant
    assert t.prefix_match([5], 3.0) == (0, None)


def test_tree_eviction_removes_the_oldest_leaves_of_a_tenant_over_its_limit():
    t = ApproxPrefixTree(2)
    t.insert([1, 2, 3], 0, 1.0)
    t.insert([1, 2, 4, 5], 0, 2.0)
    t.insert([9], 1, 0.5)
    t.evict(4)                                           # tenant 0 holds [1 2] [3] [4 5]: 5 blocks
    assert t.size == [4, 1]                              # [3], its oldest leaf, went
    assert t.prefix_match([1, 2, 3], 3.0) == (2, 0)
    assert t.prefix_match([1, 2, 4, 5], 3.0) == (4, 0)
    t.evict(1)                                           # then [4 5], then [1 2]: down to 0
    assert t.size == [0, 1]
    assert t.num_nodes() == 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=6), st.integers(0, 2)),
                min_size=1, max_size=25),
       st.integers(0, 8))
def test_tree_sizes_and_tenant_paths_stay_consistent(ops, limit):
    t = ApproxPrefixTree(3)
    for step, (keys, tenant) in enumerate(ops):
        # Chained hashes: a key stands for the whole prefix up to it.
        chained = [hash(tuple(keys[:i + 1])) for i in range(len(keys))]
        t.insert(chained, tenant, float(step))
        if step % 5 == 4:
            t.evict(limit)
            assert all(s <= max(limit, 0) or s == 0 for s in t.size)
    recount = [0, 0, 0]
    stack = [t.root]
    while stack:
        node = stack.pop()
        for child in node.children.values():
            assert child.tenants, "a node with no tenant must be gone"
            assert set(child.tenants) <= set(node.tenants) or node is t.root
            for tenant in child.tenants:
                recount[tenant] += len(child.keys)
            stack.append(child)
    assert recount == t.size


# --- the request as routers see it ---------------------------------------------------------------

def test_route_request_hashes_the_prompt_blocks_exactly_as_the_engine_does():
    rng = np.random.default_rng(3)
    spec = RequestSpec("r", 0.0, rng.integers(0, 1000, 100), max_tokens=50, cache_salt="t")
    rr = route_request(spec, 16)
    engine_req = Request(spec, 7, block_size=16, max_model_len=4096)
    assert rr.block_hashes == engine_req.block_hashes[:6]
    assert rr.num_prompt_blocks == 7
    fresh = RequestSpec("f", 0.0, np.arange(40, 80), max_tokens=5, fresh_prompt_start=40)
    assert route_request(fresh, 16).block_hashes == \
        Request(fresh, 3, block_size=16, max_model_len=4096).block_hashes[:2]
    assert route_request(spec, 16, hash_blocks=False).block_hashes == []
