"""Blocks of fresh tokens are named by their last token id, not hashed.

Trace replays give each prompt a run of counter ids no other request holds
(``RequestSpec.fresh_prompt_start``); the engine then keys each block by the
id of its last token (``kvsim.kv.hashing.fresh_block_hashes``) instead of
hashing the whole sequence. These tests pin down that this is only a cheaper
way to reach the same equalities: same prefix hits, same runs, step by step.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kvsim.cost.base import ConstantCostModel
from kvsim.kv.hashing import block_hashes, content_block_id_hashes, fresh_block_hashes
from kvsim.sched.config import SchedulerConfig
from kvsim.sched.request import NamedBlockKeys, Request, _first_fresh_id
from kvsim.sim.run import make_engine, run_engine
from kvsim.workload.request import RequestSpec
from kvsim.workload.tokens import MOONCAKE_BLOCK_TOKENS, TokenCounter, mooncake_block_tokens


def fresh_specs(num: int, seed: int, n: int = 1, max_prompt: int = 120, max_output: int = 60,
                gap_s: float = 0.3) -> list[RequestSpec]:
    """Trace-like requests: counter-run prompts, fresh outputs, regular arrivals."""
    rng = np.random.default_rng(seed)
    prompt_lens = rng.integers(1, max_prompt, size=num)
    starts = TokenCounter().take_starts(prompt_lens).tolist()
    return [RequestSpec(f"r{i}", i * gap_s, np.arange(s, s + p, dtype=np.int64),
                        int(rng.integers(1, max_output)), n=n, fresh_prompt_start=s)
            for i, (s, p) in enumerate(zip(starts, prompt_lens.tolist()))]


def last_token_keys(tokens: np.ndarray, block_size: int) -> list[int]:
    """The rule written out: each full block is named by its last token id."""
    last = tokens[block_size - 1::block_size].tolist()[:len(tokens) // block_size]
    return [-1 - 2 * t if t >= 0 else 2 * t for t in last]


@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_fresh_keys_name_each_block_by_its_last_token(block_size):
    for spec in fresh_specs(30, seed=block_size):
        req = Request(spec, 7, block_size=block_size, max_model_len=256)
        assert list(req.block_hashes) == last_token_keys(req.all_token_ids, block_size)


def test_fresh_keys_are_negative_so_they_never_equal_a_content_hash():
    keys = fresh_block_hashes(0, 40, -1, 80, 4)
    assert len(keys) == 20 and max(keys) < 0
    assert min(block_hashes(np.arange(80), 4)) >= 0


def equality_pattern(keys: list[int]) -> list[int]:
    """For each key, the position where it first occurs: equal patterns, equal equalities."""
    first: dict[int, int] = {}
    return [first.setdefault(k, i) for i, k in enumerate(keys)]


def test_fresh_keys_are_equal_exactly_when_the_content_hashes_are():
    # n > 1 siblings share the prompt (same run), not their outputs.
    specs = fresh_specs(12, seed=1)
    specs += [replace(specs[3], request_id="r3#1"), replace(specs[5], request_id="r5#1")]
    fresh, content = [], []
    for index, spec in enumerate(specs):
        kw = dict(block_size=4, max_model_len=256)
        fresh += Request(spec, index, **kw).block_hashes
        content += Request(replace(spec, fresh_prompt_start=None), index, **kw).block_hashes
    assert equality_pattern(fresh) == equality_pattern(content)
    assert len(set(fresh)) < len(fresh)   # the siblings did share blocks


def test_given_outputs_fall_back_to_content_hashing():
    spec = replace(fresh_specs(1, seed=2)[0], output_token_ids=np.arange(5, 65))
    req = Request(spec, 0, block_size=4, max_model_len=256)
    assert req.block_hashes == block_hashes(req.all_token_ids, 4)


def run(specs, scheduler):
    """Every step of the run (``--trace`` records) and every request's record."""
    config = SchedulerConfig(num_gpu_blocks=64, block_size=4, max_model_len=256,
                             max_num_batched_tokens=64, debug=True)
    steps = []
    engine = run_engine(specs, config, scheduler=scheduler, cost_model=ConstantCostModel(0.01),
                        trace=steps.append)
    # repr: a failed request's NaN times would never compare equal.
    requests = sorted((r.request_id, r.num_cached_tokens, r.num_preemptions, repr(r.first_token_time),
                       r.finish_time, r.status) for r in engine.done)
    return steps, requests


@pytest.mark.parametrize("scheduler", ["chunked", "continuous"])
def test_fresh_keys_give_the_same_run_as_hashing_the_tokens(scheduler):
    # A small cache forces preemptions (a resumed request hits its own blocks)
    # and n = 2 siblings hit each other's prompt; debug mode checks every hit
    # against the tokens.
    specs = fresh_specs(60, seed=4, n=2, max_prompt=60, gap_s=0.05)
    fresh = run(specs, scheduler)
    assert fresh == run([replace(s, fresh_prompt_start=None) for s in specs], scheduler)
    steps, requests = fresh
    assert any(step["prefix_hit_tokens"] for step in steps)     # siblings' prompts
    assert any(step["resume_hit_tokens"] for step in steps)     # after a preemption
    assert sum(r[2] for r in requests) > 0


# ------------------------------------------------- Mooncake blocks named by id


def mooncake_specs(num: int, seed: int, n: int = 1) -> list[RequestSpec]:
    """Prompts of 512-token Mooncake blocks drawn from a few shared chains, often cut mid-block."""
    rng = np.random.default_rng(seed)
    chains = [[int(h) for h in rng.integers(0, 50, size=4)] for _ in range(3)]
    specs = []
    for i in range(num):
        ids = chains[int(rng.integers(0, 3))][:int(rng.integers(1, 4))] + [int(rng.integers(0, 50))]
        length = int(rng.integers(512 * (len(ids) - 1) + 1, 512 * len(ids) + 1))
        specs.append(RequestSpec(f"r{i}", i * 0.05, mooncake_block_tokens(ids, length),
                                 int(rng.integers(1, 200)), n=n, prompt_block_ids=ids))
    return specs


@pytest.mark.parametrize("block_size", [1, 16, 48, 512, 1024])
def test_mooncake_keys_are_equal_exactly_when_the_content_hashes_are(block_size):
    specs = mooncake_specs(25, seed=block_size)
    specs += [replace(specs[3], request_id="r3#1")]             # an n > 1 sibling
    named, content = [], []
    for index, spec in enumerate(specs):
        kw = dict(block_size=block_size, max_model_len=4096)
        named += Request(spec, index, **kw).block_hashes
        content += Request(replace(spec, prompt_block_ids=None), index, **kw).block_hashes
    assert len(named) == len(content)
    assert equality_pattern(named) == equality_pattern(content)
    assert len(set(named)) < len(named)                         # prompts did share blocks


def test_mooncake_keys_need_fresh_outputs():
    spec = replace(mooncake_specs(1, seed=0)[0], output_id_base=1000)
    with pytest.raises(ValueError, match="prompt_block_ids needs the engine's fresh output ids"):
        Request(spec, 0, block_size=16, max_model_len=4096)


@pytest.mark.parametrize("scheduler", ["chunked", "continuous"])
def test_mooncake_keys_give_the_same_run_as_hashing_the_tokens(scheduler):
    specs = mooncake_specs(40, seed=5, n=2)
    config = SchedulerConfig(num_gpu_blocks=60, block_size=64, max_model_len=2560,
                             max_num_batched_tokens=2560, debug=True)

    def run_mooncake(specs):
        steps = []
        engine = run_engine(specs, config, scheduler=scheduler, cost_model=ConstantCostModel(0.01),
                            trace=steps.append)
        return steps, sorted((r.request_id, r.num_cached_tokens, r.num_preemptions,
                              repr(r.first_token_time), r.finish_time) for r in engine.done)

    named = run_mooncake(specs)
    assert named == run_mooncake([replace(s, prompt_block_ids=None) for s in specs])
    steps, requests = named
    assert any(v for step in steps for v in step["prefix_hit_tokens"].values())
    assert sum(r[2] for r in requests) > 0                      # preemptions happened


def test_mooncake_keys_are_made_when_first_read():
    spec = mooncake_specs(1, seed=1)[0]
    req = Request(spec, 7, block_size=16, max_model_len=4096)
    held = req.block_hashes
    assert isinstance(held, NamedBlockKeys)                   # nothing hashed on arrival
    expected = content_block_id_hashes(spec.prompt_block_ids, MOONCAKE_BLOCK_TOKENS, req.prompt_len,
                                       _first_fresh_id(7), req.final_num_tokens, 16)
    assert len(expected) > 8
    assert held[3] == expected[3]
    # The first read put the keys themselves in the request.
    assert type(req.block_hashes) is list and req.block_hashes == expected
    # A reference kept from before reads the same keys.
    assert len(held) == len(expected) and list(held) == expected and held[2:5] == expected[2:5]
    assert expected[4] in held and held.index(expected[4], 1) == 4
    assert held == expected and expected == held and held != expected[:-1]
    # Read first through a kept reference: the same.
    other = Request(spec, 7, block_size=16, max_model_len=4096)
    kept = other.block_hashes
    assert list(reversed(kept)) == expected[::-1] and other.block_hashes == expected


def test_a_mooncake_request_dropped_unread_leaves_no_cycle():
    import gc
    spec = mooncake_specs(1, seed=1)[0]
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        for index in range(20):
            req = Request(spec, index, block_size=16, max_model_len=4096)
            assert isinstance(req.block_hashes, NamedBlockKeys)
            del req
        assert gc.collect() == 0
    finally:
        if was:
            gc.enable()


def test_mooncake_prompt_too_long_for_its_keys_is_refused_on_arrival():
    # (A length-only stand-in for the ids: nothing reads them.)
    spec = replace(mooncake_specs(1, seed=0)[0],
                   prompt_token_ids=np.broadcast_to(np.zeros(1, dtype=np.int64), (2**32,)))
    with pytest.raises(ValueError, match="block-id hashes need < 2\\*\\*32"):
        Request(spec, 0, block_size=16, max_model_len=2**33, keep_tokens=False)


def test_a_waiting_queue_of_mooncake_requests_holds_no_keys():
    # 40 requests at once on a cache that holds a few: after the first step
    # only the admitted ones (and the waiting head, whose prefix the scheduler
    # reads) have their keys; the rest of the queue holds none, and a request
    # that finishes drops its keys.
    import simpy
    specs = mooncake_specs(40, seed=2)
    config = SchedulerConfig(num_gpu_blocks=60, block_size=64, max_model_len=2560,
                             max_num_batched_tokens=2560)
    env = simpy.Environment()
    engine = make_engine(config, cost_model=ConstantCostModel(0.01), env=env)
    for i, spec in enumerate(specs):
        engine.submit(replace(spec, arrival_time_s=0.0), 0.0, i)
    engine.start()
    env.run(until=0.015)
    waiting = list(engine.scheduler.waiting)
    assert len(waiting) > 20
    unread = [r for r in waiting if isinstance(r.block_hashes, NamedBlockKeys)]
    assert len(unread) >= len(waiting) - 1
    assert all(type(r.block_hashes) is list for r in engine.scheduler.running)
    env.run()
    assert len(engine.done) == 40 and all(r.block_hashes is None for r in engine.done)
