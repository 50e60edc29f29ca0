"""The baseline schedulers: Sarathi-Serve's ``simple_chunking`` and Orca's reservations (``orca``).

Hand-worked schedules (block_size 4 unless said, 1 s per step), then the fast
path against the step path on random workloads.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from helpers import Driver, spec
from test_fast_path import both, scenario

import kvsim
from kvsim.sched.orca import reservation_tokens


def r(a, b):
    return range(a, b + 1)


def schedules(d: Driver, n: int):
    out = []
    for _ in range(n):
        scheduled, plan, _ = d.step()
        out.append((scheduled, [x.request_id for x in plan.preempted]))
    return out


# ------------------------------------------------------------ simple_chunking

def test_simple_chunking_alternates_prefill_chunks_and_decodes_never_mixing_them():
    # Budget 8: A (10-token prompt) takes two chunks; its second chunk runs alone although
    # B waits; B is admitted only after A's prefill, in a prefill-only step.
    d = Driver("simple_chunking", num_gpu_blocks=64, max_num_batched_tokens=8)
    d.add(spec("A", r(1, 10), max_tokens=3), spec("B", r(11, 16), max_tokens=3))
    got = [s for s, _ in schedules(d, 6)]
    assert got == [{"A": 8}, {"A": 2}, {"A": 1}, {"B": 6}, {"A": 1, "B": 1}, {"B": 1}]
    assert [d.reqs[x].num_output_tokens for x in "AB"] == [3, 3]


def test_chunked_v1_mixes_the_same_requests():
    d = Driver("chunked", num_gpu_blocks=64, max_num_batched_tokens=8, enable_prefix_caching=False)
    d.add(spec("A", r(1, 10), max_tokens=3), spec("B", r(11, 16), max_tokens=3))
    assert d.step()[0] == {"A": 8}
    assert d.step()[0] == {"A": 2, "B": 6}             # what simple_chunking never does


def test_simple_chunking_decode_turn_preempts_the_last_running_and_recomputes_it_alone():
    # 4 usable blocks. Step 3: no block free at A's turn -> B (the last) is preempted; step 4
    # is a prefill turn that recomputes B's 6 tokens while A waits; step 5 preempts B again.
    d = Driver("simple_chunking", num_gpu_blocks=5, max_num_batched_tokens=16)
    d.add(spec("A", r(1, 4), max_tokens=9), spec("B", r(11, 14), max_tokens=4))
    assert schedules(d, 5) == [({"A": 4, "B": 4}, []), ({"A": 1, "B": 1}, []),
                               ({"A": 1}, ["B"]), ({"B": 6}, []), ({"A": 1}, ["B"])]
    assert d.reqs["B"].num_preemptions == 2
    assert d.reqs["B"].num_output_tokens == 3


def test_simple_chunking_admits_only_while_the_whole_prompt_leaves_the_watermark_free():
    # 8 usable blocks, watermark 0.25 of 9 = 2 blocks: A (5 blocks) fits (8 - 5 >= 2),
    # B (2 blocks) does not (3 - 2 < 2) until A is done.
    d = Driver("simple_chunking", num_gpu_blocks=9, max_num_batched_tokens=64, watermark=0.25)
    d.add(spec("A", r(1, 20), max_tokens=2), spec("B", r(21, 28), max_tokens=2))
    got = [s for s, _ in schedules(d, 3)]
    assert got == [{"A": 20}, {"A": 1}, {"B": 8}]


# ------------------------------------------------------------------------ orca

def abc(d: Driver) -> None:
    d.add(spec("A", r(1, 3), max_tokens=2), spec("B", r(11, 15), max_tokens=3),
          spec("C", r(21, 22), max_tokens=2))


def test_reservations_are_max_model_len_next_power_of_two_or_the_final_length():
    assert [reservation_tokens("max", n, 16) for n in (5, 8, 4)] == [16, 16, 16]
    assert [reservation_tokens("pow2", n, 16) for n in (5, 8, 4, 1, 13)] == [8, 8, 4, 1, 16]
    assert [reservation_tokens("oracle", n, 16) for n in (5, 8, 4)] == [5, 8, 4]


@pytest.mark.parametrize("policy, want", [
    # 18 token slots (block_size 2, 9 usable blocks); A, B, C end at 5, 8 and 4 tokens.
    ("oracle", [{"A": 3, "B": 5, "C": 2}, {"A": 1, "B": 1, "C": 1}, {"B": 1}]),
    # pow2: 8 + 8 + 4 > 18: C waits for A's slab and joins B's decode in one step.
    ("pow2", [{"A": 3, "B": 5}, {"A": 1, "B": 1}, {"B": 1, "C": 2}, {"C": 1}]),
    # max: every slab is max_model_len = 16, one request at a time.
    ("max", [{"A": 3}, {"A": 1}, {"B": 5}, {"B": 1}, {"B": 1}, {"C": 2}, {"C": 1}]),
])
def test_orca_admits_while_the_reservation_fits_and_mixes_prefills_with_decodes(policy, want):
    d = Driver("orca", num_gpu_blocks=10, block_size=2, max_model_len=16, orca_reservation=policy)
    abc(d)
    assert [s for s, _ in schedules(d, len(want))] == want
    assert not d.sched.has_requests()


def test_orca_first_fit_leaves_a_gap_too_small_for_the_next_slab():
    # 18 slots, oracle: A (5 slots), B (9 slots), C (4 slots) take them all. A and C
    # finish in step 2: 9 slots are free, in gaps of 5 and 4, so D (6 slots) waits for B.
    d = Driver("orca", num_gpu_blocks=10, block_size=2, max_model_len=16, orca_reservation="oracle")
    d.add(spec("A", r(1, 3), max_tokens=2), spec("B", r(11, 15), max_tokens=4),
          spec("C", r(21, 22), max_tokens=2), spec("D", r(31, 34), max_tokens=2))
    got = [s for s, _ in schedules(d, 3)]
    assert got == [{"A": 3, "B": 5, "C": 2}, {"A": 1, "B": 1, "C": 1}, {"B": 1}]
    assert d.sched.alloc.free_gaps() == [(0, 5), (14, 4)]
    assert d.sched.num_free_blocks() == 4                # 9 slots, in blocks of 2
    assert [s for s, _ in schedules(d, 2)] == [{"B": 1}, {"D": 4}]
    assert d.sched.alloc.slab("D") == (0, 6)


def test_orca_reports_reserved_slots_as_used_kv():
    d = Driver("orca", num_gpu_blocks=10, block_size=2, max_model_len=16, orca_reservation="max")
    abc(d)
    d.step()
    assert d.sched.num_free_blocks() == 1                # 18 - 16 slots = 1 block of 2
    assert d.sched.kv_cache_usage() == pytest.approx(16 / 18)


# ------------------------------------------------------------------- scenarios

def test_orca_reservation_needs_the_orca_scheduler():
    with pytest.raises(kvsim.ScenarioError, match="engine.orca_reservation"):
        kvsim.simulate(scenario(engine__orca_reservation="pow2"))


def test_simple_chunking_refuses_unchunked_prefill_and_notes_the_missing_prefix_cache():
    with pytest.raises(kvsim.ScenarioError, match="engine.enable_chunked_prefill"):
        kvsim.load_scenario(scenario(engine__scheduler="simple_chunking",
                                     engine__enable_chunked_prefill=False))
    sc = kvsim.load_scenario(scenario(engine__scheduler="simple_chunking"))
    assert any("enable_prefix_caching" in n for n in sc.notes)
    assert not sc.sched_config.enable_prefix_caching


FAST_CASES = {
    "simple_chunking": scenario(engine__scheduler="simple_chunking"),
    "simple_chunking_tight": scenario(engine__scheduler="simple_chunking",
                                      engine__num_gpu_blocks_override=300,
                                      workload={**scenario()["workload"],
                                                "arrival": {"type": "poisson", "rate": 60.0}}),
    "orca_max": scenario(engine={"scheduler": "orca", "max_model_len": 2400,
                                 "num_gpu_blocks_override": 1500}),
    "orca_pow2": scenario(engine={"scheduler": "orca", "max_model_len": 2400,
                                  "num_gpu_blocks_override": 800, "orca_reservation": "pow2"}),
    "orca_oracle_closed_loop": scenario(
        engine={"scheduler": "orca", "max_model_len": 2400, "num_gpu_blocks_override": 400,
                "orca_reservation": "oracle", "max_num_seqs": 12},
        cost_model={"type": "constant", "step_time_s": 0.01},
        workload={**scenario()["workload"], "arrival": {"type": "closed_loop", "concurrency": 9}}),
}


@pytest.mark.parametrize("name", list(FAST_CASES))
def test_fast_path_equals_step_path(name):
    fast, slow, trace_fast, trace_slow = both(FAST_CASES[name])
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)
    assert trace_fast == trace_slow
    np.testing.assert_array_equal(fast.itl_s, slow.itl_s)
    assert fast.summary == slow.summary
    assert fast.summary["completed"] > 0
    assert fast.stats.num_run_steps > 0


def test_baseline_steps_never_mix_or_always_may():
    steps = kvsim.simulate(FAST_CASES["simple_chunking"]).steps
    assert ((steps["num_prefill_tokens"] == 0) | (steps["num_decode_tokens"] == 0)).all()
    mixed = kvsim.simulate(FAST_CASES["orca_max"]).steps
    assert ((mixed["num_prefill_tokens"] > 0) & (mixed["num_decode_tokens"] > 0)).any()
