"""``continuous``: vLLM V0's prefill-first scheduler (kv-semantics section 8, TV16).

Driven step by step with ``helpers.Driver`` (1 s per step, no SimPy). Unless a
test says otherwise: block size 4, 5 blocks (4 usable), watermark 0, and the
two requests A = 1..6 and B = 11..16 that fill the cache after one step.
"""

from __future__ import annotations

import random

import pytest
from helpers import Driver, spec

from kvsim.sched.request import RequestStatus


def r(a, b):
    return range(a, b + 1)


def two_full(**cfg) -> Driver:
    d = Driver("continuous", num_gpu_blocks=5, **cfg)
    d.add(spec("A", r(1, 6), max_tokens=10), spec("B", r(11, 16), max_tokens=10))
    return d


def ids(reqs) -> list[str]:
    return [q.request_id for q in reqs]


# ---------------------------------------------------------------- V1: prefill-first


def test_v1_a_step_that_admits_a_prefill_runs_no_decode():
    d = Driver("continuous", num_gpu_blocks=20)
    d.add(spec("A", r(1, 6), max_tokens=10))
    assert d.step()[0] == {"A": 6}
    assert d.step()[0] == {"A": 1}
    d.add(spec("B", r(11, 19), max_tokens=10))
    assert d.step()[0] == {"B": 9}                       # A waits out the prefill step
    assert (d.reqs["A"].num_computed_tokens, d.reqs["A"].num_tokens) == (7, 8)
    assert d.step()[0] == {"A": 1, "B": 1}               # then one decode step for both


def test_v1_prefills_of_one_step_share_the_token_budget():
    d = Driver("continuous", num_gpu_blocks=20, max_num_batched_tokens=12, max_model_len=12)
    d.add(spec("A", r(1, 6)), spec("B", r(11, 16)), spec("C", r(21, 26)))
    assert d.step()[0] == {"A": 6, "B": 6}               # C does not fit the 12-token budget
    assert d.step()[0] == {"C": 6}
    assert d.step()[0] == {"A": 1, "B": 1, "C": 1}


def test_v1_every_step_is_prefill_only_or_decode_only():
    rng = random.Random(7)
    for case in range(20):
        d = Driver("continuous", num_gpu_blocks=rng.randint(6, 16),
                   preemption_mode=rng.choice(["recompute", "swap"]), num_cpu_blocks=64,
                   swap_block_bytes=1)
        pending = [spec(f"q{i}", [rng.randint(0, 3) for _ in range(rng.randint(1, 9))],
                        max_tokens=rng.randint(1, 8)) for i in range(8)]
        kinds = set()
        for _ in range(200):
            if pending and rng.random() < 0.4:
                d.add(pending.pop())
            if not d.sched.has_requests() and not pending:
                break
            scheduled, plan, _ = d.step()
            admitted = set(plan.prefix_hit_tokens) | set(plan.resume_hit_tokens)
            if admitted:
                assert set(scheduled) == admitted, (case, scheduled, admitted)
                kinds.add("prefill")
            elif scheduled:
                assert set(scheduled.values()) == {1}, (case, scheduled)
                kinds.add("decode")
        assert kinds == {"prefill", "decode"}
        assert all(q.status is RequestStatus.FINISHED for q in d.reqs.values())


# ------------------------------------------------------- V2 / TV16: watermark admission


def tv16(first_prompt_len: int) -> Driver:
    """TV16 setup: 100 blocks, bs 16, watermark 0.01 (1 block); X fills most of it."""
    d = Driver("continuous", num_gpu_blocks=100, block_size=16, watermark=0.01,
               max_model_len=2048, max_num_batched_tokens=2048)
    assert d.sched.watermark_blocks == 1
    d.add(spec("X", r(10_000, 10_000 + first_prompt_len - 1), max_tokens=100))
    assert d.step()[0] == {"X": first_prompt_len}
    return d


def test_tv16_33_token_prompt_waits_with_3_free_blocks():
    d = tv16(1535)                                       # 96 blocks, the last with 1 free slot
    assert d.kv.get_num_free_blocks() == 3
    d.add(spec("Y", r(1, 33)))                           # needs 3 blocks: 3 - 3 < 1 -> LATER
    scheduled, plan, _ = d.step()
    assert scheduled == {"X": 1} and plan.failed == []
    assert ids(d.sched.waiting) == ["Y"]


def test_tv16_33_token_prompt_is_admitted_with_4_free_blocks():
    d = tv16(1519)                                       # 95 blocks
    assert d.kv.get_num_free_blocks() == 4
    d.add(spec("Y", r(1, 33)))                           # 4 - 3 >= 1 -> OK
    assert d.step()[0] == {"Y": 33}
    assert d.kv.get_num_free_blocks() == 1


def test_v2_admission_ignores_prefix_hits():
    # Y's first two blocks are cached (X's prompt), but V0 still asks for all 3.
    d = tv16(1535)
    d.add(spec("Y", [*r(10_000, 10_031), 7]))
    assert d.step()[0] == {"X": 1}
    assert ids(d.sched.waiting) == ["Y"]


@pytest.mark.parametrize("prompt_len", [1600, 1584])
def test_tv16_prompt_above_the_watermark_of_the_whole_cache_is_ignored(prompt_len):
    d = Driver("continuous", num_gpu_blocks=100, block_size=16, watermark=0.01,
               max_model_len=2048, max_num_batched_tokens=2048)
    d.add(spec("Z", r(1, prompt_len), max_tokens=5), spec("S", r(5000, 5003), max_tokens=1))
    scheduled, plan, finished = d.step()
    assert ids(plan.failed) == ["Z"]                     # 99 - 100 (or 99 - 99) < 1: NEVER
    z = d.reqs["Z"]
    assert z.status is RequestStatus.FAILED
    assert z.fail_reason == "needs more blocks than the cache holds above the watermark"
    assert scheduled == {"S": 4} and finished == ["S"]   # the queue moves on
    assert not d.sched.has_requests()


def test_tv16_98_block_prompt_is_not_ignored():
    d = Driver("continuous", num_gpu_blocks=100, block_size=16, watermark=0.01,
               max_model_len=2048, max_num_batched_tokens=2048)
    d.add(spec("Z", r(1, 1568), max_tokens=5))           # 99 - 98 = 1 >= 1
    assert d.step()[0] == {"Z": 1568}


def test_prompt_longer_than_the_prefill_limit_is_ignored_with_its_reason():
    d = Driver("continuous", num_gpu_blocks=100, max_num_batched_tokens=32, max_model_len=64)
    d.add(spec("L", r(1, 40)), spec("S", r(100, 103), max_tokens=1))
    scheduled, plan, _ = d.step()
    assert ids(plan.failed) == ["L"]
    assert d.reqs["L"].fail_reason == ("40 tokens exceed the prompt limit "
                                       "min(max_model_len, max_num_batched_tokens) = 32")
    assert scheduled == {"S": 4}


# ------------------------------------------------- V3 / V4: worst-case decode, preemption


def test_tv16_zero_free_blocks_preempt_the_last_request_although_its_block_has_room():
    d = two_full()
    assert d.step()[0] == {"A": 6, "B": 6}
    assert d.blocks("A") == [1, 2] and d.blocks("B") == [3, 4]
    assert d.kv.get_num_free_blocks() == 0               # both last blocks hold 2 of 4 tokens
    scheduled, plan, _ = d.step()
    assert ids(plan.preempted) == ["B"] and scheduled == {"A": 1}
    assert d.blocks("A") == [1, 2]                       # A needed no new block after all
    b = d.reqs["B"]
    assert (b.status, b.num_computed_tokens, b.num_tokens, b.num_preemptions) == \
        (RequestStatus.PREEMPTED, 0, 7, 1)
    assert ids(d.sched.waiting) == ["B"]
    assert d.free_queue() == [4, 3]


def test_recompute_preemption_resumes_with_a_prefill_only_step_and_a_self_hit():
    d = two_full()
    d.step()
    d.step()
    scheduled, plan, _ = d.step()
    assert scheduled == {"B": 3}                         # 7 tokens, 4 hit in its own block 3
    assert plan.resume_hit_tokens == {"B": 4} and plan.prefix_hit_tokens == {}
    assert d.blocks("B") == [3, 4]
    assert d.reqs["A"].num_computed_tokens == 7          # A did not decode in this step


def test_a_lone_request_that_runs_out_of_blocks_preempts_itself():
    d = Driver("continuous", num_gpu_blocks=3)           # 2 usable blocks = 8 tokens
    d.add(spec("A", r(1, 8), max_tokens=5))
    d.step()
    scheduled, plan, _ = d.step()
    assert ids(plan.preempted) == ["A"] and scheduled == {}


# --------------------------------------------------------------------- V4: swapping


def swap_driver(num_cpu_blocks: int = 4) -> Driver:
    d = Driver("continuous", num_gpu_blocks=5, preemption_mode="swap",
               num_cpu_blocks=num_cpu_blocks, swap_block_bytes=1000)
    d.add(spec("A", r(1, 6), max_tokens=4), spec("B", r(11, 16), max_tokens=3))
    return d


def test_swap_preemption_moves_the_blocks_to_the_cpu_pool_and_costs_their_bytes():
    d = swap_driver()
    d.step()
    scheduled, plan, _ = d.step()
    assert ids(plan.preempted) == ["B"] and scheduled == {"A": 1}
    assert plan.swap_bytes == 2 * 1000
    b = d.reqs["B"]
    assert b.status is RequestStatus.SWAPPED and b.num_computed_tokens == 6   # kept, not recomputed
    assert ids(d.sched.swapped) == ["B"] and ids(d.sched.waiting) == []
    assert d.sched.num_free_cpu_blocks == 2
    assert d.free_queue() == [4, 3]


def test_swapped_requests_come_back_before_waiting_ones():
    d = swap_driver()
    d.step()
    d.step()                                             # B swapped out
    d.add(spec("C", r(21, 22), max_tokens=3))
    # While B is swapped no prefill is admitted, even though C would fit.
    assert d.step()[0] == {"A": 1}
    scheduled, _, finished = d.step()
    assert scheduled == {"A": 1} and finished == ["A"]
    scheduled, plan, _ = d.step()                        # swap-in: decode-only step
    assert scheduled == {"B": 1} and plan.swap_bytes == 2 * 1000
    assert d.blocks("B") == [4, 3] and d.sched.num_free_cpu_blocks == 4
    assert d.reqs["B"].status is RequestStatus.RUNNING
    assert ids(d.sched.waiting) == ["C"]
    assert d.step()[0] == {"C": 2}                       # only now is C admitted
    scheduled, _, finished = d.step()
    assert scheduled == {"B": 1, "C": 1} and finished == ["B"]


def test_swap_in_waits_until_its_blocks_and_one_more_are_free():
    d = swap_driver()
    d.step()
    d.step()
    assert d.kv.get_num_free_blocks() == 2               # B needs 2 + 1 to come back
    scheduled, plan, _ = d.step()
    assert scheduled == {"A": 1} and plan.swap_bytes == 0
    assert ids(d.sched.swapped) == ["B"]


def test_swap_space_exhaustion_raises_a_clear_error():
    d = swap_driver(num_cpu_blocks=1)
    d.step()
    with pytest.raises(RuntimeError, match=r"swap space exhausted: request B needs 2 CPU blocks, "
                                           r"1 free \(raise engine.swap_space\)"):
        d.step()


# ------------------------------------------------------- swap traffic through the engine


class RecordingCost:
    """A constant 1 s step that records each step's swap bytes."""

    def __init__(self) -> None:
        self.swap_bytes: list[int] = []

    def step_time(self, batch) -> float:
        self.swap_bytes.append(batch.swap_bytes)
        return 1.0


def test_swap_bytes_reach_the_cost_model_in_the_swap_out_and_swap_in_steps():
    from kvsim.sched.config import SchedulerConfig
    from kvsim.sim.run import run_engine

    cfg = SchedulerConfig(num_gpu_blocks=5, block_size=4, max_model_len=64,
                          max_num_batched_tokens=64, preemption_mode="swap", num_cpu_blocks=4,
                          swap_block_bytes=1000)
    cost = RecordingCost()
    engine = run_engine([spec("A", r(1, 6), max_tokens=4), spec("B", r(11, 16), max_tokens=3)],
                        cfg, scheduler="continuous", cost_model=cost, fast_path=False)
    # Steps as in test_swapped_requests_come_back_before_waiting_ones: out in step 2, in in step 5.
    assert cost.swap_bytes[:6] == [0, 2000, 0, 0, 2000, 0]
    assert {q.request_id: q.num_preemptions for q in engine.done} == {"A": 0, "B": 1}
    assert all(q.status is RequestStatus.FINISHED for q in engine.done)


def test_simulate_with_too_little_swap_space_stops_with_the_swap_error():
    import kvsim

    sc = {"name": "swap", "model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm"},
          "engine": {"scheduler": "continuous", "preemption_mode": "swap", "swap_space": 0.0,
                     "num_gpu_blocks_override": 12, "block_size": 4, "max_model_len": 32},
          "cost_model": {"type": "constant", "step_time_s": 1.0},
          "workload": {"num_requests": 4, "arrival": {"type": "all_at_once"},
                       "prompt_len": {"type": "fixed", "value": 10},
                       "output_len": {"type": "fixed", "value": 20}}}
    with pytest.raises(RuntimeError, match=r"swap space exhausted: request r\d needs \d+ CPU blocks, "
                                           r"0 free \(raise engine.swap_space\)"):
        kvsim.simulate(sc)
