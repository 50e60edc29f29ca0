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

# The hybrid manager next to the engine features of main (phase 3): drafts and
# their lookahead slots (verified blocks cached by cache_blocks), async
# scheduling, the prefill cadence, max_num_scheduled_tokens, stream_interval and
# parallel samples (siblings share prompt blocks through the prefix cache), each loaded.
_SPEC = {"method": "eagle", "num_speculative_tokens": 3, "acceptance": {"rate": 0.7}}
_NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "acceptance": {"rate": 0.6}}
_QWEN = {"hardware": {"gpu": "h200", "tp": 2}, "engine__num_gpu_blocks_override": 300,
         "workload": OVERLOAD}
CASES.update({
    "gemma3_spec_decode_eagle": hybrid("gemma-3-27b", engine__speculative_config=_SPEC,
                                       engine__num_gpu_blocks_override=2500, workload=OVERLOAD),
    "gpt_oss_spec_decode_ngram": hybrid("gpt-oss-20b", engine__speculative_config=_NGRAM,
                                        engine__num_gpu_blocks_override=1500, workload=OVERLOAD),
    "gemma3_async_scheduling": hybrid("gemma-3-27b", engine__async_scheduling=True,
                                      engine__num_gpu_blocks_override=2500, workload=OVERLOAD),
    "qwen3_next_async_scheduling": hybrid("qwen3-next-80b-a3b", engine__async_scheduling=True,
                                          **_QWEN),
    "gemma3_prefill_schedule_interval": hybrid("gemma-3-27b", engine__prefill_schedule_interval=3,
                                               engine__num_gpu_blocks_override=2500,
                                               workload=OVERLOAD),
    "qwen3_next_prefill_schedule_interval": hybrid("qwen3-next-80b-a3b",
                                                   engine__prefill_schedule_interval=3, **_QWEN),
    "llama4_prefill_schedule_interval": hybrid(
        "llama-4-scout-17b-16e", hardware={"gpu": "h100-sxm", "tp": 4},
        engine__disable_hybrid_kv_cache_manager=False, engine__prefill_schedule_interval=2,
        engine__num_gpu_blocks_override=3000, workload=OVERLOAD),
    "gpt_oss_max_num_scheduled_tokens": hybrid("gpt-oss-20b", engine__max_num_scheduled_tokens=160,
                                               engine__num_gpu_blocks_override=1500,
                                               workload=OVERLOAD),
    "qwen3_next_max_num_scheduled_tokens": hybrid("qwen3-next-80b-a3b",
                                                  engine__max_num_scheduled_tokens=160, **_QWEN),
    "gpt_oss_stream_interval": hybrid("gpt-oss-20b", engine__stream_interval=4,
                                      engine__num_gpu_blocks_override=1500, workload=OVERLOAD),
    "gemma3_parallel_sampling": hybrid("gemma-3-27b", engine__num_gpu_blocks_override=2500,
                                       workload={**OVERLOAD, "num_requests": 30, "n": 3}),
})


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


def test_blocks_verified_drafts_filled_are_cached_in_every_group(monkeypatch):
    """Verified draft tokens' blocks are cached after the step (vLLM
    update_from_output -> KVCacheManager.cache_blocks -> every group's manager)."""
    from kvsim.kv.hybrid import HybridKVCacheManager
    original = HybridKVCacheManager.cache_blocks
    grown = []

    def counting(self, req, num_computed_tokens):
        before = [m.num_cached_block.get(req.request_id, 0) for m in self.managers]
        original(self, req, num_computed_tokens)
        after = [m.num_cached_block.get(req.request_id, 0) for m in self.managers]
        grown.append(sum(after) - sum(before))

    monkeypatch.setattr(HybridKVCacheManager, "cache_blocks", counting)
    res = kvsim.simulate(CASES["gemma3_spec_decode_eagle"])
    assert res.summary["completed"] == 80
    assert res.steps["num_generated_tokens"].max() > res.steps["num_decode_tokens"].max()
    assert sum(g > 0 for g in grown) > 100     # decode blocks filled by accepted drafts


def test_drafts_with_mamba_state_are_refused_in_one_line():
    from kvsim.scenario.loader import ScenarioError, load_scenario
    sc = hybrid("qwen3-next-80b-a3b", hardware={"gpu": "h200", "tp": 2},
                engine__speculative_config=_NGRAM)
    with pytest.raises(ScenarioError) as err:
        load_scenario(sc)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("engine.speculative_config:")
    assert "qwen3-next" in msg.lower() and "num_speculative_blocks" in msg


def test_a_kv_connector_with_the_hybrid_manager_is_refused_in_one_line():
    """vLLM VllmConfig turns the hybrid manager off for a connector without
    SupportsHMA; kvsim refuses the pair when the engine is made."""
    from kvsim.scenario.loader import load_scenario
    from kvsim.sim.run import make_scheduler
    sc = load_scenario(CASES["gemma3_prefix_hits"])
    assert sc.sched_config.kv_groups is not None
    with pytest.raises(ValueError) as err:
        make_scheduler("chunked", sc.sched_config, connector=object())
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("engine.disable_hybrid_kv_cache_manager:")
    # With the hybrid manager off (Gemma 3's sliding layers promoted to full) it is taken.
    off = load_scenario(hybrid("gemma-3-27b", engine__disable_hybrid_kv_cache_manager=True))
    assert off.sched_config.kv_groups is None
