"""Private blocks (kv/block_pool.py) change nothing but the work: the same runs with them and without.

A fresh prompt of one sample (no shared system prompt, no sibling) holds keys
no other request can hold, so its blocks get no hash and stay out of the
prefix-cache map until the request is freed unfinished (a preemption), when they enter it
under their keys (``BlockPool.publish``) for its own lookup when it resumes.
Every case below runs twice, once with every request's blocks in the map as
they are filled (the engine told that no request is alone), and must give
the same requests, steps, per-step trace and summary, on the fast path and
on the step path. The cases preempt, and resumed requests hit their own
published blocks (checked: the runs reach what they test). A hypothesis
state machine then drives two KV managers through the same admissions,
decode steps and runs, preemptions, resumptions and finishes, with private
requests in one and none in the other, and checks that their pools stay
the same, lookups included.
"""

from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
import pandas as pd
import pytest
from hypothesis import settings
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule, run_state_machine_as_test)

import kvsim
from kvsim.kv.block_pool import BlockPool
from kvsim.kv.hashing import block_hashes
from kvsim.kv.manager import KVCacheManager
from kvsim.sim.engine import Engine


def scenario(**engine) -> dict:
    return {
        "name": "private-blocks", "seed": 11, "model": "llama-3.1-8b",
        "hardware": {"gpu": "h100-sxm"},
        "engine": {"max_num_batched_tokens": 512, "max_model_len": 4096,
                   "num_gpu_blocks_override": 260, **engine},
        "cost_model": {"type": "roofline"},
        "workload": {"num_requests": 150, "arrival": {"type": "poisson", "rate": 60.0},
                     "prompt_len": {"type": "lognormal", "median": 300, "sigma": 0.8, "max": 2000},
                     "output_len": {"type": "uniform", "low": 20, "high": 300}},
    }


CASES = {
    "chunked": scenario(),
    "chunked_priority": scenario(policy="priority"),
    "chunked_block_32": scenario(block_size=32, num_gpu_blocks_override=130),
    "chunked_async": scenario(async_scheduling=True),
    "chunked_no_chunking": scenario(enable_chunked_prefill=False, max_num_batched_tokens=4096),
    "continuous": scenario(scheduler="continuous", max_num_batched_tokens=4096),
    # Swapped out, a request comes back with its blocks, not by a lookup: no hit.
    "continuous_swap": scenario(scheduler="continuous", max_num_batched_tokens=4096,
                                preemption_mode="swap", swap_space=1),
    "multi_step": scenario(scheduler="continuous", max_num_batched_tokens=4096, num_scheduler_steps=4),
}
NO_HITS = {"continuous_swap"}


def run(sc: dict, *, fast_path: bool, private: bool, monkeypatch):
    calls = {"publish": 0, "private": 0, "hits": 0}
    submit_one, publish, free = Engine._submit_one, BlockPool.publish, KVCacheManager.free
    prefix = BlockPool.get_cached_prefix

    def counted_prefix(self, hashes, max_blocks):
        hits = prefix(self, hashes, max_blocks)
        calls["hits"] += len(hits)
        return hits

    def counted_publish(self, blocks, hashes):
        calls["publish"] += sum(self.block_hash[b] is None for b in blocks)
        publish(self, blocks, hashes)

    def counted_free(self, req, finished=False):
        # A private request's cached blocks that hold no hash when it is freed.
        if req.private_keys:
            blocks = self.req_to_blocks.get(req.request_id, [])
            num_cached = self.num_cached_block.get(req.request_id, 0)
            calls["private"] += sum(self.pool.block_hash[b] is None for b in blocks[:num_cached])
        free(self, req, finished)

    with monkeypatch.context() as m:
        m.setattr(BlockPool, "publish", counted_publish)
        m.setattr(KVCacheManager, "free", counted_free)
        m.setattr(BlockPool, "get_cached_prefix", counted_prefix)
        if not private:
            m.setattr(Engine, "_submit_one", lambda self, *a, alone=False: submit_one(self, *a))
        steps = []
        result = kvsim.simulate(sc, trace=steps.append, fast_path=fast_path)
    return result, steps, calls


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast", "step"])
@pytest.mark.parametrize("name", list(CASES))
def test_private_blocks_give_the_runs_of_blocks_all_in_the_map(name, fast_path, monkeypatch):
    with_private, trace_a, calls = run(CASES[name], fast_path=fast_path, private=True, monkeypatch=monkeypatch)
    in_map, trace_b, none = run(CASES[name], fast_path=fast_path, private=False, monkeypatch=monkeypatch)
    pd.testing.assert_frame_equal(with_private.requests, in_map.requests, check_exact=True)
    pd.testing.assert_frame_equal(with_private.steps, in_map.steps, check_exact=True)
    assert trace_a == trace_b
    np.testing.assert_array_equal(with_private.itl_s, in_map.itl_s)
    assert with_private.summary == in_map.summary
    # What the case is for: private blocks, preemptions that publish some, and
    # resumed requests that hit their own blocks.
    assert none["publish"] == none["private"] == 0 and calls["private"] > 1000
    assert calls["publish"] > 0 and with_private.requests["num_preemptions"].sum() > 0
    assert calls["hits"] == none["hits"] and (calls["hits"] > 0) != (name in NO_HITS)


def test_requests_with_siblings_or_a_shared_prompt_are_not_private(monkeypatch):
    shared = scenario()
    shared["workload"] = {**shared["workload"], "prefix": {"shared_prompt_tokens": 64, "num_groups": 2}}
    siblings = scenario()
    siblings["workload"] = {**siblings["workload"], "num_requests": 40, "n": 2}
    for sc in (shared, siblings):
        _, _, calls = run(sc, fast_path=True, private=True, monkeypatch=monkeypatch)
        assert calls["publish"] == calls["private"] == 0


def test_private_blocks_go_to_the_tail_and_published_ones_are_found():
    pool = BlockPool(8)
    a, b, c = pool.get_new_blocks(3)                 # a private request's: cached, no hash
    pool.publish([a, b], [-1, -3])                   # freed unfinished: its own lookup finds them
    assert pool.get_cached_prefix([-1, -3], 2) == [a, b] and pool.num_cached_hashes() == 2
    pool.publish([a, b, c], [-1, -3, -5])            # again: the published ones keep their entry
    assert pool.num_cached_hashes() == 3 and pool.get_cached_block(-5) == c
    d, e = pool.get_new_blocks(2)
    pool.free_request_blocks([e, d], 1)              # e holds nothing, d is cached (private)
    assert pool.free_queue()[0] == e and pool.free_queue()[-1] == d
    f, = pool.get_new_blocks(1)
    assert f == e
    pool.free_request_blocks([f], 0)                 # one block, cached: the tail (not the head)
    assert pool.free_queue()[-1] == f
    pool.free_request_blocks([c, b, a], 0)
    assert pool.free_queue()[-3:] == [c, b, a]
    taken = pool.get_new_blocks(7)                   # every free block: each eviction clears its hash
    assert set(taken) >= {a, b, c} and pool.num_cached_hashes() == 0
    assert all(pool.block_hash[x] is None for x in taken)


def test_debug_mode_hashes_private_requests_blocks_and_agrees(monkeypatch):
    """Debug mode keeps no block private (it checks every hit against its tokens)
    and runs the free queue's split check: the same run as with private blocks."""
    with_private, trace_a, calls = run(CASES["chunked"], fast_path=True, private=True, monkeypatch=monkeypatch)
    debug, trace_b, debug_calls = run(scenario(debug=True), fast_path=True, private=True,
                                      monkeypatch=monkeypatch)
    pd.testing.assert_frame_equal(with_private.requests, debug.requests, check_exact=True)
    pd.testing.assert_frame_equal(with_private.steps, debug.steps, check_exact=True)
    assert trace_a == trace_b
    assert calls["private"] > 1000 and debug_calls["private"] == debug_calls["publish"] == 0
    assert calls["hits"] == debug_calls["hits"] > 0


MAX_TOKENS = 40        # a request's whole sequence, known from the start as a trace's is


class _Req:
    """What the KV manager reads of a request; ``private_keys`` as the engine sets it.
    Its ids are drawn up front, as the engine's fresh outputs are, so a decode
    run can hash the blocks its steps fill."""

    def __init__(self, request_id: str, ids: list[int], length: int, block_size: int,
                 private: bool) -> None:
        self.request_id = request_id
        self.num_tokens = length
        self.num_computed_tokens = 0
        self.private_keys = private
        self.block_hashes = block_hashes(ids, block_size)


class PrivateAndPublic(RuleBasedStateMachine):
    """The same operations on two managers: in one the requests with fresh ids
    (ids no other request holds) are private, in the other no request is.
    After each operation the pools' free queues (order included), free
    counts, block tables and cached counts are equal, and so is every lookup
    the schedulers can make: of a request about to be admitted, or resumed
    after a preemption. Shared requests draw their ids from a two-letter
    alphabet, so they hit each other's blocks (and duplicates, B8, happen)."""

    # Totals over every example, to check the runs reach what the test is for.
    totals = {"runs": 0, "published": 0, "own_hits": 0, "shared_hits": 0}

    @initialize(block_size=st.integers(2, 4), num_blocks=st.integers(6, 24), lifo=st.booleans())
    def setup(self, block_size, num_blocks, lifo):
        self.bs = block_size
        self.kvs = [KVCacheManager(num_blocks, block_size, max_model_len=64, lifo_unhashed=lifo)
                    for _ in range(2)]
        self.live: dict[str, tuple[_Req, _Req]] = {}
        self.waiting: list[tuple[_Req, _Req]] = []
        self.fresh = -1                    # the next fresh id (negative: no shared id is)
        self.counter = 0

    def _ids(self, private: bool, data) -> list[int]:
        if private:
            self.fresh -= MAX_TOKENS
            return list(range(self.fresh, self.fresh + MAX_TOKENS))
        return data.draw(st.lists(st.integers(0, 1), min_size=MAX_TOKENS, max_size=MAX_TOKENS))

    def _admit(self, pair) -> bool:
        results = []
        for kv, req in zip(self.kvs, pair):
            hits, num_hit = kv.get_computed_blocks(req)
            results.append((hits, kv.allocate_slots(req, req.num_tokens - num_hit, num_hit, hits)))
        assert results[0] == results[1]
        if results[0][0]:
            self.totals["own_hits" if pair[0].private_keys else "shared_hits"] += 1
        if results[0][1] is None:
            return False
        for req in pair:
            req.num_computed_tokens = req.num_tokens
            req.num_tokens += 1               # it samples
        self.live[pair[0].request_id] = pair
        return True

    @rule(data=st.data(), private=st.booleans(), length=st.integers(1, 12))
    def admit_new(self, data, private, length):
        self.counter += 1
        ids = self._ids(private, data)
        pair = tuple(_Req(f"r{self.counter}", ids, length, self.bs, private and k == 0)
                     for k in range(2))
        self._admit(pair)

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def resume(self, data):
        pair = data.draw(st.sampled_from(self.waiting))
        if self._admit(pair):
            self.waiting.remove(pair)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def append(self, data):
        pair = self.live[data.draw(st.sampled_from(sorted(self.live)))]
        if pair[0].num_tokens >= MAX_TOKENS:
            return
        new = [kv.allocate_slots(req, 1) for kv, req in zip(self.kvs, pair)]
        assert new[0] == new[1]
        if new[0] is not None:
            for req in pair:
                req.num_computed_tokens = req.num_tokens
                req.num_tokens += 1

    @precondition(lambda self: self.live)
    @rule(data=st.data(), steps=st.integers(1, 6))
    def decode_run(self, data, steps):
        ids = data.draw(st.lists(st.sampled_from(sorted(self.live)), min_size=1, unique=True))
        pairs = [self.live[rid] for rid in ids]
        if max(p[0].num_tokens for p in pairs) + steps > MAX_TOKENS:
            return
        computed = [p[0].num_computed_tokens for p in pairs]
        outs = []
        for k, kv in enumerate(self.kvs):
            reqs = [p[k] for p in pairs]
            first = kv.decode_run_first_allocations(reqs, computed)
            if kv.nth_decode_run_allocation(first, kv.get_num_free_blocks() + 1, steps) is not None:
                outs.append(None)         # its blocks would not fit: the scheduler would step
                continue
            outs.append(kv.allocate_decode_steps(reqs, computed, first, 1, steps))
        assert outs[0] == outs[1]
        if outs[0] is None:
            return
        self.totals["runs"] += 1
        for p in pairs:
            for req in p:
                req.num_computed_tokens += steps
                req.num_tokens += steps

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def preempt(self, data):
        pair = self.live.pop(data.draw(st.sampled_from(sorted(self.live))))
        if pair[0].private_keys and self.kvs[0].num_cached_block[pair[0].request_id]:
            self.totals["published"] += 1
        for kv, req in zip(self.kvs, pair):
            kv.free(req)
            req.num_computed_tokens = 0
        self.waiting.append(pair)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def finish(self, data):
        pair = self.live.pop(data.draw(st.sampled_from(sorted(self.live))))
        for kv, req in zip(self.kvs, pair):
            kv.free(req, finished=True)

    @invariant()
    def the_same_pool(self):
        a, b = self.kvs
        assert a.pool.free_queue() == b.pool.free_queue()
        assert a.get_num_free_blocks() == b.get_num_free_blocks()
        assert a.req_to_blocks == b.req_to_blocks and a.num_cached_block == b.num_cached_block
        for pair in self.waiting:
            assert a.get_computed_blocks(pair[0]) == b.get_computed_blocks(pair[1])


def test_private_requests_leave_the_pool_as_public_ones_would():
    run_state_machine_as_test(PrivateAndPublic, settings=settings(
        max_examples=150, stateful_step_count=40, deadline=None))
    assert min(PrivateAndPublic.totals.values()) > 0, PrivateAndPublic.totals
