"""Test vectors TV1-TV5 of kv-semantics.md (block pool and KV manager), vLLM 0.33."""

from helpers import Driver, spec


def r(a, b):
    return range(a, b + 1)


def test_tv1_partial_prefix_hit_while_owner_running():
    d = Driver(num_gpu_blocks=11, max_num_batched_tokens=64)
    d.add(spec("A", r(1, 9), max_tokens=10))
    scheduled, _, _ = d.step()
    assert scheduled == {"A": 9}
    assert d.blocks("A") == [1, 2, 3]
    pool = d.kv.pool
    assert pool.block_hash[1] is not None and pool.block_hash[2] is not None
    assert pool.block_hash[3] is None                      # holds 1 token
    assert d.free_queue() == list(r(4, 10))

    d.add(spec("B", [*r(1, 8), 100], max_tokens=10))
    scheduled, plan, _ = d.step()
    assert scheduled == {"A": 1, "B": 1}
    assert d.blocks("B") == [1, 2, 4]
    assert [pool.ref_cnt[b] for b in (1, 2, 3, 4)] == [2, 2, 1, 1]
    assert d.free_queue() == list(r(5, 10))
    assert d.reqs["B"].num_cached_tokens == 8
    assert plan.prefix_hit_tokens == {"B": 8}


def test_tv2_exact_multiple_prompt_recomputes_last_block():
    d = Driver(num_gpu_blocks=11, max_num_batched_tokens=64)
    d.add(spec("A", r(1, 8), max_tokens=1))
    assert d.step()[2] == ["A"]
    assert d.free_queue() == [*r(3, 10), 2, 1]

    d.add(spec("C", r(1, 8), max_tokens=1))
    scheduled, plan, _ = d.step()
    # max_hit = 7 tokens -> 1 block; the whole last block is recomputed.
    assert plan.prefix_hit_tokens == {"C": 4}
    assert scheduled == {"C": 4}
    pool = d.kv.pool
    assert pool.num_cached_hashes() == 2                   # no de-duplication
    assert pool.block_hash[3] == pool.block_hash[2]
    assert pool.get_cached_block(pool.block_hash[2]) == 2  # the first stored wins
    assert d.free_queue() == [*r(4, 10), 2, 3, 1]
    assert {b for b in r(1, 10) if pool.block_hash[b] is not None} == {1, 2, 3}


def test_tv3_reverse_free_evicts_tail_blocks_first():
    d = Driver(num_gpu_blocks=5, max_num_batched_tokens=64)
    d.add(spec("A", r(1, 8), max_tokens=1))
    d.step()
    assert d.free_queue() == [3, 4, 2, 1]
    d.add(spec("B", r(20, 27), max_tokens=1))
    d.step()
    assert d.free_queue() == [2, 1, 4, 3]
    d.add(spec("C", r(40, 47), max_tokens=1))
    _, _, _ = d.step()
    assert d.free_queue() == [4, 3, 1, 2]


def _tv4(lifo: bool):
    d = Driver(num_gpu_blocks=5, max_num_batched_tokens=64, lifo_unhashed_free=lifo)
    d.add(spec("A", r(1, 8), max_tokens=1))
    d.step()
    assert d.free_queue() == [3, 4, 2, 1]
    d.add(spec("D", [*r(1, 8), 50], max_tokens=1))
    scheduled, plan, finished = d.step()
    assert plan.prefix_hit_tokens == {"D": 8}
    assert scheduled == {"D": 1}
    assert finished == ["D"]
    return d


def test_tv4_hit_on_free_blocks_counts_revived_blocks_and_lifo_prepends_partial():
    d = _tv4(lifo=True)
    assert d.free_queue() == [3, 4, 2, 1]                  # 0.33: partial block 3 prepended


def test_tv4_vllm_0_11_appends_partial_block():
    d = _tv4(lifo=False)
    assert d.free_queue() == [4, 3, 2, 1]


def test_tv4_capacity_accounting_refuses_when_revival_does_not_fit():
    # Same hits, but only 3 blocks free: 3 - 2 + 2 = 3 fits; take one away.
    d = Driver(num_gpu_blocks=5, max_num_batched_tokens=64)
    d.add(spec("A", r(1, 8), max_tokens=1))
    d.step()
    d.add(spec("X", r(60, 63), max_tokens=50))             # holds block 3
    d.step()
    d.add(spec("D", [*r(1, 8), 50], max_tokens=1))
    scheduled, _, _ = d.step()
    assert "D" not in scheduled                            # needs 3, only 2 free


def test_tv5_identical_prompts_in_one_step_share_blocks():
    d = Driver(num_gpu_blocks=11, max_num_batched_tokens=64)
    d.add(spec("A", r(1, 9)), spec("B", r(1, 9)))
    scheduled, plan, _ = d.step()
    assert scheduled == {"A": 9, "B": 1}
    assert d.blocks("A") == [1, 2, 3]
    assert d.blocks("B") == [1, 2, 4]
    assert d.reqs["B"].num_cached_tokens == 8
