"""Fit engine-overhead terms (``overhead.EngineOverhead``) to measurements.

Two kinds of measurement, both fitted by non-negative least squares on
relative errors (``nnls.relative_nnls``):

* **whole steps** (``fit_to_steps``): measured step times of known batches
  (``engine_points.StepPoint``) against a GPU model. The step time is linear
  in the CPU terms (``max(kernels, launch) + cpu``), so the GPU model gives the
  rest and NNLS the chosen terms.
* **CPU tables** (``fit_to_vidur_cpu_table``): Vidur's per-step CPU timings of
  the Sarathi-Serve engine against batch size (``vidur/cpu_overheads/*.csv``,
  profiled by ``vidur/profiling/cpu_overhead/benchmark_runner.py`` with
  ``sarathi.LLMEngine``). Its parts map onto the terms as the engine does
  the work: schedule + prepare inputs -> ``step_s`` + ``per_request_s``;
  sampler + output processing -> ``step_s`` + ``per_sampled_token_s``;
  the forward's CPU time (``model_execution_e2e``, kernels launched
  asynchronously) / layers -> ``eager_launch_s_per_layer``; the unaccounted
  step time (``ray_comm_time``) at TP > 1 above its TP1 level -> ``tp_hop_s``.

Serving runs (whole request latencies) need the simulator and are fitted by
``kvsim/calibrate_serve.py``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from kvsim.cost.nnls import nnls, relative_nnls
from kvsim.cost.overhead import EngineOverhead, EngineTiming

LINEAR_TERMS = ("step_s", "per_request_s", "per_prefill_request_s", "per_sampled_token_s",
                "tp_hop_s")


def _features(point, term: str, tp: int) -> float:
    n = len(point.num_new_tokens)
    if term == "step_s":
        return 1.0
    if term == "per_request_s":
        return float(n)
    if term == "per_prefill_request_s":
        return float(sum(1 for t in point.num_new_tokens if t != 1))
    if term == "per_sampled_token_s":
        return float(point.sampled)
    return 1.0 if tp > 1 else 0.0          # tp_hop_s


def step_time(model, point) -> float:
    """``model``'s seconds for a ``StepPoint``."""
    return model.step_time_from_lists(list(point.num_new_tokens), list(point.num_context_tokens),
                                      point.sampled)


def fit_to_steps(gpu_model, engine: EngineTiming, points, terms=("step_s", "per_request_s"),
                 loss: str = "l2") -> EngineTiming:
    """``engine`` with ``terms`` fitted to the measured ``points`` on ``gpu_model``'s kernels.

    The other terms (launch, the unfitted CPU terms) keep ``engine``'s values.
    ``loss``: "l2" minimises squared relative errors, "l1" absolute ones
    (iteratively reweighted; robust to a run-to-run outlier among few rows).
    ``step_s`` and ``tp_hop_s`` cannot both be fitted to points of one TP
    degree (they are the same column): a ValueError says so.
    """
    for term in terms:
        if term not in LINEAR_TERMS:
            raise ValueError(f"fit term {term!r}: only the CPU terms are linear in the step "
                             f"time; allowed: {', '.join(LINEAR_TERMS)}")
    if "step_s" in terms and "tp_hop_s" in terms:
        raise ValueError("fit terms: step_s and tp_hop_s are the same column for points of one "
                         "TP degree; fit one of them")
    zeroed = replace(engine, overhead=engine.overhead.updated({t: 0.0 for t in terms}))
    base_model = gpu_model.with_engine(zeroed)
    measured = np.array([p.measured_s for p in points])
    base = np.array([step_time(base_model, p) for p in points])
    a = np.array([[_features(p, t, engine.tp) for t in terms] for p in points])
    # minimise sum(((base + a x - measured) / measured)^2), x >= 0
    w = 1.0 / measured
    x = nnls(a * w[:, None], (measured - base) * w)
    if loss == "l1":
        for _ in range(50):
            r = np.abs((base + a @ x - measured) * w)
            ww = w / np.sqrt(np.maximum(r, 1e-4))
            x = nnls(a * ww[:, None], (measured - base) * ww)
    elif loss != "l2":
        raise ValueError(f"fit loss {loss!r}; allowed: l1, l2")
    return replace(engine, overhead=engine.overhead.updated(dict(zip(terms, map(float, x)))))


# ---------------------------------------------------------------- Vidur CPU tables

# Decoder layers of the models in Vidur's CPU tables (their Hugging Face configs).
VIDUR_LAYERS = {
    "codellama/CodeLlama-34b-Instruct-hf": 48, "meta-llama/Llama-2-7b-hf": 32,
    "meta-llama/Llama-2-70b-hf": 80, "Qwen/Qwen-72B": 80, "internlm/internlm-20b": 60,
    "microsoft/phi-2": 32,
}
_SCHEDULE_SIDE = ("schedule_median", "prepare_inputs_e2e_median")
_OUTPUT_SIDE = ("sampler_e2e_median", "process_model_outputs_median")


def read_vidur_cpu_table(path: str | Path) -> pd.DataFrame:
    """A Vidur ``cpu_overheads`` CSV; a file without its columns is an error naming one."""
    df = pd.read_csv(path)
    need = (*_SCHEDULE_SIDE, *_OUTPUT_SIDE, "model_execution_e2e_median", "ray_comm_time_mean",
            "model_name", "batch_size", "tensor_parallel_degree")
    for col in need:
        if col not in df.columns:
            raise ValueError(f"{path}: no column {col!r}; a Vidur cpu_overheads table has "
                             f"{', '.join(need)}")
    return df


def fit_to_vidur_cpu_table(df: pd.DataFrame, model_name: str, tp: int,
                           batch_sizes=None) -> EngineOverhead:
    """The engine terms one (model, TP) of a Vidur CPU table implies (seconds).

    ``batch_sizes``: fit on these rows only (the rest can be held out).
    The TP1 level of ``ray_comm_time`` (the loop's unaccounted time on one
    GPU, pooled over the table's TP1 models) goes into ``step_s``; what TP > 1
    adds above it is ``tp_hop_s``.
    """
    rows = df[(df["model_name"] == model_name) & (df["tensor_parallel_degree"] == tp)]
    if rows.empty:
        raise ValueError(f"Vidur CPU table: no rows for model {model_name!r} at TP {tp}; models: "
                         f"{', '.join(sorted(set(df['model_name'])))}")
    if batch_sizes is not None:
        rows = rows[rows["batch_size"].isin(list(batch_sizes))]
    b = rows["batch_size"].to_numpy(float)
    design = np.column_stack([np.ones_like(b), b])
    sched = relative_nnls(design, rows[list(_SCHEDULE_SIDE)].sum(axis=1).to_numpy() * 1e-3)
    out = relative_nnls(design, rows[list(_OUTPUT_SIDE)].sum(axis=1).to_numpy() * 1e-3)
    tp1 = df[df["tensor_parallel_degree"] == 1]["ray_comm_time_mean"]
    base_loop = float(tp1.mean()) * 1e-3 if len(tp1) else 0.0
    hop = max(0.0, float(rows["ray_comm_time_mean"].mean()) * 1e-3 - base_loop) if tp > 1 else 0.0
    layers = VIDUR_LAYERS.get(model_name)
    launch = float(rows["model_execution_e2e_median"].median()) * 1e-3 / layers if layers else 0.0
    return EngineOverhead(step_s=float(sched[0] + out[0]) + base_loop,
                          per_request_s=float(sched[1]), per_sampled_token_s=float(out[1]),
                          tp_hop_s=hop, eager_launch_s_per_layer=launch)


def vidur_cpu_prediction(overhead: EngineOverhead, rows: pd.DataFrame) -> np.ndarray:
    """Seconds of CPU per step (all four parts) the terms give for Vidur rows (decode steps)."""
    b = rows["batch_size"].to_numpy(float)
    return overhead.step_s + (overhead.per_request_s + overhead.per_sampled_token_s) * b


def vidur_cpu_measured(rows: pd.DataFrame, base_loop_s: float = 0.0) -> np.ndarray:
    """The same four parts as measured (s), plus the TP1 loop level the fit puts in ``step_s``."""
    return rows[list(_SCHEDULE_SIDE + _OUTPUT_SIDE)].sum(axis=1).to_numpy() * 1e-3 + base_loop_s
