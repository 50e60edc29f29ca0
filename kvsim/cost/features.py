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
    # Decode attention FLOPs per (query, key) pair when the kernel differs from
    # prefill's (MLA: vLLM decodes in the latent space, forward_mqa); None: the same.
    decode_attn_flops_per_pair: float | None = None
    # MLA prefill up-projects every cached context token's latent to per-head K/V
    # (vLLM forward_mha, _compute_prefill_context): per context token and layer.
    prefill_context_flops_per_token: float = 0.0
    prefill_context_bytes_per_token: float = 0.0
    weight_dtype_bytes: float | None = None    # GEMM weights when quantized (None: dtype_bytes)
    # Sliding-window / chunked-local layers (Gemma 3, gpt-oss, Llama 4, Mistral):
    # their share of the KV layers, and the window (chunk) a decode reads at most.
    windowed_fraction: float = 0.0
    attention_window: int = 0

    def decode_keys(self, num_seqs: float, keys: float):
        """Keys decode attention reads per layer, on average over the layers.

        ``keys`` = context sum + num_seqs, each sequence's context plus its new
        token. A sliding layer reads at most ``window`` keys of a sequence
        (FlashAttention's ``window_size``; chunked local: the current chunk,
        at most ``chunk``); from the sum alone that is ``min(keys, n x window)``
        (exact when all contexts are on one side of the window, more keys
        otherwise). Works on floats and numpy arrays alike.
        """
        f = self.windowed_fraction
        if not f:
            return keys
        cap = num_seqs * self.attention_window
        if isinstance(keys, float):          # the per-step path: plain floats, same operations
            return (1.0 - f) * keys + f * (keys if keys < cap else cap)
        return (1.0 - f) * keys + f * np.minimum(keys, cap)

    @property
    def decode_flops_per_pair(self) -> float:
        return (self.attn_flops_per_pair if self.decode_attn_flops_per_pair is None
                else self.decode_attn_flops_per_pair)

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
    def from_spec(cls, model, tp: int = 1, kv_cache_dtype: str = "auto",
                  parallel=None, expert_load_imbalance: float = 1.0) -> "RankShapes":
        return rank_shapes(model, tp, kv_cache_dtype, parallel, expert_load_imbalance)


def _gemm(name, calls, k, n, db, wdb=None) -> OpShape:
    return OpShape(name, calls, 2.0 * k * n, float(k * n * (db if wdb is None else wdb)),
                   float((k + n) * db), gemm_k=int(k), gemm_n=int(n))


def _elementwise(name, calls, bytes_per_token) -> OpShape:
    return OpShape(name, calls, 0.0, 0.0, float(bytes_per_token))


def rank_shapes(model, tp: int = 1, kv_cache_dtype: str = "auto", parallel=None,
                expert_load_imbalance: float = 1.0) -> RankShapes:
    """Per-GPU operator shapes of ``model`` (a ``kvsim.specs.ModelSpec``) at TP ``tp``.

    ``parallel`` (a ``kvsim.specs.ParallelConfig``) adds data and expert
    parallelism for the MoE layers (:func:`_moe_ops`); None is TP only.
    ``expert_load_imbalance`` (>= 1) is the busiest EP rank's routed tokens over
    the mean; it only acts under expert parallelism (:func:`_moe_ops`).
    """
    if parallel is not None and parallel.tp != tp:
        raise ValueError(f"rank_shapes: tp {tp} != parallel.tensor_parallel_size {parallel.tp}")
    L = int(model.num_layers)
    h = int(model.hidden_size)
    db = int(model.dtype_bytes)
    wdb = getattr(model, "weight_dtype_bytes", None)
    hd = int(model.head_dim)
    q_heads = max(1, int(model.num_attention_heads) // tp)
    kv_heads = int(model.kv_heads_per_rank(tp))
    inter = int(model.intermediate_size) // tp
    vocab = -(-int(model.vocab_size) // tp)
    gated = bool(model.gated_mlp)
    kv_lora = int(getattr(model, "kv_lora_rank", None) or 0)
    rope_dim = int(getattr(model, "qk_rope_head_dim", 0) or 0)
    kv_bytes_layer = float(model.kv_bytes_per_token(kv_cache_dtype, tp)) / L
    n_attn = int(getattr(model, "num_kv_layers", L))    # linear-attention layers hold no KV
    extra: dict = {}

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
        w = db if wdb is None else wdb
        ops.append(OpShape("qkv_proj", L, sum(2.0 * k * n for k, n in pairs),
                           float(sum(k * n for k, n in pairs) * w),
                           float(sum(k + n for k, n in pairs) * db)))
        attn_flops_pair = 2.0 * q_heads * (qk_head + v_dim)   # QK^T over qk dims, PV over v dims
        # vLLM MLA decode (forward_mqa): q absorbed into the latent, MQA over
        # kv_lora + rope keys and kv_lora values (mla_attention.py docstring).
        extra["decode_attn_flops_per_pair"] = 2.0 * q_heads * (2 * kv_lora + rope_dim)
        # vLLM MLA prefill (forward_mha): the cached context's latent is
        # up-projected (kv_b_proj) to K_nope and V each chunk, written and read.
        extra["prefill_context_flops_per_token"] = 2.0 * kv_lora * q_heads * (nope + v_dim)
        extra["prefill_context_bytes_per_token"] = 2.0 * q_heads * (nope + v_dim) * db
        rope_width = q_heads * rope_dim + rope_dim
        o_in = q_heads * v_dim
    else:
        q_out = q_heads * (2 if getattr(model, "attn_output_gate", False) else 1)  # + the gate
        ops.append(_gemm("qkv_proj", n_attn, h, (q_out + 2 * kv_heads) * hd, db, wdb))
        attn_flops_pair = 4.0 * q_heads * hd          # QK^T and PV
        rope_width = (q_heads + kv_heads) * hd
        o_in = q_heads * hd
    if n_attn != L:
        # Linear-attention layers read no KV: spread the attention layers' work
        # over all L layers, as the per-layer KV bytes already are.
        attn_flops_pair *= n_attn / L
        ops.extend(_linear_attention_ops(model, L - n_attn, tp, db, wdb))
    ops.append(_elementwise("rope", n_attn, 2 * rope_width * db))
    ops.append(_gemm("o_proj", n_attn, o_in, h, db, wdb))
    ops.append(_elementwise("post_attn_norm", L, 2 * h * db))

    n_exp = int(getattr(model, "num_experts", 0) or 0)
    mats = 2 if gated else 1
    if n_exp:
        moe_layers = int(model.num_moe_layers)
        dense_layers = L - moe_layers
        if dense_layers:
            ops.append(_gemm("mlp_gate_up", dense_layers, h, mats * inter, db, wdb))
            ops.append(_elementwise("mlp_act", dense_layers, (mats + 1) * inter * db))
            ops.append(_gemm("mlp_down", dense_layers, inter, h, db, wdb))
        ops.extend(_moe_ops(model, moe_layers, tp, parallel, db, wdb, expert_load_imbalance))
    else:
        ops.append(_gemm("mlp_gate_up", L, h, mats * inter, db, wdb))
        ops.append(_elementwise("mlp_act", L, (mats + 1) * inter * db))
        ops.append(_gemm("mlp_down", L, inter, h, db, wdb))
    ops.append(_elementwise("residual_add", 2 * L, 3 * h * db))
    ops.append(_elementwise("embedding", 1, 2 * h * db))         # gather a row, write it
    ops.append(_elementwise("final_norm", 1, 2 * h * db))
    ops.append(_gemm("lm_head", 1, h, vocab, db))
    # fp32 logits written by the LM head are read by softmax/top-k/sampling
    ops.append(_elementwise("sampler", 1, 2 * vocab * 4))
    kinds = tuple(getattr(model, "layer_types", ()))
    windowed = sum(1 for t in kinds if t in ("sliding_attention", "chunked_attention"))
    if windowed and n_attn:
        extra["windowed_fraction"] = windowed / n_attn
        extra["attention_window"] = int(model.sliding_window if "sliding_attention" in kinds
                                        else model.attention_chunk_size)
    return RankShapes(L, h, q_heads, kv_heads, hd, db, kv_bytes_layer, attn_flops_pair, tp,
                      tuple(ops), weight_dtype_bytes=wdb, **extra)


def _linear_attention_ops(model, calls: int, tp: int, db: int, wdb) -> list[OpShape]:
    """Gated DeltaNet projections (Qwen3-Next), named like attention's for profiles.

    in_proj_qkvz + in_proj_ba as "qkv_proj", out_proj as "o_proj", split tp
    ways. The recurrence itself (state read and written once per sequence per
    step) is not costed.
    """
    h = int(model.hidden_size)
    nk, dk = int(model.linear_num_key_heads), int(model.linear_key_head_dim)
    nv, dv = int(model.linear_num_value_heads), int(model.linear_value_head_dim)
    in_width = (2 * nk * dk + 2 * nv * dv + 2 * nv) // tp
    return [_gemm("qkv_proj", calls, h, in_width, db, wdb),
            _gemm("o_proj", calls, nv * dv // tp, h, db, wdb)]


def _moe_ops(model, moe_layers: int, tp: int, parallel, db: int, wdb,
             imbalance: float = 1.0) -> list[OpShape]:
    """Routed and shared experts of the MoE layers on one GPU.

    Tokens pick ``k`` of ``E`` experts uniformly. With ``dp`` DP ranks the MoE
    layer sees ``dp x n`` tokens (every rank's, each rank stepping a batch like
    this one); this GPU does ``1 / (tp x dp)`` of their expert work: without EP
    every expert at ``1/(tp x dp)`` of its width, with EP
    ``ceil(E / ep)`` whole experts (vLLM FusedMoEParallelConfig). Expert
    weights read are those of the experts the ``dp x n`` tokens touch:
    ``local_experts x (1 - (1 - k/E)^(dp n))`` of them, written in OpShape's
    form with a per-rank selection rate ``k' = E (1 - (1 - k/E)^dp)``.
    The shared experts are a dense MLP split ``tp`` ways. With DP > 1 the
    tokens are moved to and from the experts ("moe_all2all", two calls a
    layer, :func:`moe_dispatch_bytes_per_token`).

    Expert load imbalance (EP only): a layer ends when its busiest EP rank
    does, and real routers are not uniform. ``imbalance`` = that rank's
    (token, expert) pairs over the mean (gamma = max/mean, the straggler
    factor DeepSeek's EPLB and vLLM's ``--enable-eplb`` replicate hot experts
    to bring toward 1) scales the routed GEMMs' FLOPs and activations, and
    the tokens an all-to-all backend delivers to that rank. Gather backends
    move every token to every rank whatever the routing; the weights read
    stay those of the experts touched. Without EP every GPU holds a slice
    of every expert: balanced by construction, the factor does not apply.
    """
    h = int(model.hidden_size)
    mats = 2 if model.gated_mlp else 1
    n_exp = int(model.num_experts)
    k_exp = int(model.num_experts_per_tok)
    shared = int(getattr(model, "num_shared_experts", 0) or 0)
    edb = getattr(model, "expert_dtype_bytes", None)
    edb = (db if wdb is None else wdb) if edb is None else edb
    w_dense = db if wdb is None else wdb
    moe_inter = int(model.moe_intermediate_size) // tp      # shared experts: split tp ways
    shared_inter = shared * moe_inter
    dp = 1 if parallel is None else parallel.dp
    use_ep = parallel is not None and parallel.use_ep
    if use_ep:
        width = int(model.moe_intermediate_size)             # whole experts
        frac = parallel.local_experts(n_exp) / n_exp         # this GPU's share of the experts
        pairs = k_exp * dp * frac * imbalance                # (token, expert) pairs per own token
    else:
        world = tp * dp
        width = int(model.moe_intermediate_size) // world    # every expert, 1/(tp dp) wide
        frac = 1
        pairs = k_exp * dp
    k_rate = k_exp if dp == 1 else n_exp * (1.0 - (1.0 - k_exp / n_exp) ** dp)
    routed = pairs * width                                   # expert intermediate per own token
    ops = [
        OpShape("mlp_gate_up", moe_layers,
                2.0 * h * (routed * mats + shared * mats * moe_inter) + 2.0 * h * n_exp,
                float(h * mats * shared_inter * w_dense + h * n_exp * db),
                float((h + (routed * mats + shared * mats * moe_inter)) * db),
                n_exp, k_rate, float(h * mats * width * edb) * frac),
        _elementwise("mlp_act", moe_layers, (routed + shared * moe_inter) * (mats + 1) * db),
        OpShape("mlp_down", moe_layers,
                2.0 * (routed + shared_inter) * h,
                float(shared_inter * h * w_dense),
                float(((routed + shared_inter) + h) * db),
                n_exp, k_rate, float(width * h * edb) * frac),
    ]
    if parallel is not None and parallel.uses_moe_dispatch:
        moved = moe_dispatch_bytes_per_token(model, parallel)
        if parallel.uses_all_to_all:
            moved *= imbalance                               # the busiest rank's share
        ops.append(OpShape("moe_all2all", 2 * moe_layers, 0.0, 0.0, moved))
    return ops


def moe_dispatch_bytes_per_token(model, parallel) -> float:
    """Bytes one GPU sends (and receives) per token of its DP rank, per dispatch or combine.

    * gather backends (vLLM's default ``allgather_reducescatter``): every GPU
      gets every token of the group: ``(G - 1) x hidden`` per own token, the
      group being the DP ranks (or all EP ranks with sequence-parallel MoE,
      where each TP rank of a DP rank holds ``1/tp`` of its tokens);
    * all-to-all backends (DeepEP, pplx, ...): a token goes once to each other
      EP rank holding one of its ``k`` experts: ``(ep - 1) x P(rank hit) x
      hidden``, ``P = 1 - C(E - E/ep, k) / C(E, k)`` (uniform routing).
    """
    h = float(model.hidden_size * model.dtype_bytes)
    tp_split = parallel.tp if parallel.sequence_parallel_moe else 1
    if not parallel.uses_all_to_all:
        group = parallel.world_size if parallel.sequence_parallel_moe else parallel.dp
        return (group - 1) * h / tp_split
    ep = parallel.expert_parallel_size
    e, k = int(model.num_experts), int(model.num_experts_per_tok)
    per_rank = e / ep
    miss = 1.0
    for i in range(k):                     # C(E - E/ep, k) / C(E, k), term by term
        miss *= max(0.0, (e - per_rank - i)) / (e - i)
    return (ep - 1) * (1.0 - miss) * h / tp_split
