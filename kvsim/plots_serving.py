"""Serving trade-off figures across a sweep: throughput per GPU against speed per user, and cost.

The picture serving benchmarks now use (SemiAnalysis InferenceMAX): every
sweep point is a way to run the model (a batch size, a chunk size, a request
rate); each costs some speed for each user and gives some throughput for each
GPU. ``throughput_interactivity`` draws one against the other with the
Pareto frontier (the points no other point beats on both);
``cost_per_million_tokens`` turns throughput per GPU into dollars given the
price of a GPU-hour.

Definitions (columns of a sweep's results.csv):

* tokens/s per user = 1000 / ``median_tpot_ms`` (``mean_tpot_ms`` with
  ``stat="mean"``): how fast one user sees tokens stream after the first;
* tokens/s per GPU = ``total_token_throughput`` (prompt + output tokens;
  ``output_throughput`` with ``tokens="output"``) / GPUs of the point;
* $ per million tokens = GPUs x $/GPU-hour / (tokens/s x 3600) x 10^6.

GPUs of a point: the column ``gpus`` names (``hardware.tp`` when swept), or a
number for every point.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from kvsim.plots import _colors, _figure, _require, _suptitle

TOKEN_COLUMNS = {"total": "total_token_throughput", "output": "output_throughput"}


def serving_points(results: pd.DataFrame, *, gpus: str | float = 1, stat: str = "median",
                   tokens: str = "total", group: str | None = None) -> pd.DataFrame:
    """One row per usable sweep point: ``per_user``, ``per_gpu``, ``gpus`` and ``group``."""
    if stat not in ("median", "mean"):
        raise ValueError(f"stat = {stat!r}: allowed: median, mean")
    if tokens not in TOKEN_COLUMNS:
        raise ValueError(f"tokens = {tokens!r}: allowed: {', '.join(TOKEN_COLUMNS)}")
    tpot, throughput = f"{stat}_tpot_ms", TOKEN_COLUMNS[tokens]
    needed = [tpot, throughput] + ([gpus] if isinstance(gpus, str) else []) + ([group] if group else [])
    _require("throughput-interactivity", results, needed, "results.csv")
    n_gpus = pd.to_numeric(results[gpus], errors="coerce") if isinstance(gpus, str) else \
        pd.Series(float(gpus), index=results.index)
    if (n_gpus <= 0).any():
        raise ValueError(f"gpus: every point needs a positive number of GPUs (got {gpus!r})")
    points = pd.DataFrame({
        "per_user": 1000.0 / pd.to_numeric(results[tpot], errors="coerce"),
        "per_gpu": pd.to_numeric(results[throughput], errors="coerce") / n_gpus,
        "gpus": n_gpus,
        "group": results[group].astype(str) if group else "",
    })
    # Failed points, and points whose requests all had one output token (no TPOT).
    return points.replace([np.inf, -np.inf], np.nan).dropna().reset_index(drop=True)


def pareto_front(points: pd.DataFrame) -> pd.DataFrame:
    """The points no other point beats on both tokens/s per user and per GPU, by speed per user."""
    ordered = points.sort_values(["per_user", "per_gpu"], ascending=[False, False], kind="stable")
    best, keep = -np.inf, []
    for index, row in ordered.iterrows():
        if row["per_gpu"] > best:
            keep.append(index)
            best = row["per_gpu"]
    return points.loc[keep].sort_values("per_user", kind="stable")


def throughput_interactivity(results: pd.DataFrame, *, gpus: str | float = 1, stat: str = "median",
                             tokens: str = "total", group: str | None = None,
                             title: str | None = None) -> Figure:
    """Tokens/s per GPU (y) against tokens/s per user (x), one colour per ``group``, the frontier in black."""
    points = serving_points(results, gpus=gpus, stat=stat, tokens=tokens, group=group)
    if points.empty:
        raise ValueError("plot 'throughput-interactivity': no sweep point has both a TPOT and a throughput")
    fig, (ax,) = _figure(1)
    groups = sorted(points["group"].unique())
    for color, name in zip(_colors(len(groups)), groups):
        part = points[points["group"] == name].sort_values("per_user", kind="stable")
        ax.plot(part["per_user"], part["per_gpu"], "o-", color=color, alpha=0.8, label=name or "points")
    front = pareto_front(points)
    ax.plot(front["per_user"], front["per_gpu"], "k--", linewidth=1.5, label="Pareto frontier")
    ax.set_xlabel(f"Tokens/s per user (1000 / {stat} TPOT ms)")
    ax.set_ylabel(f"Tokens/s per GPU ({tokens} tokens)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    _suptitle(fig, title, "Throughput per GPU vs interactivity")
    return fig


def cost_per_million_tokens(results: pd.DataFrame, *, gpu_hour_usd: float, gpus: str | float = 1,
                            stat: str = "median", tokens: str = "total", group: str | None = None,
                            title: str | None = None) -> Figure:
    """$ per million tokens (y) against tokens/s per user (x): what interactivity costs."""
    if not gpu_hour_usd > 0:
        raise ValueError(f"gpu_hour_usd = {gpu_hour_usd!r}: the price of a GPU-hour must be > 0")
    points = serving_points(results, gpus=gpus, stat=stat, tokens=tokens, group=group)
    if points.empty:
        raise ValueError("plot 'cost': no sweep point has both a TPOT and a throughput")
    points["usd_per_m"] = dollars_per_million_tokens(points["per_gpu"], gpu_hour_usd)
    fig, (ax,) = _figure(1)
    groups = sorted(points["group"].unique())
    for color, name in zip(_colors(len(groups)), groups):
        part = points[points["group"] == name].sort_values("per_user", kind="stable")
        ax.plot(part["per_user"], part["usd_per_m"], "o-", color=color, label=name or "points")
    ax.set_xlabel(f"Tokens/s per user (1000 / {stat} TPOT ms)")
    ax.set_ylabel(f"Cost per million {tokens} tokens ($)")
    ax.set_title(f"at ${gpu_hour_usd:g} per GPU-hour", fontsize="small")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    _suptitle(fig, title, "Cost per million tokens vs interactivity")
    return fig


def dollars_per_million_tokens(tokens_per_s_per_gpu, gpu_hour_usd: float):
    """$ for 10^6 tokens on GPUs that each make ``tokens_per_s_per_gpu``: price / (rate x 3600) x 10^6."""
    return gpu_hour_usd / (np.asarray(tokens_per_s_per_gpu, dtype=float) * 3600.0) * 1e6
