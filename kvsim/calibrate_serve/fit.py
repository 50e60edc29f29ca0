"""Fit engine-overhead terms to measured serving runs by replaying them through ``kvsim.simulate``.

Each run's requests are replayed at their measured arrival times with their
measured prompt and output lengths (fresh token ids: the prompts are not in
the results, so no prefix-cache hits), on the run's server settings with the
candidate terms (``cost_model.engine_overhead``) and GPU scale. The fit
minimises, over the training runs, the mean absolute log error of every
request's TTFT, TPOT and E2E latency (a relative error, symmetric, robust to
a few bad requests), by Nelder-Mead on the terms' logarithms (so they stay
positive). The step time is not linear in the terms once queueing sets in,
hence a search over simulations rather than least squares.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from kvsim.calibrate_serve.results import ServingRun
from kvsim.cost.overhead import EngineOverhead
from kvsim.cost.presets import ENGINE_FIT_FORMAT, get_preset

METRICS = ("ttft", "tpot", "e2e")
FIT_TERMS = (*EngineOverhead.field_names(), "gpu_scale")
DEFAULT_TERMS = ("step_s", "per_request_s", "per_prefill_request_s")
# Where the search starts, whatever the preset's values: a fit does not depend on the
# numbers it may replace, so re-running it reproduces a preset made by it.
_START = {"step_s": 1e-3, "per_request_s": 2e-5, "per_prefill_request_s": 1e-4,
          "per_sampled_token_s": 1e-5, "tp_hop_s": 1e-3, "eager_launch_s_per_layer": 2e-5,
          "piecewise_launch_s_per_layer": 5e-6, "gpu_scale": 1.0}


def write_requests_file(measured: pd.DataFrame, path: Path) -> None:
    """The run as a kvsim requests file: measured arrivals and lengths, fresh token ids."""
    next_id = 1
    with path.open("w") as f:
        for i, r in enumerate(measured.itertuples()):
            ids = list(range(next_id, next_id + int(r.input_len)))
            next_id += int(r.input_len)
            f.write(json.dumps({"id": str(i), "arrival_time": float(r.arrival_s),
                                "prompt_token_ids": ids, "max_tokens": int(r.output_len)}) + "\n")


def replay_scenario(run: ServingRun, requests_file: Path, preset: str | None,
                    values: dict[str, float]) -> dict:
    """The run's server scenario on its measured requests, with these engine terms."""
    sc = copy.deepcopy(run.scenario)
    cost = dict(sc.get("cost_model") or {"type": "roofline"})
    if preset:
        cost["engine_preset"] = preset
    terms = {k: v for k, v in values.items() if k != "gpu_scale"}
    if terms:
        base = cost.get("engine_overhead") or {}
        if not isinstance(base, dict):
            raise ValueError(f"run {run.name}: cost_model.engine_overhead must be a mapping "
                             f"when terms are fitted on top of it")
        cost["engine_overhead"] = {**base, **terms}
    if "gpu_scale" in values:
        cost["gpu_scale"] = values["gpu_scale"]
    sc["cost_model"] = cost
    sc["workload"] = {"requests_file": str(requests_file)}
    sc.setdefault("name", f"replay-{run.name}")
    return sc


def replay(run: ServingRun, requests_file: Path, preset: str | None,
           values: dict[str, float]) -> pd.DataFrame:
    """Simulated ttft_s / e2e_s / tpot_s, one row per measured request (same order)."""
    from kvsim.scenario.simulate import simulate
    res = simulate(replay_scenario(run, requests_file, preset, values)).requests
    res = res.assign(idx=res["request_id"].astype(int)).set_index("idx").sort_index()
    # Latencies from when the client sent the request (vllm bench serve), or from
    # when the engine core took it in (LLMServingSim's queued_ts).
    origin = res["queued_time_s" if run.measured.attrs.get("latency_origin") == "queued"
                 else "arrival_time_s"]
    out = pd.DataFrame({"ttft_s": (res["first_token_time_s"] - origin).to_numpy(),
                        "e2e_s": (res["finish_time_s"] - origin).to_numpy()})
    n_out = res["num_output_tokens"].to_numpy()
    out["tpot_s"] = np.where(n_out > 1, (out["e2e_s"] - out["ttft_s"]) / np.maximum(n_out - 1, 1),
                             np.nan)
    failed = (res["status"] != "completed").to_numpy()
    out.loc[failed, ["ttft_s", "e2e_s", "tpot_s"]] = np.nan
    return out


def run_errors(measured: pd.DataFrame, simulated: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Per metric: measured and predicted medians, error of the median, per-request APE median / p90."""
    out = {}
    for m in METRICS:
        meas, sim = measured[f"{m}_s"].to_numpy(), simulated[f"{m}_s"].to_numpy()
        ok = np.isfinite(meas) & (meas > 0)
        ape = np.abs(sim[ok] / meas[ok] - 1) * 100
        ape = np.where(np.isfinite(ape), ape, 100.0)       # a request kvsim failed: 100%
        med_m, med_s = float(np.median(meas[ok])), float(np.nanmedian(sim[ok]))
        out[m] = {"measured_median_s": med_m, "predicted_median_s": med_s,
                  "median_error_pct": (med_s / med_m - 1) * 100,
                  "median_ape": float(np.median(ape)), "p90_ape": float(np.percentile(ape, 90))}
    return out


def _loss(measured: pd.DataFrame, simulated: pd.DataFrame) -> float:
    total = []
    for m in METRICS:
        meas, sim = measured[f"{m}_s"].to_numpy(), simulated[f"{m}_s"].to_numpy()
        ok = np.isfinite(meas) & (meas > 0)
        err = np.abs(np.log(np.maximum(sim[ok], 1e-9) / meas[ok]))
        total.append(float(np.mean(np.where(np.isfinite(err), err, 5.0))))
    return float(np.mean(total))


def nelder_mead(f, x0: np.ndarray, step: float = 0.5, max_evals: int = 60, tol: float = 1e-4):
    """Minimise ``f`` from ``x0`` (deterministic; standard coefficients). Returns (x, f(x), evals)."""
    n = len(x0)
    simplex = [np.array(x0, float)] + [np.array(x0, float) + step * np.eye(n)[i] for i in range(n)]
    values = [f(x) for x in simplex]
    evals = len(values)
    while evals < max_evals:
        order = np.argsort(values, kind="stable")
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if values[-1] - values[0] <= tol:
            break
        centroid = np.mean(simplex[:-1], axis=0)
        reflected = centroid + (centroid - simplex[-1])
        fr = f(reflected)
        evals += 1
        if fr < values[0]:
            expanded = centroid + 2.0 * (centroid - simplex[-1])
            fe = f(expanded)
            evals += 1
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = centroid + 0.5 * (simplex[-1] - centroid)
            fc = f(contracted)
            evals += 1
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:                                   # shrink toward the best
                for i in range(1, n + 1):
                    simplex[i] = simplex[0] + 0.5 * (simplex[i] - simplex[0])
                    values[i] = f(simplex[i])
                    evals += 1
    best = int(np.argmin(values))
    return simplex[best], values[best], evals


@dataclass
class ServeFit:
    """The result of ``kvsim calibrate serve``."""

    preset: str
    terms: tuple[str, ...]
    values: dict[str, float]                          # fitted terms (the preset's for the rest)
    start: dict[str, float]                           # the preset's values of the fitted terms
    errors: dict[str, dict] = field(default_factory=dict)        # run -> metric -> errors (fitted)
    baseline: dict[str, dict] = field(default_factory=dict)      # the same with the preset's terms
    splits: dict[str, str] = field(default_factory=dict)
    evals: int = 0

    def as_json(self) -> dict:
        overhead = {k: v for k, v in self.values.items() if k != "gpu_scale"}
        return {"format": ENGINE_FIT_FORMAT, "engine_preset": self.preset,
                "engine_overhead": overhead, "gpu_scale": self.values.get("gpu_scale", 1.0),
                "fitted_terms": list(self.terms), "preset_values": self.start,
                "runs": {name: {"split": self.splits[name], "fitted": self.errors[name],
                                "preset": self.baseline[name]} for name in self.errors},
                "simulations": self.evals}


def fit_serving_runs(runs: list[ServingRun], workdir: Path, *, preset: str,
                     terms=DEFAULT_TERMS, max_evals: int = 60) -> ServeFit:
    """Fit ``terms`` of ``preset`` to the runs whose split is "train"; errors for every run."""
    spec = get_preset(preset)
    for t in terms:
        if t not in FIT_TERMS:
            raise ValueError(f"fit: {t!r} is not a term; allowed: {', '.join(FIT_TERMS)}")
    train = [r for r in runs if r.split == "train"]
    if terms and not train:
        raise ValueError("runs: no run has split: train; nothing to fit on")
    workdir.mkdir(parents=True, exist_ok=True)
    files = {}
    for i, run in enumerate(runs):
        files[run.name] = workdir / f"requests_{i}.jsonl"
        write_requests_file(run.measured, files[run.name])
    preset_values = {**spec.overhead.as_dict(), "gpu_scale": 1.0}
    start = {t: preset_values[t] for t in terms}
    evals = 0

    def values_of(x) -> dict[str, float]:
        return {t: float(math.exp(v)) for t, v in zip(terms, x)}

    def loss(x) -> float:
        nonlocal evals
        evals += 1
        vals = values_of(x)
        return float(np.mean([_loss(r.measured, replay(r, files[r.name], preset, vals))
                              for r in train]))

    fitted = {}
    if terms:
        x0 = np.log([_START[t] for t in terms])
        x, _, _ = nelder_mead(loss, x0, max_evals=max_evals)
        fitted = values_of(x)
    out = ServeFit(preset, tuple(terms), {**preset_values, **fitted}, start, evals=evals,
                   splits={r.name: r.split for r in runs})
    for run in runs:
        out.errors[run.name] = run_errors(run.measured, replay(run, files[run.name], preset, fitted))
        out.baseline[run.name] = run_errors(run.measured, replay(run, files[run.name], preset, {}))
    return out


def markdown(fit: ServeFit) -> str:
    """The fit as a markdown table: per run and metric, preset vs fitted errors."""
    terms = ", ".join(f"`{t}` {fit.start[t]:.4g} -> {fit.values[t]:.4g}" for t in fit.terms)
    lines = [f"Preset `{fit.preset}`; fitted on the *train* runs ({fit.evals} simulations): "
             f"{terms or 'nothing (evaluation only)'}.", "",
             "| run | split | metric | measured median | preset: median error / per-request "
             "median APE | fitted: median error / per-request median APE |",
             "|---|---|---|---|---|---|"]
    for name, per_metric in fit.errors.items():
        for m in METRICS:
            e, b = per_metric[m], fit.baseline[name][m]
            lines.append(f"| {name} | {fit.splits[name]} | {m} | {e['measured_median_s']:.4g} s | "
                         f"{b['median_error_pct']:+.1f}% / {b['median_ape']:.1f}% | "
                         f"{e['median_error_pct']:+.1f}% / {e['median_ape']:.1f}% |")
    return "\n".join(lines)
