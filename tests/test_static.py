"""``static``: request-level batching as FasterTransformer served (no paging).

When idle, the engine takes up to ``max_num_seqs`` waiting requests as one
batch, reserves each one's maximum length (prompt + max_tokens) in the
contiguous allocator, and runs until every one of them is done; early
finishers keep their slot (padding) and are returned with the batch.
"""

from __future__ import annotations

from helpers import Driver, spec

from kvsim.cost.base import ConstantCostModel
from kvsim.sched.config import SchedulerConfig
from kvsim.sched.request import RequestStatus
from kvsim.sim.run import run_engine


def r(a, b):
    return range(a, b + 1)


def batch_10_50_200(**extra):
    """A (5-token prompt, 10 outputs), B (7, 50), C (3, 200), then D (2, 2) waiting."""
    return [spec("A", r(1, 5), max_tokens=10), spec("B", r(11, 17), max_tokens=50),
            spec("C", r(21, 23), max_tokens=200), spec("D", r(31, 32), max_tokens=2, **extra)]


def test_one_batch_of_10_50_200_outputs_uses_260_of_600_slot_steps():
    d = Driver("static", num_gpu_blocks=200, max_num_seqs=3)
    d.add(*batch_10_50_200())
    finished_at = {}
    for step in range(1, 201):
        scheduled, _, finished = d.step()
        assert set(scheduled) == {"A", "B", "C"}          # finished requests stay as padding
        for rid in finished:
            finished_at[rid] = step
    assert finished_at == {"A": 200, "B": 200, "C": 200}
    assert (d.sched.slot_steps, d.sched.used_slot_steps) == (600, 260)
    assert d.sched.slot_utilization == 260 / 600
    assert [d.reqs[x].num_output_tokens for x in "ABC"] == [10, 50, 200]


def test_the_next_batch_starts_only_after_the_whole_batch_finishes():
    d = Driver("static", num_gpu_blocks=200, max_num_seqs=3)
    d.add(*batch_10_50_200())
    assert d.step()[0] == {"A": 5, "B": 7, "C": 3}       # one prefill step for the batch
    for _ in range(199):
        assert "D" not in d.step()[0]
    assert d.step()[0] == {"D": 2}


def test_each_request_reserves_its_maximum_length_at_admission():
    d = Driver("static", num_gpu_blocks=200, max_num_seqs=3)
    d.add(*batch_10_50_200())
    d.step()
    alloc = d.sched.alloc
    assert [alloc.slab(x) for x in "ABC"] == [(0, 15), (15, 57), (72, 203)]
    assert "D" not in alloc
    usage = alloc.usage()
    assert usage.used_bytes == 6 + 8 + 4                 # prompt + first token each
    assert usage.reserved_unused_bytes == 275 - 18
    assert usage.free_bytes == 199 * 4 - 275


def test_a_batch_stops_at_the_first_request_whose_slab_does_not_fit():
    # 19 usable blocks = 76 token slots: A (15) + B (57) fit, C (10) does not.
    d = Driver("static", num_gpu_blocks=20, max_num_seqs=3)
    d.add(spec("A", r(1, 5), max_tokens=10), spec("B", r(11, 17), max_tokens=50),
          spec("C", r(21, 25), max_tokens=5))
    assert d.step()[0] == {"A": 5, "B": 7}
    for _ in range(49):
        assert "C" not in d.step()[0]
    assert d.step()[0] == {"C": 5}


def test_engine_returns_the_batch_at_the_end_of_step_200_and_admits_the_next():
    cfg = SchedulerConfig(num_gpu_blocks=200, block_size=4, max_model_len=256, max_num_seqs=3)
    engine = run_engine(batch_10_50_200(), cfg, scheduler="static",
                        cost_model=ConstantCostModel(1.0))
    done = {q.request_id: q for q in engine.done}
    assert [done[x].finish_time for x in "ABC"] == [200.0, 200.0, 200.0]
    assert [done[x].first_token_time for x in "ABC"] == [1.0, 1.0, 1.0]
    assert done["D"].scheduled_time == 200.0
    assert (done["D"].first_token_time, done["D"].finish_time) == (201.0, 202.0)
    assert len(engine.steps) == 202
    assert all(q.status is RequestStatus.FINISHED for q in engine.done)


def test_a_request_longer_than_the_allocator_fails_with_its_reason():
    cfg = SchedulerConfig(num_gpu_blocks=20, block_size=4, max_model_len=256, max_num_seqs=3)
    engine = run_engine([spec("A", r(1, 5), max_tokens=10), spec("B", r(11, 17), max_tokens=80)],
                        cfg, scheduler="static", cost_model=ConstantCostModel(1.0))
    done = {q.request_id: q for q in engine.done}
    assert done["B"].status is RequestStatus.FAILED
    assert done["B"].fail_reason == ("needs 22 KV blocks for 87 tokens; "
                                     "the cache has only 19 usable blocks")
    assert done["A"].status is RequestStatus.FINISHED and done["A"].finish_time == 10.0
