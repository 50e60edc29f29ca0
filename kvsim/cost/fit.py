"""Fit a profile (``fitted.py``) to measurements in kvsim's calibration CSV format.

One row is one timed thing; ``kind`` says what, and the columns it needs::

    kind               columns                                      fits
    op                 op, num_tokens                               ops.<op>
    prefill_attention  prefill_chunk, prefill_context               prefill_attention
    decode_attention   num_decode, decode_context (each sequence's) decode_attention
    allreduce          nbytes (per-GPU buffer), tp (GPUs)           allreduce
    overhead           num_requests                                 overhead
    copy               nbytes (bytes copied device to device)       elementwise ops with no own rows
    layer_step         prefill_chunk, prefill_context,              (validation only: one
                       num_decode, decode_context                    transformer layer, mixed batch)

Every row has ``time_s`` (median seconds per call); ``time_p10_s``,
``time_p90_s``, ``reps`` and ``source`` are optional. ``op`` names are those
of ``features.LINEAR_OPS``; op rows time one call of one layer at the
measured model's per-rank shapes.

Each part is fitted on a seeded 80% of its rows and judged on the other 20%
(held out), as is the uncalibrated roofline on the same rows
(``fit_errors.py``); the fits of the parts are in ``fit_parts.py``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvsim.cost.attention_work import decode_attention_work, prefill_attention_work
from kvsim.cost.features import LINEAR_OPS, RankShapes, rank_shapes
from kvsim.cost.fit_errors import (FitPart, ape_stats, coef_dict, column, heldout_by_key,
                                   heldout_mask)
from kvsim.cost.fit_parts import (fit_gemm, fit_hinge, fit_mixed_decode, fit_num_sms,
                                  fit_prefill_attention, layer_total, validate_steps)
from kvsim.cost.fitted import PROFILE_FORMAT
from kvsim.cost.nnls import relative_nnls
from kvsim.cost.roofline import roofline_cost_model

__all__ = ["KINDS", "ape_stats", "fit_profile", "heldout_by_key", "heldout_mask"]

KINDS = ("op", "prefill_attention", "decode_attention", "attention", "allreduce", "overhead",
         "copy", "layer_step")


def fit_profile(data: pd.DataFrame, *, model, gpu, tp: int = 1, name: str | None = None,
                target_model=None, attention_shapes: RankShapes | None = None,
                sources: list[dict] | None = None, description: str = "",
                require_attention: bool = True) -> dict:
    """Fit every part the data has rows for; return the profile dict.

    ``model`` is the model the data was measured with (its shapes give the
    FLOPs and bytes of each row); ``target_model`` (default ``model``) is the
    one the profile is for: the coefficients are per FLOP and per byte, so
    they carry over between models of similar shapes on the same GPU.
    ``attention_shapes`` overrides the shapes for attention rows (attention
    measured with another model's head counts).
    """
    unknown = set(data["kind"].unique()) - set(KINDS)
    if unknown:
        raise ValueError(f"calibration data: unknown kind(s) {sorted(unknown)}; allowed: "
                         f"{', '.join(KINDS)}")
    target_model = target_model or model
    shapes = rank_shapes(model, tp)
    attn_shapes = attention_shapes or shapes
    rl = roofline_cost_model(model, gpu, tp)
    t_all = column(data, "time_s") if len(data) else np.zeros(0)
    if (t_all <= 0).any():
        raise ValueError("calibration data: time_s must be positive")
    parts: list[FitPart] = []
    profile: dict = {"format": PROFILE_FORMAT,
                     "name": name or f"{gpu.name}_{target_model.name}_tp{tp}",
                     "gpu": gpu.name, "model": target_model.name, "tp": tp,
                     "description": description,
                     "fitted_on_model": model.name,
                     "ops": {}, "sources": sources or []}

    # ---- linear and elementwise ops
    op_rows = data[data["kind"] == "op"]
    if op_rows.empty:
        op_rows = pd.DataFrame({"op": [], "kind": []})
    by_name = {op.name: op for op in shapes.ops}
    unknown_ops = set(op_rows["op"]) - set(by_name)
    if unknown_ops:
        raise ValueError(f"calibration data: op(s) {sorted(unknown_ops)} not among "
                         f"{', '.join(LINEAR_OPS)}")
    groups = {name: rows for name, rows in op_rows.groupby("op", sort=True)}
    num_sms = fit_num_sms(groups, by_name)
    for op_name, rows in groups.items():
        op = by_name[op_name]
        n = column(rows, "num_tokens")
        t = column(rows, "time_s")
        test = heldout_by_key(n)
        nbytes = op.bytes(n)
        if op.gemm_k and num_sms:
            coef, pred, flops = fit_gemm(op, n, nbytes, t, test, num_sms)
        else:
            flops = op.flops(n)
            coef, pred = fit_hinge(flops, nbytes, t, test, floor=op.flops_per_token == 0)
        profile["ops"][op_name] = coef_dict(coef)
        parts.append(FitPart(f"op:{op_name}", n, t, pred, rl.ops[op_name].time(op.flops(n), nbytes),
                           test, (~test).sum()))
    layer = layer_total([p for p in parts if p.name.startswith("op:")], shapes)
    if layer is not None:
        parts.append(layer)

    # ---- copy bandwidth -> elementwise ops nobody measured
    copy_rows = data[data["kind"] == "copy"]
    if len(copy_rows):
        nb = 2.0 * column(copy_rows, "nbytes")          # read + write
        t = column(copy_rows, "time_s")
        test = heldout_mask(len(copy_rows))
        coef, pred = fit_hinge(np.zeros_like(nb), nb, t, test, floor=True)
        parts.append(FitPart("copy", nb / 2, t, pred, rl.ops["residual_add"].time(0.0, nb),
                           test, (~test).sum()))
        profile["measured_copy_bandwidth_gbps"] = float(f"{1e-9 / coef.sec_per_byte:.4g}") \
            if coef.sec_per_byte else None
        for op in shapes.ops:
            if op.flops_per_token == 0 and op.name not in profile["ops"]:
                profile["ops"][op.name] = coef_dict(coef)

    # ---- attention
    rows = data[data["kind"] == "prefill_attention"]
    if len(rows):
        c, p, t = column(rows, "prefill_chunk"), column(rows, "prefill_context"), column(rows, "time_s")
        test = heldout_mask(len(rows))
        flops, nbytes = prefill_attention_work(attn_shapes, c, p)
        coef, pred = fit_prefill_attention(attn_shapes, c, p, flops, nbytes, t, test)
        profile["prefill_attention"] = coef_dict(coef)
        parts.append(FitPart("prefill_attention", c * (p + c / 2), t, pred,
                           rl.prefill_attention.time(flops, nbytes), test, (~test).sum()))
    rows = data[data["kind"] == "decode_attention"]
    if len(rows):
        n, ctx, t = column(rows, "num_decode"), column(rows, "decode_context"), column(rows, "time_s")
        test = heldout_mask(len(rows))
        flops, nbytes = decode_attention_work(attn_shapes, n, n * ctx)
        coef, pred = fit_hinge(flops, nbytes, t, test, extra=n, extra_names=("sec_per_token",),
                                floor=True)
        profile["decode_attention"] = coef_dict(coef)
        parts.append(FitPart("decode_attention", n * ctx, t, pred,
                           rl.decode_attention.time(flops, nbytes), test, (~test).sum()))

    # ---- communication and CPU overhead
    rows = data[data["kind"] == "allreduce"]
    if len(rows):
        k = column(rows, "tp")
        if (k == tp).any() and tp > 1:
            rows, k = rows[k == tp], k[k == tp]
        nb = column(rows, "nbytes")
        t = column(rows, "time_s")
        ring = 2.0 * (k - 1) / k * nb
        test = heldout_mask(len(rows))
        x = relative_nnls(np.column_stack([ring, np.ones_like(ring)])[~test], t[~test])
        profile["allreduce"] = {"sec_per_byte": float(f"{x[0]:.6g}"), "const_s": float(f"{x[1]:.6g}")}
        parts.append(FitPart("allreduce", nb, t, x[0] * ring + x[1],
                           rl.allreduce.sec_per_byte * ring + rl.allreduce.const_s,
                           test, (~test).sum()))
    rows = data[data["kind"] == "overhead"]
    if len(rows):
        r, t = column(rows, "num_requests"), column(rows, "time_s")
        test = heldout_mask(len(rows))
        x = relative_nnls(np.column_stack([np.ones_like(r), r])[~test], t[~test])
        profile["overhead"] = {"const_s": float(f"{x[0]:.6g}"), "sec_per_request": float(f"{x[1]:.6g}")}
        parts.append(FitPart("overhead", r, t, x[0] + x[1] * r,
                           rl.overhead.const_s + rl.overhead.sec_per_request * r,
                           test, (~test).sum()))

    missing = [k for k in ("prefill_attention", "decode_attention") if k not in profile]
    if missing and require_attention:
        raise ValueError(f"calibration data: no rows of kind {' or '.join(missing)}; a profile "
                         f"needs both attention parts")
    profile.setdefault("allreduce", {"sec_per_byte": 0.0, "const_s": 0.0})
    profile.setdefault("overhead", {"const_s": 0.0, "sec_per_request": 0.0})

    # ---- mixed prefill + decode attention steps: decodes there cost differently
    rows = data[data["kind"] == "attention"]
    if len(rows) and "prefill_attention" in profile and "decode_attention" in profile:
        parts.append(fit_mixed_decode(rows, profile, attn_shapes, rl))

    # ---- whole-layer steps: validation of the assembled per-layer model
    rows = data[data["kind"] == "layer_step"]
    if len(rows):
        parts.append(validate_steps("layer_step", rows, profile, model, gpu, tp, attn_shapes))

    profile["errors"] = {p.name: p.errors() for p in parts}
    profile["heldout"] = {p.name: p.heldout() for p in parts}
    return profile
