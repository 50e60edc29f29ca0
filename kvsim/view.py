"""``kvsim view DIR``: one self-contained HTML page of a run or a sweep.

    kvsim view out/qs              # a `kvsim run --out` folder -> out/qs/index.html
    kvsim view out/sweep           # a `kvsim sweep --out` folder (results.csv)
    kvsim view out/plan            # a `kvsim plan --out` folder (plan.csv, plan.png, runs/)

The page has everything inline: CSS in a ``<style>``, every figure a PNG in a
``data:`` URI, no script but an ``onload`` that marks an image as shown. Its
Content-Security-Policy forbids fetching anything, so it opens from a file or
an e-mail attachment in any browser, with no server and no CDN.

A run page: the summary (vllm bench serve's keys), the KV and batch timelines,
the prefix-cache hit rate per scrape (metrics.csv) and the slowest requests.
A sweep page: every point, the best point for each goal, and the trade-off
figures the results allow (the knob against latency, latency against rate,
throughput per GPU against tokens/s per user).
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
import math
from pathlib import Path

import pandas as pd

CSP = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'")
STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 0.2em 0.6em; text-align: right; }
th { background: #f3f3f3; } td.key, th.key { text-align: left; }
img { max-width: 100%; display: block; margin: 0.5em 0; }
p.note { color: #666; font-size: 0.85em; } div.wide { overflow-x: auto; }
"""
# Summary keys shown on a run page, in sections (metrics/summary.py SUMMARY_KEYS).
RUN_SECTIONS = {
    "Requests and throughput": ["completed", "failed", "duration", "total_input_tokens",
                                "total_output_tokens", "request_throughput", "request_goodput",
                                "output_throughput", "total_token_throughput"],
    "Latency (ms)": [f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el")
                     for s in ("mean", "median", "p90", "p99")],
    "KV cache and batching": ["num_preemptions", "prefix_cache_hit_rate", "num_gpu_blocks",
                              "kv_cache_usage_mean", "kv_cache_usage_max", "max_concurrent_requests",
                              "mean_batch_size"],
}
# Sweep goals: (title, column, higher is better).
GOALS = [("highest goodput", "request_goodput", True),
         ("highest total throughput", "total_token_throughput", True),
         ("lowest p99 TTFT", "p99_ttft_ms", False), ("lowest p99 ITL", "p99_itl_ms", False)]


def render_view(folder: str | Path) -> str:
    """The HTML page of a run folder (summary.json) or a sweep folder (results.csv)."""
    folder = Path(folder)
    if (folder / "results.csv").is_file():
        title, body = _sweep_page(folder)
    elif (folder / "summary.json").is_file():
        title, body = _run_page(folder)
    elif (folder / "plan.csv").is_file():
        title, body = _plan_page(folder)
    else:
        raise FileNotFoundError(f"{folder}: neither a run folder (summary.json, from kvsim run --out), "
                                f"a sweep folder (results.csv, from kvsim sweep --out) nor a plan "
                                f"folder (plan.csv, from kvsim plan --out)")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f"<title>{_e(title)}</title><style>{STYLE}</style></head>\n<body>\n"
            f"<h1>{_e(title)}</h1>\n{body}\n</body></html>\n")


# --------------------------------------------------------------------------- run

def _run_page(folder: Path) -> tuple[str, str]:
    from kvsim import plots

    summary = _summary(folder / "summary.json")
    name = summary.get("scenario") or folder.resolve().name
    parts = [f'<p class="note">kvsim run of <b>{_e(name)}</b> (scheduler {_e(summary.get("scheduler", "?"))}), '
             f"folder {_e(str(folder))}. Times are simulated.</p>"]
    for section, keys in RUN_SECTIONS.items():
        rows = [(k, summary[k]) for k in keys if k in summary]
        if rows:
            parts.append(f"<h2>{_e(section)}</h2>" + _key_value_table(rows))
    steps = _csv(folder / "steps.csv")
    fleet = "replica" in steps.columns if steps is not None else False
    if fleet:                                    # a cluster: scenario/cluster_outputs.py
        parts.append(_fleet_section(summary, steps, _csv(folder / "requests.csv"), name))
    elif steps is not None and len(steps):
        parts.append("<h2>KV cache and queues over time</h2>" + _figure(plots.kv_timeline(steps, name)))
        parts.append("<h2>What each step computes</h2>" + _figure(plots.batch_timeline(steps, name)))
    metrics = _csv(folder / "metrics.csv", needs=("time_s", "vllm:prefix_cache_queries_total",
                                                  "vllm:prefix_cache_hits_total"))
    if metrics is not None and "replica" in metrics.columns:   # the fleet's counters: add them up
        summed = metrics.drop(columns=["replica"]).groupby("time_s", sort=True).sum()
        metrics = pd.DataFrame({"time_s": summed.index.to_numpy(),
                                **{c: summed[c].to_numpy() for c in summed.columns}})
    if metrics is not None and len(metrics) > 1:
        parts.append("<h2>Prefix cache hit rate per scrape (vLLM's counters)</h2>" + _figure(_hit_rate(metrics, name)))
    columns = ["request_id", "arrival_time_s", "e2el_s", "num_prompt_tokens", "num_output_tokens",
               "num_cached_tokens", "num_preemptions", "status"]
    requests = _csv(folder / "requests.csv", needs=("finish_time_s", *columns[:2], *columns[3:]))
    if requests is not None and len(requests):
        slow = requests.assign(e2el_s=requests["finish_time_s"] - requests["arrival_time_s"])
        slow = slow.sort_values("e2el_s", ascending=False, kind="stable").head(10)
        if "replica" in requests.columns:
            columns.insert(1, "replica")
        parts.append("<h2>The ten slowest requests</h2>" + _table(slow[columns]))
    return f"kvsim run: {name}", "\n".join(parts)


# Per-replica columns of a fleet page (summary.json "replicas", kvsim/metrics/fleet.py).
REPLICA_COLUMNS = ["pool", "routed", "completed", "failed", "prefix_cache_hit_rate", "kv_cache_usage_mean",
                   "kv_cache_usage_max", "num_preemptions", "computed_tokens", "median_ttft_ms",
                   "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms"]
FLEET_KEYS = ["num_replicas", "router", "slo_attainment", "imbalance_routed", "imbalance_computed_tokens"]


def _fleet_section(summary: dict, steps: pd.DataFrame, requests: pd.DataFrame | None, name: str) -> str:
    from kvsim import plots_fleet

    parts = ["<h2>Fleet</h2>" + _key_value_table([(k, summary[k]) for k in FLEET_KEYS if k in summary])]
    for title, key in (("Pools", "pools"), ("Replicas", "replicas")):
        rows = summary.get(key) or {}
        if rows:
            table = pd.DataFrame.from_dict(rows, orient="index")
            table = table[[c for c in ["role", "replicas", *REPLICA_COLUMNS] if c in table.columns]]
            parts.append(f"<h2>{title}</h2>" + _table(table.rename_axis("name").reset_index()))
    if requests is not None and len(steps) and len(requests):
        parts.append("<h2>Load and prefix-cache hit rate per replica</h2>"
                     + _figure(plots_fleet.replica_timeline(steps, requests, title=name)))
    return "\n".join(parts)


def _hit_rate(metrics: pd.DataFrame, name: str):
    from kvsim.plots import _figure as new_figure, _suptitle

    queries = metrics["vllm:prefix_cache_queries_total"].diff()
    hits = metrics["vllm:prefix_cache_hits_total"].diff()
    rate = (hits / queries.where(queries > 0)) * 100
    fig, (ax,) = new_figure(1, (11.0, 3.5))
    ax.step(metrics["time_s"], rate, where="pre", color="tab:green")
    ax.set_xlabel("Simulated time (s)")
    ax.set_ylabel("Hit rate (%)")
    ax.set_ylim(0, 105)
    ax.grid(True, alpha=0.3)
    _suptitle(fig, name, "prefix_cache_hits / prefix_cache_queries per scrape interval")
    return fig


# --------------------------------------------------------------------------- sweep

def _sweep_page(folder: Path) -> tuple[str, str]:
    results = _csv(folder / "results.csv")
    if results is None or results.empty:
        raise ValueError(f"{folder / 'results.csv'}: no sweep points")
    names = results["scenario"].dropna().unique() if "scenario" in results.columns else []
    name = str(names[0]) if len(names) == 1 else folder.resolve().name
    swept = [c for c in results.columns if "." in str(c)]
    varying = [c for c in swept if results[c].nunique() > 1]
    ok = results[results["status"] == "ok"] if "status" in results.columns else results
    parts = [f'<p class="note">kvsim sweep <b>{_e(name)}</b>: {len(results)} points, {len(ok)} ran '
             f"({_e(', '.join(varying) or 'nothing varies')}). Times are simulated.</p>"]
    best = _best_points(ok, swept)
    if best is not None:
        parts.append("<h2>Best points</h2>" + _table(best))
    for heading, fig in _sweep_figures(ok, varying, name):
        parts.append(f"<h2>{_e(heading)}</h2>" + _figure(fig))
    shown = [c for c in [*swept, "completed", "request_throughput", "request_goodput",
                         "total_token_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms",
                         "p99_itl_ms", "prefix_cache_hit_rate", "num_preemptions", "status"]
             if c in results.columns]
    parts.append("<h2>Every point</h2>" + _table(results[shown]))
    return f"kvsim sweep: {name}", "\n".join(parts)


def _best_points(ok: pd.DataFrame, swept: list[str]) -> pd.DataFrame | None:
    rows = []
    for goal, column, higher in GOALS:
        if column not in ok.columns:
            continue
        values = pd.to_numeric(ok[column], errors="coerce")
        if values.notna().any():
            at = values.idxmax() if higher else values.idxmin()
            rows.append({"goal": goal, "metric": column, "value": values[at],
                         **{c: ok.loc[at, c] for c in swept}})
    return pd.DataFrame(rows) if rows else None


def _sweep_figures(ok: pd.DataFrame, varying: list[str], name: str):
    from kvsim import plots, plots_serving

    figures, attempts = [], []
    if len(varying) >= 1:
        x = "workload.arrival.rate" if "workload.arrival.rate" in varying else varying[0]
        attempts.append((f"Latency against {x}", lambda: plots.tradeoff(ok, x, title=name)))
    if "workload.arrival.rate" in ok.columns:
        policy = next((c for c in varying if c != "workload.arrival.rate"), None)
        if policy is not None:
            attempts.append(("Latency against request rate", lambda: plots.latency_throughput(
                ok, "workload.arrival.rate", policy, title=name)))
    gpus = "hardware.tp" if "hardware.tp" in ok.columns else 1
    attempts.append(("Throughput per GPU against tokens/s per user", lambda: plots_serving.throughput_interactivity(
        ok, gpus=gpus, title=name)))
    for heading, make in attempts:
        try:
            figures.append((heading, make()))
        except ValueError:
            continue                    # the results lack that figure's columns
    return figures


# --------------------------------------------------------------------------- plan

def _plan_page(folder: Path) -> tuple[str, str]:
    """A ``kvsim plan --out`` folder: the answer, plan.png, every candidate, the runs to replay."""
    table = _csv(folder / "plan.csv", needs=("candidate", "status", "num_gpus"))
    if table is None or table.empty:
        raise ValueError(f"{folder / 'plan.csv'}: no candidates")
    fleet = "router" in table.columns                # a fleet plan: kvsim/plan/fleet.py
    ok = table[table["status"] == "ok"]
    what = "candidate x router rows" if fleet else "candidates"
    parts = [f'<p class="note">kvsim {"fleet " if fleet else ""}plan in folder {_e(str(folder))}: '
             f"{len(table)} {what}, {len(ok)} meet the SLOs. Times are simulated.</p>"]
    gpus = pd.to_numeric(ok["num_gpus"], errors="coerce")
    if gpus.notna().any():
        best = ok[gpus == gpus.min()]
        parts.append("<h2>Fewest GPUs</h2>" + _table(best[[c for c in (
            "candidate", "router", "replicas", "num_gpus", "max_rate_req_s", "prefix_cache_hit_rate",
            "binding", "detail") if c in best.columns]]))
    picture = folder / "plan.png"
    if picture.is_file():
        parts.append("<h2>GPUs per candidate</h2>" + _image(picture.read_bytes(), "plan.png"))
    parts.append(f"<h2>Every {'row' if fleet else 'candidate'}</h2>" + _table(table))
    runs = sorted((folder / "runs").glob("*.yaml")) if (folder / "runs").is_dir() else []
    if runs:
        items = "".join(f"<li><code>kvsim run {_e(str(r))}</code></li>" for r in runs)
        parts.append(f"<h2>Scenarios at the answer</h2><ul>{items}</ul>")
    return f"kvsim plan: {folder.resolve().name}", "\n".join(parts)


# --------------------------------------------------------------------------- html pieces

def _figure(fig) -> str:
    alt = _e(fig.get_suptitle() or "figure")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80)
    fig.clear()                       # release the artists: a sweep page draws several
    return _image(buffer.getvalue(), alt, escaped=True)


def _image(png: bytes, alt: str, *, escaped: bool = False) -> str:
    data = base64.b64encode(png).decode("ascii")
    alt = alt if escaped else _e(alt)
    return f'<img alt="{alt}" src="data:image/png;base64,{data}" onload="this.dataset.loaded=1">'


def _key_value_table(rows) -> str:
    body = "".join(f'<tr><td class="key">{_e(k)}</td><td>{_e(_fmt(v))}</td></tr>' for k, v in rows)
    return f'<table><tr><th class="key">key</th><th>value</th></tr>{body}</table>'


def _table(df: pd.DataFrame) -> str:
    head = "".join(f"<th>{_e(str(c))}</th>" for c in df.columns)
    body = "".join("<tr>" + "".join(f"<td>{_e(_fmt(v))}</td>" for v in row) + "</tr>"
                   for row in df.itertuples(index=False))
    return f'<div class="wide"><table><tr>{head}</tr>{body}</table></div>'


def _fmt(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def _e(text) -> str:
    return html.escape(str(text), quote=True)


def _summary(path: Path) -> dict:
    """A run's summary.json; a broken one is a one-line error naming it."""
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not a UTF-8 text file (byte {exc.start} cannot be decoded)") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(summary, dict):
        raise ValueError(f"{path}: expected a JSON object (kvsim run's summary), got {type(summary).__name__}")
    return summary


def _csv(path: Path, needs: tuple[str, ...] = ()) -> pd.DataFrame | None:
    """A table of the folder (None if absent or empty); a broken one is a
    one-line error naming it and, for missing ``needs`` columns, them."""
    if not path.is_file():
        return None
    try:
        table = pd.read_csv(path)
    except pd.errors.EmptyDataError:
        return None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not a UTF-8 text file (byte {exc.start} cannot be decoded)") from None
    except pd.errors.ParserError as exc:
        raise ValueError(f"{path}: not a readable CSV ({str(exc).splitlines()[0]})") from None
    missing = [c for c in needs if c not in table.columns]
    if missing and len(table):
        raise ValueError(f"{path}: missing column(s) {', '.join(missing)} (not written by kvsim?)")
    return table


# --------------------------------------------------------------------------- CLI

def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "view", help="one self-contained HTML page of a run, sweep or plan folder",
        description="Write one HTML page (inline CSS, figures as inline PNGs, no server, no CDN) "
                    "of a `kvsim run --out DIR`, `kvsim sweep --out DIR` or `kvsim plan --out DIR` folder; "
                    "prints its path.")
    p.add_argument("folder", metavar="DIR", type=Path, help="the folder of a run, a sweep or a plan")
    p.add_argument("--out", type=Path, metavar="FILE.html", help="default: DIR/index.html")
    p.set_defaults(func=view_command)


def view_command(args: argparse.Namespace) -> int:
    from kvsim.scenario.outputs import atomic_open, check_output_file

    page = render_view(args.folder)
    out = args.out or args.folder / "index.html"
    option = "--out" if args.out else "DIR"
    check_output_file(out, option=option)
    with atomic_open(out, option=option) as f:  # an old page stays whole if this fails
        f.write(page)
    print(out)
    return 0
