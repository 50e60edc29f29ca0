"""The fast path equals the step path for models run by the hybrid KV manager.

Decode runs of the hybrid manager free blocks as well as take them (sliding
windows move on, Mamba states are replaced), so a run must stop exactly
where the step path would preempt, and a blocked waiting head must stay
blocked (kv/hybrid_runs.py). Same checks as tests/test_fast_path.py, on
Gemma 3 (5 sliding groups + 1 full), gpt-oss (sliding 128 + full),
Mistral-7B (one sliding group), Llama 4 Scout with the hybrid manager on
(chunked local) and Qwen3-Next (Gated DeltaNet state), with tight memory
and overload.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import kvsim
from test_fast_path import both, scenario


def hybrid(model: str, **over) -> dict:
    sc = scenario(model=model, **over)
    sc["workload"] = {**sc["workload"], "num_requests": 80,
                      "prompt_len": {"type": "lognormal", "median": 900, "sigma": 0.8, "max": 3000}}
    return sc


OVERLOAD = {"num_requests": 80, "arrival": {"type": "poisson", "rate": 80.0},
            "prompt_len": {"type": "lognormal", "median": 900, "sigma": 0.8, "max": 3000},
            "output_len": {"type": "uniform", "low": 20, "high": 300},
            "prefix": {"shared_prompt_tokens": 512, "num_groups": 3}}

LIGHT = {**OVERLOAD, "arrival": {"type": "poisson", "rate": 2.0}}

CASES = {
    "gemma3_prefix_hits": hybrid("gemma-3-27b"),
    "gemma3_light_load": hybrid("gemma-3-27b", workload=LIGHT),
    "gemma3_tight_memory": hybrid("gemma-3-27b", engine__num_gpu_blocks_override=2500),
    "gemma3_overloaded_blocked_head": hybrid("gemma-3-27b", engine__num_gpu_blocks_override=2500,
                                             workload=OVERLOAD),
    "gemma3_caching_off": hybrid("gemma-3-27b", engine__enable_prefix_caching=False,
                                 engine__num_gpu_blocks_override=2500),
    "gpt_oss_overloaded": hybrid("gpt-oss-20b", engine__num_gpu_blocks_override=1500,
                                 workload=OVERLOAD),
    "mistral_sliding_window": hybrid("mistral-7b", engine__num_gpu_blocks_override=700,
                                     engine__max_model_len=8192,
                                     workload={**OVERLOAD, "output_len": {"type": "uniform",
                                                                          "low": 500, "high": 5000}}),
    "llama4_chunked_local": hybrid("llama-4-scout-17b-16e", hardware={"gpu": "h100-sxm", "tp": 4},
                                   engine__disable_hybrid_kv_cache_manager=False,
                                   engine__num_gpu_blocks_override=3000, workload=OVERLOAD),
    "qwen3_next_prefix_hits": hybrid("qwen3-next-80b-a3b", hardware={"gpu": "h200", "tp": 2}),
    "qwen3_next_mamba": hybrid("qwen3-next-80b-a3b", hardware={"gpu": "h200", "tp": 2},
                               engine__num_gpu_blocks_override=300, workload=OVERLOAD),
}


@pytest.mark.parametrize("name", list(CASES))
def test_hybrid_fast_path_equals_step_path(name):
    fast, slow, trace_fast, trace_slow = both(CASES[name])
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)
    assert trace_fast == trace_slow
    np.testing.assert_array_equal(fast.itl_s, slow.itl_s)
    assert fast.summary == slow.summary


@pytest.mark.parametrize("name", ["gemma3_light_load", "qwen3_next_prefix_hits"])
def test_hybrid_fast_path_actually_skips_steps(name):
    stats = kvsim.simulate(CASES[name]).stats
    assert stats.num_run_steps > stats.num_steps / 2


@pytest.mark.parametrize("name", ["gemma3_overloaded_blocked_head", "gpt_oss_overloaded",
                                  "mistral_sliding_window", "llama4_chunked_local",
                                  "qwen3_next_mamba"])
def test_run_plans_predict_the_free_blocks_of_every_step(name, monkeypatch):
    """What a run plan counts (closed forms, kv/hybrid_runs.decode_counts) is what
    applying its steps does: the free blocks after every step, exactly."""
    from kvsim.kv.hybrid_runs import HybridDecodeRuns
    from kvsim.sched.paged import PagedScheduler

    make_run = PagedScheduler._make_run
    apply = HybridDecodeRuns.allocate_decode_steps
    checked = []

    def planning(self, max_steps, context_sum, computed, steps_that_fit):
        run = make_run(self, max_steps, context_sum, computed, steps_that_fit)
        if run is not None:               # count the whole run before any step is applied
            self.kv._plan(run.first_allocations, run.max_steps)
        return run

    def checking(self, reqs, num_computed, plan, first, last):
        free = self.pool.get_num_free_blocks()
        out = apply(self, reqs, num_computed, plan, first, last)
        net = {}
        for key, freed, allocated in plan.events:
            s = key // plan.num_seqs
            net[s] = net.get(s, 0) + freed - allocated
        want = []
        for s in range(first, last + 1):
            free += net.get(s, 0)
            want.append(free)
        assert out == want
        checked.append(last - first + 1)
        return out

    monkeypatch.setattr(PagedScheduler, "_make_run", planning)
    monkeypatch.setattr(HybridDecodeRuns, "allocate_decode_steps", checking)
    kvsim.simulate(CASES[name])
    assert sum(checked) > 50
