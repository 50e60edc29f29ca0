"""The physical quantities of one engine step: FLOPs and bytes of every operator.

Both cost models read the same numbers from here. The roofline model turns each
operator's (FLOPs, bytes) into ``max(FLOPs / peak, bytes / bandwidth)``; the
fitted model multiplies the same quantities by coefficients fitted to
measurements. Everything is per GPU (one tensor-parallel rank), summed over
the layers that run the operator.

Operators (names are the keys of a fitted profile's ``ops``)::

    per token, every layer   input_norm  qkv_proj  rope  o_proj  post_attn_norm
                             mlp_gate_up  mlp_act  mlp_down  residual_add (x2)
    per token, once          embedding  final_norm
    per sampled sequence     lm_head  sampler
    attention, every layer   prefill chunk (quadratic in the chunk, reads the cached KV)
                             decode (reads every decoding sequence's KV)
    tp > 1, every layer      all-reduce after attention and after the MLP

A GEMM of ``T`` tokens by a ``K x N`` weight does ``2 T K N`` FLOPs and moves
``(K N + T (K + N)) * dtype`` bytes; elementwise ops move a fixed number of
bytes per token. MoE layers route each token to ``num_experts_per_tok``
experts; the expert weights read are those of the experts the batch touches
(expected count under uniform routing).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

LINEAR_OPS = ("input_norm", "qkv_proj", "rope", "o_proj", "post_attn_norm",
              "mlp_gate_up", "mlp_act", "mlp_down", "residual_add",
              "embedding", "final_norm", "lm_head", "sampler")
# Ops whose work scales with the sequences that sample a token, not with T.
SAMPLED_OPS = ("lm_head", "sampler")


@dataclass(frozen=True)
class OpShape:
    """One operator, as linear functions of its token count ``n``.

    ``flops = flops_per_token * n``; ``bytes = weight_bytes(n) + act_bytes_per_token * n``
    where weight bytes are ``weight_bytes`` (dense) or, for MoE expert GEMMs,
    ``expert_weight_bytes * E * (1 - (1 - k/E)^n)`` (experts touched by n tokens).
    ``calls`` is how many times a step runs it (layers x calls per layer).
    """

    name: str
    calls: int
    flops_per_token: float
    weight_bytes: float
    act_bytes_per_token: float
    num_experts: int = 0            # > 0 for a routed-expert GEMM
    experts_per_token: int = 0
    expert_weight_bytes: float = 0.0
    gemm_k: int = 0                 # a plain GEMM's weight shape (0: not one)
    gemm_n: int = 0

    def flops(self, n):
        return self.flops_per_token * n

    def wave_flops(self, n, tile_m: int, tile_n: int, num_sms: int):
        """FLOPs the GPU spends, counting whole waves of output tiles.

        A GEMM kernel computes ``tile_m x tile_n`` output tiles, ``num_sms`` at
        a time; a partly filled last wave costs a full one. This is why
        measured GEMM time jumps at token counts where the tile count crosses
        a multiple of the SM count (Vidur H100 tables: +40% from 992 to 1056
        tokens). Not a plain GEMM: the exact FLOPs.
        """
        if not self.gemm_k or not tile_m:
            return self.flops(n)
        tiles = np.ceil(np.asarray(n, dtype=float) / tile_m) * np.ceil(self.gemm_n / tile_n)
        waves = np.ceil(tiles / num_sms)
        return waves * num_sms * 2.0 * tile_m * tile_n * self.gemm_k

    def bytes(self, n):
        b = self.weight_bytes + self.act_bytes_per_token * n
        if self.num_experts:
            e, k = self.num_experts, self.experts_per_token
            touched = e * (1.0 - (1.0 - k / e) ** np.asarray(n, dtype=float))
            b = b + self.expert_weight_bytes * touched
        return b


@dataclass(frozen=True)
class RankShapes:
    """The model as one tensor-parallel rank sees it, with the per-op shapes."""

    num_layers: int
    hidden_size: int
    q_heads: int                     # query heads on this rank
    kv_heads: int                    # KV heads on this rank (replicated when tp > kv heads)
    head_dim: int
    dtype_bytes: int
    kv_bytes_per_token_layer: float  # KV-cache bytes one token adds to one layer on this rank
    attn_flops_per_pair: float       # FLOPs per (query, key) pair, all heads of this rank
    tp: int
    ops: tuple[OpShape, ...]

    @property
    def q_bytes_per_token(self) -> float:
        # attention reads Q and writes O for each new token
        return 2.0 * self.q_heads * self.head_dim * self.dtype_bytes

    @property
    def allreduce_bytes_per_token(self) -> float:
        return float(self.hidden_size * self.dtype_bytes)

    @property
    def allreduce_calls(self) -> int:
        # Megatron-style TP: one all-reduce after attention, one after the MLP.
        return 2 * self.num_layers if self.tp > 1 else 0

    @classmethod
    def from_spec(cls, model, tp: int = 1, kv_cache_dtype: str = "auto") -> "RankShapes":
        return rank_shapes(model, tp, kv_cache_dtype)


def _gemm(name, calls, k, n, db) -> OpShape:
    return OpShape(name, calls, 2.0 * k * n, float(k * n * db), float((k + n) * db),
                   gemm_k=int(k), gemm_n=int(n))


def _elementwise(name, calls, bytes_per_token) -> OpShape:
    return OpShape(name, calls, 0.0, 0.0, float(bytes_per_token))


def rank_shapes(model, tp: int = 1, kv_cache_dtype: str = "auto") -> RankShapes:
    """Per-rank operator shapes of ``model`` (a ``kvsim.specs.ModelSpec``) at TP ``tp``."""
    L = int(model.num_layers)
    h = int(model.hidden_size)
    db = int(model.dtype_bytes)
    hd = int(model.head_dim)
    q_heads = max(1, int(model.num_attention_heads) // tp)
    kv_heads = int(model.kv_heads_per_rank(tp))
    inter = int(model.intermediate_size) // tp
    vocab = -(-int(model.vocab_size) // tp)
    gated = bool(model.gated_mlp)
    kv_lora = int(getattr(model, "kv_lora_rank", None) or 0)
    rope_dim = int(getattr(model, "qk_rope_head_dim", 0) or 0)
    kv_bytes_layer = float(model.kv_bytes_per_token(kv_cache_dtype, tp)) / L

    ops: list[OpShape] = []
    ops.append(_elementwise("input_norm", L, 2 * h * db))
    if kv_lora:
        # MLA (DeepSeek-V2/V3), as vLLM shards it: q (optionally through a
        # replicated q_a LoRA), the replicated kv_a down-projection to the
        # latent + rope key, and the split kv_b up-projection to per-head K/V
        # are counted as one "qkv_proj"; the cache holds the latent only.
        nope = int(model.qk_nope_head_dim)
        v_dim = int(model.v_head_dim)
        qk_head = nope + rope_dim
        q_lora = getattr(model, "q_lora_rank", None)
        if q_lora:
            q_pairs = [(h, int(q_lora)), (int(q_lora), q_heads * qk_head)]
        else:
            q_pairs = [(h, q_heads * qk_head)]
        pairs = q_pairs + [(h, kv_lora + rope_dim), (kv_lora, q_heads * (nope + v_dim))]
        ops.append(OpShape("qkv_proj", L, sum(2.0 * k * n for k, n in pairs),
                           float(sum(k * n for k, n in pairs) * db),
                           float(sum(k + n for k, n in pairs) * db)))
        attn_flops_pair = 2.0 * q_heads * (qk_head + v_dim)   # QK^T over qk dims, PV over v dims
        rope_width = q_heads * rope_dim + rope_dim
        o_in = q_heads * v_dim
    else:
        ops.append(_gemm("qkv_proj", L, h, (q_heads + 2 * kv_heads) * hd, db))
        attn_flops_pair = 4.0 * q_heads * hd          # QK^T and PV
        rope_width = (q_heads + kv_heads) * hd
        o_in = q_heads * hd
    ops.append(_elementwise("rope", L, 2 * rope_width * db))
    ops.append(_gemm("o_proj", L, o_in, h, db))
    ops.append(_elementwise("post_attn_norm", L, 2 * h * db))

    n_exp = int(getattr(model, "num_experts", 0) or 0)
    mats = 2 if gated else 1
    if n_exp:
        k_exp = int(model.num_experts_per_tok)
        dense_layers = int(getattr(model, "first_k_dense_layers", 0) or 0)
        moe_layers = L - dense_layers
        moe_inter = int(model.moe_intermediate_size) // tp
        shared = int(getattr(model, "num_shared_experts", 0) or 0)
        if dense_layers:
            ops.append(_gemm("mlp_gate_up", dense_layers, h, mats * inter, db))
            ops.append(_elementwise("mlp_act", dense_layers, (mats + 1) * inter * db))
            ops.append(_gemm("mlp_down", dense_layers, inter, h, db))
        # routed experts: k expert GEMMs per token; router logits h x E; shared experts dense
        shared_inter = shared * moe_inter
        ops.append(OpShape("mlp_gate_up", moe_layers,
                           2.0 * h * (k_exp + shared) * mats * moe_inter + 2.0 * h * n_exp,
                           float((h * mats * shared_inter + h * n_exp) * db),
                           float((h + (k_exp + shared) * mats * moe_inter) * db),
                           n_exp, k_exp, float(h * mats * moe_inter * db)))
        ops.append(_elementwise("mlp_act", moe_layers, (k_exp + shared) * (mats + 1) * moe_inter * db))
        ops.append(OpShape("mlp_down", moe_layers,
                           2.0 * (k_exp + shared) * moe_inter * h,
                           float(shared_inter * h * db),
                           float(((k_exp + shared) * moe_inter + h) * db),
                           n_exp, k_exp, float(moe_inter * h * db)))
    else:
        ops.append(_gemm("mlp_gate_up", L, h, mats * inter, db))
        ops.append(_elementwise("mlp_act", L, (mats + 1) * inter * db))
        ops.append(_gemm("mlp_down", L, inter, h, db))
    ops.append(_elementwise("residual_add", 2 * L, 3 * h * db))
    ops.append(_elementwise("embedding", 1, 2 * h * db))         # gather a row, write it
    ops.append(_elementwise("final_norm", 1, 2 * h * db))
    ops.append(_gemm("lm_head", 1, h, vocab, db))
    # fp32 logits written by the LM head are read by softmax/top-k/sampling
    ops.append(_elementwise("sampler", 1, 2 * vocab * 4))
    return RankShapes(L, h, q_heads, kv_heads, hd, db, kv_bytes_layer, attn_flops_pair, tp, tuple(ops))


# ---------------------------------------------------------------- attention

def prefill_attention_work(shapes: RankShapes, chunk, context):
    """(FLOPs, bytes) of one layer's attention for prefill chunks (arrays, elementwise).

    A chunk of ``c`` new tokens after ``p`` cached ones attends causally:
    ``c p + c (c + 1) / 2`` (query, key) pairs. It reads the KV of all
    ``p + c`` tokens (the new ones were just written), Q and O of the chunk,
    and writes the chunk's KV.
    """
    c = np.asarray(chunk, dtype=float)
    p = np.asarray(context, dtype=float)
    pairs = c * p + c * (c + 1.0) / 2.0
    flops = pairs * shapes.attn_flops_per_pair
    nbytes = (p + 2.0 * c) * shapes.kv_bytes_per_token_layer + c * shapes.q_bytes_per_token
    return flops, nbytes


def causal_attention_flops(shapes: RankShapes, chunk):
    """FLOPs of the causal (triangular) part of a prefill chunk: ``c (c + 1) / 2`` pairs.

    Kernels tile the diagonal blocks less efficiently than the rectangle of
    cached keys, so a fitted profile may charge them extra.
    """
    c = np.asarray(chunk, dtype=float)
    return c * (c + 1.0) / 2.0 * shapes.attn_flops_per_pair


def prefill_wave_keys(shapes: RankShapes, chunk, context, tile_m: int, use_kv_heads: bool,
                      num_sms: int):
    """Keys one FlashAttention program walks, times the waves of programs a chunk needs.

    A prefill kernel runs one program per (query tile of ``tile_m`` tokens,
    head); each walks all ``context + chunk/2`` keys (on average, causal) one
    after another. With fewer programs than SMs the time is set by that walk,
    not by FLOPs or bytes: in vLLM's tables a 16-token chunk costs the same
    as a 128-token one, 264 µs after 8k cached tokens on an RTX 4090.
    """
    c = np.asarray(chunk, dtype=float)
    p = np.asarray(context, dtype=float)
    heads = shapes.kv_heads if use_kv_heads else shapes.q_heads
    waves = np.ceil(np.ceil(c / tile_m) * heads / num_sms)
    return waves * (p + c / 2.0)


def decode_attention_work(shapes: RankShapes, num_seqs, context_sum):
    """(FLOPs, bytes) of one layer's decode attention for a whole decode batch.

    Every decoding sequence attends its one new query to its ``p + 1`` keys and
    streams their KV once; one kernel covers the batch, so work depends on the
    contexts only through their sum (``context_sum`` = sum of p).
    """
    n = np.asarray(num_seqs, dtype=float)
    keys = np.asarray(context_sum, dtype=float) + n
    flops = keys * shapes.attn_flops_per_pair
    nbytes = (keys + n) * shapes.kv_bytes_per_token_layer + n * shapes.q_bytes_per_token
    return flops, nbytes
