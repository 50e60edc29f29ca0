"""Chunk runs (sched/chunked_runs.py, kv/chunk_runs.py): a prompt chunked while the
others decode, skipped ahead, gives what the steps taken one by one give.

Three levels: the KV manager's ``allocate_chunk_steps`` against
``allocate_slots`` step by step on a copy (every block, hash, free-queue
entry and map entry); whole runs, fast path against step path, on scenarios
built so that chunk runs happen (and counted, so the test would notice if
they stopped happening); and random engines and workloads (hypothesis).
"""

from __future__ import annotations

import copy

import hypothesis.strategies as st
import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings

import kvsim
from kvsim.kv.hashing import block_hashes
from kvsim.kv.manager import KVCacheManager
from kvsim.sched import chunked_runs
from tests.test_kv_properties import FakeReq


# ---------------------------------------------------------------- the KV manager

def snapshot(kv):
    p = kv.pool
    return (list(p.ref_cnt), list(p.block_hash), p.free_queue(), list(p._cached.items()),
            {rid: list(b) for rid, b in kv.req_to_blocks.items()}, dict(kv.num_cached_block))


@settings(max_examples=150, deadline=None)
@given(bs=st.integers(2, 8), chunk=st.integers(2, 20), num_decodes=st.integers(0, 3),
       steps=st.integers(1, 6), split=st.integers(0, 6), caching=st.booleans(),
       warm=st.integers(0, 3), debug=st.booleans(), seed=st.integers(0, 10_000))
def test_allocate_chunk_steps_is_allocate_slots_step_by_step(bs, chunk, num_decodes, steps, split,
                                                             caching, warm, debug, seed):
    """Decodes (one token each) then the chunked request (``chunk`` tokens), each
    step, through ``allocate_slots``; against the run's one or two calls."""
    rng = np.random.default_rng(seed)
    kv = KVCacheManager(400, bs, max_model_len=10_000, enable_caching=caching, debug=debug)
    alphabet = 3                                  # few tokens: hashes repeat, blocks get shared
    # Earlier requests leave cached (evictable) blocks in the free queue.
    for w in range(warm):
        r = FakeReq(f"w{w}", list(rng.integers(0, alphabet, int(rng.integers(bs, 6 * bs)))), bs)
        hits, n_hit = kv.get_computed_blocks(r)
        kv.allocate_slots(r, r.num_tokens - n_hit, n_hit, hits)
        kv.free(r)
    reqs = []
    for i in range(num_decodes):
        r = FakeReq(f"d{i}", list(rng.integers(0, alphabet, int(rng.integers(1, 5 * bs)))), bs)
        hits, n_hit = kv.get_computed_blocks(r)
        kv.allocate_slots(r, r.num_tokens - n_hit, n_hit, hits)
        r.num_computed_tokens = r.num_tokens
        r.tokens += list(rng.integers(0, alphabet, steps + 1))   # its tokens of the run, known ahead
        reqs.append(r)
    prompt = list(rng.integers(0, alphabet, chunk * (steps + 1) + int(rng.integers(1, 3 * bs))))
    p = FakeReq("p", prompt, bs)
    hits, n_hit = kv.get_computed_blocks(p)
    first_chunk = min(chunk, p.num_tokens - n_hit - 1)
    if first_chunk < 1:
        return
    kv.allocate_slots(p, first_chunk, n_hit, hits)
    p.num_computed_tokens = n_hit + first_chunk
    reqs.append(p)
    computed = [r.num_computed_tokens for r in reqs]
    first = kv.decode_run_first_allocations(reqs[:-1], computed[:-1])
    left = p.num_tokens - p.num_computed_tokens          # up to its last chunk, which samples
    steps = min(steps, -(-left // chunk))
    assert kv.chunk_run_steps_that_fit(reqs, computed, first, chunk, left, steps) == steps  # 400 blocks

    ref = copy.deepcopy(kv)
    ref_reqs = {r.request_id: r for r in copy.deepcopy(reqs)}
    free_ref = []
    for s in range(1, steps + 1):
        for r in reqs[:-1]:
            rr = ref_reqs[r.request_id]
            rr.num_computed_tokens = r.num_computed_tokens + s - 1
            assert ref.allocate_slots(rr, 1) is not None
        rp = ref_reqs["p"]
        rp.num_computed_tokens = p.num_computed_tokens + (s - 1) * chunk
        assert ref.allocate_slots(rp, min(chunk, left - (s - 1) * chunk)) is not None
        free_ref.append(ref.get_num_free_blocks())

    cut = min(split, steps)
    free = []
    if cut:
        free += kv.allocate_decode_steps(reqs, computed, first, 1, cut, chunk=chunk, chunk_left=left)
    if cut < steps:
        free += kv.allocate_decode_steps(reqs, computed, first, cut + 1, steps, chunk=chunk,
                                         chunk_left=left)
    assert free == free_ref
    assert snapshot(kv) == snapshot(ref)


def test_steps_that_fit_stop_before_the_step_that_would_preempt():
    bs = 4
    kv = KVCacheManager(12, bs, max_model_len=1000, enable_caching=False)
    d = FakeReq("d", [1] * 4, bs)                  # 1 block, full: a new one at step 1, then every 4
    kv.allocate_slots(d, 4)
    d.num_computed_tokens = 4
    d.tokens += [2] * 20
    p = FakeReq("p", list(range(60)), bs)
    kv.allocate_slots(p, 6)                        # 2 blocks for 6 tokens
    p.num_computed_tokens = 6
    free = kv.get_num_free_blocks()                # 11 usable - 3 held = 8
    assert free == 8
    # Step s: d holds ceil((4 + s) / 4) blocks, p ceil((6 + 6 s) / 4).
    # After step 2: d 2 (+1), p 5 (+3) -> 4 taken; after 3: d 2, p 6 (+1) -> 5;
    # after 4: d 2, p 8 (+2) -> 7; after 5: d 3 (+1), p 9 (+1) -> 9 > 8.
    assert kv.chunk_run_steps_that_fit([d, p], [4, 6], [1], 6, 54, 9) == 4
    assert kv.chunk_run_steps_that_fit([d, p], [4, 6], [1], 6, 54, 3) == 3
    # With 14 tokens left p stops at 20 tokens, 5 blocks (+3 by step 2); d takes
    # blocks at steps 1, 5 and 9: 6 in all by step 9, which fits.
    assert kv.chunk_run_steps_that_fit([d, p], [4, 6], [1], 6, 14, 9) == 9


# ---------------------------------------------------------------- whole runs

def scenario(**engine) -> dict:
    return {
        "name": "chunk-runs", "seed": 7, "model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm"},
        "engine": {"max_num_batched_tokens": 128, "max_model_len": 8192, "block_size": 16, **engine},
        "cost_model": {"type": "roofline"},
        "workload": {"num_requests": 80, "arrival": {"type": "poisson", "rate": 4.0},
                     "prompt_len": {"type": "lognormal", "median": 700, "sigma": 0.7, "max": 4000},
                     "output_len": {"type": "uniform", "low": 10, "high": 200},
                     "prefix": {"shared_prompt_tokens": 96, "num_groups": 3}},
    }


def count_chunk_runs(monkeypatch) -> list:
    planned = []
    real = chunked_runs.ChunkedDecodeRuns._plan_chunk_run

    def counted(self):
        run = real(self)
        if run is not None:
            planned.append(run.max_steps)
        return run

    monkeypatch.setattr(chunked_runs.ChunkedDecodeRuns, "_plan_chunk_run", counted)
    return planned


def assert_fast_is_step(sc: dict):
    trace_fast, trace_step = [], []
    fast = kvsim.simulate(sc, trace=trace_fast.append)
    step = kvsim.simulate(sc, trace=trace_step.append, fast_path=False)
    pd.testing.assert_frame_equal(fast.requests, step.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, step.steps, check_exact=True)
    np.testing.assert_array_equal(fast.itl_s, step.itl_s)
    assert trace_fast == trace_step
    return fast


@pytest.mark.parametrize("engine", [
    {},
    {"enable_prefix_caching": False, "block_size": 8},
    {"num_gpu_blocks_override": 260, "max_model_len": 4096},  # runs cut where blocks run out, preemptions
    {"max_num_seqs": 4},                                     # a waiting queue behind a spent budget
    {"debug": True},                                         # every hit checked against its tokens
    {"policy": "priority"},
    {"max_num_scheduled_tokens": 96},                        # the token budget below the input budget
    {"max_num_queued_reqs": 6, "max_num_queued_tokens": 2500},  # a first token leaves the backlog
])
def test_chunk_runs_happen_and_match_the_step_path(engine, monkeypatch):
    planned = count_chunk_runs(monkeypatch)
    sc = scenario(**engine)
    if engine.get("policy") == "priority":
        sc["workload"]["priority"] = {"values": [0, 1, 2]}
    fast = assert_fast_is_step(sc)
    assert len(planned) > 10 and max(planned) > 1


def test_a_shared_fleet_reads_replica_state_in_the_middle_of_chunk_runs(monkeypatch):
    """least_loaded reads every replica at each arrival: runs in flight are synced then."""
    planned = count_chunk_runs(monkeypatch)
    sc = scenario()
    sc["workload"] = {**sc["workload"], "num_requests": 120, "arrival": {"type": "poisson", "rate": 12.0}}
    sc["cluster"] = {"replicas": 3, "router": "kv_utilization"}
    trace_fast, trace_step = [], []
    fast = kvsim.simulate(sc, trace=trace_fast.append)
    step = kvsim.simulate(sc, trace=trace_step.append, fast_path=False)
    pd.testing.assert_frame_equal(fast.requests, step.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, step.steps, check_exact=True)
    def by_replica(trace):          # a run's records come at its end: order by replica, step
        return sorted(trace, key=lambda r: (r["replica"], r["step"]))

    assert by_replica(trace_fast) == by_replica(trace_step) and planned


@pytest.mark.parametrize("engine", [{"async_scheduling": True}, {"prefill_schedule_interval": 3}])
def test_no_chunk_run_where_a_step_is_not_plain(engine, monkeypatch):
    planned = count_chunk_runs(monkeypatch)
    assert_fast_is_step(scenario(**engine))
    assert planned == []


@pytest.mark.parametrize("adaptive", [False, True])
def test_a_long_prefill_threshold_cuts_every_chunk_of_a_run(adaptive, monkeypatch):
    """The threshold (N4; adaptive: floored at the fair share) is the same in every
    step of a run, since nothing arrives or leaves; alone in the system, none."""
    planned = count_chunk_runs(monkeypatch)
    sc = scenario(long_prefill_token_threshold=48, long_prefill_token_threshold_adaptive=adaptive)
    fast = assert_fast_is_step(sc)
    assert len(planned) > 10
    assert (fast.steps["num_prefill_tokens"] == 48).any()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(budget=st.integers(8, 300), bs=st.sampled_from([4, 8, 16, 32]), caching=st.booleans(),
       blocks=st.sampled_from([None, 1.1, 3.0]), seqs=st.sampled_from([None, 3, 16]),
       rate=st.sampled_from([2.0, 20.0, 200.0]), n=st.sampled_from([1, 1, 2]),
       median=st.sampled_from([60, 300, 700]), seed=st.integers(0, 1000))
def test_random_engines_fast_is_step(budget, bs, caching, blocks, seqs, rate, n, median, seed):
    max_model_len = 1024
    engine = {"max_num_batched_tokens": budget, "block_size": bs, "enable_prefix_caching": caching,
              "max_model_len": max_model_len}
    if blocks is not None:                       # tight: preemptions, runs cut where blocks run out
        engine["num_gpu_blocks_override"] = int(blocks * max_model_len / bs) + 1
    if seqs is not None:
        engine["max_num_seqs"] = min(seqs, budget)
    sc = {"name": "chunk-runs-random", "seed": seed, "model": "llama-3.1-8b",
          "hardware": {"gpu": "h100-sxm"}, "engine": engine, "cost_model": {"type": "roofline"},
          "workload": {"num_requests": 30, "n": n, "arrival": {"type": "poisson", "rate": rate},
                       "prompt_len": {"type": "lognormal", "median": median, "sigma": 0.8, "max": 1000},
                       "output_len": {"type": "uniform", "low": 1, "high": 60},
                       "prefix": {"shared_prompt_tokens": 2 * bs, "num_groups": 2}}}
    assert_fast_is_step(sc)
