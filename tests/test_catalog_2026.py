"""The 2026 catalog (issue 16): entries, published totals, hybrid layouts as vLLM groups them."""

import math

import pytest

from kvsim.specs import kv_capacity, list_gpus, list_models, load_gpu, load_model
from kvsim.specs.gpu import GIB, MIB
from kvsim.specs.kv_groups import FULL, MAMBA, SLIDING, get_kv_cache_groups, model_layer_specs

ISSUE_MODELS = [
    "llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b", "llama-3.1-70b", "llama-3.3-70b",
    "llama-3.1-405b", "llama-4-scout-17b-16e", "llama-4-maverick-17b-128e", "qwen3-0.6b",
    "qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-32b", "qwen3-30b-a3b",
    "qwen3-235b-a22b", "qwen3-next-80b-a3b", "deepseek-v3", "deepseek-r1", "gpt-oss-20b",
    "gpt-oss-120b", "gemma-3-1b", "gemma-3-4b", "gemma-3-12b", "gemma-3-27b",
    "mistral-small-24b", "mistral-large-2", "mixtral-8x7b", "mixtral-8x22b"]
ISSUE_GPUS = ["h100-sxm", "h100-pcie", "h100-nvl", "h200", "h20", "b200", "gb200", "a100-40gb",
              "a100-80gb-sxm", "a100-80gb-pcie", "l40s", "l4", "a10g", "rtx-4090", "rtx-pro-6000",
              "mi300x", "mi325x"]


@pytest.mark.parametrize("name", ISSUE_MODELS)
def test_the_issue_s_models_are_in_the_catalog_with_a_source(name):
    assert name in list_models()
    m = load_model(name)
    assert "config.json" in m.source


@pytest.mark.parametrize("name", ISSUE_GPUS)
def test_the_issue_s_gpus_are_in_the_catalog_with_a_source(name):
    assert name in list_gpus()
    assert load_gpu(name).source


def test_blackwell_gpus_have_fp4_peaks_and_hopper_do_not():
    assert load_gpu("b200").fp4_tflops == 9000 and load_gpu("gb200").fp4_tflops == 10000
    assert load_gpu("h100-sxm").fp4_tflops is None
    assert load_gpu("a100-80gb-sxm").fp8_tflops is None


@pytest.mark.parametrize("name,mib", [("b200", 183359), ("gb200", 189471), ("h100-nvl", 95830),
                                      ("h20", 97871), ("rtx-pro-6000", 97887)])
def test_gpu_memory_is_the_nvidia_smi_total_seen_in_public_logs(name, mib):
    assert load_gpu(name).memory_bytes == mib * MIB


def test_mi300x_memory_is_the_rocm_total():
    assert load_gpu("mi300x").memory_bytes == 205_822_885_888


# ------------------------------------------------------------------ published totals
@pytest.mark.parametrize("name,params", [
    ("llama-3.2-1b", 1.236e9), ("llama-3.1-405b", 405.85e9), ("qwen3-235b-a22b", 235.09e9),
    ("deepseek-v3", 671.0e9), ("gpt-oss-20b", 20.9e9), ("gpt-oss-120b", 116.8e9),
    ("llama-4-maverick-17b-128e", 400.7e9), ("mixtral-8x7b", 46.7e9), ("mixtral-8x22b", 140.6e9),
])
def test_parameter_counts_match_the_published_sizes(name, params):
    assert load_model(name).num_params() == pytest.approx(params, rel=0.003)


def test_mistral_small_counts_all_but_the_norms_of_the_published_total():
    # 23,572,403,200 published; 40 layers x 2 norms x 5120 + the final norm are left out.
    assert load_model("mistral-small-24b").num_params() == 23_572_403_200 - (80 + 1) * 5120


def test_qwen3_next_counts_the_published_total_but_the_norms():
    # A public test of the Qwen3-Coder-Next config: 79,674,391,296 parameters.
    assert load_model("qwen3-next-80b-a3b").num_params() == pytest.approx(79_674_391_296, abs=4e5)


def test_gpt_oss_experts_are_mxfp4_and_the_rest_bf16():
    m = load_model("gpt-oss-120b")
    parts = m.weight_bytes_by_part()
    routed = m.num_moe_layers * m.num_experts * 3 * m.hidden_size * m.moe_intermediate_size
    assert parts["experts"] == pytest.approx(routed * 4.25 / 8)
    assert m.weight_bytes() / GIB == pytest.approx(60.8, abs=0.2)    # the 65 GB checkpoint


def test_deepseek_v3_fp8_weights_keep_the_embeddings_in_bf16():
    m = load_model("deepseek-v3")
    emb = 2 * m.vocab_size * m.hidden_size
    assert m.weight_bytes_by_part()["embeddings"] == emb * 2
    assert m.weight_bytes() / GIB == pytest.approx(626.7, abs=0.5)


# ------------------------------------------------------------------ vLLM's log for Qwen3-Next
# vLLM 0.10.2, Qwen3-Next-80B-A3B-Instruct, --tensor-parallel-size 2 on H200, prefix caching
# off (a public startup log): "Setting attention block size to 544 tokens", "Padding mamba
# page size by 1.49%", "Model loading took 74.2812 GiB", "Available KV cache memory: 44.59 GiB",
# "GPU KV cache size: 973,760 tokens", "Maximum concurrency for 262,144 tokens per request: 14.77x".
def test_qwen3_next_block_size_and_padding_match_vllm_s_log():
    m = load_model("qwen3-next-80b-a3b")
    specs, block_size = model_layer_specs(m, 16, tp=2)
    assert block_size == 544
    state = m.linear_state_bytes(tp=2)
    assert round(100 * (specs[0].page_size_bytes / state - 1), 2) == 1.49


def test_qwen3_next_weights_per_gpu_match_vllm_s_log():
    assert load_model("qwen3-next-80b-a3b").weight_bytes(2) / GIB == pytest.approx(74.2812,
                                                                                   rel=1e-3)


def test_qwen3_next_groups_and_concurrency_match_vllm_s_log():
    m = load_model("qwen3-next-80b-a3b")
    specs, _ = model_layer_specs(m, 16, tp=2, mamba_cache_mode="none")
    groups = get_kv_cache_groups(specs)
    assert [(g.kind, len(g.layers)) for g in groups.groups] == [(MAMBA, 12)] * 3 + [(FULL, 12)]
    for available in (44.585 * GIB, 44.595 * GIB):          # the log rounds to 0.01 GiB
        assert groups.num_blocks(int(available)) // 4 * 544 == 973_760   # 0.10.2's tokens
    blocks = groups.num_blocks(int(44.59 * GIB))
    assert round(groups.max_concurrency(blocks, 262_144, 16384), 2) == 14.77


# ------------------------------------------------------------------ hybrid layouts
def test_gemma3_27b_has_one_full_group_and_six_sliding_groups_of_ten():
    m = load_model("gemma-3-27b")
    groups = get_kv_cache_groups(model_layer_specs(m, 16)[0])
    kinds = [g.kind for g in groups.groups]
    assert kinds.count(FULL) == 1 and kinds.count(SLIDING) == 6
    full = next(g for g in groups.groups if g.kind == FULL)
    assert full.layers == tuple(range(5, 62, 6))
    assert groups.bytes_per_block == 10 * 16 * m.kv_bytes_per_token_layer()


def test_gemma3_capacity_with_the_hybrid_manager_on_and_off():
    m, gpu = load_model("gemma-3-27b"), load_gpu("h200")
    on = kv_capacity(m, gpu)
    off = kv_capacity(m, gpu, disable_hybrid_kv_cache_manager=True)
    assert on.available_kv_bytes == off.available_kv_bytes
    assert off.num_gpu_blocks == off.available_kv_bytes // (62 * 16 * 8192)
    assert on.num_gpu_blocks == on.available_kv_bytes // (10 * 16 * 8192)
    # At 32K tokens a request holds 2048 blocks of the full group, plus, with the manager
    # on, what vLLM reserves in each of the 6 sliding groups: the window and two batches
    # in flight (async scheduling): ceil((1023 + 2 x 8192) / 16) + 1 = 1089.
    assert on.blocks_per_group(32768) == [1089] * 6 + [2048]
    assert off.blocks_per_group(32768) == [2048]
    assert on.max_concurrent_requests(32768) == (on.num_gpu_blocks - 1) // (6 * 1089 + 2048)
    assert on.max_concurrent_requests(32768) > off.max_concurrent_requests(32768)


def test_gpt_oss_splits_into_a_sliding_and_a_full_group():
    groups = get_kv_cache_groups(model_layer_specs(load_model("gpt-oss-120b"), 16)[0])
    assert [(g.kind, len(g.layers)) for g in groups.groups] == [(SLIDING, 18), (FULL, 18)]


def test_llama4_runs_with_the_hybrid_manager_off_by_default_as_vllm_does():
    cap = kv_capacity(load_model("llama-4-scout-17b-16e"), load_gpu("h200"), tp=4)
    assert cap.disable_hybrid_kv_cache_manager and not cap.is_hybrid
    assert len(cap.kv_groups.groups[0].layers) == 48


def test_mistral_7b_keeps_its_block_count_and_caps_a_request_at_the_window():
    m, gpu = load_model("mistral-7b"), load_gpu("h100-sxm")
    cap = kv_capacity(m, gpu)
    assert cap.num_gpu_blocks == cap.available_kv_bytes // (16 * 131_072)
    assert cap.blocks_per_request(32768) == math.ceil((4095 + 2 * 8192) / 16) + 1


def test_hybrid_manager_off_is_refused_for_linear_attention_models():
    with pytest.raises(ValueError, match="disable_hybrid_kv_cache_manager"):
        kv_capacity(load_model("qwen3-next-80b-a3b"), load_gpu("h200"), tp=2,
                    disable_hybrid_kv_cache_manager=True)
