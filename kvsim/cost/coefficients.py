"""The coefficients of the step-time formula (``step_model.py``) and the per-layer
attention times built from them (split out of ``step_model.py``: the fit
(``fit_parts.py``) and the validation read them without the model).

Every operator costs ``calls * (max(sec_per_flop * FLOPs, sec_per_byte * bytes,
floor_s) + const_s)``; attention adds ``sec_per_token`` per new token and
prefill ``sec_per_causal_flop`` on the FLOPs of the causal diagonal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvsim.cost.attention_work import (causal_attention_flops, decode_attention_work, prefill_attention_work,
                                       prefill_wave_keys)
from kvsim.cost.features import RankShapes


@dataclass(frozen=True)
class OpCoefficients:
    """Seconds per unit of an operator's work (all >= 0)."""

    sec_per_flop: float = 0.0
    sec_per_byte: float = 0.0
    const_s: float = 0.0
    floor_s: float = 0.0          # no kernel finishes faster than its launch
    sec_per_token: float = 0.0    # attention: per new token (decode: per sequence) work
    sec_per_causal_flop: float = 0.0  # prefill attention: extra cost of the causal diagonal blocks
    tile_m: int = 0               # GEMM output tile and SM count for wave-quantised FLOPs
    tile_n: int = 0               # (0: exact FLOPs; see OpShape.wave_flops)
    num_sms: int = 0
    sec_per_wave_key: float = 0.0  # prefill attention: serial key walk per wave (prefill_wave_keys)
    wave_tile_m: int = 0
    wave_kv_heads: int = 0         # 1: programs per KV head (GQA-packed kernels), 0: per query head

    def time(self, flops, nbytes):
        return np.maximum(np.maximum(self.sec_per_flop * flops, self.sec_per_byte * nbytes),
                          self.floor_s) + self.const_s


@dataclass(frozen=True)
class CommCoefficients:
    """Ring all-reduce: ``sec_per_byte * 2 (tp-1)/tp * bytes + const_s``."""

    sec_per_byte: float = 0.0
    const_s: float = 0.0


@dataclass(frozen=True)
class OverheadCoefficients:
    """A GPU profile's own per-step CPU term (used when the model has no ``EngineTiming``)."""

    const_s: float = 0.0
    sec_per_request: float = 0.0


def _decode_terms(c: OpCoefficients) -> tuple[float, float, float, float, float]:
    """What decode attention reads of its coefficients, as plain floats."""
    return (float(c.sec_per_flop), float(c.sec_per_byte), float(c.floor_s), float(c.const_s),
            float(c.sec_per_token))


def _op_time_scalar(op, c: OpCoefficients, n: int) -> float:
    """Seconds of ``op`` on ``n`` tokens (``OpCoefficients.time`` in plain floats)."""
    if n <= 0:
        return 0.0
    if c.tile_m and op.gemm_k:
        tiles = math.ceil(n / c.tile_m) * math.ceil(op.gemm_n / c.tile_n)
        flops = math.ceil(tiles / c.num_sms) * c.num_sms * 2.0 * c.tile_m * c.tile_n * op.gemm_k
    else:
        flops = op.flops_per_token * n
    nbytes = op.weight_bytes + op.act_bytes_per_token * n
    if op.num_experts:
        e, k = op.num_experts, op.experts_per_token
        nbytes += op.expert_weight_bytes * e * (1.0 - (1.0 - k / e) ** n)
    return op.calls * (max(c.sec_per_flop * flops, c.sec_per_byte * nbytes, c.floor_s) + c.const_s)


def prefill_attention_layer_time(coef: OpCoefficients, shapes: RankShapes, chunks, contexts):
    """Seconds of one layer's attention for each prefill chunk (elementwise over arrays)."""
    chunks = np.asarray(chunks, dtype=float)
    flops, nbytes = prefill_attention_work(shapes, chunks, contexts)
    t = (coef.time(flops, nbytes) + coef.sec_per_token * chunks
         + coef.sec_per_causal_flop * causal_attention_flops(shapes, chunks))
    if coef.wave_tile_m:
        t = t + coef.sec_per_wave_key * prefill_wave_keys(shapes, chunks, contexts, coef.wave_tile_m,
                                                          bool(coef.wave_kv_heads), coef.num_sms)
    return t


def decode_attention_layer_time(coef: OpCoefficients, shapes: RankShapes, num_seqs, context_sum):
    """Seconds of one layer's decode attention for ``num_seqs`` sequences holding ``context_sum`` tokens."""
    flops, nbytes = decode_attention_work(shapes, num_seqs, context_sum)
    return coef.time(flops, nbytes) + coef.sec_per_token * np.asarray(num_seqs, dtype=float)
