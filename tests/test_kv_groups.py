"""vLLM's KV-cache groups (kvsim.specs.kv_groups) against the real vLLM 0.33 code.

The expected values in tests/golden/kv_groups/vllm_kv_groups.json were made by
running vLLM 0.33's get_kv_cache_groups / get_kv_cache_config_from_groups /
get_max_concurrency_for_kv_cache_config on CPU (tests/golden/kv_groups/
vllm_kv_groups.py). Cases 1-9 are the vectors of vLLM's own
tests/v1/core/test_kv_cache_utils.py::test_get_kv_cache_config_one_worker.
"""

import json
from pathlib import Path

import pytest

from kvsim.scenario.loader import load_scenario
from kvsim.scenario.schema import ScenarioError
from kvsim.specs.kv_groups import (CHUNKED, FULL, MAMBA, SLIDING, LayerKVSpec,
                                   get_kv_cache_groups)

GOLDEN = json.loads((Path(__file__).parent / "golden" / "kv_groups"
                     / "vllm_kv_groups.json").read_text())["cases"]
P = 16 * 2 * 64 * 4 * 2           # one 16-token block of vLLM's test spec (head 64, float32)
KIND = {"full": FULL, "sliding": SLIDING, "chunked": CHUNKED, "mamba": MAMBA}
VLLM_TYPE = {FULL: "FullAttentionSpec", SLIDING: "SlidingWindowSpec",
             CHUNKED: "ChunkedLocalAttentionSpec", MAMBA: "MambaSpec"}


def to_specs(layers):
    """The script's (kind, block, head_size | state elements, window | chunk) as kvsim specs."""
    attn_page = [block * 2 * size * 2 * 4 for kind, block, size, _ in layers if kind != "mamba"][-1]
    specs = []
    for kind, block, size, extra in layers:
        k = KIND[kind]
        if k == MAMBA:
            specs.append(LayerKVSpec(MAMBA, block, attn_page))     # padded to the attention page
            continue
        page = block * 2 * size * 2 * 4
        specs.append(LayerKVSpec(k, block, page,
                                 sliding_window=extra if k in (SLIDING, FULL) else None,
                                 attention_chunk_size=extra if k == CHUNKED else None))
    return specs


GROUPED = sorted(name for name, case in GOLDEN.items() if "error" not in case)
REFUSED = sorted(name for name, case in GOLDEN.items() if "error" in case)


@pytest.mark.parametrize("name", GROUPED)
def test_groups_and_num_blocks_match_vllm(name):
    case = GOLDEN[name]
    groups = get_kv_cache_groups(to_specs(case["layers"]), case["disable_hybrid_kv_cache_manager"])
    got = [{"layers": list(g.layers), "type": VLLM_TYPE[g.kind], "block_size": g.spec.block_size,
            "uniform_type": g.uniform_type} for g in groups.groups]
    want = [{k: g[k] for k in ("layers", "type", "block_size", "uniform_type")}
            for g in case["groups"]]
    assert got == want
    assert groups.num_blocks(case["memory"]) == case["num_blocks"]


@pytest.mark.parametrize("name", REFUSED)
def test_layouts_vllm_refuses_are_refused(name):
    # vLLM 0.33 raises ValueError for these layouts (its message in the golden file);
    # kvsim refuses them too, naming the setting at fault.
    case = GOLDEN[name]
    assert case["error"] == "ValueError"
    with pytest.raises(ValueError, match="^disable_hybrid_kv_cache_manager: vLLM cannot put"):
        get_kv_cache_groups(to_specs(case["layers"]), case["disable_hybrid_kv_cache_manager"])


def test_some_golden_layouts_are_refused():
    assert {"two_windows_hybrid_off", "two_chunks_hybrid_off", "qwen3next_like_hybrid_off"} <= set(REFUSED)


@pytest.mark.parametrize("name", GROUPED)
def test_max_concurrency_matches_vllm(name):
    case = GOLDEN[name]
    groups = get_kv_cache_groups(to_specs(case["layers"]), case["disable_hybrid_kv_cache_manager"])
    for key, want in case["max_concurrency"].items():
        seq_len, in_flight = map(int, key.split(","))
        assert groups.max_concurrency(case["num_blocks"], seq_len, in_flight) == pytest.approx(
            want, rel=1e-12), key


def test_one_full_and_one_sliding_layer_get_a_block_each():
    # vLLM test_get_kv_cache_config_one_worker: 2 layers' memory, 64 blocks of one layer each.
    groups = get_kv_cache_groups([LayerKVSpec(FULL, 16, P),
                                  LayerKVSpec(SLIDING, 16, P, sliding_window=1)])
    assert groups.bytes_per_block == P and groups.num_blocks(P * 2 * 32) == 64


def test_hybrid_manager_off_promotes_sliding_layers_to_full_attention():
    groups = get_kv_cache_groups([LayerKVSpec(FULL, 16, P),
                                  LayerKVSpec(SLIDING, 16, P, sliding_window=1)],
                                 disable_hybrid_kv_cache_manager=True)
    (group,) = groups.groups
    assert group.kind == FULL and group.spec.sliding_window == 1
    assert groups.num_blocks(P * 2 * 32) == 32


def test_hybrid_manager_off_keeps_an_all_sliding_model_sliding():
    specs = [LayerKVSpec(SLIDING, 16, P, sliding_window=4096)] * 4
    (group,) = get_kv_cache_groups(specs, disable_hybrid_kv_cache_manager=True).groups
    assert group.kind == SLIDING


def test_hybrid_manager_off_refuses_mamba_layers():
    specs = [LayerKVSpec(MAMBA, 16, P)] * 3 + [LayerKVSpec(FULL, 16, P)]
    with pytest.raises(ValueError, match="disable_hybrid_kv_cache_manager"):
        get_kv_cache_groups(specs, disable_hybrid_kv_cache_manager=True)


def test_sliding_window_blocks_stop_growing_at_the_window():
    spec = LayerKVSpec(SLIDING, 16, P, sliding_window=1024)
    # min(1023 + 2048, len) tokens, +1 block for a window that starts mid-block
    assert spec.max_blocks_per_request(100, 2048) == 7 + 1
    assert spec.max_blocks_per_request(100_000, 2048) == 192 + 1


def test_mamba_state_is_one_block_or_two_in_align_mode():
    assert LayerKVSpec(MAMBA, 16, P).max_blocks_per_request(10**6, 8192) == 1
    assert LayerKVSpec(MAMBA, 16, P, mamba_cache_mode="align").max_blocks_per_request(
        10**6, 8192) == 2


def test_a_uniform_type_group_is_refused_for_vllm_v1():
    # vLLM 0.33 plans sliding + chunked + full layers with the hybrid manager off as one
    # UniformTypeKVCacheSpecs group (golden case sliding_chunked_full_hybrid_off), but its
    # scheduler has no KV manager for one (KVCacheSpecRegistry.get_manager_class is None):
    # the engine fails at start-up, so the scenario is refused; with the manager on it runs.
    sc = {"name": "uniform-type", "model": {"base": "gemma-3-1b", "attention_chunk_size": 64,
                                            "layer_pattern": ["sliding_attention",
                                                              "chunked_attention",
                                                              "full_attention"]},
          "hardware": {"gpu": "h100-sxm"},
          "engine": {"disable_hybrid_kv_cache_manager": True, "max_model_len": 1024},
          "workload": {"num_requests": 3, "arrival": {"type": "poisson", "rate": 1.0},
                       "prompt_len": {"type": "fixed", "value": 10},
                       "output_len": {"type": "fixed", "value": 5}}}
    with pytest.raises(ScenarioError, match=r"^engine.disable_hybrid_kv_cache_manager: got true; "
                                            r".*no KV manager"):
        load_scenario(sc)
    sc["engine"]["disable_hybrid_kv_cache_manager"] = False
    groups = load_scenario(sc).sched_config.kv_groups.groups
    assert [g.kind for g in groups] == [SLIDING, CHUNKED, FULL]
    assert not any(g.uniform_type for g in groups)
