"""The attention operators' work: FLOPs and bytes of prefill chunks and decode batches.

Split out of ``kvsim.cost.features`` (the per-token operators); both cost
models and the fitting read these. Everything is per layer of one
tensor-parallel rank, elementwise over arrays of chunks.
"""

from __future__ import annotations

import numpy as np

from kvsim.cost.features import RankShapes


def prefill_attention_work(shapes: RankShapes, chunk, context):
    """(FLOPs, bytes) of one layer's attention for prefill chunks (arrays, elementwise).

    A chunk of ``c`` new tokens after ``p`` cached ones attends causally:
    ``c p + c (c + 1) / 2`` (query, key) pairs. It reads the KV of all
    ``p + c`` tokens (the new ones were just written), Q and O of the chunk,
    and writes the chunk's KV. MLA adds the up-projection of the ``p`` cached
    latents to per-head K and V (``prefill_context_*``; zero otherwise).
    """
    c = np.asarray(chunk, dtype=float)
    p = np.asarray(context, dtype=float)
    pairs = c * p + c * (c + 1.0) / 2.0
    flops = pairs * shapes.attn_flops_per_pair + p * shapes.prefill_context_flops_per_token
    nbytes = ((p + 2.0 * c) * shapes.kv_bytes_per_token_layer + c * shapes.q_bytes_per_token
              + p * shapes.prefill_context_bytes_per_token)
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
    keys = shapes.decode_keys(n, np.asarray(context_sum, dtype=float) + n)
    flops = keys * shapes.decode_flops_per_pair
    nbytes = (keys + n) * shapes.kv_bytes_per_token_layer + n * shapes.q_bytes_per_token
    return flops, nbytes
