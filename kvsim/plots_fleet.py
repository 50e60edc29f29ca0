"""The fleet figure: each replica's load and prefix-cache hit rate over simulated time.

It reads a fleet run's ``steps.csv`` and ``requests.csv`` (both with a
``replica`` column, kvsim/scenario/cluster_outputs.py). The numbers drawn are
computed by two functions that return tables, so a test (or a notebook)
can check them:

* ``replica_load(steps, times)``: each replica's running + waiting requests
  at the given instants, as a gauge scraped then reads it (the state after
  the replica's last step that ended at or before the instant; 0 before its
  first step);
* ``replica_hit_rate(requests, window_s)``: per replica and time window, the
  prompt tokens served from the prefix cache over the prompt tokens of the
  requests *first scheduled* in that window (when vLLM counts a request's
  prefix-cache query and hits, ``record_prefix_cache_stats``).

A router that splits requests evenly can still split the cache unevenly:
under round robin every replica sees every prefix, so the hit rates are
low and alike; under a prefix-aware router they are high, and the load
lines show whether balance was traded for it.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from kvsim.plots import _colors, _new_figure, _require, _suptitle

DEFAULT_SAMPLES = 400        # load samples per replica: enough to see queues, cheap to draw
DEFAULT_WINDOWS = 30         # hit-rate windows over the run when window_s is not given


def replica_load(steps: pd.DataFrame, times: np.ndarray) -> pd.DataFrame:
    """Columns ``time_s``, ``replica``, ``load`` (running + waiting), one row per replica and time."""
    _require("replica-timeline", steps, ["replica", "start_time_s", "duration_s", "num_running",
                                         "num_waiting"], "steps.csv")
    times = np.asarray(times, dtype=float)
    frames = []
    for name, own in steps.groupby("replica", sort=False):
        end = (own["start_time_s"] + own["duration_s"]).to_numpy(dtype=float)
        load = (own["num_running"] + own["num_waiting"]).to_numpy(dtype=np.int64)
        order = np.argsort(end, kind="stable")
        end, load = end[order], load[order]
        last = np.searchsorted(end, times, side="right") - 1
        value = np.where(last >= 0, load[np.maximum(last, 0)], 0)
        frames.append(pd.DataFrame({"time_s": times, "replica": name, "load": value}))
    return pd.concat(frames, ignore_index=True)


def replica_hit_rate(requests: pd.DataFrame, window_s: float) -> pd.DataFrame:
    """Columns ``window_start_s``, ``replica``, ``prompt_tokens``, ``cached_tokens``, ``hit_rate``.

    One row per replica and window in which it first scheduled a request
    (windows ``[k * window_s, (k + 1) * window_s)``); requests never
    scheduled are left out, as vLLM never queried the cache for them.
    """
    _require("replica-timeline", requests, ["replica", "scheduled_time_s", "num_prompt_tokens",
                                            "num_cached_tokens"], "requests.csv")
    if not window_s > 0:
        raise ValueError(f"window_s = {window_s!r}: must be > 0")
    seen = requests[requests["scheduled_time_s"].notna()]
    window = np.floor(seen["scheduled_time_s"].to_numpy(dtype=float) / window_s).astype(np.int64)
    table = (seen.assign(window=window)
             .groupby(["replica", "window"], sort=False)[["num_prompt_tokens", "num_cached_tokens"]]
             .sum().reset_index())
    # Replicas in the order they first appear in the table, each one's windows in time order.
    rank = {name: k for k, name in enumerate(dict.fromkeys(requests["replica"]))}
    table = table.assign(rank=table["replica"].map(rank)).sort_values(["rank", "window"], kind="stable")
    return pd.DataFrame({
        "window_start_s": table["window"].to_numpy(dtype=float) * window_s,
        "replica": table["replica"].to_numpy(),
        "prompt_tokens": table["num_prompt_tokens"].to_numpy(dtype=np.int64),
        "cached_tokens": table["num_cached_tokens"].to_numpy(dtype=np.int64),
        "hit_rate": (table["num_cached_tokens"] / table["num_prompt_tokens"]).to_numpy(dtype=float),
    })


def replica_timeline(steps: pd.DataFrame, requests: pd.DataFrame, *, window_s: float | None = None,
                     samples: int = DEFAULT_SAMPLES, title: str | None = None) -> Figure:
    """Load (top) and prefix-cache hit rate (bottom) of every replica over time.

    The load line of replica ``k`` is ``replica_load`` at ``samples`` evenly
    spaced instants from 0 to the last step's end; its hit-rate line joins
    the points of ``replica_hit_rate`` drawn at their window's middle. The
    figure's lines are, in order, replica by replica: load lines in the top
    axes, hit-rate lines in the bottom axes (``fig.axes[0].lines``,
    ``fig.axes[1].lines``).
    """
    _require("replica-timeline", steps, ["replica", "start_time_s", "duration_s"], "steps.csv")
    end = float((steps["start_time_s"] + steps["duration_s"]).max())
    times = np.linspace(0.0, end, max(int(samples), 2))
    window_s = window_s or nice_window(end)
    load = replica_load(steps, times)
    hits = replica_hit_rate(requests, window_s)
    names = list(dict.fromkeys(steps["replica"]))
    fig = _new_figure((11.0, 7.0))
    ax_load, ax_hit = fig.subplots(2, 1, sharex=True)
    for color, name in zip(_colors(len(names)), names):
        own = load[load["replica"] == name]
        ax_load.plot(own["time_s"], own["load"], color=color, lw=1.0, label=name)
        mine = hits[hits["replica"] == name]
        ax_hit.plot(mine["window_start_s"] + window_s / 2, mine["hit_rate"] * 100, "o-", ms=3,
                    color=color, lw=1.0, label=name)
    ax_load.set_ylabel("Requests running + waiting")
    ax_hit.set_ylabel("Prefix cache hit rate (%)")
    ax_hit.set_ylim(0, 105)
    ax_hit.set_xlabel("Simulated time (s)")
    ax_hit.set_title(f"prompt tokens served from the cache / prompt tokens, per {window_s:g} s "
                     f"window, by when a request was first scheduled", fontsize="small")
    for ax in (ax_load, ax_hit):
        ax.grid(True, alpha=0.3)
    if len(names) <= 16:
        ax_load.legend(fontsize="x-small", ncol=min(len(names), 8), loc="upper left")
    _suptitle(fig, title, "load and prefix-cache hit rate per replica")
    return fig


def nice_window(duration_s: float, windows: int = DEFAULT_WINDOWS) -> float:
    """A round window length (1, 2 or 5 times a power of ten) giving about ``windows`` windows."""
    if not duration_s > 0:
        return 1.0
    raw = duration_s / windows
    power = 10.0 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def fleet_plan_gpus(table: pd.DataFrame, title: str | None = None) -> Figure:
    """A fleet plan (``kvsim plan`` with ``plan.fleet``): GPUs each candidate needs, per router.

    One group of bars per candidate, one bar per router, its height the
    plan's ``num_gpus`` and its label the replica count; a row that found no
    fleet size (unreachable, does not fit, error) is an empty slot named by
    its status.
    """
    _require("fleet-plan", table, ["candidate", "router", "status", "num_gpus", "replicas"], "plan.csv")
    candidates = list(dict.fromkeys(table["candidate"]))
    routers = list(dict.fromkeys(table["router"]))
    width = 0.8 / len(routers)
    fig = _new_figure((max(6.0, 1.8 * len(candidates) * max(1, len(routers) / 2)), 4.5))
    ax = fig.subplots()
    top = float(pd.to_numeric(table["num_gpus"], errors="coerce").max() or 1.0)
    for k, (color, router) in enumerate(zip(_colors(len(routers)), routers)):
        for i, cand in enumerate(candidates):
            row = table[(table["candidate"] == cand) & (table["router"] == router)]
            if not len(row):
                continue
            row = row.iloc[0]
            x = i + (k - (len(routers) - 1) / 2) * width
            if row["status"] == "ok":
                ax.bar(x, row["num_gpus"], width, color=color, label=router if i == 0 else None)
                ax.annotate(f"{int(row['replicas'])}x", (x, row["num_gpus"]), ha="center", va="bottom",
                            fontsize="small")
            else:
                ax.annotate(str(row["status"]), (x, 0.02 * top), ha="center", va="bottom", rotation=90,
                            fontsize="small", color=color)
    ax.set_xticks(range(len(candidates)), candidates)
    ax.set_ylabel("GPUs (replicas x TP)")
    ax.set_ylim(0, top * 1.15)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize="small", title="router")
    _suptitle(fig, title, "fewest GPUs that meet the SLOs at the target rate")
    return fig
