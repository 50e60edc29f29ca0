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
from kvsim.kv.hashing import block_hashes, fresh_block_hashes
from kvsim.sched.config import SchedulerConfig
from kvsim.sched.request import Request
from kvsim.sim.run import run_engine
from kvsim.workload.request import RequestSpec
from kvsim.workload.tokens import TokenCounter


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
        assert req.block_hashes == last_token_keys(req.all_token_ids, block_size)


def test_fresh_keys_are_negative_so_they_never_equal_a_content_hash():
    keys = fresh_block_hashes(0, 40, -1, 80, 4)
    assert len(keys) == 20 and max(keys) < 0
    assert min(block_hashes(np.arange(80), 4)) >= 0


def test_fresh_keys_are_equal_exactly_when_the_content_hashes_are():
    # n > 1 siblings share the prompt (same run), not their outputs.
    specs = fresh_specs(12, seed=1)
    specs += [replace(specs[3], request_id="r3#1"), replace(specs[5], request_id="r5#1")]
    fresh, content = [], []
    for index, spec in enumerate(specs):
        kw = dict(block_size=4, max_model_len=256)
        fresh += Request(spec, index, **kw).block_hashes
        content += Request(replace(spec, fresh_prompt_start=None), index, **kw).block_hashes
    pairs_fresh = {(i, j) for i in range(len(fresh)) for j in range(len(fresh)) if fresh[i] == fresh[j]}
    pairs_content = {(i, j) for i in range(len(content)) for j in range(len(content)) if content[i] == content[j]}
    assert pairs_fresh == pairs_content
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
