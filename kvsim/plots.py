"""The figures ``kvsim plot`` draws, one function per plot.

Every function takes DataFrames (the tables a run or a sweep wrote) and returns
a :class:`matplotlib.figure.Figure`. Figures are built with the object API on
the Agg canvas, never through pyplot, so library code touches no global state
and works headless; save with ``fig.savefig("x.png")`` or ``"x.svg"``.

A table that lacks a column a plot needs gives a ValueError naming the plot,
the missing columns and the columns present.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator

KINDS = ("tradeoff", "latency-throughput", "kv-timeline", "batch-timeline", "memory-waste",
         "throughput-interactivity", "cost")      # the last two: kvsim/plots_serving.py

MEMORY_COLUMNS = ("used_bytes", "reserved_unused_bytes", "internal_fragmentation_bytes",
                  "external_fragmentation_bytes")

_SIZE_IN = (11.0, 4.5)


# --- sweeps: results.csv --------------------------------------------------------


def tradeoff(results: pd.DataFrame, x: str, *, title: str | None = None) -> Figure:
    """A swept knob against p50/p99 ITL (left) and p50/p99 TTFT (right).

    The chunk-size picture: a larger ``max_num_batched_tokens`` lets prefills
    through faster (TTFT falls) but makes the decode steps they share longer
    (ITL rises). Other swept parameters that vary get one line each.
    """
    needed = [x, "median_itl_ms", "p99_itl_ms", "median_ttft_ms", "p99_ttft_ms"]
    _require("tradeoff", results, needed, "results.csv")
    fig, (ax_itl, ax_ttft) = _figure(2)
    groups = _series(results, x, fixed=[])
    for color, (label, part) in zip(_colors(len(groups)), groups):
        for ax, metric in ((ax_itl, "itl"), (ax_ttft, "ttft")):
            ax.plot(part[x], part[f"median_{metric}_ms"], "o-", color=color,
                    label=_join(label, "p50"))
            ax.plot(part[x], part[f"p99_{metric}_ms"], "s--", color=color,
                    label=_join(label, "p99"))
    for ax, name in ((ax_itl, "Inter-token latency"), (ax_ttft, "Time to first token")):
        ax.set_xlabel(_axis_name(x))
        ax.set_ylabel(f"{name} (ms)")
        ax.set_title(name)
        _maybe_log_x(ax, results[x])
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    _suptitle(fig, title, f"ITL and TTFT vs {_axis_name(x)}")
    return fig


def latency_throughput(results: pd.DataFrame, rate_col: str = "workload.arrival.rate",
                       policy_col: str = "engine.scheduler", *,
                       title: str | None = None, slo: dict | None = None) -> Figure:
    """Request rate against TTFT (left) and TPOT (right) percentiles, a line per policy.

    Past the knee the queue grows without bound and TTFT leaves the chart, so
    its axis turns logarithmic when the values span more than two decades.
    ``slo`` (``{"ttft_ms": 2000, "tpot_ms": 100}``) draws each limit as a
    horizontal line: the highest rate whose p99 stays under it is the capacity.
    """
    needed = [rate_col, policy_col, "median_ttft_ms", "p99_ttft_ms",
              "median_tpot_ms", "p99_tpot_ms"]
    _require("latency-throughput", results, needed, "results.csv")
    fig, (ax_ttft, ax_tpot) = _figure(2)
    groups = _series(results, rate_col, fixed=[policy_col])
    for color, (label, part) in zip(_colors(len(groups)), groups):
        for ax, metric in ((ax_ttft, "ttft"), (ax_tpot, "tpot")):
            ax.plot(part[rate_col], part[f"median_{metric}_ms"], "o-", color=color,
                    label=_join(label, "p50"))
            ax.plot(part[rate_col], part[f"p99_{metric}_ms"], "s--", color=color,
                    label=_join(label, "p99"))
    for ax, metric, name in ((ax_ttft, "ttft", "Time to first token"),
                             (ax_tpot, "tpot", "Time per output token")):
        ax.set_xlabel("Request rate (req/s)")
        ax.set_ylabel(f"{name} (ms)")
        ax.set_title(name)
        if (slo or {}).get(f"{metric}_ms"):
            ax.axhline(slo[f"{metric}_ms"], color="black", linestyle=":",
                       label=f"SLO {slo[f'{metric}_ms']:g} ms")
        values = pd.to_numeric(results[f"p99_{metric}_ms"], errors="coerce")
        values = values[values > 0]
        if len(values) and values.max() / values.min() > 100:
            ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    _suptitle(fig, title, "Latency vs request rate")
    return fig


# --- one run: steps.csv -----------------------------------------------------------


def kv_timeline(steps: pd.DataFrame, title: str | None = None) -> Figure:
    """KV usage, running and waiting requests, and preemptions over simulated time.

    Each step's values are the state after it, drawn from the step's end.
    """
    needed = ["start_time_s", "duration_s", "kv_cache_usage", "num_running", "num_waiting",
              "num_preempted"]
    _require("kv-timeline", steps, needed, "steps.csv")
    t = (steps["start_time_s"] + steps["duration_s"]).to_numpy(dtype=float)
    fig = _new_figure((11.0, 7.5))
    ax_kv, ax_req, ax_pre = fig.subplots(3, 1, sharex=True,
                                         gridspec_kw={"height_ratios": [2, 2, 1]})
    ax_kv.step(t, steps["kv_cache_usage"].to_numpy(dtype=float) * 100, where="post",
               color="tab:blue")
    ax_kv.set_ylim(0, 105)
    ax_kv.set_ylabel("KV cache usage (%)")
    ax_req.step(t, steps["num_running"], where="post", label="running", color="tab:green")
    ax_req.step(t, steps["num_waiting"], where="post", label="waiting", color="tab:orange")
    ax_req.set_ylabel("Requests")
    ax_req.legend(fontsize="small", loc="upper left")
    preempted = steps["num_preempted"].to_numpy(dtype=float)
    hit = preempted > 0
    ax_pre.vlines(t[hit], 0, preempted[hit], color="tab:red")
    ax_pre.set_ylim(bottom=0)
    ax_pre.set_ylabel("Preemptions\n(per step)")
    ax_pre.set_xlabel("Simulated time (s)")
    ax_pre.set_title(f"{int(preempted.sum())} preemptions in total", fontsize="small")
    for ax in (ax_kv, ax_req, ax_pre):
        ax.grid(True, alpha=0.3)
    _suptitle(fig, title, "KV cache and queues over time")
    return fig


def batch_timeline(steps: pd.DataFrame, title: str | None = None,
                   token_budget: int | None = None, max_bins: int = 600) -> Figure:
    """Per step, decode tokens (bottom) and prefill tokens (top), stacked.

    Prefill-first ``continuous`` batching shows tall prefill-only steps with no
    decode under them (stalls); decode-first ``chunked`` shows a steady decode
    band with prefill chunks filling the budget above it. Runs longer than
    ``max_bins`` steps are drawn as the mean per step over equal groups of
    consecutive steps (a single step would be thinner than a pixel); select a
    range of steps first to see every step.
    """
    needed = ["step", "num_prefill_tokens", "num_decode_tokens"]
    _require("batch-timeline", steps, needed, "steps.csv")
    step = steps["step"].to_numpy(dtype=float)
    decode = steps["num_decode_tokens"].to_numpy(dtype=float)
    prefill = steps["num_prefill_tokens"].to_numpy(dtype=float)
    per = int(np.ceil(len(step) / max_bins))
    if per > 1:
        groups = np.arange(len(step)) // per
        counts = np.bincount(groups)
        decode = np.bincount(groups, decode) / counts
        prefill = np.bincount(groups, prefill) / counts
        step = step[::per]
    # One filled band per series (not one bar per step) keeps long runs cheap.
    edges = np.append(step, step[-1] + per)
    fig, (ax,) = _figure(1)
    ax.fill_between(edges, 0, np.append(decode, decode[-1:]), step="post",
                    color="tab:blue", label="decode tokens", linewidth=0)
    top = decode + prefill
    ax.fill_between(edges, np.append(decode, decode[-1:]), np.append(top, top[-1:]),
                    step="post", color="tab:orange", label="prefill tokens", linewidth=0)
    if token_budget:
        ax.axhline(token_budget, color="black", linestyle=":", linewidth=1,
                   label=f"max_num_batched_tokens = {token_budget}")
    ax.set_xlabel("Engine step")
    ax.set_ylabel("Tokens scheduled in the step" if per == 1
                  else f"Tokens per step (mean of {per} steps)")
    ax.set_ylim(bottom=0)
    ax.set_xlim(edges[0], edges[-1])
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small", loc="upper right")
    _suptitle(fig, title, "Prefill and decode tokens per step")
    return fig


# --- memory: one row per system -----------------------------------------------------


def memory_waste(df: pd.DataFrame, title: str | None = None) -> Figure:
    """Stacked bars per system: bytes holding tokens, reserved-but-unused,
    internal and external fragmentation (and free, when given).

    The columns are those of ``kvsim.kv.contiguous.ContiguousUsage``; the
    percentage above a bar is the waste (reserved + both fragmentations) over
    the bytes not free.
    """
    _require("memory-waste", df, ["system", *MEMORY_COLUMNS], "the memory table")
    parts = list(MEMORY_COLUMNS) + (["free_bytes"] if "free_bytes" in df.columns else [])
    labels = {"used_bytes": "holding tokens", "reserved_unused_bytes": "reserved, unused",
              "internal_fragmentation_bytes": "internal fragmentation",
              "external_fragmentation_bytes": "external fragmentation", "free_bytes": "free"}
    colors = {"used_bytes": "tab:green", "reserved_unused_bytes": "tab:orange",
              "internal_fragmentation_bytes": "tab:red",
              "external_fragmentation_bytes": "tab:purple", "free_bytes": "lightgray"}
    values = df[parts].apply(pd.to_numeric, errors="raise").to_numpy(dtype=float)
    unit, scale = _byte_unit(values.sum(axis=1).max() if len(values) else 0.0)
    names = [str(s) for s in df["system"]]
    xs = np.arange(len(names))
    fig, (ax,) = _figure(1, size=(max(5.0, 1.6 * len(names) + 3), 5.0))
    bottom = np.zeros(len(names))
    for j, col in enumerate(parts):
        ax.bar(xs, values[:, j] / scale, bottom=bottom, color=colors[col], label=labels[col],
               width=0.6)
        bottom += values[:, j] / scale
    taken = values[:, :4].sum(axis=1)
    waste = values[:, 1:4].sum(axis=1)
    for x, total, w, height in zip(xs, taken, waste, bottom):
        if total > 0:
            ax.annotate(f"{100 * w / total:.0f}% waste", (x, height), ha="center",
                        va="bottom", fontsize="small", xytext=(0, 2),
                        textcoords="offset points")
    ax.set_xticks(xs, names)
    ax.set_ylim(0, max(bottom.max(), 1e-12) * 1.08)  # room for the waste labels
    ax.set_xlabel("System")
    ax.set_ylabel(f"KV memory ({unit})")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(True, axis="y", alpha=0.3)
    _suptitle(fig, title, "Where the KV memory goes")
    return fig


# --- private helpers ------------------------------------------------------------------


def _require(plot: str, df: pd.DataFrame, columns, source: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        present = ", ".join(map(str, df.columns)) or "(none)"
        raise ValueError(f"plot '{plot}' needs column(s) {', '.join(missing)} in {source}; "
                         f"present: {present}")
    if len(df) == 0:
        raise ValueError(f"plot '{plot}': {source} has no rows")


def _new_figure(size) -> Figure:
    fig = Figure(figsize=size, layout="constrained")
    FigureCanvasAgg(fig)  # attach the headless canvas explicitly
    return fig


def _figure(n: int, size=None):
    fig = _new_figure(size or (_SIZE_IN if n > 1 else (9.0, 4.5)))
    axes = fig.subplots(1, n, squeeze=False)[0]
    return fig, list(axes)


def _suptitle(fig: Figure, title: str | None, what: str) -> None:
    fig.suptitle(f"{title}: {what}" if title else what)


def _series(results: pd.DataFrame, x: str, fixed: list[str]):
    """Split ``results`` into lines: one per combination of the ``fixed`` columns
    and of any other swept parameter (dotted column such as ``engine.block_size``)
    that varies. Returns ``[(label, one row per x)]``; rows sharing an x (repeats
    with other seeds) are averaged, and failed points (empty metrics) are skipped."""
    varying = [c for c in results.columns
               if c != x and c not in fixed and "." in str(c) and results[c].nunique() > 1]
    keys = [*fixed, *varying]

    def per_x(part: pd.DataFrame) -> pd.DataFrame:
        metrics = [c for c in part.columns if c != x and c not in keys]
        numeric = part[metrics].apply(pd.to_numeric, errors="coerce")
        return numeric.assign(**{x: part[x]}).groupby(x, sort=True).mean().reset_index()

    if not keys:
        return [("", per_x(results))]
    out = []
    for values, part in results.groupby(keys, sort=True, dropna=False):
        values = values if isinstance(values, tuple) else (values,)
        label = ", ".join(str(v) if k in fixed else f"{_axis_name(k)}={v}"
                          for k, v in zip(keys, values))
        out.append((label, per_x(part)))
    return out


def _colors(n: int):
    palette = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple",
               "tab:brown", "tab:pink", "tab:gray", "tab:olive", "tab:cyan"]
    return [palette[i % len(palette)] for i in range(n)]


def _join(label: str, stat: str) -> str:
    return f"{label} {stat}" if label else stat


def _axis_name(column: str) -> str:
    """``engine.max_num_batched_tokens`` -> ``max_num_batched_tokens``."""
    return str(column).rsplit(".", 1)[-1]


def _maybe_log_x(ax, values: pd.Series) -> None:
    # Swept token budgets are usually powers of two spanning decades.
    numeric = pd.to_numeric(values, errors="coerce").dropna()
    if len(numeric) and (numeric > 0).all() and numeric.max() / numeric.min() >= 16:
        ax.set_xscale("log", base=2)
        ticks = np.unique(numeric.to_numpy(dtype=float))
        if len(ticks) <= 12:  # label the swept values themselves, in plain numbers
            ax.set_xticks(ticks, [f"{v:g}" for v in ticks])
            ax.xaxis.set_minor_locator(NullLocator())


def _byte_unit(largest: float) -> tuple[str, float]:
    for unit, scale in (("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10)):
        if largest >= scale:
            return unit, scale
    return "bytes", 1.0


# --- capacity planning: kvsim plan's table --------------------------------------------


def plan_goodput(table: pd.DataFrame, title: str | None = None) -> Figure:
    """Goodput per GPU (req/s within the SLOs, per GPU) for each ``kvsim plan`` candidate.

    A bar per candidate with the spread over seeds as an error bar (the
    slowest and fastest seed), labelled with the binding constraint and, when
    the plan has a target rate, the GPUs it needs. A candidate that does not
    fit or cannot meet the SLOs at any rate gets an empty slot saying so.
    """
    needed = ["candidate", "status", "goodput_req_s_per_gpu", "max_rate_min", "max_rate_max",
              "tp", "binding", "num_gpus"]
    _require("plan-goodput", table, needed, "plan.csv")
    names = [str(c) for c in table["candidate"]]
    ok = table["status"].isin(["ok", "capped"]).to_numpy()
    per_gpu = pd.to_numeric(table["goodput_req_s_per_gpu"], errors="coerce").fillna(0).to_numpy()
    tp = pd.to_numeric(table["tp"], errors="coerce").fillna(1).to_numpy()
    low = pd.to_numeric(table["max_rate_min"], errors="coerce").to_numpy() / tp
    high = pd.to_numeric(table["max_rate_max"], errors="coerce").to_numpy() / tp
    err = np.nan_to_num(np.vstack([per_gpu - low, high - per_gpu]), nan=0.0).clip(min=0)
    xs = np.arange(len(names))
    fig, (ax,) = _figure(1, size=(max(6.0, 1.7 * len(names) + 3), 5.0))
    colors = {"kv_capacity": "tab:purple", "compute": "tab:blue", "ttft_queueing": "tab:orange"}
    bar_colors = [colors.get(str(b), "tab:gray") for b in table["binding"]]
    ax.bar(xs, np.where(ok, per_gpu, 0), yerr=np.where(ok, err, 0), capsize=4, color=bar_colors,
           width=0.6)
    top = float(np.max(np.where(ok, per_gpu + err[1], 0))) if ok.any() else 1.0
    for x, row, good, value in zip(xs, table.itertuples(index=False), ok, per_gpu):
        if good:
            gpus = "" if pd.isna(row.num_gpus) else f"\n{int(row.num_gpus)} GPUs for target"
            text, y = f"{value:.3g} req/s/GPU\n{row.binding}{gpus}", value + err[1][x]
        else:
            text, y = str(row.status), 0.0
        ax.annotate(text, (x, y), ha="center", va="bottom", fontsize="small", xytext=(0, 3),
                    textcoords="offset points")
    ax.set_xticks(xs, names, rotation=15 if len(names) > 4 else 0)
    ax.set_ylim(0, top * 1.25 if top > 0 else 1.0)
    ax.set_xlabel("Candidate (GPU, TP, knobs)")
    ax.set_ylabel("Goodput per GPU (req/s within SLOs)")
    ax.grid(True, axis="y", alpha=0.3)
    _suptitle(fig, title, "Highest rate within the SLOs, per GPU")
    return fig


# --- known-result reports (kvsim report) ---------------------------------------------


def metric_lines(df: pd.DataFrame, x: str, ys: list[str], *, group: str | None = None,
                 xlabel: str | None = None, ylabels: list[str] | None = None,
                 logx: bool = False, logy: bool = False, title: str | None = None,
                 what: str = "Metrics") -> Figure:
    """One panel per column in ``ys`` against ``x``, a line per value of ``group``.

    A plain line chart for the report figures that no sweep plot covers
    (throughput against latency, savings against width, a knob against a rate).
    """
    _require("metric-lines", df, [x, *ys, *([group] if group else [])], "the table")
    fig, axes = _figure(len(ys), size=(max(7.0, 4.6 * len(ys) + 1.0), 4.0))
    groups = [("", df)] if group is None else [(str(k), part) for k, part in
                                               df.groupby(group, sort=False)]
    for i, (ax, y) in enumerate(zip(axes, ys)):
        for color, (label, part) in zip(_colors(len(groups)), groups):
            part = part.sort_values(x)
            ax.plot(pd.to_numeric(part[x]), pd.to_numeric(part[y]), "o-", color=color,
                    label=label or None)
        ax.set_xlabel(xlabel or _axis_name(x))
        ax.set_ylabel(ylabels[i] if ylabels else y)
        if logx:
            ax.set_xscale("log", base=2)
        if logy:
            ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        if group is not None:
            ax.legend(fontsize="small")
    _suptitle(fig, title, what)
    return fig


def metric_bars(df: pd.DataFrame, label: str, ys: list[str], *,
                ylabels: list[str] | None = None, title: str | None = None,
                what: str = "Metrics") -> Figure:
    """One panel per column in ``ys``: a bar per row, named by the ``label`` column."""
    _require("metric-bars", df, [label, *ys], "the table")
    fig, axes = _figure(len(ys), size=(3.6 * len(ys) + 1.0, 3.8))
    names = [str(v) for v in df[label]]
    xs = np.arange(len(names))
    for i, (ax, y) in enumerate(zip(axes, ys)):
        values = pd.to_numeric(df[y]).to_numpy(dtype=float)
        ax.bar(xs, values, color=_colors(len(names)), width=0.6)
        for xv, v in zip(xs, values):
            ax.annotate(f"{v:.3g}", (xv, v), ha="center", va="bottom", fontsize="small",
                        xytext=(0, 2), textcoords="offset points")
        ax.set_xticks(xs, names)
        ax.set_ylabel(ylabels[i] if ylabels else y)
        ax.set_ylim(0, max(values.max(), 1e-12) * 1.15)
        ax.grid(True, axis="y", alpha=0.3)
    _suptitle(fig, title, what)
    return fig
