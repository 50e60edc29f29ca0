"""KV capacity as vLLM sizes it (kv-semantics D2-D3)."""

import math

import pytest

from kvsim.specs.capacity import (
    DEFAULT_CUDAGRAPH_BYTES,
    DEFAULT_NON_TORCH_BYTES,
    DEFAULT_NON_TORCH_TP_EXTRA_BYTES,
    default_max_num_seqs,
    estimate_activation_peak_bytes,
    kv_capacity,
)
from kvsim.specs.catalog import load_gpu, load_model
from kvsim.specs.gpu import GIB

LLAMA = load_model("llama-3.1-8b")
H100 = load_gpu("h100-sxm")
FIXED = dict(activation_bytes=GIB, non_torch_bytes=GIB // 4, cudagraph_bytes=GIB // 2)


def test_requested_memory_is_total_times_utilization():
    cap = kv_capacity(LLAMA, H100, gpu_memory_utilization=0.8, **FIXED)
    assert cap.requested_memory_bytes == int(H100.memory_bytes * 0.8)


def test_available_kv_is_requested_minus_every_term():
    cap = kv_capacity(LLAMA, H100, **FIXED)
    assert cap.available_kv_bytes == (int(H100.memory_bytes * 0.9) - LLAMA.weight_bytes()
                                      - GIB - GIB // 4 - GIB // 2)


def test_num_gpu_blocks_is_available_over_block_bytes():
    cap = kv_capacity(LLAMA, H100, **FIXED)
    assert cap.block_bytes == 16 * 131_072
    assert cap.num_gpu_blocks == cap.available_kv_bytes // cap.block_bytes


def test_token_capacity_leaves_out_the_null_block():
    cap = kv_capacity(LLAMA, H100, **FIXED)
    assert cap.token_capacity == (cap.num_gpu_blocks - 1) * 16
    assert cap.vllm_logged_tokens == cap.num_gpu_blocks * 16


def test_override_replaces_the_block_count():
    cap = kv_capacity(LLAMA, H100, num_gpu_blocks_override=11, **FIXED)
    assert cap.num_gpu_blocks == 11 and cap.token_capacity == 160
    assert cap.num_gpu_blocks_overridden


def test_max_concurrent_requests_rounds_each_request_up_to_whole_blocks():
    cap = kv_capacity(LLAMA, H100, num_gpu_blocks_override=101, **FIXED)
    assert cap.max_concurrent_requests(640) == 100 // 40
    assert cap.max_concurrent_requests(641) == 100 // 41


def test_fp8_kv_cache_doubles_the_blocks():
    auto = kv_capacity(LLAMA, H100, **FIXED)
    fp8 = kv_capacity(LLAMA, H100, kv_cache_dtype="fp8", **FIXED)
    assert fp8.num_gpu_blocks == auto.available_kv_bytes // (auto.block_bytes // 2)


def test_tp_splits_weights_and_kv_per_rank():
    cap = kv_capacity(LLAMA, H100, tp=2, **FIXED)
    assert cap.weight_bytes == LLAMA.weight_bytes(1) // 2
    assert cap.kv_bytes_per_token == 65_536


def test_default_overheads_are_the_documented_constants():
    cap = kv_capacity(LLAMA, H100)
    assert cap.non_torch_bytes == DEFAULT_NON_TORCH_BYTES
    assert cap.cudagraph_bytes == DEFAULT_CUDAGRAPH_BYTES
    assert kv_capacity(LLAMA, H100, tp=2).non_torch_bytes == (
        DEFAULT_NON_TORCH_BYTES + DEFAULT_NON_TORCH_TP_EXTRA_BYTES)


def test_default_max_num_seqs_follows_vllm_v1_per_gpu():
    # kv-semantics D4: 1024 on >= 70 GiB GPUs that are not A100, else 256.
    assert default_max_num_seqs(H100, 8192) == 1024
    assert default_max_num_seqs(load_gpu("a100-80gb-sxm"), 8192) == 256
    assert default_max_num_seqs(load_gpu("l4"), 8192) == 256
    assert default_max_num_seqs(H100, 512) == 512


def test_activation_peak_grows_linearly_with_batched_tokens():
    a = estimate_activation_peak_bytes(LLAMA, 4096, 256)
    b = estimate_activation_peak_bytes(LLAMA, 8192, 256)
    per_token = (3 * 4096 + 3 * 14336) * 2
    assert b - a == 4096 * per_token


def test_activation_peak_matches_vllm_profile_log_for_llama_3_8b():
    # vLLM PR #10511 (H100, Meta-Llama-3-8B, 8192 batched tokens, 256 seqs):
    # "PyTorch activation peak memory 1.26GiB".
    est = estimate_activation_peak_bytes(load_model("llama-3-8b"), 8192, 256)
    assert est / GIB == pytest.approx(1.26, rel=0.02)


def test_end_to_end_llama_3_8b_on_h100_matches_vllm_log():
    # vLLM PR #10511: total 79.22 GiB x 0.90 = 71.29 GiB; weights 14.96 GiB;
    # non_torch 1.79 GiB; activation 1.26 GiB -> available_kv_cache_memory 53.29 GiB.
    # We pass the logged non-torch figure (that vLLM version counted the CUDA
    # context in it) and no CUDA-graph term (that version did not subtract one).
    cap = kv_capacity(load_model("llama-3-8b"), H100, max_num_batched_tokens=8192,
                      max_num_seqs=256, non_torch_bytes=int(1.79 * GIB), cudagraph_bytes=0)
    assert cap.available_kv_bytes / GIB == pytest.approx(53.29, rel=0.005)
    logged_tokens = 53.29 * GIB / 131_072
    assert cap.vllm_logged_tokens == pytest.approx(logged_tokens, rel=0.005)


@pytest.mark.parametrize("model,tp,kv_gb,slots", [("opt-13b", 1, 12, 15_700),
                                                   ("opt-66b", 4, 21, 9_700)])
def test_vllm_paper_table_1_kv_memory(model, tp, kv_gb, slots):
    # vLLM paper (SOSP'23) Table 1 on A100-40GB: 13B -> 12 GB KV, 15.7K slots;
    # 66B on 4 GPUs -> 21 GB KV, 9.7K slots. 2023-era vLLM: 2048 batched
    # tokens, no CUDA-graph term, non-torch not measured.
    cap = kv_capacity(load_model(model), load_gpu("a100-40gb"), tp=tp,
                      max_num_batched_tokens=2048, max_num_seqs=256,
                      non_torch_bytes=0, cudagraph_bytes=0)
    assert cap.available_kv_bytes * tp / GIB == pytest.approx(kv_gb, rel=0.05)
    assert cap.token_capacity == pytest.approx(slots, rel=0.06)  # ours: -2.7% and -5.8%


def test_mla_capacity_uses_latent_bytes():
    m = load_model("deepseek-v2-lite")
    cap = kv_capacity(m, H100, block_size=64, **FIXED)
    assert cap.block_bytes == 64 * 27 * 576 * 2
    assert cap.num_gpu_blocks == cap.available_kv_bytes // cap.block_bytes


def test_model_too_big_names_the_sizes_and_suggests_tp():
    with pytest.raises(ValueError) as err:
        kv_capacity(load_model("llama-3.1-70b"), H100)
    msg = str(err.value)
    assert "llama-3.1-70b needs 131.4 GiB of weights per GPU at tp=1" in msg
    assert "h100-sxm has 71.3 GiB at gpu_memory_utilization=0.9" in msg
    assert "try --tp 2 or more" in msg


def test_model_that_never_fits_says_so():
    # 7 GiB of activations alone fill an 8 GiB card at 0.9.
    with pytest.raises(ValueError, match="does not fit at any tp up to 64"):
        kv_capacity(load_model("qwen3-1.7b"), load_gpu("rtx-4060"), activation_bytes=7 * GIB)


def test_huge_model_on_a_small_gpu_suggests_the_tp_that_fits():
    # 24 is the smallest TP that divides OPT-175B's 96 heads and leaves room on an L4.
    with pytest.raises(ValueError, match="try --tp 24 or more"):
        kv_capacity(load_model("opt-175b"), load_gpu("l4"), **FIXED)


def test_the_hint_never_suggests_a_tp_vllm_refuses():
    # tp=64 would fit OPT-175B on 8 GB cards, but does not divide its 96 heads.
    with pytest.raises(ValueError, match="does not fit at any tp up to 64"):
        kv_capacity(load_model("opt-175b"), load_gpu("rtx-4060"), **FIXED)


@pytest.mark.parametrize("kwargs,match", [
    (dict(block_size=0), "block_size must be a positive integer"),
    (dict(tp=-1), "tp must be a positive integer"),
    (dict(gpu_memory_utilization=1.5), r"gpu_memory_utilization must be in \(0, 1\]"),
    (dict(gpu_memory_utilization=0), r"gpu_memory_utilization must be in \(0, 1\]"),
    (dict(max_num_batched_tokens=0), "max_num_batched_tokens must be a positive integer"),
    (dict(num_gpu_blocks_override=1), "num_gpu_blocks_override must be an integer >= 2"),
    (dict(activation_bytes=-5), "activation_bytes must be an integer >= 0"),
])
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        kv_capacity(LLAMA, H100, **kwargs)


def test_bad_seq_len_is_named():
    cap = kv_capacity(LLAMA, H100, **FIXED)
    with pytest.raises(ValueError, match="seq_len must be a positive integer"):
        cap.max_concurrent_requests(0)


def test_capacity_for_every_catalog_model_that_fits_an_h200():
    for name in ["qwen3-1.7b", "llama-3.1-8b", "llama-2-7b", "llama-2-13b", "mistral-7b",
                 "yi-34b", "opt-13b", "opt-66b", "deepseek-v2-lite"]:
        cap = kv_capacity(load_model(name), load_gpu("h200"))
        assert cap.num_gpu_blocks >= 2
        assert math.isclose(cap.token_capacity / 16 + 1, cap.num_gpu_blocks)
