"""``kvsim report chunk_size_itl``: Chunk size vs inter-token latency (Sarathi-Serve): a
long decode's ITL grows with max_num_batched_tokens.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvsim.reports.framework import Report, ReportContext, check, md_table, simulate_scenario

CHUNK_MIN_R2 = 0.95            # "about linearly": an affine fit explains this much of max ITL
CHUNK_MAX_TTFT_GAIN = 0.5      # "slightly": the largest chunk cuts TTFT by less than half


def run(ctx: ReportContext) -> Report:
    name = "chunk_size_itl"
    chunks = [512, 2048, 8192] if ctx.fast else [256, 512, 1024, 2048, 4096, 8192]
    over = ["workload.trace.max_requests=21"] if ctx.fast else []
    rows = []
    for c in chunks:
        trace: list[dict] = []
        res = simulate_scenario(ctx.scenario(name), [f"engine.max_num_batched_tokens={c}", *over],
                                trace=trace.append)
        req = res.requests
        decode = req.loc[req["num_output_tokens"].idxmax()]
        itl = np.diff(token_times(res, trace, decode["request_id"], int(decode["num_prompt_tokens"]))) * 1e3
        longp = req[req["num_prompt_tokens"] >= 1000]
        ttft = (longp["first_token_time_s"] - longp["arrival_time_s"]) * 1e3
        rows.append({"max_num_batched_tokens": c, "max_itl_ms": float(itl.max()),
                     "p99_itl_ms": float(np.percentile(itl, 99)),
                     "median_itl_ms": float(np.median(itl)),
                     "mean_ttft_long_ms": float(ttft.mean()),
                     "median_ttft_ms": float(ttft.median()), "p99_ttft_ms": float(ttft.quantile(0.99))})
    df = pd.DataFrame(rows)
    x = df["max_num_batched_tokens"].to_numpy(float)
    y = df["max_itl_ms"].to_numpy(float)
    slope, intercept = np.polyfit(x, y, 1)
    r2 = 1 - np.sum((y - (slope * x + intercept)) ** 2) / np.sum((y - y.mean()) ** 2)
    ttft = df["mean_ttft_long_ms"].to_numpy(float)
    gain = 1 - ttft[-1] / ttft[0]

    from kvsim.plots import tradeoff
    fig = tradeoff(df, "max_num_batched_tokens", title=name)
    figure = ctx.save(fig, name)
    mono = lambda v: bool(np.all(np.diff(v) >= 0))  # noqa: E731
    checks = [
        check("max ITL of the decode rises with max_num_batched_tokens",
               " < ".join(f"{v:.0f}" for v in y) + " ms", "rises", mono(y), "monotone"),
        check("p99 ITL of the decode rises with max_num_batched_tokens",
               " < ".join(f"{v:.0f}" for v in df["p99_itl_ms"]) + " ms", "rises",
               mono(df["p99_itl_ms"].to_numpy(float)), "monotone"),
        check("max ITL is about linear in max_num_batched_tokens (R^2 of an affine fit)",
               f"{r2:.3f} ({slope * 1000:.1f} ms per 1000 tokens)", "about linear",
               r2 >= CHUNK_MIN_R2, f">= {CHUNK_MIN_R2}"),
        check("TTFT of the long prompts improves slightly with larger chunks",
               f"{gain:+.1%} ({ttft[0]:.0f} -> {ttft[-1]:.0f} ms)", "slightly better",
               0 < gain < CHUNK_MAX_TTFT_GAIN, f"between 0 and {CHUNK_MAX_TTFT_GAIN:.0%} better"),
    ]
    return Report(
        name, "Chunk size vs inter-token latency",
        "One long decode runs while long prompts arrive; its max and p99 ITL grow about linearly "
        "with max_num_batched_tokens (the prefill chunk shares its steps), while the TTFT of the "
        "long prompts improves slightly with larger chunks.",
        "Agrawal et al., Sarathi-Serve (OSDI'24), sec. 4-5 (stall-free batching; token budget trades "
        "TTFT for TBT); vLLM docs, 'Optimization and Tuning: chunked prefill'.",
        checks, "kvsim report chunk_size_itl", figure,
        numbers={"table": df, "r2": r2, "ttft_gain": gain},
        tables=["### Per chunk size (ITL: the long decode; TTFT: the 8000-token prompts)\n\n"
                + md_table(df)],
        notes=["Forty 8000-token prompts arrive 0.5 s apart while the decode runs, so even at the largest chunk more than 1% of the decode's steps carry a prefill chunk and its p99 ITL sees them. Step times come from the roofline cost model; a step's time is a fixed overhead plus "
               "terms linear in its tokens, so the affine fit is what 'about linear' can mean."])


def token_times(res, trace: list[dict], request_id: str, prompt_len: int) -> np.ndarray:
    """When each output token of ``request_id`` came: the end of every step that gave it one.

    Read from the run's step trace (``kvsim run --trace``: which requests each
    step scheduled, and how many tokens) and its steps table (start and
    duration of each step). A step gives the request a token once its
    computed tokens reach the prompt (the last prefill chunk samples the
    first token; each decode step one more). A request that was preempted
    recomputes, which this reading does not follow, so it refuses one.
    """
    ends = (res.steps["start_time_s"] + res.steps["duration_s"]).to_numpy()
    times, computed = [], 0
    for rec in trace:
        if request_id in rec["preempted"]:
            raise ValueError(f"request {request_id} was preempted; token_times does not follow recomputes")
        n = rec["scheduled"].get(request_id)
        if n is None:
            continue
        computed += n
        if computed >= prompt_len:
            times.append(ends[rec["step"]])
    return np.asarray(times)
