"""GPU and model specs: catalog contents, KV bytes, weights, FLOPs, loading."""

import json
from pathlib import Path

import pytest
import yaml

from kvsim.specs.catalog import list_gpus, list_models, load_gpu, load_model
from kvsim.specs.gpu import GIB, MIB, GPUSpec
from kvsim.specs.model import ModelSpec

HW_MODELS = Path(__file__).resolve().parents[2] / "shared" / "data" / "hw_models.yaml"

# Catalog name -> hw_models.yaml entry it is copied from.
SEEDED = {
    "qwen3-1.7b": "Qwen3-1.7B", "llama-3.1-8b": "Llama-3.1-8B", "llama-2-7b": "Llama-2-7B",
    "llama-2-13b": "Llama-2-13B", "llama-2-70b": "Llama-2-70B",
    "llama-3.1-70b": "Llama-3.1-70B", "mistral-7b": "Mistral-7B-v0.1", "yi-34b": "Yi-34B",
    "opt-13b": "OPT-13B", "opt-66b": "OPT-66B", "opt-175b": "OPT-175B",
}


def tiny(**overrides) -> ModelSpec:
    fields = dict(name="tiny", num_layers=2, hidden_size=64, num_attention_heads=8,
                  num_kv_heads=2, head_dim=8, intermediate_size=128, vocab_size=100,
                  gated_mlp=True, tie_word_embeddings=False, max_position_embeddings=512)
    fields.update(overrides)
    return ModelSpec(**fields)


# ------------------------------------------------------------------ catalog
def test_catalog_has_the_gpus_the_issue_names():
    for name in ["h100-sxm", "h200", "a100-80gb-sxm", "a100-80gb-pcie", "a100-40gb", "l4",
                 "a10g", "a40", "rtx-4060", "rtx-3070"]:
        assert name in list_gpus()


def test_catalog_has_the_models_the_issue_names():
    for name in ["qwen3-1.7b", "llama-3.1-8b", "llama-2-7b", "llama-2-13b", "llama-2-70b",
                 "llama-3.1-70b", "mistral-7b", "yi-34b", "opt-13b", "opt-66b", "opt-175b",
                 "deepseek-v2-lite"]:
        assert name in list_models()


def test_every_catalog_entry_names_its_source():
    assert all(load_gpu(g).source for g in list_gpus())
    assert all(load_model(m).source for m in list_models())


def test_names_are_read_case_and_underscore_insensitively():
    assert load_model("Llama_3.1_8B") == load_model("llama-3.1-8b")
    assert load_gpu("H100") == load_gpu("h100-sxm")


@pytest.mark.skipif(not HW_MODELS.exists(), reason="shared data not present")
@pytest.mark.parametrize("name", sorted(SEEDED))
def test_catalog_models_match_hw_models_yaml(name):
    ref = yaml.safe_load(HW_MODELS.read_text())["models"][SEEDED[name]]
    m = load_model(name)
    for field in ["num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim",
                  "intermediate_size", "vocab_size", "gated_mlp", "tie_word_embeddings"]:
        assert getattr(m, field) == ref[field], field
    assert m.kv_bytes_per_token() == ref["derived_kv_bytes_per_token_bf16"]
    assert m.num_params() == ref["derived_params_total_approx"]
    assert m.weight_bytes() == ref["derived_weight_bytes_bf16_approx"]


@pytest.mark.skipif(not HW_MODELS.exists(), reason="shared data not present")
def test_catalog_gpu_figures_match_hw_models_yaml():
    ref = yaml.safe_load(HW_MODELS.read_text())["gpus"]
    pairs = {"a100-40gb": "A100-SXM4-40GB", "a100-80gb-sxm": "A100-SXM4-80GB",
             "a100-80gb-pcie": "A100-PCIe-80GB", "h100-sxm": "H100-SXM5-80GB",
             "h200": "H200-SXM-141GB", "l4": "L4", "a10g": "A10G", "a40": "A40"}
    for name, key in pairs.items():
        g = load_gpu(name)
        assert g.hbm_bandwidth_gbps == ref[key]["hbm_bandwidth_GBps"], name
        assert g.bf16_tflops == ref[key]["bf16_dense_tflops"], name


def test_h100_memory_is_the_total_vllm_logs():
    # vLLM PR #10511: "total_gpu_memory 79.22GiB" on an H100 80GB.
    assert round(load_gpu("h100-sxm").memory_bytes / GIB, 2) == 79.22


def test_h200_memory_is_the_nvidia_smi_total():
    assert load_gpu("h200").memory_bytes == 143771 * MIB


# ------------------------------------------------------------------ KV bytes per token
def test_llama_3_1_8b_kv_bytes_per_token_bf16():
    assert load_model("llama-3.1-8b").kv_bytes_per_token() == 131_072


def test_qwen3_1_7b_kv_bytes_per_token_bf16():
    assert load_model("qwen3-1.7b").kv_bytes_per_token() == 114_688


def test_opt_13b_kv_is_800_kib_per_token_as_in_the_vllm_paper():
    assert load_model("opt-13b").kv_bytes_per_token() == 800 * 1024


def test_mla_kv_is_latent_plus_rope_per_layer():
    # DeepSeek-V2-Lite: 27 layers x (512 + 64) x 2 bytes.
    assert load_model("deepseek-v2-lite").kv_bytes_per_token() == 27 * 576 * 2


def test_mla_kv_is_replicated_not_split_across_tp_ranks():
    m = load_model("deepseek-v2-lite")
    assert m.kv_bytes_per_token(tp=4) == m.kv_bytes_per_token(tp=1)


def test_fp8_kv_cache_halves_bytes_per_token():
    m = load_model("llama-3.1-8b")
    assert m.kv_bytes_per_token("fp8") == 65_536
    assert m.kv_bytes_per_token("fp8_e5m2") == 65_536
    assert m.kv_bytes_per_token("int8") == 65_536


def test_auto_kv_dtype_follows_the_model_dtype():
    assert tiny(dtype_bytes=4).kv_dtype_bytes("auto") == 4
    assert tiny(dtype_bytes=4).kv_dtype_bytes("bf16") == 2


def test_unknown_kv_cache_dtype_names_the_allowed_values():
    with pytest.raises(ValueError, match="allowed: auto, fp16, bf16, fp8"):
        tiny().kv_bytes_per_token("fp4")


def test_tp_divides_kv_heads():
    m = load_model("llama-3.1-8b")  # 8 KV heads
    assert m.kv_heads_per_rank(2) == 4
    assert m.kv_bytes_per_token(tp=2) == 65_536


def test_tp_above_kv_heads_replicates_one_head_per_rank():
    # vLLM get_num_kv_heads: max(1, kv_heads // tp).
    m = load_model("llama-3.1-8b")
    assert m.kv_heads_per_rank(16) == 1
    assert m.kv_bytes_per_token(tp=16) == 2 * 32 * 1 * 128 * 2


def test_mqa_model_keeps_one_kv_head():
    m = tiny(num_kv_heads=1)
    assert m.kv_bytes_per_token() == 2 * 2 * 1 * 8 * 2


def test_kv_bytes_per_block_is_block_size_tokens():
    m = load_model("llama-3.1-8b")
    assert m.kv_bytes_per_block(16) == 16 * 131_072


def test_kv_bytes_per_block_rejects_zero_block_size():
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        tiny().kv_bytes_per_block(0)


def test_zero_tp_is_rejected():
    with pytest.raises(ValueError, match="tp"):
        tiny().kv_bytes_per_token(tp=0)


# ------------------------------------------------------------------ parameters and weights
def test_deepseek_v2_lite_has_15_7b_params_and_2_4b_active():
    m = load_model("deepseek-v2-lite")
    assert round(m.num_params() / 1e9, 1) == 15.7
    assert round(m.num_active_params() / 1e9, 1) in (2.4, 2.5)  # published: 2.4B active


def test_tied_embeddings_are_counted_once():
    assert tiny(tie_word_embeddings=False).num_params() - tiny(
        tie_word_embeddings=True).num_params() == 100 * 64


def test_weights_split_evenly_when_kv_heads_divide():
    m = load_model("llama-3.1-8b")
    assert m.weight_bytes(tp=2) == m.weight_bytes(tp=1) // 2


def test_weights_per_rank_replicate_kv_projection_when_tp_exceeds_kv_heads():
    m = tiny()  # 2 KV heads
    q_o = 2 * 64 * 8 * 8
    kv_one_head = 2 * 64 * 1 * 8
    mlp = 3 * 64 * 128
    emb = 2 * 100 * 64
    expected = (2 * (q_o / 4 + kv_one_head) + 2 * mlp / 4 + emb / 4) * 2
    assert m.weight_bytes(tp=4) == expected


def test_llama_3_8b_weights_match_vllm_log():
    # vLLM PR #10511: "model weights take 14.96GiB" (tp=1) and 7.48GiB (tp=2).
    m = load_model("llama-3-8b")
    assert round(m.weight_bytes(1) / GIB, 2) == 14.96
    assert round(m.weight_bytes(2) / GIB, 2) == 7.48


# ------------------------------------------------------------------ FLOPs
def test_flops_per_token_is_two_per_active_param_without_context():
    m = load_model("llama-3.1-8b")
    assert m.flops_per_token(0) == 2 * m.num_active_params()


def test_attention_flops_grow_linearly_with_context():
    m = load_model("llama-3.1-8b")
    per_ctx = 2 * 32 * 32 * (128 + 128)
    assert m.flops_per_token(1000) - m.flops_per_token(0) == 1000 * per_ctx


def test_moe_flops_count_only_routed_top_k_experts():
    m = load_model("deepseek-v2-lite")
    assert m.flops_per_token(0) < 2 * m.num_params() / 5


# ------------------------------------------------------------------ validation
def test_zero_layers_is_rejected_naming_the_field():
    with pytest.raises(ValueError, match="num_layers must be a positive integer, got 0"):
        tiny(num_layers=0)


def test_heads_not_multiple_of_kv_heads_is_rejected():
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        tiny(num_attention_heads=6, num_kv_heads=4)


def test_negative_gpu_memory_is_rejected():
    with pytest.raises(ValueError, match="memory_bytes must be a positive integer"):
        GPUSpec("g", -1, 1.0, 1.0, None, 1.0, 1.0, 1.0)


# ------------------------------------------------------------------ loading
def test_unknown_model_error_lists_the_known_names():
    with pytest.raises(ValueError, match=r"unknown model 'gpt-5'; known: qwen3-1.7b, llama-3.1-8b"):
        load_model("gpt-5")


def test_unknown_gpu_error_lists_the_known_names():
    with pytest.raises(ValueError, match=r"unknown GPU 'tpu'; known: a100-40gb"):
        load_gpu("tpu")


def test_inline_gpu_mapping_with_memory_in_gib():
    g = load_gpu({"name": "my-gpu", "memory_gib": 24, "hbm_bandwidth_gbps": 1000,
                  "bf16_tflops": 100, "interconnect_bandwidth_gbps": 32,
                  "interconnect_latency_us": 30, "pcie_bandwidth_gbps": 32})
    assert g.memory_bytes == 24 * GIB and g.fp8_tflops is None


def test_inline_gpu_with_unknown_field_names_allowed_ones():
    with pytest.raises(ValueError, match="unknown field\\(s\\) tflops; allowed:"):
        load_gpu({"memory_gib": 24, "tflops": 1})


def test_inline_model_mapping():
    m = load_model({"name": "tiny", "num_layers": 2, "hidden_size": 64,
                    "num_attention_heads": 8, "num_kv_heads": 2, "head_dim": 8,
                    "intermediate_size": 128, "vocab_size": 100, "gated_mlp": True,
                    "tie_word_embeddings": False, "max_position_embeddings": 512})
    assert m == tiny()


def test_inline_model_missing_field_is_a_value_error():
    with pytest.raises(ValueError, match="model tiny"):
        load_model({"name": "tiny", "num_layers": 2})


def test_hf_llama_config_json_from_disk(tmp_path):
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
           "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
           "max_position_embeddings": 131072, "hidden_act": "silu",
           "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    d = tmp_path / "Llama-3.1-8B"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    m = load_model(str(d / "config.json"))
    assert load_model(str(d)) == m  # the model folder works too
    assert m.name == "llama-3.1-8b"
    assert m.head_dim == 128 and m.gated_mlp
    assert m.kv_bytes_per_token() == 131_072
    assert m.num_params() == load_model("llama-3.1-8b").num_params()


def test_hf_opt_config_maps_ffn_dim_and_positions():
    cfg = {"model_type": "opt", "hidden_size": 5120, "ffn_dim": 20480, "num_hidden_layers": 40,
           "num_attention_heads": 40, "vocab_size": 50272, "max_position_embeddings": 2048,
           "do_layer_norm_before": True, "word_embed_proj_dim": 5120, "torch_dtype": "float16",
           "activation_function": "relu", "_name_or_path": "facebook/opt-13b"}
    m = load_model(cfg)
    assert m.name == "opt-13b" and not m.gated_mlp and m.tie_word_embeddings
    assert m.num_params() == load_model("opt-13b").num_params()


def test_hf_deepseek_v2_lite_config_is_mla_moe():
    cfg = {"model_type": "deepseek_v2", "hidden_size": 2048, "intermediate_size": 10944,
           "num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16,
           "vocab_size": 102400, "max_position_embeddings": 163840, "tie_word_embeddings": False,
           "q_lora_rank": None, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
           "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 64,
           "num_experts_per_tok": 6, "n_shared_experts": 2, "moe_intermediate_size": 1408,
           "first_k_dense_replace": 1, "hidden_act": "silu", "torch_dtype": "bfloat16"}
    m = load_model(cfg)
    ref = load_model("deepseek-v2-lite")
    assert m.is_mla and m.is_moe
    assert m.kv_bytes_per_token() == ref.kv_bytes_per_token()
    assert m.num_params() == ref.num_params()


def test_float32_checkpoint_is_served_in_16_bits():
    # vLLM dtype="auto" downcasts float32 checkpoints to 16-bit.
    cfg = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 8, "vocab_size": 100, "torch_dtype": "float32"}
    assert load_model(cfg).dtype_bytes == 2


def test_model_from_yaml_file(tmp_path):
    p = tmp_path / "tiny.yaml"
    p.write_text(yaml.safe_dump({k: v for k, v in tiny().__dict__.items()}))
    assert load_model(str(p)) == tiny()
