"""Parameters, weight bytes per GPU and FLOPs of a :class:`~kvsim.specs.model.ModelSpec`.

A mixin of ``ModelSpec`` (the data and the KV sizing stay in ``model.py``);
it reads only the spec's fields. Parameter counts leave out biases and norms,
as ``../shared/data/hw_models.yaml``'s ``derived_*`` figures do.
"""

from __future__ import annotations

from kvsim.specs.parallel import ParallelConfig


class ModelParams:
    """Parameter counting, per-GPU weights and per-token FLOPs (mixed into ModelSpec)."""

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
        q = h * self.num_attention_heads * self.head_dim * (2 if self.attn_output_gate else 1)
        kv = 2 * h * self.num_kv_heads * self.head_dim
        o = self.num_attention_heads * self.head_dim * h
        return q + kv + o, 0

    def _linear_attention_params(self) -> int:
        """Gated DeltaNet layer (Qwen3-Next), all split across TP: in_proj_qkvz,
        in_proj_ba, the depthwise conv1d and out_proj (vLLM qwen3_next.py)."""
        h, nv, dv = self.hidden_size, self.linear_num_value_heads, self.linear_value_head_dim
        qkvz = h * (2 * self.linear_num_key_heads * self.linear_key_head_dim + 2 * nv * dv)
        return qkvz + h * 2 * nv + self.linear_conv_channels * self.linear_conv_kernel_dim + nv * dv * h

    def _mixer_params(self) -> tuple[float, float]:
        """(split, replicated) parameters of all layers' attention / linear-attention mixers."""
        split, repl = self._attention_params()
        n_attn = self.num_kv_layers
        n_linear = self.num_layers - n_attn
        return n_attn * split + n_linear * self._linear_attention_params(), n_attn * repl

    def _mlp_params(self, width: int) -> int:
        # Gated (SwiGLU): gate, up, down; plain (OPT, GPT): fc1, fc2.
        return (3 if self.gated_mlp else 2) * self.hidden_size * width

    def _embedding_params(self) -> tuple[int, int]:
        """(input embedding, LM head) parameters; a tied head shares the table."""
        emb = self.vocab_size * self.hidden_size
        return emb, (0 if self.tie_word_embeddings else emb)

    def _position_params(self) -> int:
        return self.learned_position_embeddings * self.hidden_size

    def _layer_params(self, experts: int) -> int:
        """Mixers plus MLPs of all layers, MoE layers counted with ``experts`` routed experts."""
        split, repl = self._mixer_params()
        total = split + repl
        total += (self.num_layers - self.num_moe_layers) * self._mlp_params(self.intermediate_size)
        if self.is_moe:
            per_layer = ((experts + self.num_shared_experts)
                         * self._mlp_params(self.moe_intermediate_size)
                         + self.hidden_size * self.num_experts)  # router
            total += self.num_moe_layers * per_layer
        return int(total)

    def num_params(self) -> int:
        """Total parameters (all experts), biases and norms left out."""
        emb, head = self._embedding_params()
        return self._layer_params(self.num_experts) + emb + head + self._position_params()

    def num_active_params(self, include_lm_head: bool = True) -> int:
        """Parameters one token multiplies: routed experts counted at top-k.

        The input embedding is a lookup, not a matmul, so it is left out; the
        LM head is in (the tied table is multiplied once, as the head).
        """
        total = self._layer_params(self.num_experts_per_tok)
        if include_lm_head:
            total += self.vocab_size * self.hidden_size
        return total

    def weight_bytes(self, tp: int = 1, *, dp: int = 1, expert_parallel: bool = False) -> int:
        """Weight bytes one GPU holds (vLLM's sharding; see :mod:`kvsim.specs.parallel`).

        q/o projections, MLPs, shared experts, the embedding and the LM head
        (vocab-parallel) are split ``tp`` ways; K/V projections hold
        ``kv_heads_per_rank(tp)`` heads (replicated when tp > kv heads); MLA's
        down-projections (``kv_a_proj``, ``q_a_proj``) are replicated. Routed
        experts: without EP each is split ``tp x dp`` ways; with EP the busiest
        GPU holds ``ceil(num_experts / (tp x dp))`` whole experts. Checked
        against vLLM's log for Llama-3-8B (14.96 GiB at tp=1, 7.48 GiB at tp=2;
        vLLM PR #10511).
        """
        parts = self.weight_bytes_by_part(tp, dp=dp, expert_parallel=expert_parallel)
        return int(round(sum(parts.values())))

    def weight_bytes_by_part(self, tp: int = 1, *, dp: int = 1,
                             expert_parallel: bool = False) -> dict[str, float]:
        """:meth:`weight_bytes` split into attention, dense MLP, routed experts, embeddings."""
        _check_tp(tp)
        h = self.hidden_size
        if self.is_mla:
            split, repl = self._attention_params()
            per_layer = split / tp + repl
        else:
            q_o = (3 if self.attn_output_gate else 2) * h * self.num_attention_heads * self.head_dim
            kv = 2 * h * self.kv_heads_per_rank(tp) * self.head_dim
            per_layer = q_o / tp + kv
        n_attn = self.num_kv_layers
        mixers = n_attn * per_layer + (self.num_layers - n_attn) * self._linear_attention_params() / tp
        dense = (self.num_layers - self.num_moe_layers) * self._mlp_params(self.intermediate_size) / tp
        experts = 0.0
        if self.is_moe:
            p = ParallelConfig(tp, dp, expert_parallel)
            routed = self._mlp_params(self.moe_intermediate_size)
            if p.use_ep:
                routed_per_gpu = p.local_experts(self.num_experts) * routed
            else:
                routed_per_gpu = self.num_experts * routed / p.moe_tensor_parallel_size
            shared = self.num_shared_experts * routed / tp
            dense += self.num_moe_layers * (shared + h * self.num_experts)  # + router
            experts = self.num_moe_layers * routed_per_gpu
        emb, head = self._embedding_params()
        embeddings = (emb + head) / tp + self._position_params()  # positions: replicated
        wdb = self.dtype_bytes if self.weight_dtype_bytes is None else self.weight_dtype_bytes
        edb = wdb if self.expert_dtype_bytes is None else self.expert_dtype_bytes
        if self.weight_dtype_bytes is None and self.expert_dtype_bytes is None:
            # One dtype for everything: one multiplication, as the seeded figures were made.
            return {"attention": mixers * self.dtype_bytes, "dense_mlp": dense * self.dtype_bytes,
                    "experts": experts * self.dtype_bytes,
                    "embeddings": embeddings * self.dtype_bytes}
        return {"attention": mixers * wdb, "dense_mlp": dense * wdb, "experts": experts * edb,
                "embeddings": embeddings * self.dtype_bytes}

    # ------------------------------------------------------------------ FLOPs
    def attention_flops_per_token(self, context_len: int) -> int:
        """Score (QK^T) and value (PV) FLOPs of one token against ``context_len`` keys.

        A sliding-window layer sees at most ``sliding_window`` keys, a chunked
        layer those of its own chunk; linear-attention layers are left out.
        """
        if not isinstance(context_len, int) or isinstance(context_len, bool) or context_len < 0:
            raise ValueError(f"context_len must be an integer >= 0, got {context_len!r}")
        if self.is_mla:
            qk_dim = self.qk_nope_head_dim + self.qk_rope_head_dim
            v_dim = self.v_head_dim
        else:
            qk_dim = v_dim = self.head_dim
        per_key = 2 * self.num_attention_heads * (qk_dim + v_dim)
        if not self.is_hybrid:
            return per_key * self.num_layers * context_len
        keys = 0
        for kind in self.layer_types:
            if kind == "full_attention":
                keys += context_len
            elif kind == "sliding_attention":
                keys += min(context_len, self.sliding_window)
            elif kind == "chunked_attention":
                keys += context_len % self.attention_chunk_size
        return per_key * keys

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
