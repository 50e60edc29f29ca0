"""Non-negative least squares, and the hinge fit a roofline op needs.

numpy only (scipy is not a kvsim dependency). ``nnls`` is Lawson and Hanson's
active-set algorithm (1974, ch. 23), the one ``scipy.optimize.nnls`` runs; the
problems here have at most a dozen columns, so its cost is negligible.
"""

from __future__ import annotations

import numpy as np


def nnls(a: np.ndarray, b: np.ndarray, max_iter: int | None = None) -> np.ndarray:
    """x >= 0 minimising ||a x - b||_2."""
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    m, n = a.shape
    # Scale columns to unit norm so the tolerance means the same for every feature
    # (FLOPs are ~1e12, constants ~1).
    norms = np.linalg.norm(a, axis=0)
    norms[norms == 0] = 1.0
    a = a / norms
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    w = a.T @ (b - a @ x)
    tol = 10 * np.finfo(float).eps * max(m, n) * max(1.0, np.abs(w).max(initial=0))
    max_iter = max_iter or 3 * n
    for _ in range(max_iter):
        if passive.all() or (w[~passive] <= tol).all():
            break
        j = np.argmax(np.where(passive, -np.inf, w))
        passive[j] = True
        while True:
            s = np.zeros(n)
            s[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (s[passive] > 0).all():
                break
            neg = passive & (s <= 0)
            alpha = np.min(x[neg] / (x[neg] - s[neg]))
            x = x + alpha * (s - x)
            passive &= x > tol
            x[~passive] = 0.0
        x = s
        w = a.T @ (b - a @ x)
    return x / norms


def relative_nnls(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """NNLS on relative errors: minimise sum(((a x - y) / y)^2).

    Timings span four decades (µs to 100 ms); plain least squares would fit
    only the slowest rows, while the report judges percentage errors.
    """
    y = np.asarray(y, dtype=float)
    return nnls(np.asarray(a, dtype=float) / y[:, None], np.ones_like(y))


def fit_roofline_op(flops: np.ndarray, nbytes: np.ndarray, time_s: np.ndarray,
                    extra: np.ndarray | None = None, n_iter: int = 30) -> np.ndarray:
    """Fit ``t = max(a * flops, b * bytes) + c + sum_j d_j * extra[:, j]``, all >= 0.

    A roofline op is compute-bound or memory-bound, never both: the sum
    ``a*flops + b*bytes`` overshoots at the knee by up to 2x. So each row is
    assigned to the regime the current coefficients make binding, an NNLS is
    solved on that piecewise-linear design, and this repeats until the
    assignment stops changing (a hinge fit; it converges in a few rounds).
    ``extra`` holds additive terms (per sequence, per token). Returns
    ``[sec_per_flop, sec_per_byte, const_s, *extra coefficients]``.
    """
    flops = np.asarray(flops, dtype=float)
    nbytes = np.asarray(nbytes, dtype=float)
    time_s = np.asarray(time_s, dtype=float)
    extra = np.zeros((len(time_s), 0)) if extra is None else np.asarray(extra, float).reshape(len(time_s), -1)
    x = relative_nnls(np.column_stack([flops, nbytes, np.ones_like(time_s), extra]), time_s)
    best, best_err = x, np.inf
    # Start the regimes at the split the first (additive) fit suggests, and
    # also try every split of the sorted arithmetic intensity on a coarse grid:
    # the assignment iteration alone can stall in a local optimum.
    intensity = flops / np.maximum(nbytes, 1e-30)
    order_vals = np.unique(np.quantile(intensity, np.linspace(0, 1, 6)))
    starts = [flops * x[0] > nbytes * x[1]] + [intensity > v for v in order_vals]
    for compute in starts:
        prev = None
        for _ in range(n_iter):
            design = np.column_stack([np.where(compute, flops, 0.0),
                                      np.where(compute, 0.0, nbytes),
                                      np.ones_like(time_s), extra])
            x = relative_nnls(design, time_s)
            compute = flops * x[0] >= nbytes * x[1]
            if prev is not None and (compute == prev).all():
                break
            prev = compute
        pred = np.maximum(x[0] * flops, x[1] * nbytes) + x[2] + extra @ x[3:]
        err = float(np.sum(((pred - time_s) / time_s) ** 2))
        if err < best_err:
            best, best_err = x, err
    return np.asarray(best, dtype=float)
