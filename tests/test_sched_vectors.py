"""Test vectors TV6-TV13 of kv-semantics.md (vLLM V1 scheduler), 0.33 behaviour."""

from helpers import Driver, spec


def r(a, b):
    return range(a, b + 1)


def hashed(d):
    pool = d.kv.pool
    return {b for b in range(1, pool.num_gpu_blocks) if pool.block_hash[b] is not None}


def test_tv6_fcfs_preemption_and_resume_with_partial_self_hit():
    d = Driver(num_gpu_blocks=5, max_num_batched_tokens=64)
    d.add(spec("A", r(1, 6), max_tokens=6), spec("B", r(11, 16), max_tokens=6))
    assert d.step()[0] == {"A": 6, "B": 6}
    assert d.blocks("A") == [1, 2] and d.blocks("B") == [3, 4]
    assert d.free_queue() == [] and hashed(d) == {1, 3}
    assert d.step()[0] == {"A": 1, "B": 1}
    assert d.step()[0] == {"A": 1, "B": 1}
    assert hashed(d) == {1, 2, 3, 4}

    scheduled, plan, _ = d.step()                          # step 4
    assert scheduled == {"A": 1}
    assert [q.request_id for q in plan.preempted] == ["B"]
    assert d.blocks("A") == [1, 2, 4] and d.free_queue() == [3]
    b = d.reqs["B"]
    assert (b.num_computed_tokens, b.num_tokens, b.num_preemptions) == (0, 9, 1)
    assert d.sched.waiting.peek() is b
    assert plan.prefix_hit_tokens == {} and plan.resume_hit_tokens == {}

    assert d.step()[0] == {"A": 1}                         # step 5: B hits 1 block, needs 3
    scheduled, _, finished = d.step()                      # step 6
    assert scheduled == {"A": 1} and finished == ["A"]
    assert d.free_queue() == [4, 3, 2, 1]

    scheduled, plan, _ = d.step()                          # step 7
    assert scheduled == {"B": 5}
    assert plan.resume_hit_tokens == {"B": 4}
    assert d.blocks("B") == [3, 4, 2] and d.free_queue() == [1]
    assert hashed(d) == {1, 3, 4}


def test_tv7_chunked_prefill_running_decode_goes_first():
    d = Driver(num_gpu_blocks=20, max_num_batched_tokens=8)
    d.add(spec("R", r(1, 3), max_tokens=20))
    d.step()
    assert d.blocks("R") == [1]
    d.add(spec("A", r(100, 119), max_tokens=5))
    assert d.step()[0] == {"R": 1, "A": 7}
    assert d.blocks("A") == [2, 3] and d.kv.pool.block_hash[1] is not None
    assert d.step()[0] == {"R": 1, "A": 7}
    assert d.blocks("R") == [1, 4] and d.blocks("A") == [2, 3, 5, 6]
    scheduled, plan, _ = d.step()
    assert scheduled == {"R": 1, "A": 6}
    assert d.reqs["A"].num_output_tokens == 1              # reached 20 and sampled
    assert d.step()[0] == {"R": 1, "A": 1}
    assert d.blocks("A")[-1] == 8


def test_tv8_long_prefill_token_threshold_and_lifo_free_order():
    d = Driver(num_gpu_blocks=20, max_num_batched_tokens=16, long_prefill_token_threshold=4)
    d.add(spec("A", r(1, 10), max_tokens=2), spec("B", r(101, 110), max_tokens=2))
    assert [d.step()[0] for _ in range(3)] == [{"A": 4, "B": 4}, {"A": 4, "B": 4}, {"A": 2, "B": 2}]
    scheduled, _, finished = d.step()
    assert scheduled == {"A": 1, "B": 1} and finished == ["A", "B"]
    assert d.free_queue() == [6, 5, *r(7, 19), 3, 1, 4, 2]


def test_tv8_threshold_ignored_for_a_lone_request():
    d = Driver(num_gpu_blocks=20, max_num_batched_tokens=16, long_prefill_token_threshold=4)
    d.add(spec("A", r(1, 10), max_tokens=2))
    assert d.step()[0] == {"A": 10}


def test_tv9_max_num_seqs_caps_running_requests():
    d = Driver(num_gpu_blocks=20, max_num_batched_tokens=64, max_num_seqs=2)
    d.add(spec("A", r(1, 3), max_tokens=2), spec("B", r(11, 13), max_tokens=2),
          spec("C", r(21, 23), max_tokens=2))
    assert d.step()[0] == {"A": 3, "B": 3}
    scheduled, _, finished = d.step()
    assert scheduled == {"A": 1, "B": 1} and finished == ["A", "B"]
    assert d.step()[0] == {"C": 3}


def test_tv10_head_of_line_blocking():
    d = Driver(num_gpu_blocks=5, max_num_batched_tokens=64)
    d.add(spec("R", r(1, 8), max_tokens=10))
    d.step()
    assert d.blocks("R") == [1, 2]
    d.add(spec("BIG", r(100, 111)), spec("SMALL", [200, 201]))
    scheduled, _, _ = d.step()
    assert scheduled == {"R": 1}                            # SMALL would fit, but is not tried
    assert d.free_queue() == [4]


def test_tv11_priority_self_preemption_continues_with_next_request():
    d = Driver(num_gpu_blocks=5, max_num_batched_tokens=64, policy="priority")
    d.add(spec("P5", r(11, 16), max_tokens=20, priority=5, arrival=0.5))
    d.step()
    assert d.blocks("P5") == [1, 2]
    d.add(spec("P0", r(1, 6), max_tokens=20, priority=0, arrival=1.0))
    d.step()
    assert d.blocks("P0") == [3, 4]
    d.step()
    scheduled, plan, _ = d.step()                          # step 4
    assert [q.request_id for q in plan.preempted] == ["P5"]
    assert scheduled == {"P0": 1}
    assert d.free_queue() == [2, 1]
    d.step()
    assert d.blocks("P0") == [3, 4, 2]


def test_tv12_chunking_off_breaks_at_request_over_budget():
    d = Driver(num_gpu_blocks=40, max_num_batched_tokens=16, max_model_len=16,
               enable_chunked_prefill=False)
    d.add(spec("R", r(1, 3), max_tokens=10))
    d.step()
    d.add(spec("A", r(101, 112)), spec("BIG", r(201, 212)), spec("S1", r(301, 303)),
          spec("S2", r(401, 403)))
    assert d.step()[0] == {"R": 1, "A": 12}
    assert [q.request_id for q in d.sched.waiting] == ["BIG", "S1", "S2"]


def test_tv13_reserve_full_isl_gates_admission():
    d = Driver(num_gpu_blocks=6, max_num_batched_tokens=8)
    d.add(spec("R", r(1, 8), max_tokens=10))
    d.step()
    assert d.blocks("R") == [1, 2]
    d.add(spec("L", r(100, 115)))
    scheduled, _, _ = d.step()
    assert scheduled == {"R": 1}
    assert d.free_queue() == [4, 5]


def test_tv13_without_reserve_full_isl_the_admitted_request_thrashes():
    d = Driver(num_gpu_blocks=6, max_num_batched_tokens=8, scheduler_reserve_full_isl=False,
               lifo_unhashed_free=False)
    d.add(spec("R", r(1, 8), max_tokens=10))
    d.step()
    d.add(spec("L", r(100, 115)))
    assert d.step()[0] == {"R": 1, "L": 7}
    assert d.blocks("L") == [4, 5]
    scheduled, plan, _ = d.step()
    assert [q.request_id for q in plan.preempted] == ["L"]
    assert "L" not in scheduled
    assert d.free_queue() == [5, 4]
