"""Read a Hugging Face ``config.json`` into a :class:`ModelSpec`.

The names are those of the transformers configs vLLM reads: Llama/Qwen/Mistral
(``num_hidden_layers``, ``num_key_value_heads``, ``head_dim``), OPT
(``ffn_dim``), DeepSeek-V2/V3 MLA and MoE (``kv_lora_rank``,
``n_routed_experts``, ``first_k_dense_replace``), Mixtral/Qwen-MoE/gpt-oss
(``num_local_experts``, ``num_experts``), Llama 4 (``intermediate_size_mlp``,
``interleave_moe_layer_step``, ``attention_chunk_size``, ``no_rope_layers``),
Gemma 3 (``sliding_window_pattern``), Qwen3-Next (``full_attention_interval``,
``linear_*``) and any config with ``layer_types``. A nested ``text_config``
(multimodal wrappers) is used when present.
"""

from __future__ import annotations

from typing import Any, Mapping

from kvsim.specs.model import LAYER_TYPES, ModelSpec

# torch_dtype -> bytes. vLLM's dtype="auto" serves float32 checkpoints in
# 16 bits (it downcasts them), so float32 maps to 2 as well.
_HF_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "half": 2, "float32": 2, "float": 2,
                   "float8_e4m3fn": 1}
# quantization_config.quant_method -> bytes per quantized weight. MXFP4 (gpt-oss):
# 4-bit values plus one 8-bit scale per 32 (OCP MX spec) = 4.25 bits.
_QUANT_WEIGHT_BYTES = {"fp8": 1.0, "mxfp4": 4.25 / 8}
_GATED_MODEL_TYPES = ("llama", "llama4", "llama4_text", "mistral", "mistral3", "mixtral",
                      "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "qwen3_next", "deepseek_v2",
                      "deepseek_v3", "gemma", "gemma2", "gemma3", "gemma3_text", "gpt_oss")


def model_from_hf_config(config: Mapping[str, Any], default_name: str = "custom-model") -> ModelSpec:
    """A :class:`ModelSpec` from a Hugging Face ``config.json`` mapping."""
    cfg = dict(config)
    if isinstance(cfg.get("text_config"), Mapping):
        cfg = {**cfg, **cfg["text_config"]}
    name = str(cfg.get("name") or cfg.get("_name_or_path") or default_name)
    name = name.rstrip("/").split("/")[-1].lower() or default_name

    def need(*keys: str):
        for key in keys:
            if cfg.get(key) is not None:
                return cfg[key]
        raise ValueError(f"config.json for {name}: missing {' or '.join(keys)}")

    hidden = need("hidden_size", "d_model", "n_embd")
    heads = need("num_attention_heads", "n_head")
    layers = need("num_hidden_layers", "n_layer")
    kv_heads = cfg.get("num_key_value_heads") or heads
    model_type = str(cfg.get("model_type", ""))
    is_opt = model_type == "opt" or "ffn_dim" in cfg
    is_llama4 = model_type.startswith("llama4")
    if is_opt:
        intermediate = need("ffn_dim")
        gated = False
        proj = cfg.get("word_embed_proj_dim", hidden)
        if proj != hidden:
            raise ValueError(f"config.json for {name}: word_embed_proj_dim ({proj}) != "
                             f"hidden_size ({hidden}) is not supported")
        tie_default = True
        # OPTLearnedPositionalEmbedding keeps 2 extra rows (its offset).
        positions = (cfg.get("max_position_embeddings") or 2048) + 2
    else:
        # Llama 4: intermediate_size is the expert width, intermediate_size_mlp the dense one.
        intermediate = (need("intermediate_size_mlp") if is_llama4
                        else need("intermediate_size", "n_inner", "ffn_dim"))
        act = str(cfg.get("hidden_act", cfg.get("activation_function", "silu")))
        # Llama-family configs use a gated (SwiGLU/GeGLU) MLP; GPT-style gelu/relu do not.
        gated = bool(cfg.get("gated_mlp", act in ("silu", "swiglu")
                             or model_type in _GATED_MODEL_TYPES))
        tie_default = model_type.startswith("gemma")  # transformers' Gemma configs tie by default
        positions = 0
    tie = bool(cfg.get("tie_word_embeddings", tie_default))

    kv_lora = cfg.get("kv_lora_rank")
    if kv_lora is not None:
        nope = need("qk_nope_head_dim")
        rope = need("qk_rope_head_dim")
        head_dim = nope + rope
        mla = dict(kv_lora_rank=kv_lora, qk_rope_head_dim=rope, qk_nope_head_dim=nope,
                   v_head_dim=need("v_head_dim"), q_lora_rank=cfg.get("q_lora_rank"))
    else:
        head_dim = cfg.get("head_dim") or hidden // heads
        mla = {}

    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").replace("torch.", "")
    if dtype not in _HF_DTYPE_BYTES:
        raise ValueError(f"config.json for {name}: torch_dtype {dtype!r} is not supported; "
                         f"allowed: {', '.join(_HF_DTYPE_BYTES)}")

    return ModelSpec(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate,
        vocab_size=need("vocab_size"),
        gated_mlp=gated,
        tie_word_embeddings=tie,
        max_position_embeddings=cfg.get("max_position_embeddings") or cfg.get("n_positions") or 2048,
        dtype_bytes=_HF_DTYPE_BYTES[dtype],
        learned_position_embeddings=positions,
        source="Hugging Face config.json",
        **mla,
        **_moe_fields(cfg, intermediate, is_llama4, need),
        **_layer_fields(cfg, layers, name),
        **_quant_fields(cfg, name),
        **({"attn_output_gate": True} if cfg.get("attn_output_gate") or model_type == "qwen3_next"
           else {}),
    )


def _moe_fields(cfg: dict, intermediate: int, is_llama4: bool, need) -> dict:
    experts = (cfg.get("n_routed_experts") or cfg.get("num_local_experts")
               or cfg.get("num_experts") or 0)
    if not experts:
        return {}
    if is_llama4:
        # vLLM Llama4MoE: routed experts and one shared expert of width intermediate_size.
        moe_width, shared = need("intermediate_size"), 1
    else:
        moe_width = cfg.get("moe_intermediate_size") or intermediate
        shared = cfg.get("n_shared_experts") or 0
        if not shared and cfg.get("shared_expert_intermediate_size"):
            # Qwen-MoE states the shared expert by its width; count it in expert units.
            shared = max(1, round(cfg["shared_expert_intermediate_size"] / moe_width))
    return dict(num_experts=experts,
                num_experts_per_tok=need("num_experts_per_tok", "experts_per_token"),
                moe_intermediate_size=moe_width, num_shared_experts=shared,
                first_k_dense_layers=cfg.get("first_k_dense_replace") or 0,
                moe_layer_step=(cfg.get("interleave_moe_layer_step")
                                or cfg.get("decoder_sparse_step") or 1))


def _layer_fields(cfg: dict, layers: int, name: str) -> dict:
    """``layer_pattern`` and its window/chunk/state sizes, by the rule vLLM applies."""
    out: dict[str, Any] = {}
    types = cfg.get("layer_types")
    if types is None and cfg.get("sliding_window_pattern"):
        # transformers Gemma3TextConfig: sliding unless (i + 1) % pattern == 0.
        p = int(cfg["sliding_window_pattern"])
        types = ["sliding_attention" if (i + 1) % p else "full_attention" for i in range(layers)]
    if types is None and cfg.get("full_attention_interval"):
        # transformers Qwen3NextConfig: linear unless (i + 1) % interval == 0.
        p = int(cfg["full_attention_interval"])
        types = ["linear_attention" if (i + 1) % p else "full_attention" for i in range(layers)]
    if types is None and cfg.get("attention_chunk_size"):
        # Llama 4: layers with RoPE (no_rope_layers[i] == 1) attend within their chunk,
        # the NoPE ones globally (vLLM llama4.py: use_chunked_local_attn).
        nope = cfg.get("no_rope_layers") or [
            int((i + 1) % (cfg.get("no_rope_layer_interval") or 4) != 0) for i in range(layers)]
        types = ["chunked_attention" if nope[i] else "full_attention" for i in range(layers)]
    if types is None and cfg.get("sliding_window") and cfg.get("use_sliding_window", True):
        # vLLM EngineArgs.create_engine_config: no layer_types and a window -> all layers slide
        # (Mistral-7B-v0.1). Qwen2/3 configs carry a window with use_sliding_window false.
        types = ["sliding_attention"] * layers
    if types is None:
        return out
    types = [str(t) for t in types]
    bad = sorted(set(types) - set(LAYER_TYPES))
    if bad:
        raise ValueError(f"config.json for {name}: layer_types has {bad[0]!r}; kvsim knows "
                         f"{', '.join(LAYER_TYPES)}")
    if len(types) != layers:
        raise ValueError(f"config.json for {name}: layer_types has {len(types)} entries for "
                         f"{layers} layers")
    if set(types) == {"full_attention"}:
        return out
    out["layer_pattern"] = _shortest_period(types)
    if "sliding_attention" in types:
        out["sliding_window"] = int(cfg["sliding_window"])
    if "chunked_attention" in types:
        out["attention_chunk_size"] = int(cfg["attention_chunk_size"])
    if "linear_attention" in types:
        for key in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                    "linear_value_head_dim", "linear_conv_kernel_dim"):
            if cfg.get(key) is None:
                raise ValueError(f"config.json for {name}: linear_attention layers need {key}")
            out[key] = int(cfg[key])
    return out


def _shortest_period(types: list[str]) -> tuple[str, ...]:
    """The shortest pattern that, repeated and cut, gives ``types`` (Gemma 3: 6 of 62)."""
    for p in range(1, len(types) + 1):
        if all(types[i] == types[i % p] for i in range(len(types))):
            return tuple(types[:p])
    return tuple(types)  # pragma: no cover - p = len(types) always matches


def _quant_fields(cfg: dict, name: str) -> dict:
    quant = cfg.get("quantization_config")
    if not isinstance(quant, Mapping):
        return {}
    method = str(quant.get("quant_method", ""))
    if method not in _QUANT_WEIGHT_BYTES:
        raise ValueError(f"config.json for {name}: quantization {method!r} is not supported; "
                         f"allowed: {', '.join(_QUANT_WEIGHT_BYTES)} (or remove "
                         f"quantization_config to size a 16-bit checkpoint)")
    if method == "mxfp4":
        # gpt-oss ships only the MoE experts in MXFP4; attention and the rest stay bf16.
        return {"expert_dtype_bytes": _QUANT_WEIGHT_BYTES[method]}
    return {"weight_dtype_bytes": _QUANT_WEIGHT_BYTES[method]}
