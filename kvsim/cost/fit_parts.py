"""The fit of each part of a profile: hinge fits of ops, GEMM waves, attention, mixed steps.

Called by ``fit.fit_profile``; every function fits on the training rows
(``~test``) and predicts every row, so ``fit_errors.FitPart`` can judge it
on the held-out ones.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from kvsim.cost.attention_work import causal_attention_flops, decode_attention_work, prefill_wave_keys
from kvsim.cost.features import SAMPLED_OPS, RankShapes, rank_shapes
from kvsim.cost.fit_errors import FitPart, coef_dict, column, heldout_mask
from kvsim.cost.nnls import fit_roofline_op, relative_nnls
from kvsim.cost.roofline import roofline_cost_model
from kvsim.cost.step_model import (OpCoefficients, decode_attention_layer_time,
                                   prefill_attention_layer_time)

def fit_hinge(flops, nbytes, t, test, extra=None, extra_names=(), floor=False):
    """Fit one op on the training rows; predict every row.

    ``floor=True`` (elementwise ops, decode attention) puts a constant launch
    floor where a GEMM has its compute term: ``max(floor, b * bytes) + c``.
    """
    train = ~test
    ex = np.zeros((len(t), 0)) if extra is None else np.asarray(extra, float).reshape(len(t), -1)
    first = np.ones_like(t) if floor else flops
    x = fit_roofline_op(first[train], nbytes[train], t[train], ex[train])
    kw = {name: float(v) for name, v in zip(extra_names, x[3:])}
    if floor:
        coef = OpCoefficients(0.0, x[1], x[2], floor_s=x[0], **kw)
    else:
        coef = OpCoefficients(x[0], x[1], x[2], **kw)
    pred = coef.time(flops, nbytes) + ex @ x[3:]
    return coef, pred


# GEMM tiles cuBLAS/CUTLASS pick at these sizes, and SM counts of common GPUs
# (A10G 80, A40 84, A100 108, H100 PCIe 114, RTX 4090 128, H100/H200 SXM 132,
# B200 148, RTX PRO 6000 188); the fit keeps the pair that explains the data best.
TILE_CANDIDATES = ((64, 64), (64, 128), (128, 64), (128, 128), (128, 256), (256, 128))
SM_CANDIDATES = (80, 84, 108, 114, 128, 132, 148, 188)


def relative_sse(pred, t, train) -> float:
    return float(np.sum(((pred[train] - t[train]) / t[train]) ** 2))


def fit_gemm(op, n, nbytes, t, test, num_sms):
    """Best of exact and wave-quantised FLOPs over the tile candidates (training error)."""
    train = ~test
    best = None
    for tile in ((0, 0),) + TILE_CANDIDATES:
        flops = op.wave_flops(n, tile[0], tile[1], num_sms)
        coef, pred = fit_hinge(flops, nbytes, t, test)
        err = relative_sse(pred, t, train)
        if best is None or err < best[0]:
            if tile[0]:
                coef = OpCoefficients(coef.sec_per_flop, coef.sec_per_byte, coef.const_s,
                                      tile_m=tile[0], tile_n=tile[1], num_sms=num_sms)
            best = (err, coef, pred, flops)
    return best[1], best[2], best[3]


def fit_prefill_attention(shapes, c, p, flops, nbytes, t, test):
    """Hinge fit plus per-token and causal terms, with or without the wave term (best on training rows)."""
    base = [c, causal_attention_flops(shapes, c)]
    names = ("sec_per_token", "sec_per_causal_flop")
    coef, pred = fit_hinge(flops, nbytes, t, test, extra=np.column_stack(base), extra_names=names)
    best = (relative_sse(pred, t, ~test), coef, pred)
    # Pick the wave variant with one additive NNLS each (cheap), then hinge-fit the winner.
    train = ~test
    one = np.ones_like(t)
    proxy = None
    for kv in (0, 1):
        for tile in (64, 128):
            for sms in SM_CANDIDATES:
                w = prefill_wave_keys(shapes, c, p, tile, bool(kv), sms)
                design = np.column_stack([flops, nbytes, one] + base + [w])
                x = relative_nnls(design[train], t[train])
                err = relative_sse(design @ x, t, train)
                if proxy is None or err < proxy[0]:
                    proxy = (err, kv, tile, sms, w)
    _, kv, tile, sms, w = proxy
    cf, pr = fit_hinge(flops, nbytes, t, test, extra=np.column_stack(base + [w]),
                        extra_names=names + ("sec_per_wave_key",))
    err = relative_sse(pr, t, train)
    if err < best[0] * 0.98:                        # a real improvement, not noise
        best = (err, dataclasses.replace(cf, wave_tile_m=tile, wave_kv_heads=kv, num_sms=sms), pr)
    return best[1], best[2]


def fit_num_sms(groups: dict, by_name: dict) -> int:
    """SM count that best explains the largest GEMM's steps (0 when there is no GEMM data)."""
    gemms = [name for name in groups if by_name[name].gemm_k]
    if not gemms:
        return 0
    name = max(gemms, key=lambda g: by_name[g].flops_per_token)
    rows, op = groups[name], by_name[name]
    n, t = column(rows, "num_tokens"), column(rows, "time_s")
    if n.max() < 256:               # too few tokens for a second wave: nothing to learn
        return 0
    test = heldout_mask(len(rows))
    nbytes = op.bytes(n)
    errs = {}
    for sms in SM_CANDIDATES:
        errs[sms] = min(relative_sse(fit_hinge(op.wave_flops(n, tm, tn, sms), nbytes, t, test)[1], t, ~test)
                        for tm, tn in ((128, 128), (128, 256), (256, 128)))
    return min(errs, key=errs.get)


def layer_total(op_parts: list, shapes: RankShapes):
    """One layer's linear and elementwise ops summed, at token counts every op was timed at."""
    per_layer = {op.name: op.calls / shapes.num_layers for op in shapes.ops
                 if op.name not in SAMPLED_OPS and op.name not in ("embedding", "final_norm")}
    have = {p.name[3:]: p for p in op_parts if p.name[3:] in per_layer}
    if set(have) != set(per_layer):
        return None
    common = None
    for p in have.values():
        common = set(p.x) if common is None else common & set(p.x)
    xs = np.array(sorted(common))
    if not len(xs):
        return None
    tot = {k: np.zeros(len(xs)) for k in ("measured", "fitted", "roofline")}
    test = np.zeros(len(xs), dtype=bool)
    for name, p in have.items():
        idx = {x: i for i, x in enumerate(p.x)}
        sel = np.array([idx[x] for x in xs])
        for k in tot:
            tot[k] += per_layer[name] * getattr(p, k)[sel]
        test |= p.test[sel]
    return FitPart("layer_linear_ops", xs, tot["measured"], tot["fitted"], tot["roofline"],
                 test, int((~test).sum()))


def fit_mixed_decode(rows, profile, shapes, rl) -> FitPart:
    """Fit the decode part of mixed steps: measured minus the fitted prefill part.

    ``max(floor, b * decode KV bytes) + c + d * decodes`` on the residual, in
    relative terms of the whole step (vLLM's tables: mixed steps cost ~1.5x
    the sum of their pure prefill and pure decode parts).
    """
    from kvsim.cost.step_model import OpCoefficients as C
    pc, pp = column(rows, "prefill_chunk"), column(rows, "prefill_context")
    nd, dc = column(rows, "num_decode"), column(rows, "decode_context")
    t = column(rows, "time_s")
    test = heldout_mask(len(rows))
    train = ~test
    pre = prefill_attention_layer_time(C(**profile["prefill_attention"]), shapes, pc, pp)
    _, nbytes = decode_attention_work(shapes, nd, nd * dc)
    design = np.column_stack([nbytes, nd, np.ones_like(t)]) / t[:, None]
    from kvsim.cost.nnls import nnls
    x = nnls(design[train], ((t - pre) / t)[train])
    coef = OpCoefficients(0.0, float(x[0]), float(x[2]), sec_per_token=float(x[1]))
    profile["mixed_decode_attention"] = coef_dict(coef)
    fitted = pre + decode_attention_layer_time(coef, shapes, nd, nd * dc)
    roof = (prefill_attention_layer_time(rl.prefill_attention, shapes, pc, pp)
            + decode_attention_layer_time(rl.decode_attention, shapes, nd, nd * dc))
    return FitPart("mixed_attention", pc + nd, t, fitted, roof, test, int(train.sum()))


def validate_steps(kind, rows, profile, model, gpu, tp, attn_shapes) -> FitPart:
    """Predict measured mixed steps (one layer, or attention alone) from the fitted parts."""
    from kvsim.cost.fitted import OP_FALLBACK
    from kvsim.cost.step_model import OpCoefficients as C
    shapes = rank_shapes(model, tp)
    rl = roofline_cost_model(model, gpu, tp)
    pc, pp = column(rows, "prefill_chunk"), column(rows, "prefill_context")
    nd, dc = column(rows, "num_decode"), column(rows, "decode_context")
    t = column(rows, "time_s")

    def coef_for(op):
        seen = set()
        while op not in profile["ops"] and op not in seen:
            seen.add(op)
            op = OP_FALLBACK[op]
        return C(**profile["ops"][op])

    pre = C(**profile["prefill_attention"])
    dec = C(**profile["decode_attention"])
    fitted = np.zeros_like(t)
    roof = np.zeros_like(t)
    for attn_f, dec_f, out, ops in ((pre, dec, fitted, None), (rl.prefill_attention,
                                                                rl.decode_attention, roof, rl.ops)):
        out += np.where(pc > 0, prefill_attention_layer_time(attn_f, attn_shapes, pc, pp), 0.0)
        out += np.where(nd > 0, decode_attention_layer_time(dec_f, attn_shapes, nd, nd * dc), 0.0)
        if kind == "layer_step":
            tokens = pc + nd
            for op in shapes.ops:
                if op.name in SAMPLED_OPS or op.name in ("embedding", "final_norm"):
                    continue
                c = coef_for(op.name) if ops is None else ops[op.name]
                per_layer_calls = op.calls / shapes.num_layers
                out += per_layer_calls * c.time(op.flops(tokens), op.bytes(tokens))
    test = np.ones(len(t), dtype=bool)      # nothing here was fitted on
    return FitPart(kind, pc + nd, t, fitted, roof, test, 0)
