"""Whole-step checks of the cost models against published end-to-end measurements.

* Splitwise (``splitwise/perf_model.csv``): Llama-2-70B at TP 2/4/8 on A100 and
  H100; prompt time of a batch of identical prompts (one prefill step) and
  mean decode time per token. Dropped, as ``MORE.md`` says: the modelled
  ``h100-80gb-pcap`` rows and the TP2 batch-64 rows (not one batch). Decode
  steps are costed at the mean context over the generation
  (prompt + output/2); medians over the repeats.
* Sarathi-Serve artifact points (Yi-34B, TP2, two A100-80GB PCIe with a
  pairwise NVLink bridge, vLLM-based engine, fp16), quoted in the issue.

The checks that read published tables take their folder as ``root``
(``kvsim.cost.published.data_root``: the ``--data`` option of ``kvsim calibrate``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd

from kvsim.cost import build_cost_model
from kvsim.cost.base import BatchShape

SPLITWISE_GPUS = {"a100-80gb": "a100-80gb-sxm", "h100-80gb": "h100-sxm"}


def splitwise_rows(*, root: Path) -> pd.DataFrame:
    df = pd.read_csv(Path(root) / "splitwise" / "perf_model.csv")
    df = df[(df["model"] == "llama2-70b") & df["hardware"].isin(list(SPLITWISE_GPUS))]
    df = df[~((df["tensor_parallel"] == 2) & (df["batch_size"] == 64))]
    keys = ["hardware", "tensor_parallel", "prompt_size", "batch_size", "token_size"]
    return df.groupby(keys)[["prompt_time", "token_time"]].median().reset_index()


def splitwise_predictions(load_model, load_gpu, *, root: Path) -> pd.DataFrame:
    """One row per (config, phase): measured and predicted ms by both models."""
    model = load_model("llama-2-70b")
    out = []
    for (hw, tp), rows in splitwise_rows(root=root).groupby(["hardware", "tensor_parallel"]):
        gpu = load_gpu(SPLITWISE_GPUS[hw])
        models = {"roofline": build_cost_model({"type": "roofline"}, model=model, gpu=gpu, tp=int(tp)),
                  "fitted": build_cost_model({"type": "fitted",
                                              "profile": f"{gpu.name}_llama-2-70b_tp{int(tp)}"},
                                             model=model, gpu=gpu, tp=int(tp))}
        for r in rows.itertuples():
            b, p = int(r.batch_size), int(r.prompt_size)
            prompt = BatchShape.from_lists([p] * b, [0] * b)
            ctx = int(p + r.token_size / 2)
            decode = BatchShape.from_lists([1] * b, [ctx] * b)
            for phase, batch, measured in (("prompt", prompt, r.prompt_time),
                                           ("decode", decode, r.token_time)):
                row = {"hardware": hw, "tp": int(tp), "prompt_size": p, "batch_size": b,
                       "token_size": int(r.token_size), "phase": phase, "measured_ms": measured}
                for name, cm in models.items():
                    row[f"{name}_ms"] = cm.step_time(batch) * 1e3
                out.append(row)
    return pd.DataFrame(out)


SARATHI_POINTS = (
    # (label, new tokens per request, context per request, measured ms)
    ("prefill 128", [128], [0], 48.0),
    ("prefill 1,024", [1024], [0], 214.0),
    ("prefill 4,096", [4096], [0], 758.0),
    ("prefill 8,192", [8192], [0], 1863.0),
    ("prefill 16,384", [16384], [0], 4408.0),
    ("decode batch 1", [1], [128], 46.8),
    ("decode batch 128", [1] * 128, [128] * 128, 189.0),
    ("hybrid 1,021 prefill + 3 decode", [1021, 1, 1, 1], [0, 128, 128, 128], 217.0),
)
SARATHI_PROFILE = "a100-80gb-pcie_yi-34b_tp2"


def sarathi_predictions(load_model, load_gpu) -> pd.DataFrame:
    model = load_model("yi-34b")
    # The testbed's A100 PCIe pairs are bridged by NVLink (catalog note on a100-80gb-pcie).
    gpu = dataclasses.replace(load_gpu("a100-80gb-pcie"), interconnect_bandwidth_gbps=300.0,
                              interconnect_latency_us=25.0)
    models = {"roofline": build_cost_model({"type": "roofline"}, model=model, gpu=gpu, tp=2),
              "fitted": build_cost_model({"type": "fitted", "profile": SARATHI_PROFILE},
                                         model=model, gpu=gpu, tp=2)}
    rows = []
    for label, new, ctx, measured in SARATHI_POINTS:
        batch = BatchShape.from_lists(new, ctx)
        row = {"point": label, "measured_ms": measured}
        for name, cm in models.items():
            row[f"{name}_ms"] = cm.step_time(batch) * 1e3
            row[f"{name}_err_pct"] = (row[f"{name}_ms"] / measured - 1) * 100
        rows.append(row)
    return pd.DataFrame(rows)


def error_summary(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Median and p90 absolute percentage error of each model, per group."""
    def stats(g):
        out = {}
        for name in ("fitted", "roofline"):
            ape = (g[f"{name}_ms"] - g["measured_ms"]).abs() / g["measured_ms"] * 100
            out[f"{name}_median_ape"] = float(np.median(ape))
            out[f"{name}_p90_ape"] = float(np.percentile(ape, 90))
        out["n"] = len(g)
        return pd.Series(out)
    return df.groupby(by).apply(stats, include_groups=False).reset_index()


# ---------------------------------------------------------------- cross-GPU checks

def h100_attention_check(load_model, load_gpu, *, root: Path) -> pd.DataFrame:
    """The H100 profiles' attention (A100 fit, rescaled) against H100 FlashAttention-2 timings.

    ``hf_layerwise_v0/H100/.../Llama-3.1-70B/tp4/attention.csv``: FA2 on
    contiguous K/V, per rank of Llama-3.1-70B at TP4 (16 query / 2 KV heads).
    Prefill ``kv_cache_size`` counts the chunk itself; decode ``kv_cache_size``
    is the batch's total, split evenly. Not a vLLM kernel (no split-KV decode).
    """
    from kvsim.cost.fitted import fitted_cost_model, load_profile
    from kvsim.cost.step_model import decode_attention_layer_time, prefill_attention_layer_time

    df = pd.read_csv(Path(root) / "llmservingsim/hf_layerwise_v0/H100/meta-llama/Llama-3.1-70B/tp4/attention.csv")
    df = df.drop_duplicates(subset=["batch_size", "prefill_chunk_size", "kv_cache_size", "is_prefill"])
    model, gpu = load_model("llama-3.1-70b"), load_gpu("h100-sxm")
    profile = dict(load_profile("h100-sxm_llama-2-70b_tp4"), model=model.name)
    fitted = fitted_cost_model(profile, model, gpu, tp=4)
    roof = build_cost_model({"type": "roofline"}, model=model, gpu=gpu, tp=4)
    out = []
    pre = df[df["is_prefill"]]
    c = pre["prefill_chunk_size"].to_numpy(float)
    p = pre["kv_cache_size"].to_numpy(float) - c
    dec = df[~df["is_prefill"]]
    n = dec["batch_size"].to_numpy(float)
    total = dec["kv_cache_size"].to_numpy(float)
    for name, cm in (("fitted", fitted), ("roofline", roof)):
        out.append(pd.DataFrame({"phase": "prefill", "model": name,
                                 "measured_ms": pre["time_stats.attn_prefill.median"].to_numpy(),
                                 "predicted_ms": prefill_attention_layer_time(
                                     cm.prefill_attention, cm.shapes, c, p) * 1e3}))
        out.append(pd.DataFrame({"phase": "decode", "model": name,
                                 "measured_ms": dec["time_stats.attn_decode.median"].to_numpy(),
                                 "predicted_ms": decode_attention_layer_time(
                                     cm.decode_attention, cm.shapes, n, total - n) * 1e3}))
    return pd.concat(out, ignore_index=True)


def nccl_allreduce_check(load_gpu, *, root: Path) -> pd.DataFrame:
    """All-reduce per call (fp16) against apex_plus NCCL timings on H100 and H200 (2/4/8 GPUs)."""
    from kvsim.cost.fitted import load_profile
    rows = []
    for folder, gpu_name in (("H100-SXM-80GB", "h100-sxm"), ("H200-SXM-141GB", "h200")):
        df = pd.read_csv(Path(root) / "apex_plus" / "comm" / folder / "all_reduce.csv")
        df = df[(df["dtype"] == "half") & (df["num_nodes"] == 1) & (df["size(kb)"] >= 64)]
        gpu = load_gpu(gpu_name)
        for r in df.itertuples():
            tp = int(r.num_gpus_per_node)
            nbytes = float(getattr(r, "_5")) * 1024
            ring = 2.0 * (tp - 1) / tp * nbytes
            row = {"gpu": gpu_name, "tp": tp, "nbytes": nbytes, "measured_ms": float(getattr(r, "_6")) / 1e3}
            roof_bw = gpu.interconnect_bandwidth_gbps * 1e9 * 0.65
            row["roofline_ms"] = (ring / roof_bw + gpu.interconnect_latency_us * 1e-6) * 1e3
            prof = load_profile(f"h100-sxm_llama-2-70b_tp{tp}")["allreduce"] if tp > 1 else None
            row["fitted_ms"] = (prof["sec_per_byte"] * ring + prof["const_s"]) * 1e3
            rows.append(row)
    return pd.DataFrame(rows)
