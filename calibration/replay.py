"""Replay LLMServingSim's real vLLM serving runs through kvsim and compare per-request latencies.

``python -m calibration.replay`` (also run by ``kvsim calibrate report``):

1. fits a profile to the vLLM 0.19 kernel tables of the same GPU and model
   (``llmservingsim/vllm_layerwise``; ``kvsim.cost.published.read_vllm_layerwise``)
   and writes it to ``calibration/profiles/<gpu>_llama-3.1-8b_tp1.json``;
2. turns the run's ``requests.jsonl`` into a kvsim requests file (arrival gaps
   from ``arrival_time``; prompt and output lengths; fresh token ids, since
   the prompts are not published, so no prefix-cache hits);
3. runs ``kvsim.simulate`` with the run's engine arguments (vLLM 0.19 V1,
   chunked prefill, ``max_num_batched_tokens`` 2048, block 16, its
   ``max_num_seqs``, the RTX 4090 run's logged KV capacity of 2,588 blocks);
4. compares TTFT (from ``queued_ts``), TPOT and E2E per request.

The kernel tables exclude CPU time (eager-mode kernel sums), and nothing here
measures vLLM 0.19's CPU time per step, so the profiles take the roofline's
default per-step overhead (1 ms + 20 µs per request, ``roofline.py``). The
replay is sensitive to that term, so it is also run with Vidur's A100
CPU-overhead fit for a 7B model at TP1 (an older vLLM, ~0.8 ms + 42 µs per
request) and both are reported. Neither is fitted to these runs.
Only the Llama-3.1-8B runs are replayed: Qwen3-32B and Qwen3-30B-A3B are not
in kvsim's model catalog, and the RTX 4090 / RTX PRO 6000 are not in its GPU
catalog (inline GPU specs below, datasheet figures).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

REPO_ROOT = Path(__file__).resolve().parents[1]

# Datasheet figures (dense bf16 with fp32 accumulate for the GeForce card).
RTX4090 = {"name": "rtx-4090", "memory_mib": 24564, "hbm_bandwidth_gbps": 1008,
           "bf16_tflops": 165.2, "fp8_tflops": 330.3, "interconnect_bandwidth_gbps": 32,
           "interconnect_latency_us": 35, "pcie_bandwidth_gbps": 32,
           "source": "NVIDIA Ada GPU architecture whitepaper (RTX 4090); inline in calibration/replay.py"}
RTXPRO6000 = {"name": "rtx-pro-6000", "memory_mib": 97887, "hbm_bandwidth_gbps": 1792,
              "bf16_tflops": 503.8, "fp8_tflops": 1007.6, "interconnect_bandwidth_gbps": 64,
              "interconnect_latency_us": 35, "pcie_bandwidth_gbps": 64,
              "source": "NVIDIA RTX PRO 6000 Blackwell Server Edition datasheet; inline in calibration/replay.py"}


@dataclass(frozen=True)
class ServingRun:
    bench_dir: str          # vllm_serving_bench/<bench_dir>
    layerwise_dir: str      # vllm_layerwise/<layerwise_dir>
    gpu: dict
    max_num_seqs: int
    num_gpu_blocks: int | None

    @property
    def profile_name(self) -> str:
        return f"{self.gpu['name']}_llama-3.1-8b_tp1"


RUNS = (
    ServingRun("RTX4090/Llama-3.1-8B", "RTX4090", RTX4090, 256, 2588),
    ServingRun("RTXPRO6000/Llama-3.1-8B", "RTXPRO6000", RTXPRO6000, 128, None),
)


def fit_run_profile(run: ServingRun) -> dict:
    from kvsim.cost.fit import fit_profile
    from kvsim.cost.published import read_vllm_layerwise
    from kvsim.cost.roofline import RooflineParams
    from kvsim.specs import load_gpu, load_model

    rows, src = read_vllm_layerwise(run.layerwise_dir, "meta-llama/Llama-3.1-8B")
    profile = fit_profile(rows, model=load_model("llama-3.1-8b"), gpu=load_gpu(run.gpu), tp=1,
                          name=run.profile_name, sources=[src],
                          description="vLLM 0.19 kernel tables (LLMServingSim); residual adds are "
                                      "fused into vLLM's RMSNorm, so they cost nothing here; CPU "
                                      "overhead not measured: the roofline's default prior.")
    profile["ops"]["residual_add"] = {"sec_per_flop": 0.0, "sec_per_byte": 0.0, "const_s": 0.0}
    prior = RooflineParams()
    profile["overhead"] = {"const_s": prior.step_overhead_s, "sec_per_request": prior.request_overhead_s}
    return profile


def with_vidur_overhead(profile: dict) -> dict:
    """The same profile with Vidur's A100 CPU-overhead fit (Llama-2-7B, TP1): the sensitivity run."""
    from kvsim.cost.fit import fit_profile
    from kvsim.cost.published import read_vidur_overhead
    from kvsim.specs import load_gpu, load_model
    rows, _ = read_vidur_overhead("meta-llama/Llama-2-7b-hf", 1)
    fit = fit_profile(rows, model=load_model("llama-3.1-8b"), gpu=load_gpu("a100-80gb-sxm"),
                      require_attention=False)
    return dict(profile, overhead=fit["overhead"])


def load_bench(run: ServingRun) -> pd.DataFrame:
    from kvsim.cost.published import data_root
    path = data_root() / "llmservingsim" / "vllm_serving_bench" / run.bench_dir / "requests.jsonl"
    df = pd.read_json(path, lines=True, dtype=False)
    df["ttft_s"] = df["first_token_ts"] - df["queued_ts"]
    df["tpot_s"] = (df["last_token_ts"] - df["first_token_ts"]) / (df["output_toks"] - 1).clip(lower=1)
    df["e2e_s"] = df["last_token_ts"] - df["queued_ts"]
    return df


def write_requests_file(bench: pd.DataFrame, path: Path) -> None:
    t0 = bench["arrival_time"].min()
    next_id = 1
    with path.open("w") as f:
        for i, r in enumerate(bench.itertuples()):
            n = int(r.input_toks)
            ids = list(range(next_id, next_id + n))     # unique ids: no accidental prefix hits
            next_id += n
            f.write(json.dumps({"id": str(i), "arrival_time": float(r.arrival_time - t0),
                                "prompt_token_ids": ids, "max_tokens": int(r.output_toks)}) + "\n")


def replay(run: ServingRun, profile_path: Path, workdir: Path) -> pd.DataFrame:
    import kvsim
    from kvsim.cost.fitted import dump_profile, load_profile

    bench = load_bench(run)
    req_file = workdir / f"{run.gpu['name']}_requests.jsonl"
    write_requests_file(bench, req_file)
    engine = {"scheduler": "chunked", "max_num_batched_tokens": 2048, "max_num_seqs": run.max_num_seqs,
              "block_size": 16, "enable_prefix_caching": True, "max_model_len": 8192}
    if run.num_gpu_blocks:
        engine["num_gpu_blocks_override"] = run.num_gpu_blocks
    vidur = workdir / f"{run.profile_name}.vidur_overhead.json"
    vidur.write_text(dump_profile(with_vidur_overhead(load_profile(str(profile_path)))))
    out = {}
    for kind, cost in (("fitted", {"type": "fitted", "profile": str(profile_path)}),
                       ("fitted_v0_overhead", {"type": "fitted", "profile": str(vidur)}),
                       ("roofline", {"type": "roofline"})):
        scenario = {"name": f"replay-{run.gpu['name']}", "model": "llama-3.1-8b",
                    "hardware": {"gpu": run.gpu, "tp": 1}, "engine": engine, "cost_model": cost,
                    "workload": {"requests_file": str(req_file)}}
        res = kvsim.simulate(scenario).requests.copy()
        res["ttft_s"] = res["first_token_time_s"] - res["arrival_time_s"]
        res["tpot_s"] = ((res["finish_time_s"] - res["first_token_time_s"])
                         / (res["num_output_tokens"] - 1).clip(lower=1))
        res["e2e_s"] = res["finish_time_s"] - res["arrival_time_s"]
        res["idx"] = res["request_id"].astype(int)
        out[kind] = res.set_index("idx").sort_index()
    merged = pd.DataFrame({"measured_" + m: bench[m + "_s"].to_numpy() for m in ("ttft", "tpot", "e2e")})
    for kind, res in out.items():
        for m in ("ttft", "tpot", "e2e"):
            merged[f"{kind}_{m}"] = res[f"{m}_s"].to_numpy()
    return merged


def summarize(run: ServingRun, merged: pd.DataFrame) -> list[dict]:
    rows = []
    for m in ("ttft", "tpot", "e2e"):
        row = {"run": run.bench_dir, "metric": m, "measured_mean_s": merged[f"measured_{m}"].mean()}
        for kind in ("fitted", "fitted_v0_overhead", "roofline"):
            ape = (merged[f"{kind}_{m}"] - merged[f"measured_{m}"]).abs() / merged[f"measured_{m}"] * 100
            row[f"{kind}_mean_s"] = merged[f"{kind}_{m}"].mean()
            row[f"{kind}_median_ape"] = float(np.median(ape))
            row[f"{kind}_p90_ape"] = float(np.percentile(ape, 90))
        rows.append(row)
    return rows


def run_all(workdir: Path, profile_dir: Path | None = None, refit: bool = True) -> pd.DataFrame:
    from kvsim.cost.fitted import PROFILE_DIR, dump_profile
    profile_dir = profile_dir or PROFILE_DIR
    workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    for run in RUNS:
        path = profile_dir / f"{run.profile_name}.json"
        if refit or not path.exists():
            path.write_text(dump_profile(fit_run_profile(run)))
        rows += summarize(run, replay(run, path, workdir))
    return pd.DataFrame(rows)


def markdown(summary: pd.DataFrame) -> str:
    lines = [
        "## Serving replay: real vLLM 0.19 runs (LLMServingSim `vllm_serving_bench`)",
        "",
        "300 ShareGPT-like requests at 10 req/s replayed through `kvsim.simulate` with a profile "
        "fitted to the same GPU's vLLM kernel tables (`calibration/replay.py`). Per-request "
        "absolute percentage error, median / p90, and the means (seconds). The kernel tables "
        "hold no CPU time, so the profile's per-step overhead is the roofline's default prior "
        "(1 ms + 20 µs per request); *v0 overhead* reruns it with Vidur's older-vLLM CPU "
        "overhead (~0.8 ms + 42 µs per request) to show how much that unmeasured term matters.",
        "",
        "| run | metric | measured mean | fitted mean | fitted median / p90 APE | v0 overhead "
        "median / p90 | roofline mean | roofline median / p90 APE |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in summary.itertuples():
        lines.append(f"| {r.run} | {r.metric} | {r.measured_mean_s:.3f} | {r.fitted_mean_s:.3f} | "
                     f"{r.fitted_median_ape:.1f} / {r.fitted_p90_ape:.1f} | "
                     f"{r.fitted_v0_overhead_median_ape:.1f} / {r.fitted_v0_overhead_p90_ape:.1f} | "
                     f"{r.roofline_mean_s:.3f} | "
                     f"{r.roofline_median_ape:.1f} / {r.roofline_p90_ape:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        summary = run_all(Path(tmp))
    print(markdown(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
