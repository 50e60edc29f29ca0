"""``kvsim plot KIND --run DIR | --results FILE.csv``: draw one figure to PNG or SVG.

``--run DIR`` is a ``kvsim run --out DIR`` folder (``steps.csv``,
``requests.csv``, ``summary.json``); ``--results`` a sweep's ``results.csv``
(or, for ``memory-waste``, any CSV with one row per system).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from kvsim import plots, plots_serving

# Which input each plot reads.
RUN_KINDS = ("kv-timeline", "batch-timeline")
RESULTS_KINDS = ("tradeoff", "latency-throughput", "memory-waste", "throughput-interactivity", "cost")
FORMATS = (".png", ".svg")


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "plot", help="draw a figure from a run folder or a sweep's results.csv",
        description="Draw one figure (PNG or SVG) from a `kvsim run --out DIR` folder "
                    "(kv-timeline, batch-timeline) or a sweep's results.csv (tradeoff, "
                    "latency-throughput, throughput-interactivity, cost; memory-waste reads a "
                    "CSV with one row per system). Writes KIND.png next to the input unless "
                    "--out says otherwise, and prints the path it wrote.")
    p.add_argument("kind", choices=plots.KINDS, help="which plot")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--run", type=Path, metavar="DIR", help="a `kvsim run --out` folder")
    source.add_argument("--results", type=Path, metavar="FILE.csv", help="a sweep's results.csv")
    p.add_argument("--x", metavar="COL",
                   help="x column: the swept parameter (tradeoff; default: the one swept "
                        "parameter that varies) or the request-rate column "
                        "(latency-throughput; default workload.arrival.rate)")
    p.add_argument("--policy", metavar="COL", default="engine.scheduler",
                   help="latency-throughput, throughput-interactivity, cost: column with one line "
                        "per value (default engine.scheduler; the latter two: only if present)")
    p.add_argument("--slo", nargs="+", metavar="KEY:MS",
                   help="latency-throughput: SLO lines, vLLM --goodput style, e.g. ttft:2000 tpot:100")
    p.add_argument("--gpus", default=None, metavar="N|COL",
                   help="throughput-interactivity, cost: GPUs per point, a number or a column "
                        "(default: hardware.tp if swept, else 1)")
    p.add_argument("--gpu-hour-usd", type=float, metavar="PRICE",
                   help="cost: the price of one GPU-hour in dollars (required)")
    p.add_argument("--stat", choices=("median", "mean"), default="median",
                   help="throughput-interactivity, cost: TPOT statistic for tokens/s per user")
    p.add_argument("--tokens", choices=("total", "output"), default="total",
                   help="throughput-interactivity, cost: count prompt + output tokens, or output only")
    p.add_argument("--steps", metavar="START:END",
                   help="kv-timeline, batch-timeline: only steps START <= step < END "
                        "(either side may be left empty)")
    p.add_argument("--out", type=Path, metavar="FILE.png|.svg",
                   help="where to write (default: KIND.png next to the input)")
    p.add_argument("--title", help="scenario name for the title (default: from the input)")
    p.set_defaults(func=run_plot)
    return p


def run_plot(args: argparse.Namespace) -> int:
    kind = args.kind
    if kind in RUN_KINDS and args.run is None:
        raise ValueError(f"plot '{kind}' reads a run folder: pass --run DIR "
                         f"(the --out of `kvsim run`), not --results")
    if kind in RESULTS_KINDS and args.results is None:
        raise ValueError(f"plot '{kind}' reads a sweep's results.csv: pass --results FILE.csv, "
                         f"not --run")
    out = args.out or (args.run if args.run is not None else args.results.parent) / f"{kind}.png"
    if args.steps and kind not in RUN_KINDS:
        raise ValueError(f"--steps applies to {' and '.join(RUN_KINDS)}, not '{kind}'")
    if out.suffix.lower() not in FORMATS:
        raise ValueError(f"--out {out}: the file must end in .png or .svg")

    if args.run is not None:
        steps = _read_csv(args.run / "steps.csv")
        if args.steps:
            steps = _select_steps(steps, args.steps)
        title = args.title or _run_title(args.run)
        fig = plots.kv_timeline(steps, title) if kind == "kv-timeline" \
            else plots.batch_timeline(steps, title)
    else:
        results = _read_csv(args.results)
        title = args.title or _results_title(results, args.results)
        if kind == "tradeoff":
            fig = plots.tradeoff(results, args.x or _swept_column(results), title=title)
        elif kind == "latency-throughput":
            fig = plots.latency_throughput(results, args.x or "workload.arrival.rate",
                                           args.policy, title=title, slo=_slo(args.slo))
        elif kind in ("throughput-interactivity", "cost"):
            fig = _serving_plot(kind, results, args, title)
        else:
            fig = plots.memory_waste(results, title)

    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    fig.clear()  # release the artists now: a sweep script may draw hundreds of figures
    print(out)
    return 0


def _serving_plot(kind: str, results: pd.DataFrame, args: argparse.Namespace, title: str):
    gpus = args.gpus if args.gpus is not None else ("hardware.tp" if "hardware.tp" in results.columns else 1)
    try:
        gpus = float(gpus)
    except ValueError:
        pass                                     # a column name
    group = args.policy if args.policy in results.columns else None
    common = dict(gpus=gpus, stat=args.stat, tokens=args.tokens, group=group, title=title)
    if kind == "throughput-interactivity":
        return plots_serving.throughput_interactivity(results, **common)
    if args.gpu_hour_usd is None:
        raise ValueError("plot 'cost' needs --gpu-hour-usd PRICE (dollars per GPU-hour)")
    return plots_serving.cost_per_million_tokens(results, gpu_hour_usd=args.gpu_hour_usd, **common)


def _slo(pairs: list[str] | None) -> dict | None:
    """``ttft:2000 tpot:100`` (vLLM's --goodput form) -> {"ttft_ms": 2000.0, "tpot_ms": 100.0}."""
    if not pairs:
        return None
    slo = {}
    for pair in pairs:
        name, _, value = pair.partition(":")
        try:
            limit = float(value)
        except ValueError:
            limit = float("nan")
        if name not in ("ttft", "tpot") or not limit > 0:
            raise ValueError(f"--slo {pair!r}: expected ttft:MS or tpot:MS with a limit > 0 ms")
        slo[f"{name}_ms"] = limit
    return slo


def _read_csv(path: Path) -> pd.DataFrame:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        return pd.read_csv(path)
    except pd.errors.EmptyDataError:
        raise ValueError(f"{path}: the file is empty") from None
    except pd.errors.ParserError as exc:
        raise ValueError(f"{path}: not a readable CSV ({str(exc).splitlines()[0]})") from None


def _run_title(run_dir: Path) -> str:
    """The scenario's name from summary.json when it has one, else the folder's name."""
    summary_path = run_dir / "summary.json"
    if summary_path.is_file():
        try:
            summary = json.loads(summary_path.read_text())
        except json.JSONDecodeError:
            summary = {}
        for key in ("scenario", "name", "scenario_name"):
            if isinstance(summary.get(key), str) and summary[key]:
                return summary[key]
    return run_dir.resolve().name


def _results_title(results: pd.DataFrame, path: Path) -> str:
    """The scenario's name when the sweep recorded one (``scenario`` column), else the folder's."""
    if "scenario" in results.columns:
        names = results["scenario"].dropna().unique()
        if len(names) == 1:
            return str(names[0])
    return path.resolve().parent.name


def _swept_column(results: pd.DataFrame) -> str:
    """The only swept parameter (dotted column) that varies; --x must choose otherwise."""
    swept = [c for c in results.columns if "." in str(c) and results[c].nunique() > 1]
    if len(swept) == 1:
        return swept[0]
    if not swept:
        raise ValueError("plot 'tradeoff': no swept parameter varies in results.csv; "
                         "pass --x COL")
    raise ValueError(f"plot 'tradeoff': several swept parameters vary ({', '.join(swept)}); "
                     f"pass --x COL")


def _select_steps(steps: pd.DataFrame, spec: str) -> pd.DataFrame:
    """Rows with START <= step < END for ``--steps START:END``."""
    start, sep, end = spec.partition(":")
    try:
        lo = int(start) if start.strip() else None
        hi = int(end) if end.strip() else None
    except ValueError:
        lo = hi = sep = None
    if not sep:
        raise ValueError(f"--steps {spec}: expected START:END with integers, e.g. 1000:1200")
    if "step" not in steps.columns:
        raise ValueError("--steps: steps.csv has no 'step' column")
    keep = pd.Series(True, index=steps.index)
    if lo is not None:
        keep &= steps["step"] >= lo
    if hi is not None:
        keep &= steps["step"] < hi
    if not keep.any():
        raise ValueError(f"--steps {spec}: no step in that range (steps.csv has steps "
                         f"{steps['step'].min()}..{steps['step'].max()})")
    return steps[keep]
