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
(held out), as is the uncalibrated roofline on the same rows.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from kvsim.cost.features import (LINEAR_OPS, SAMPLED_OPS, RankShapes, decode_attention_work,
                                 causal_attention_flops, prefill_attention_work,
                                 prefill_wave_keys, rank_shapes)
from kvsim.cost.fitted import PROFILE_FORMAT
from kvsim.cost.nnls import fit_roofline_op, relative_nnls
from kvsim.cost.roofline import roofline_cost_model
from kvsim.cost.step_model import (OpCoefficients, decode_attention_layer_time,
                                   prefill_attention_layer_time)

KINDS = ("op", "prefill_attention", "decode_attention", "attention", "allreduce", "overhead",
         "copy", "layer_step")
HELDOUT_FRACTION = 0.2
MAX_PLOT_POINTS = 40


def ape_stats(pred, meas) -> tuple[float, float]:
    """(median, p90) absolute percentage error, in percent."""
    ape = np.abs(np.asarray(pred, float) - np.asarray(meas, float)) / np.asarray(meas, float) * 100
    return float(np.median(ape)), float(np.percentile(ape, 90))


def heldout_mask(n: int, seed: int = 0) -> np.ndarray:
    if n < 5:
        return np.zeros(n, dtype=bool)
    rng = np.random.default_rng(seed)
    mask = np.zeros(n, dtype=bool)
    mask[rng.choice(n, size=max(1, int(round(n * HELDOUT_FRACTION))), replace=False)] = True
    return mask


def heldout_by_key(keys, seed: int = 0) -> np.ndarray:
    """Hold out every row of a seeded 20% of the distinct ``keys`` (e.g. token counts).

    Op tables share their token counts, so holding out the same counts for
    every op makes the per-layer sum of the ops a held-out test too.
    """
    keys = np.asarray(keys)
    uniq = np.unique(keys)
    return np.isin(keys, uniq[heldout_mask(len(uniq), seed)])


def _num(df: pd.DataFrame, col: str) -> np.ndarray:
    if col not in df.columns:
        raise ValueError(f"calibration data: rows of kind {df['kind'].iloc[0]!r} need a "
                         f"{col!r} column")
    values = pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=float)
    if np.isnan(values).any():
        raise ValueError(f"calibration data: column {col!r} has missing or non-numeric values "
                         f"in rows of kind {df['kind'].iloc[0]!r}")
    return values


class _Part:
    """The fit of one part: coefficients, and the held-out comparison."""

    def __init__(self, name, x, measured, fitted, roofline, test, n_train):
        self.name, self.x = name, np.asarray(x, float)
        self.measured, self.fitted, self.roofline = (np.asarray(a, float)
                                                     for a in (measured, fitted, roofline))
        self.test, self.n_train = test, n_train

    def errors(self) -> dict:
        sel = self.test if self.test.any() else np.ones_like(self.test)
        fm, fp = ape_stats(self.fitted[sel], self.measured[sel])
        rm, rp = ape_stats(self.roofline[sel], self.measured[sel])
        return {"n_train": int(self.n_train), "n_test": int(self.test.sum()),
                "fitted_median_ape": round(fm, 3), "fitted_p90_ape": round(fp, 3),
                "roofline_median_ape": round(rm, 3), "roofline_p90_ape": round(rp, 3)}

    def heldout(self) -> dict:
        idx = np.flatnonzero(self.test if self.test.any() else np.ones_like(self.test))
        if len(idx) > MAX_PLOT_POINTS:
            idx = idx[np.linspace(0, len(idx) - 1, MAX_PLOT_POINTS).astype(int)]
        return {"x": [float(v) for v in self.x[idx]],
                "measured_s": [float(f"{v:.6g}") for v in self.measured[idx]],
                "fitted_s": [float(f"{v:.6g}") for v in self.fitted[idx]],
                "roofline_s": [float(f"{v:.6g}") for v in self.roofline[idx]]}


def _coef_dict(c: OpCoefficients) -> dict:
    out = {"sec_per_flop": c.sec_per_flop, "sec_per_byte": c.sec_per_byte, "const_s": c.const_s}
    for extra in ("floor_s", "sec_per_token", "sec_per_causal_flop", "sec_per_wave_key"):
        if getattr(c, extra):
            out[extra] = getattr(c, extra)
    out = {k: float(f"{v:.6g}") for k, v in out.items()}
    if c.tile_m:
        out.update(tile_m=c.tile_m, tile_n=c.tile_n, num_sms=c.num_sms)
    if c.wave_tile_m:
        out.update(wave_tile_m=c.wave_tile_m, wave_kv_heads=c.wave_kv_heads, num_sms=c.num_sms)
    return out


def _fit_hinge(flops, nbytes, t, test, extra=None, extra_names=(), floor=False):
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


def _sse(pred, t, train) -> float:
    return float(np.sum(((pred[train] - t[train]) / t[train]) ** 2))


def _fit_gemm(op, n, nbytes, t, test, num_sms):
    """Best of exact and wave-quantised FLOPs over the tile candidates (training error)."""
    train = ~test
    best = None
    for tile in ((0, 0),) + TILE_CANDIDATES:
        flops = op.wave_flops(n, tile[0], tile[1], num_sms)
        coef, pred = _fit_hinge(flops, nbytes, t, test)
        err = _sse(pred, t, train)
        if best is None or err < best[0]:
            if tile[0]:
                coef = OpCoefficients(coef.sec_per_flop, coef.sec_per_byte, coef.const_s,
                                      tile_m=tile[0], tile_n=tile[1], num_sms=num_sms)
            best = (err, coef, pred, flops)
    return best[1], best[2], best[3]


def _fit_prefill_attention(shapes, c, p, flops, nbytes, t, test):
    """Hinge fit plus per-token and causal terms, with or without the wave term (best on training rows)."""
    base = [c, causal_attention_flops(shapes, c)]
    names = ("sec_per_token", "sec_per_causal_flop")
    coef, pred = _fit_hinge(flops, nbytes, t, test, extra=np.column_stack(base), extra_names=names)
    best = (_sse(pred, t, ~test), coef, pred)
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
                err = _sse(design @ x, t, train)
                if proxy is None or err < proxy[0]:
                    proxy = (err, kv, tile, sms, w)
    _, kv, tile, sms, w = proxy
    cf, pr = _fit_hinge(flops, nbytes, t, test, extra=np.column_stack(base + [w]),
                        extra_names=names + ("sec_per_wave_key",))
    err = _sse(pr, t, train)
    if err < best[0] * 0.98:                        # a real improvement, not noise
        best = (err, dataclasses.replace(cf, wave_tile_m=tile, wave_kv_heads=kv, num_sms=sms), pr)
    return best[1], best[2]


def _fit_num_sms(groups: dict, by_name: dict) -> int:
    """SM count that best explains the largest GEMM's steps (0 when there is no GEMM data)."""
    gemms = [name for name in groups if by_name[name].gemm_k]
    if not gemms:
        return 0
    name = max(gemms, key=lambda g: by_name[g].flops_per_token)
    rows, op = groups[name], by_name[name]
    n, t = _num(rows, "num_tokens"), _num(rows, "time_s")
    if n.max() < 256:               # too few tokens for a second wave: nothing to learn
        return 0
    test = heldout_mask(len(rows))
    nbytes = op.bytes(n)
    errs = {}
    for sms in SM_CANDIDATES:
        errs[sms] = min(_sse(_fit_hinge(op.wave_flops(n, tm, tn, sms), nbytes, t, test)[1], t, ~test)
                        for tm, tn in ((128, 128), (128, 256), (256, 128)))
    return min(errs, key=errs.get)


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
    t_all = _num(data, "time_s") if len(data) else np.zeros(0)
    if (t_all <= 0).any():
        raise ValueError("calibration data: time_s must be positive")
    parts: list[_Part] = []
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
    num_sms = _fit_num_sms(groups, by_name)
    for op_name, rows in groups.items():
        op = by_name[op_name]
        n = _num(rows, "num_tokens")
        t = _num(rows, "time_s")
        test = heldout_by_key(n)
        nbytes = op.bytes(n)
        if op.gemm_k and num_sms:
            coef, pred, flops = _fit_gemm(op, n, nbytes, t, test, num_sms)
        else:
            flops = op.flops(n)
            coef, pred = _fit_hinge(flops, nbytes, t, test, floor=op.flops_per_token == 0)
        profile["ops"][op_name] = _coef_dict(coef)
        parts.append(_Part(f"op:{op_name}", n, t, pred, rl.ops[op_name].time(op.flops(n), nbytes),
                           test, (~test).sum()))
    layer = _layer_total([p for p in parts if p.name.startswith("op:")], shapes)
    if layer is not None:
        parts.append(layer)

    # ---- copy bandwidth -> elementwise ops nobody measured
    copy_rows = data[data["kind"] == "copy"]
    if len(copy_rows):
        nb = 2.0 * _num(copy_rows, "nbytes")          # read + write
        t = _num(copy_rows, "time_s")
        test = heldout_mask(len(copy_rows))
        coef, pred = _fit_hinge(np.zeros_like(nb), nb, t, test, floor=True)
        parts.append(_Part("copy", nb / 2, t, pred, rl.ops["residual_add"].time(0.0, nb),
                           test, (~test).sum()))
        profile["measured_copy_bandwidth_gbps"] = float(f"{1e-9 / coef.sec_per_byte:.4g}") \
            if coef.sec_per_byte else None
        for op in shapes.ops:
            if op.flops_per_token == 0 and op.name not in profile["ops"]:
                profile["ops"][op.name] = _coef_dict(coef)

    # ---- attention
    rows = data[data["kind"] == "prefill_attention"]
    if len(rows):
        c, p, t = _num(rows, "prefill_chunk"), _num(rows, "prefill_context"), _num(rows, "time_s")
        test = heldout_mask(len(rows))
        flops, nbytes = prefill_attention_work(attn_shapes, c, p)
        coef, pred = _fit_prefill_attention(attn_shapes, c, p, flops, nbytes, t, test)
        profile["prefill_attention"] = _coef_dict(coef)
        parts.append(_Part("prefill_attention", c * (p + c / 2), t, pred,
                           rl.prefill_attention.time(flops, nbytes), test, (~test).sum()))
    rows = data[data["kind"] == "decode_attention"]
    if len(rows):
        n, ctx, t = _num(rows, "num_decode"), _num(rows, "decode_context"), _num(rows, "time_s")
        test = heldout_mask(len(rows))
        flops, nbytes = decode_attention_work(attn_shapes, n, n * ctx)
        coef, pred = _fit_hinge(flops, nbytes, t, test, extra=n, extra_names=("sec_per_token",),
                                floor=True)
        profile["decode_attention"] = _coef_dict(coef)
        parts.append(_Part("decode_attention", n * ctx, t, pred,
                           rl.decode_attention.time(flops, nbytes), test, (~test).sum()))

    # ---- communication and CPU overhead
    rows = data[data["kind"] == "allreduce"]
    if len(rows):
        k = _num(rows, "tp")
        if (k == tp).any() and tp > 1:
            rows, k = rows[k == tp], k[k == tp]
        nb = _num(rows, "nbytes")
        t = _num(rows, "time_s")
        ring = 2.0 * (k - 1) / k * nb
        test = heldout_mask(len(rows))
        x = relative_nnls(np.column_stack([ring, np.ones_like(ring)])[~test], t[~test])
        profile["allreduce"] = {"sec_per_byte": float(f"{x[0]:.6g}"), "const_s": float(f"{x[1]:.6g}")}
        parts.append(_Part("allreduce", nb, t, x[0] * ring + x[1],
                           rl.allreduce.sec_per_byte * ring + rl.allreduce.const_s,
                           test, (~test).sum()))
    rows = data[data["kind"] == "overhead"]
    if len(rows):
        r, t = _num(rows, "num_requests"), _num(rows, "time_s")
        test = heldout_mask(len(rows))
        x = relative_nnls(np.column_stack([np.ones_like(r), r])[~test], t[~test])
        profile["overhead"] = {"const_s": float(f"{x[0]:.6g}"), "sec_per_request": float(f"{x[1]:.6g}")}
        parts.append(_Part("overhead", r, t, x[0] + x[1] * r,
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
        parts.append(_fit_mixed_decode(rows, profile, attn_shapes, rl))

    # ---- whole-layer steps: validation of the assembled per-layer model
    rows = data[data["kind"] == "layer_step"]
    if len(rows):
        parts.append(_validate_steps("layer_step", rows, profile, model, gpu, tp, attn_shapes))

    profile["errors"] = {p.name: p.errors() for p in parts}
    profile["heldout"] = {p.name: p.heldout() for p in parts}
    return profile


def _layer_total(op_parts: list, shapes: RankShapes):
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
    return _Part("layer_linear_ops", xs, tot["measured"], tot["fitted"], tot["roofline"],
                 test, int((~test).sum()))


def _fit_mixed_decode(rows, profile, shapes, rl) -> _Part:
    """Fit the decode part of mixed steps: measured minus the fitted prefill part.

    ``max(floor, b * decode KV bytes) + c + d * decodes`` on the residual, in
    relative terms of the whole step (vLLM's tables: mixed steps cost ~1.5x
    the sum of their pure prefill and pure decode parts).
    """
    from kvsim.cost.step_model import OpCoefficients as C
    pc, pp = _num(rows, "prefill_chunk"), _num(rows, "prefill_context")
    nd, dc = _num(rows, "num_decode"), _num(rows, "decode_context")
    t = _num(rows, "time_s")
    test = heldout_mask(len(rows))
    train = ~test
    pre = prefill_attention_layer_time(C(**profile["prefill_attention"]), shapes, pc, pp)
    _, nbytes = decode_attention_work(shapes, nd, nd * dc)
    design = np.column_stack([nbytes, nd, np.ones_like(t)]) / t[:, None]
    from kvsim.cost.nnls import nnls
    x = nnls(design[train], ((t - pre) / t)[train])
    coef = OpCoefficients(0.0, float(x[0]), float(x[2]), sec_per_token=float(x[1]))
    profile["mixed_decode_attention"] = _coef_dict(coef)
    fitted = pre + decode_attention_layer_time(coef, shapes, nd, nd * dc)
    roof = (prefill_attention_layer_time(rl.prefill_attention, shapes, pc, pp)
            + decode_attention_layer_time(rl.decode_attention, shapes, nd, nd * dc))
    return _Part("mixed_attention", pc + nd, t, fitted, roof, test, int(train.sum()))


def _validate_steps(kind, rows, profile, model, gpu, tp, attn_shapes) -> _Part:
    """Predict measured mixed steps (one layer, or attention alone) from the fitted parts."""
    from kvsim.cost.fitted import OP_FALLBACK
    from kvsim.cost.step_model import OpCoefficients as C
    shapes = rank_shapes(model, tp)
    rl = roofline_cost_model(model, gpu, tp)
    pc, pp = _num(rows, "prefill_chunk"), _num(rows, "prefill_context")
    nd, dc = _num(rows, "num_decode"), _num(rows, "decode_context")
    t = _num(rows, "time_s")

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
    return _Part(kind, pc + nd, t, fitted, roof, test, 0)
