"""Replay LLMServingSim's real vLLM serving runs through kvsim and compare per-request latencies.

Part of ``kvsim calibrate report`` (and ``python -m calibration.replay``):

1. fits a profile to the vLLM 0.19 kernel tables of the same GPU and model
   (``kvsim.cost.published_runs.fit_run_profile``), or reads the shipped one;
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
catalog (inline GPU specs in ``kvsim/cost/published_runs.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from kvsim.cost.published_runs import RUNS, ServingRun, fit_run_profile, with_vidur_overhead


def load_bench(run: ServingRun, *, root: Path) -> pd.DataFrame:
    path = Path(root) / "llmservingsim" / "vllm_serving_bench" / run.bench_dir / "requests.jsonl"
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


def replay(run: ServingRun, profile_path: Path, workdir: Path, *, root: Path) -> pd.DataFrame:
    from kvsim.cost.fitted import dump_profile, load_profile
    from kvsim.scenario import simulate

    bench = load_bench(run, root=root)
    req_file = workdir / f"{run.gpu['name']}_requests.jsonl"
    write_requests_file(bench, req_file)
    engine = {"scheduler": "chunked", "max_num_batched_tokens": 2048, "max_num_seqs": run.max_num_seqs,
              "block_size": 16, "enable_prefix_caching": True, "max_model_len": 8192}
    if run.num_gpu_blocks:
        engine["num_gpu_blocks_override"] = run.num_gpu_blocks
    vidur = workdir / f"{run.profile_name}.vidur_overhead.json"
    vidur.write_text(dump_profile(with_vidur_overhead(load_profile(str(profile_path)), root=root)))
    out = {}
    for kind, cost in (("fitted", {"type": "fitted", "profile": str(profile_path)}),
                       ("fitted_v0_overhead", {"type": "fitted", "profile": str(vidur)}),
                       ("roofline", {"type": "roofline"})):
        scenario = {"name": f"replay-{run.gpu['name']}", "model": "llama-3.1-8b",
                    "hardware": {"gpu": run.gpu, "tp": 1}, "engine": engine, "cost_model": cost,
                    "workload": {"requests_file": str(req_file)}}
        res = simulate(scenario).requests.copy()
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


def run_all(workdir: Path, profile_dir: Path | None = None, refit: bool = True, *,
            root: Path) -> pd.DataFrame:
    """Replay every run; ``refit`` (or a missing profile) fits it again into ``profile_dir``."""
    from kvsim.cost.fitted import PROFILE_DIR, dump_profile
    profile_dir = profile_dir or PROFILE_DIR
    workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    for run in RUNS:
        path = profile_dir / f"{run.profile_name}.json"
        if refit or not path.exists():
            path.write_text(dump_profile(fit_run_profile(run, root=root)))
        rows += summarize(run, replay(run, path, workdir, root=root))
    return pd.DataFrame(rows)


def markdown(summary: pd.DataFrame) -> str:
    lines = [
        "## Serving replay: real vLLM 0.19 runs (LLMServingSim `vllm_serving_bench`)",
        "",
        "300 ShareGPT-like requests at 10 req/s replayed through `kvsim.simulate` with a profile "
        "fitted to the same GPU's vLLM kernel tables (`kvsim/reports/replay.py`). Per-request "
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
