"""Scenario keys of issue #16: hardware.dp, engine.enable_expert_parallel,
engine.all2all_backend, engine.disable_hybrid_kv_cache_manager; what they
reach (kv_capacity, the KV manager, the cost model) and their one-line errors;
and the sliding-window decode cost."""

from __future__ import annotations

import numpy as np
import pytest

import kvsim
from kvsim.cost.features import rank_shapes
from kvsim.kv.hybrid import HybridKVCacheManager
from kvsim.kv.manager import KVCacheManager
from kvsim.scenario.loader import load_scenario
from kvsim.specs.catalog import load_model


def scenario(**over) -> dict:
    sc = {"name": "t", "model": "gemma-3-27b", "hardware": {"gpu": "h100-sxm", "tp": 1},
          "engine": {"max_model_len": 8192, "max_num_batched_tokens": 2048}, "cost_model": {"type": "roofline"},
          "workload": {"num_requests": 20, "arrival": {"type": "poisson", "rate": 5.0},
                       "prompt_len": {"type": "fixed", "value": 3000},
                       "output_len": {"type": "fixed", "value": 50}}}
    for key, value in over.items():
        section, _, name = key.partition("__")
        sc[section] = {**sc[section], name: value} if name else value
    return sc


def manager_of(sc):
    return sc.sched_config.make_kv_manager()


def test_gemma3_runs_the_hybrid_manager_and_it_holds_more_requests():
    on = load_scenario(scenario())
    off = load_scenario(scenario(engine__disable_hybrid_kv_cache_manager=True))
    assert isinstance(manager_of(on), HybridKVCacheManager)
    assert len(on.sched_config.kv_groups.groups) == 7        # 6 sliding groups + 1 full
    assert isinstance(manager_of(off), KVCacheManager) and off.sched_config.kv_groups is None
    # One request of 8192 tokens: 512 blocks in the full group; a sliding group holds at
    # most the window plus a batch in flight: cdiv(1023 + 2048, 16) + 1 = 193 (vLLM
    # max_admission_blocks_per_request; synchronous steps, one batch in flight).
    assert on.sched_config.blocks_per_request(8192) == 512 + 6 * 193
    # vLLM's logged concurrency is for 0.33's default, async scheduling: two batches
    # in flight, cdiv(1023 + 4096, 16) + 1 = 321.
    assert on.capacity.blocks_per_group(8192) == [321] * 6 + [512]
    assert on.capacity.max_concurrency(8192) > 1.25 * off.capacity.max_concurrency(8192)
    # With engine.async_scheduling the run's admission cap reserves them too
    # (VllmConfig.max_in_flight_tokens = max_concurrent_batches x max_num_batched_tokens).
    both = load_scenario(scenario(engine__async_scheduling=True))
    assert both.sched_config.blocks_per_request(8192) == 512 + 6 * 321
    assert [m.admission_cap for m in manager_of(both).managers] == [321] * 6 + [None]


def test_hybrid_and_not_give_the_same_tokens_when_nothing_slides_out():
    # Prompts shorter than the window: the hybrid manager frees nothing early.
    short = {"workload__prompt_len": {"type": "fixed", "value": 500},
             "engine__num_gpu_blocks_override": 4000}
    a = kvsim.simulate(scenario(**short))
    b = kvsim.simulate(scenario(**short, engine__disable_hybrid_kv_cache_manager=True))
    assert a.summary["completed"] == b.summary["completed"] == 20
    assert a.summary["total_output_tokens"] == b.summary["total_output_tokens"]


def test_qwen3_next_runs_with_mamba_state_and_a_raised_block_size():
    sc = load_scenario(scenario(model="qwen3-next-80b-a3b", hardware={"gpu": "h200", "tp": 2}))
    assert sc.sched_config.block_size == 544 and any("raised to 544" in n for n in sc.notes)
    kinds = {g.kind for g in sc.sched_config.kv_groups.groups}
    assert kinds == {"full_attention", "mamba"}
    result = kvsim.simulate(sc)
    assert result.summary["completed"] == 20


@pytest.mark.parametrize("over, message", [
    ({"engine__enable_expert_parallel": True},
     "engine.enable_expert_parallel: gemma-3-27b has no experts"),
    ({"model": "mixtral-8x7b", "hardware": {"gpu": "h100-sxm", "tp": 4, "dp": 4},
      "engine__enable_expert_parallel": True},
     "hardware.dp: got 4 (with hardware.tp 4 and engine.enable_expert_parallel): expert-parallel "
     "size 16"),
    ({"hardware": {"gpu": "h100-sxm", "tp": 3}}, "hardware.tp: got 3"),
    ({"engine__all2all_backend": "nccl"}, "engine.all2all_backend: got 'nccl'"),
    ({"model": "qwen3-next-80b-a3b", "hardware": {"gpu": "h200", "tp": 2},
      "engine__disable_hybrid_kv_cache_manager": True},
     "engine.disable_hybrid_kv_cache_manager: got true; qwen3-next-80b-a3b's linear-attention"),
    ({"model": "qwen3-next-80b-a3b", "hardware": {"gpu": "h200", "tp": 2},
      "engine__enable_chunked_prefill": False, "engine__max_num_batched_tokens": 8192},
     "engine.enable_chunked_prefill: got false; vLLM requires chunked prefill"),
    ({"model": "qwen3-next-80b-a3b", "hardware": {"gpu": "h200", "tp": 2},
      "engine__scheduler": "continuous"}, "engine.scheduler: got 'continuous'"),
    ({"engine__scheduler": "continuous", "engine__disable_hybrid_kv_cache_manager": False,
      "engine__max_num_batched_tokens": 8192},
     "engine.disable_hybrid_kv_cache_manager: got false; the continuous scheduler"),
    ({"engine__num_gpu_blocks_override": 500},
     "engine.max_model_len: got 8192; one request of that length needs 1670 blocks (all "
     "KV-cache groups)"),
])
def test_bad_layouts_are_one_line_errors_naming_the_key(over, message):
    with pytest.raises(kvsim.ScenarioError) as err:
        load_scenario(scenario(**over))
    assert str(err.value).startswith(message), str(err.value)
    assert "\n" not in str(err.value)


def test_the_continuous_scheduler_keeps_every_token_and_says_so():
    sc = load_scenario(scenario(engine__scheduler="continuous", engine__max_num_batched_tokens=8192))
    assert sc.sched_config.kv_groups is None
    assert any("keeps every token" in n for n in sc.notes)


def test_dp_and_expert_parallelism_reach_capacity_and_the_cost_model():
    base = {"model": "qwen3-30b-a3b", "workload__num_requests": 5}
    tp2 = load_scenario(scenario(**base, hardware={"gpu": "h100-sxm", "tp": 2}))
    ep = load_scenario(scenario(**base, hardware={"gpu": "h100-sxm", "tp": 1, "dp": 2},
                                engine__enable_expert_parallel=True,
                                engine__all2all_backend="deepep_low_latency"))
    assert ep.capacity.dp == 2 and ep.capacity.expert_parallel_size == 2
    assert ep.capacity.num_local_experts == 64
    # Attention is not split under DP: each rank holds all KV heads, so fewer blocks per byte.
    assert ep.capacity.block_bytes == 2 * tp2.capacity.block_bytes
    shapes = ep.cost_model.shapes
    assert any(op.name == "moe_all2all" for op in shapes.ops)
    assert not any(op.name == "moe_all2all" for op in tp2.cost_model.shapes.ops)


def test_serve_flags_set_the_new_keys():
    sc = load_scenario(scenario(model="qwen3-30b-a3b", engine__serve_args=(
        "--data-parallel-size 2 --enable-expert-parallel --all2all-backend pplx "
        "--no-disable-hybrid-kv-cache-manager")))
    assert sc.capacity.expert_parallel_size == 2 and sc.scenario.engine.all2all_backend == "pplx"
    assert sc.scenario.engine.disable_hybrid_kv_cache_manager is False


# ------------------------------------------------------------ the decode cost
def test_sliding_layers_read_only_their_window_in_decode():
    shapes = rank_shapes(load_model("gemma-3-27b"))
    assert shapes.windowed_fraction == pytest.approx(52 / 62) and shapes.attention_window == 1024
    n, contexts = 4.0, 4 * 5000.0
    keys = contexts + n
    assert shapes.decode_keys(n, keys) == pytest.approx(10 / 62 * keys + 52 / 62 * 4 * 1024)
    assert shapes.decode_keys(n, 2000.0) == 2000.0             # all inside the window
    arr = shapes.decode_keys(n, np.array([2000.0, keys]))
    assert arr.tolist() == [shapes.decode_keys(n, 2000.0), shapes.decode_keys(n, keys)]
    dense = rank_shapes(load_model("llama-3.1-8b"))
    assert dense.windowed_fraction == 0 and dense.decode_keys(n, keys) == keys


def test_long_context_decode_is_cheaper_with_a_window():
    sc = load_scenario(scenario())
    model = sc.cost_model
    short = model.step_time_from_lists([1] * 8, [900] * 8, 8)
    long = model.step_time_from_lists([1] * 8, [7000] * 8, 8)
    import dataclasses
    full = dataclasses.replace(model, shapes=dataclasses.replace(model.shapes, windowed_fraction=0.0))
    assert long - short < 0.25 * (full.step_time_from_lists([1] * 8, [7000] * 8, 8)
                                  - full.step_time_from_lists([1] * 8, [900] * 8, 8))
