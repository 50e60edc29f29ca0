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

Parameter counts ignore biases and norm weights (well under 0.1% of a 1B+
model), as ``../shared/data/hw_models.yaml`` does for its ``derived_*`` figures.
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer, by its config numbers (HF names in brackets).

    ``num_layers`` [num_hidden_layers], ``num_kv_heads`` [num_key_value_heads],
    ``intermediate_size`` is the dense MLP width (for MoE models the width of
    the ``first_k_dense_layers`` dense layers), ``dtype_bytes`` the weight and
    default KV element size (2 for bf16/fp16).

    MLA (DeepSeek-V2/V3) is on when ``kv_lora_rank`` is set; then
    ``q_lora_rank`` (None = a full q projection), ``qk_nope_head_dim``,
    ``qk_rope_head_dim`` and ``v_head_dim`` describe the attention, and
    ``head_dim`` is the q/k head size ``qk_nope_head_dim + qk_rope_head_dim``.

    MoE is on when ``num_experts`` > 0: layers after the first
    ``first_k_dense_layers`` have ``num_experts`` routed experts of width
    ``moe_intermediate_size`` (``num_experts_per_tok`` active per token) plus
    ``num_shared_experts`` always-active experts of the same width.

    ``learned_position_embeddings`` is the row count of a learned positional
    table (OPT: max_position_embeddings + 2); 0 for RoPE models.
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
    learned_position_embeddings: int = 0
    source: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"model.name must be a non-empty string, got {self.name!r}")
        for field in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads",
                      "head_dim", "intermediate_size", "vocab_size", "max_position_embeddings"):
            self._check_int(field, getattr(self, field), minimum=1)
        if self.dtype_bytes not in (1, 2, 4):
            raise ValueError(f"model {self.name}: dtype_bytes must be 1, 2 or 4, "
                             f"got {self.dtype_bytes!r}")
        for field in ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                      "num_shared_experts", "first_k_dense_layers",
                      "learned_position_embeddings"):
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

    def _check_int(self, field: str, value, minimum: int) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            what = "a positive integer" if minimum == 1 else "an integer >= 0"
            raise ValueError(f"model {self.name}: {field} must be {what}, got {value!r}")

    # ------------------------------------------------------------------ kinds
    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.first_k_dense_layers if self.is_moe else 0

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

    def kv_bytes_per_token(self, kv_cache_dtype: str = "auto", tp: int = 1) -> int:
        """KV-cache bytes one token takes on one rank, all layers together."""
        elem = self.kv_dtype_bytes(kv_cache_dtype)
        if self.is_mla:
            # vLLM MLA page: block_size x (kv_lora_rank + rope_dim) per layer (D3).
            _check_tp(tp)
            return self.num_layers * (self.kv_lora_rank + self.qk_rope_head_dim) * elem
        return 2 * self.num_layers * self.kv_heads_per_rank(tp) * self.head_dim * elem

    def kv_bytes_per_block(self, block_size: int, kv_cache_dtype: str = "auto", tp: int = 1) -> int:
        """Bytes of one KV block (``block_size`` tokens, all layers) on one rank."""
        if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
            raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
        return block_size * self.kv_bytes_per_token(kv_cache_dtype, tp)

    # ------------------------------------------------------------------ parameters
    def _attention_params(self) -> tuple[int, int]:
        """Per-layer attention parameters: (split across TP ranks, replicated)."""
        h = self.hidden_size
        if self.is_mla:
            qk_head = self.qk_nope_head_dim + self.qk_rope_head_dim
            heads = self.num_attention_heads
            if self.q_lora_rank is None:
                q = h * heads * qk_head                      # q_proj
                q_repl = 0
            else:
                q = self.q_lora_rank * heads * qk_head       # q_b_proj (split)
                q_repl = h * self.q_lora_rank                # q_a_proj (replicated)
            kv_a = h * (self.kv_lora_rank + self.qk_rope_head_dim)  # replicated in vLLM
            kv_b = self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
            o = heads * self.v_head_dim * h
            return q + kv_b + o, q_repl + kv_a
        q = h * self.num_attention_heads * self.head_dim
        kv = 2 * h * self.num_kv_heads * self.head_dim
        o = self.num_attention_heads * self.head_dim * h
        return q + kv + o, 0

    def _mlp_params(self, width: int) -> int:
        # Gated (SwiGLU): gate, up, down; plain (OPT, GPT): fc1, fc2.
        return (3 if self.gated_mlp else 2) * self.hidden_size * width

    def _embedding_params(self) -> tuple[int, int]:
        """(input embedding, LM head) parameters; a tied head shares the table."""
        emb = self.vocab_size * self.hidden_size
        return emb, (0 if self.tie_word_embeddings else emb)

    def _position_params(self) -> int:
        return self.learned_position_embeddings * self.hidden_size

    def num_params(self) -> int:
        """Total parameters (all experts), biases and norms left out."""
        split, repl = self._attention_params()
        total = self.num_layers * (split + repl)
        dense_layers = self.num_layers - self.num_moe_layers
        total += dense_layers * self._mlp_params(self.intermediate_size)
        if self.is_moe:
            per_layer = ((self.num_experts + self.num_shared_experts)
                         * self._mlp_params(self.moe_intermediate_size)
                         + self.hidden_size * self.num_experts)  # router
            total += self.num_moe_layers * per_layer
        emb, head = self._embedding_params()
        return total + emb + head + self._position_params()

    def num_active_params(self, include_lm_head: bool = True) -> int:
        """Parameters one token multiplies: routed experts counted at top-k.

        The input embedding is a lookup, not a matmul, so it is left out; the
        LM head is in (the tied table is multiplied once, as the head).
        """
        split, repl = self._attention_params()
        total = self.num_layers * (split + repl)
        dense_layers = self.num_layers - self.num_moe_layers
        total += dense_layers * self._mlp_params(self.intermediate_size)
        if self.is_moe:
            per_layer = ((self.num_experts_per_tok + self.num_shared_experts)
                         * self._mlp_params(self.moe_intermediate_size)
                         + self.hidden_size * self.num_experts)
            total += self.num_moe_layers * per_layer
        if include_lm_head:
            total += self.vocab_size * self.hidden_size
        return total

    def weight_bytes(self, tp: int = 1) -> int:
        """Weight bytes one tensor-parallel rank holds.

        As vLLM shards a Llama-style model: q/o projections, MLP and experts,
        the embedding and the LM head (vocab-parallel) are split ``tp`` ways;
        K/V projections hold ``kv_heads_per_rank(tp)`` heads (replicated when
        tp > kv heads); MLA's down-projections (``kv_a_proj``, ``q_a_proj``)
        are replicated. Checked against vLLM's log for Llama-3-8B
        (14.96 GiB at tp=1, 7.48 GiB at tp=2; vLLM PR #10511).
        """
        _check_tp(tp)
        h = self.hidden_size
        if self.is_mla:
            split, repl = self._attention_params()
            per_layer = split / tp + repl
        else:
            q_o = 2 * h * self.num_attention_heads * self.head_dim
            kv = 2 * h * self.kv_heads_per_rank(tp) * self.head_dim
            per_layer = q_o / tp + kv
        total = self.num_layers * per_layer
        dense_layers = self.num_layers - self.num_moe_layers
        total += dense_layers * self._mlp_params(self.intermediate_size) / tp
        if self.is_moe:
            experts = ((self.num_experts + self.num_shared_experts)
                       * self._mlp_params(self.moe_intermediate_size))
            total += self.num_moe_layers * (experts / tp + h * self.num_experts)
        emb, head = self._embedding_params()
        total += (emb + head) / tp + self._position_params()  # positions: replicated
        return int(round(total * self.dtype_bytes))

    # ------------------------------------------------------------------ FLOPs
    def attention_flops_per_token(self, context_len: int) -> int:
        """Score (QK^T) and value (PV) FLOPs of one token against ``context_len`` keys."""
        if not isinstance(context_len, int) or isinstance(context_len, bool) or context_len < 0:
            raise ValueError(f"context_len must be an integer >= 0, got {context_len!r}")
        if self.is_mla:
            qk_dim = self.qk_nope_head_dim + self.qk_rope_head_dim
            v_dim = self.v_head_dim
        else:
            qk_dim = v_dim = self.head_dim
        return 2 * self.num_layers * self.num_attention_heads * (qk_dim + v_dim) * context_len

    def flops_per_token(self, context_len: int = 0, include_lm_head: bool = True) -> int:
        """Forward FLOPs for one token: 2 x active params + attention against context.

        ``include_lm_head`` counts the vocabulary projection, which an engine
        runs only for tokens it samples (the last token of a prefill chunk, or
        a decode token).
        """
        return (2 * self.num_active_params(include_lm_head)
                + self.attention_flops_per_token(context_len))


def _check_tp(tp) -> None:
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise ValueError(f"tp (tensor-parallel size) must be a positive integer, got {tp!r}")
