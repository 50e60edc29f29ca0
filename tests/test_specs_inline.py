"""Inline GPUs and models: base: + overrides, one-line errors, Hugging Face configs of 2026 models."""

import pytest

from kvsim.specs import load_gpu, load_model
from kvsim.specs.gpu import GIB


# ------------------------------------------------------------------ base: overrides
def test_inline_gpu_starts_from_a_catalog_entry():
    g = load_gpu({"base": "a100-80gb-pcie", "interconnect_bandwidth_gbps": 300})
    ref = load_gpu("a100-80gb-pcie")
    assert g.interconnect_bandwidth_gbps == 300
    assert g.name == ref.name and g.memory_bytes == ref.memory_bytes
    assert "interconnect_bandwidth_gbps changed" in g.source


def test_inline_gpu_override_of_memory_replaces_the_base_memory():
    g = load_gpu({"base": "h100-sxm", "memory_gib": 64, "name": "h100-64"})
    assert g.memory_bytes == 64 * GIB and g.name == "h100-64"


def test_inline_model_starts_from_a_catalog_entry():
    m = load_model({"base": "llama-3.1-8b", "max_position_embeddings": 8192})
    assert m.max_position_embeddings == 8192
    assert m.kv_bytes_per_token() == load_model("llama-3.1-8b").kv_bytes_per_token()


def test_a_base_not_in_the_catalog_is_named():
    with pytest.raises(ValueError, match=r"gpu.base: 'a100-120gb' is not in the catalog; known:"):
        load_gpu({"base": "a100-120gb"})
    with pytest.raises(ValueError, match=r"model.base: 'llama-9' is not in the catalog; known:"):
        load_model({"base": "llama-9"})


def test_an_override_of_an_unknown_field_is_named():
    with pytest.raises(ValueError, match=r"gpu a100-80gb-pcie: unknown field\(s\) nvlink_gbps"):
        load_gpu({"base": "a100-80gb-pcie", "nvlink_gbps": 300})
    with pytest.raises(ValueError, match=r"model llama-3.1-8b: unknown field\(s\) layers; allowed:"):
        load_model({"base": "llama-3.1-8b", "layers": 40})


def test_an_inline_model_with_missing_fields_names_them_in_one_line():
    with pytest.raises(ValueError) as err:
        load_model({"name": "mine", "num_layers": 2, "hidden_size": 64})
    msg = str(err.value)
    assert msg.startswith("model mine: missing field(s) num_attention_heads, num_kv_heads")
    assert "base: NAME" in msg and "\n" not in msg


def test_an_inline_gpu_with_missing_fields_suggests_a_base():
    with pytest.raises(ValueError, match=r"missing field\(s\) .*base: NAME"):
        load_gpu({"name": "g", "memory_gib": 8})


def test_a_bad_layer_type_is_named():
    with pytest.raises(ValueError, match="layer_pattern has 'local'; allowed: full_attention"):
        load_model({"base": "gemma-3-1b", "layer_pattern": ["local", "full_attention"]})


def test_a_sliding_layer_without_a_window_is_refused():
    with pytest.raises(ValueError, match="sliding_attention layers but sliding_window is not set"):
        load_model({"base": "llama-3.1-8b", "layer_pattern": ["sliding_attention"]})


# ------------------------------------------------------------------ Hugging Face configs
GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880,
    "intermediate_size": 2880, "num_hidden_layers": 24, "num_attention_heads": 64,
    "num_key_value_heads": 8, "head_dim": 64, "num_local_experts": 32, "num_experts_per_tok": 4,
    "experts_per_token": 4, "vocab_size": 201088, "max_position_embeddings": 131072,
    "sliding_window": 128, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "quantization_config": {"quant_method": "mxfp4"}, "_name_or_path": "openai/gpt-oss-20b"}
GEMMA3_27B = {
    "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
    "text_config": {"head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504,
                    "model_type": "gemma3_text", "num_attention_heads": 32,
                    "num_hidden_layers": 62, "num_key_value_heads": 16,
                    "sliding_window": 1024, "sliding_window_pattern": 6, "vocab_size": 262208,
                    "max_position_embeddings": 131072, "hidden_activation": "gelu_pytorch_tanh"},
    "torch_dtype": "bfloat16", "_name_or_path": "google/gemma-3-27b-it"}
LLAMA4_SCOUT = {
    "model_type": "llama4", "_name_or_path": "meta-llama/Llama-4-Scout-17B-16E-Instruct",
    "text_config": {"attention_chunk_size": 8192, "head_dim": 128, "hidden_act": "silu",
                    "hidden_size": 5120, "interleave_moe_layer_step": 1, "intermediate_size": 8192,
                    "intermediate_size_mlp": 16384, "max_position_embeddings": 10485760,
                    "model_type": "llama4_text", "num_attention_heads": 40,
                    "num_experts_per_tok": 1, "num_hidden_layers": 48, "num_key_value_heads": 8,
                    "num_local_experts": 16, "vocab_size": 202048, "torch_dtype": "bfloat16"}}
QWEN3_NEXT = {
    "model_type": "qwen3_next", "_name_or_path": "Qwen/Qwen3-Next-80B-A3B-Instruct",
    "hidden_size": 2048, "num_hidden_layers": 48, "vocab_size": 151936, "head_dim": 256,
    "num_attention_heads": 16, "num_key_value_heads": 2, "num_experts": 512,
    "num_experts_per_tok": 10, "moe_intermediate_size": 512, "intermediate_size": 5120,
    "shared_expert_intermediate_size": 512, "linear_num_key_heads": 16,
    "linear_key_head_dim": 128, "linear_num_value_heads": 32, "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4, "full_attention_interval": 4, "tie_word_embeddings": False,
    "max_position_embeddings": 262144, "hidden_act": "silu", "torch_dtype": "bfloat16"}
QWEN3_8B = {"model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288,
            "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "vocab_size": 151936, "sliding_window": None,
            "use_sliding_window": False, "max_position_embeddings": 40960,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


@pytest.mark.parametrize("config,name", [(GPT_OSS_20B, "gpt-oss-20b"), (GEMMA3_27B, "gemma-3-27b"),
                                         (LLAMA4_SCOUT, "llama-4-scout-17b-16e"),
                                         (QWEN3_NEXT, "qwen3-next-80b-a3b"), (QWEN3_8B, "qwen3-8b")])
def test_hf_configs_read_as_the_catalog_entries(config, name):
    got, ref = load_model(config), load_model(name)
    for field in ("num_layers", "num_kv_heads", "head_dim", "layer_pattern", "sliding_window",
                  "attention_chunk_size", "linear_num_value_heads", "num_experts",
                  "num_shared_experts", "moe_layer_step", "expert_dtype_bytes",
                  "tie_word_embeddings", "attn_output_gate"):
        assert getattr(got, field) == getattr(ref, field), field
    assert got.num_params() == ref.num_params()
    assert got.kv_bytes_per_token() == ref.kv_bytes_per_token()


def test_gemma3_pattern_is_five_sliding_then_one_full_cut_at_62_layers():
    types = load_model(GEMMA3_27B).layer_types
    assert types[:6] == ("sliding_attention",) * 5 + ("full_attention",)
    assert types[-2:] == ("sliding_attention", "sliding_attention")
    assert types.count("full_attention") == 10


def test_a_window_with_use_sliding_window_false_is_full_attention():
    assert not load_model({**QWEN3_8B, "sliding_window": 4096}).is_hybrid


def test_a_window_without_layer_types_slides_every_layer():
    # vLLM EngineArgs.create_engine_config: Mistral-7B-v0.1 (no layer_types) slides everywhere.
    cfg = {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
           "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
           "vocab_size": 32000, "sliding_window": 4096, "max_position_embeddings": 32768}
    m = load_model(cfg)
    assert m.layer_pattern == ("sliding_attention",) and m.sliding_window == 4096


def test_an_unsupported_quantization_is_named():
    with pytest.raises(ValueError, match="quantization 'gptq' is not supported; allowed: fp8, mxfp4"):
        load_model({**QWEN3_8B, "quantization_config": {"quant_method": "gptq"}})


def test_fp8_checkpoint_quantizes_the_linear_weights_only():
    m = load_model({**QWEN3_8B, "quantization_config": {"quant_method": "fp8"}})
    assert m.weight_dtype_bytes == 1 and m.dtype_bytes == 2
    assert m.kv_dtype_bytes("auto") == 2          # vLLM's auto KV dtype is the model dtype
