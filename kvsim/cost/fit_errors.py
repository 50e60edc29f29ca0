"""How a fit is judged: rows held out of it, and its error on them (for ``fit.py``).

Each part of a profile is fitted on a seeded 80% of its rows (``heldout_mask``;
op tables by whole token counts, ``heldout_by_key``) and judged on the other
20%, as is the uncalibrated roofline on the same rows (:class:`FitPart`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvsim.cost.step_model import OpCoefficients

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


def column(df: pd.DataFrame, col: str) -> np.ndarray:
    if col not in df.columns:
        raise ValueError(f"calibration data: rows of kind {df['kind'].iloc[0]!r} need a "
                         f"{col!r} column")
    values = pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=float)
    if np.isnan(values).any():
        raise ValueError(f"calibration data: column {col!r} has missing or non-numeric values "
                         f"in rows of kind {df['kind'].iloc[0]!r}")
    return values


class FitPart:
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


def coef_dict(c: OpCoefficients) -> dict:
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
