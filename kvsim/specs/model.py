"""What kvsim knows about a model: the shapes that size its KV cache and weights.

A :class:`ModelSpec` is a decoder-only transformer described by its Hugging
Face config numbers. It answers three questions, all per tensor-parallel rank:

* how many bytes of KV cache a token takes (``kv_bytes_per_token``),
* how many bytes of weights a GPU holds (``weight_bytes``),
* how many FLOPs one token's forward pass costs (``flops_per_token``).

KV layout, as vLLM sizes it (kv-semantics D3)::

    MHA/GQA/MQA: 2 (K and V) x layers x kv_heads_per_rank x head_dim x kv_dtype_bytes
    MLA:         layers x (kv_lora_rank + qk_rope_head_dim) x kv_dtype_bytes
                 (one latent vector per token, no separate V, same on every rank)

Models that mix layer types (Gemma 3, gpt-oss, Llama 4, Qwen3-Next) say so
with ``layer_pattern``, Hugging Face's ``layer_types`` names repeated over the
layers: ``full_attention``, ``sliding_attention`` (``sliding_window`` keys),
``chunked_attention`` (``attention_chunk_size``-token chunks, Llama 4) and
``linear_attention`` (Gated DeltaNet: a constant-size state, no KV). Only the
attention layers hold KV; :mod:`kvsim.specs.kv_groups` splits them into
vLLM's KV-cache groups.

Parameter counts ignore biases and norm weights (well under 0.1% of a 1B+
model), as ``../shared/data/hw_models.yaml`` does for its ``derived_*`` figures.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.specs.model_params import ModelParams, _check_tp

# kv_cache_dtype (vLLM's --kv-cache-dtype names) -> bytes per element; "auto"
# means the model's own dtype. vLLM's fp8 variants all store one byte.
KV_CACHE_DTYPE_BYTES: dict[str, int | None] = {
    "auto": None,
    "fp16": 2,
    "bf16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "int8": 1,
}

# Hugging Face layer_types values (transformers configs of Gemma 3, gpt-oss,
# Qwen3-Next; Llama 4's chunked layers are its no_rope_layers == 1 ones).
LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention", "linear_attention")
ATTENTION_LAYER_TYPES = LAYER_TYPES[:3]


@dataclass(frozen=True)
class ModelSpec(ModelParams):
    """A decoder-only transformer, by its config numbers (HF names in brackets).

    ``num_layers`` [num_hidden_layers], ``num_kv_heads`` [num_key_value_heads],
    ``intermediate_size`` is the dense MLP width (for MoE models the width of
    the dense layers), ``dtype_bytes`` the model's compute dtype, which is also
    the default KV element size (2 for bf16/fp16).

    MLA (DeepSeek-V2/V3) is on when ``kv_lora_rank`` is set; then
    ``q_lora_rank`` (None = a full q projection), ``qk_nope_head_dim``,
    ``qk_rope_head_dim`` and ``v_head_dim`` describe the attention, and
    ``head_dim`` is the q/k head size ``qk_nope_head_dim + qk_rope_head_dim``.

    MoE is on when ``num_experts`` > 0: layer ``i`` (0-based) is an MoE layer
    when ``i >= first_k_dense_layers`` and ``(i + 1) % moe_layer_step == 0``
    (HF ``first_k_dense_replace``, ``interleave_moe_layer_step`` /
    ``decoder_sparse_step``); it has ``num_experts`` routed experts of width
    ``moe_intermediate_size`` (``num_experts_per_tok`` active per token) plus
    ``num_shared_experts`` always-active experts of the same width.

    ``weight_dtype_bytes`` is the bytes per weight of the linear layers when the
    checkpoint is quantized (FP8 checkpoints: 1; None = ``dtype_bytes``, and then
    the embedding and LM head too); ``expert_dtype_bytes`` that of the routed
    experts (gpt-oss MXFP4: 4 bits + one 8-bit scale per 32 = 0.53125).

    ``learned_position_embeddings`` is the row count of a learned positional
    table (OPT: max_position_embeddings + 2); 0 for RoPE models.
    ``attn_output_gate`` (Qwen3-Next) doubles q_proj: a sigmoid gate per query
    channel multiplies the attention output.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    gated_mlp: bool
    tie_word_embeddings: bool
    max_position_embeddings: int
    dtype_bytes: int = 2
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    q_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    v_head_dim: int | None = None
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    first_k_dense_layers: int = 0
    moe_layer_step: int = 1
    learned_position_embeddings: int = 0
    layer_pattern: tuple[str, ...] | None = None
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    attn_output_gate: bool = False
    weight_dtype_bytes: float | None = None
    expert_dtype_bytes: float | None = None
    source: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"model.name must be a non-empty string, got {self.name!r}")
        for field in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads",
                      "head_dim", "intermediate_size", "vocab_size", "max_position_embeddings",
                      "moe_layer_step"):
            self._check_int(field, getattr(self, field), minimum=1)
        if self.dtype_bytes not in (1, 2, 4):
            raise ValueError(f"model {self.name}: dtype_bytes must be 1, 2 or 4, "
                             f"got {self.dtype_bytes!r}")
        for field in ("weight_dtype_bytes", "expert_dtype_bytes"):
            value = getattr(self, field)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not 0 < value <= 4):
                raise ValueError(f"model {self.name}: {field} must be a number in (0, 4], "
                                 f"got {value!r}")
        for field in ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                      "num_shared_experts", "first_k_dense_layers",
                      "learned_position_embeddings", "linear_num_key_heads",
                      "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                      "linear_conv_kernel_dim"):
            self._check_int(field, getattr(self, field), minimum=0)
        if self.is_mla:
            for field in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
                self._check_int(field, getattr(self, field), minimum=1)
            if self.q_lora_rank is not None:
                self._check_int("q_lora_rank", self.q_lora_rank, minimum=1)
        elif self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"model {self.name}: num_attention_heads ({self.num_attention_heads}) must be "
                f"a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.is_moe:
            if not 1 <= self.num_experts_per_tok <= self.num_experts:
                raise ValueError(
                    f"model {self.name}: num_experts_per_tok must be between 1 and "
                    f"num_experts ({self.num_experts}), got {self.num_experts_per_tok}")
            self._check_int("moe_intermediate_size", self.moe_intermediate_size, minimum=1)
            if self.first_k_dense_layers > self.num_layers:
                raise ValueError(f"model {self.name}: first_k_dense_layers "
                                 f"({self.first_k_dense_layers}) exceeds num_layers "
                                 f"({self.num_layers})")
        self._check_layer_pattern()

    def _check_int(self, field: str, value, minimum: int) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            what = "a positive integer" if minimum == 1 else "an integer >= 0"
            raise ValueError(f"model {self.name}: {field} must be {what}, got {value!r}")

    def _check_layer_pattern(self) -> None:
        pattern = self.layer_pattern
        if pattern is None:
            return
        if isinstance(pattern, str) or not pattern:
            raise ValueError(f"model {self.name}: layer_pattern must be a non-empty list of "
                             f"layer types, got {pattern!r}")
        if not isinstance(pattern, tuple):
            object.__setattr__(self, "layer_pattern", tuple(pattern))  # YAML gives a list
        bad = [t for t in self.layer_pattern if t not in LAYER_TYPES]
        if bad:
            raise ValueError(f"model {self.name}: layer_pattern has {bad[0]!r}; allowed: "
                             f"{', '.join(LAYER_TYPES)}")
        needs = {"sliding_attention": "sliding_window", "chunked_attention": "attention_chunk_size",
                 "linear_attention": "linear_num_value_heads"}
        for kind, field in needs.items():
            if kind in self.layer_pattern and not getattr(self, field):
                raise ValueError(f"model {self.name}: layer_pattern has {kind} layers but "
                                 f"{field} is not set")
        if self.is_mla and set(self.layer_pattern) - {"full_attention"}:
            raise ValueError(f"model {self.name}: MLA with other layer types is not supported")
        if not any(t in ATTENTION_LAYER_TYPES for t in self.layer_pattern):
            raise ValueError(f"model {self.name}: layer_pattern has no attention layer")

    # ------------------------------------------------------------------ kinds
    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def layer_types(self) -> tuple[str, ...]:
        """Each layer's type: ``layer_pattern`` repeated and cut to ``num_layers``.

        Gemma 3 (``sliding_window_pattern`` 6, 62 layers) is five sliding
        layers then a full one, ten times, then two sliding: HF's own rule
        ``"sliding" if (i + 1) % pattern else "full"``.
        """
        pattern = self.layer_pattern or ("full_attention",)
        return tuple(pattern[i % len(pattern)] for i in range(self.num_layers))

    def num_layers_of(self, *kinds: str) -> int:
        return sum(1 for t in self.layer_types if t in kinds)

    @property
    def num_kv_layers(self) -> int:
        """Layers that hold KV (every attention layer; not linear-attention ones)."""
        return self.num_layers_of(*ATTENTION_LAYER_TYPES)

    @property
    def is_hybrid(self) -> bool:
        """Whether any layer is not full attention (vLLM: more than one KV-cache spec)."""
        return any(t != "full_attention" for t in self.layer_types)

    @property
    def has_linear_attention(self) -> bool:
        return "linear_attention" in self.layer_types

    @property
    def linear_conv_channels(self) -> int:
        """Gated DeltaNet conv1d channels: q and k of every key head, v of every value head."""
        return (2 * self.linear_num_key_heads * self.linear_key_head_dim
                + self.linear_num_value_heads * self.linear_value_head_dim)

    def is_moe_layer(self, layer: int) -> bool:
        return (self.is_moe and layer >= self.first_k_dense_layers
                and (layer + 1) % self.moe_layer_step == 0)

    @property
    def num_moe_layers(self) -> int:
        return sum(1 for i in range(self.num_layers) if self.is_moe_layer(i))

    # ------------------------------------------------------------------ KV cache
    def kv_dtype_bytes(self, kv_cache_dtype: str = "auto") -> int:
        """Bytes per KV element for vLLM's ``--kv-cache-dtype`` value."""
        if kv_cache_dtype not in KV_CACHE_DTYPE_BYTES:
            raise ValueError(f"kv_cache_dtype {kv_cache_dtype!r} is not supported; "
                             f"allowed: {', '.join(KV_CACHE_DTYPE_BYTES)}")
        size = KV_CACHE_DTYPE_BYTES[kv_cache_dtype]
        return self.dtype_bytes if size is None else size

    def kv_heads_per_rank(self, tp: int = 1) -> int:
        """KV heads each tensor-parallel rank stores.

        vLLM ``ModelConfig.get_num_kv_heads``: ``max(1, total_kv_heads // tp)``,
        i.e. heads are split across ranks and replicated when tp > kv heads.
        MLA keeps one latent "head" on every rank (the latent is replicated).
        """
        _check_tp(tp)
        if self.is_mla:
            return 1
        return max(1, self.num_kv_heads // tp)

    def kv_bytes_per_token_layer(self, kv_cache_dtype: str = "auto", tp: int = 1) -> int:
        """KV bytes one token takes in one attention layer on one rank (vLLM's page / block_size)."""
        elem = self.kv_dtype_bytes(kv_cache_dtype)
        if self.is_mla:
            # vLLM MLAAttentionSpec: one head of kv_lora_rank + rope_dim, no V (D3).
            _check_tp(tp)
            return (self.kv_lora_rank + self.qk_rope_head_dim) * elem
        return 2 * self.kv_heads_per_rank(tp) * self.head_dim * elem

    def kv_bytes_per_token(self, kv_cache_dtype: str = "auto", tp: int = 1) -> int:
        """KV-cache bytes one token takes on one rank, all attention layers together."""
        return self.num_kv_layers * self.kv_bytes_per_token_layer(kv_cache_dtype, tp)

    def kv_bytes_per_block(self, block_size: int, kv_cache_dtype: str = "auto", tp: int = 1) -> int:
        """Bytes of one KV block (``block_size`` tokens, all layers) on one rank."""
        if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
            raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
        return block_size * self.kv_bytes_per_token(kv_cache_dtype, tp)

    def linear_state_bytes(self, tp: int = 1) -> int:
        """One request's Gated DeltaNet state in one linear-attention layer, one rank.

        vLLM ``MambaStateShapeCalculator.gated_delta_net_state_shape``: a conv
        state of ``conv_channels / tp x (kernel - 1)`` and a recurrent state of
        ``value_heads / tp x value_dim x key_dim``, both in the model dtype
        (``mamba_cache_dtype`` / ``mamba_ssm_cache_dtype`` "auto").
        """
        _check_tp(tp)
        if not self.has_linear_attention:
            return 0
        conv = self.linear_conv_channels // tp * (self.linear_conv_kernel_dim - 1)
        recurrent = (self.linear_num_value_heads // tp * self.linear_value_head_dim
                     * self.linear_key_head_dim)
        return (conv + recurrent) * self.dtype_bytes
