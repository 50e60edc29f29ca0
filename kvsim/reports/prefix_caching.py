"""``kvsim report prefix_caching``: Prefix caching (vLLM automatic prefix caching; SGLang):
block arithmetic of a hit, TTFT with and without caching.
"""

from __future__ import annotations

import pandas as pd

from kvsim.reports.framework import Report, ReportContext, check, md_table, simulate_scenario

PREFIX_MIN_TTFT_FACTOR = 3.0        # "many-fold"
PREFIX_MAX_THROUGHPUT_CHANGE = 0.01  # "about nothing"


def run(ctx: ReportContext) -> Report:
    name = "prefix_caching"
    n = 30 if ctx.fast else 200
    path = ctx.scenario(name)
    res = {}
    for on in (True, False):
        res[on] = simulate_scenario(path, [f"engine.enable_prefix_caching={str(on).lower()}",
                                 f"workload.num_requests={n}"])
    bs = res[True].scenario.sched_config.block_size
    req = res[True].requests
    prompt = int(req["num_prompt_tokens"].iloc[1])
    cached = int(req["num_cached_tokens"].iloc[1])
    full_blocks, shared_blocks, prefilled = prompt // bs, cached // bs, prompt - cached
    ttft_on = res[True].summary["median_ttft_ms"]
    ttft_off = res[False].summary["median_ttft_ms"]
    factor = ttft_off / ttft_on

    # No shared prefix: the same engine, prompts of the same length, all at once.
    thr = {}
    for on in (True, False):
        r = simulate_scenario(path, [f"engine.enable_prefix_caching={str(on).lower()}",
                           f"workload.num_requests={n}", "workload.prefix.shared_prompt_tokens=0",
                           "workload.prompt_len={type: fixed, value: 2100}",
                           "workload.arrival={type: all_at_once}"])
        thr[on] = r.summary["output_throughput"]
    change = thr[True] / thr[False] - 1

    table = pd.DataFrame([
        {"variant": "shared 2000-token prefix, caching on", "median_ttft_ms": ttft_on,
         "hit_rate": res[True].summary["prefix_cache_hit_rate"]},
        {"variant": "shared 2000-token prefix, caching off", "median_ttft_ms": ttft_off,
         "hit_rate": res[False].summary["prefix_cache_hit_rate"]}])
    from kvsim.plots import metric_bars
    fig = metric_bars(pd.DataFrame([
        {"case": "prefix, cache on", "ttft": ttft_on, "thr": float("nan")},
        {"case": "prefix, cache off", "ttft": ttft_off, "thr": float("nan")}]),
        "case", ["ttft"], ylabels=["Median TTFT (ms)"], title=name,
        what="2,100-token prompts with a 2,000-token shared prefix")
    figure = ctx.save(fig, name)
    checks = [
        check("full 16-token blocks of a 2,100-token prompt", full_blocks, "131", full_blocks == 131, "exact"),
        check("of which shared (the 2,000-token system prompt)", shared_blocks, "125",
               shared_blocks == 125, "exact"),
        check("tokens prefilled on a hit", prefilled, "100", prefilled == 100, "exact"),
        check("median TTFT, caching off / on", f"{factor:.1f}x ({ttft_off:.1f} vs {ttft_on:.1f} ms)",
               "many-fold", factor >= PREFIX_MIN_TTFT_FACTOR, f">= {PREFIX_MIN_TTFT_FACTOR:g}x"),
        check("no shared prefix: output throughput change from caching", f"{change:+.2%}",
               "about nothing", abs(change) <= PREFIX_MAX_THROUGHPUT_CHANGE,
               f"within +-{PREFIX_MAX_THROUGHPUT_CHANGE:.0%}"),
    ]
    return Report(
        name, "Prefix caching",
        "A 2,100-token prompt whose first 2,000 tokens are a shared system prompt holds 131 full "
        "16-token blocks of which 125 are shared, so only about 100 tokens are prefilled on a hit; "
        "with a long shared prefix TTFT drops many-fold; with no shared prefixes caching changes "
        "throughput by about nothing.",
        "vLLM docs, 'Automatic Prefix Caching' (design: hashed full blocks); Zheng et al., SGLang "
        "(NeurIPS'24), sec. 3; the block arithmetic is exact (2100 // 16 = 131, 2000 // 16 = 125).",
        checks, "kvsim report prefix_caching", figure,
        numbers={"full_blocks": full_blocks, "shared_blocks": shared_blocks, "prefilled": prefilled,
                 "ttft_factor": factor, "no_prefix_throughput_change": change},
        tables=[f"### {n} requests at 1 req/s\n\n" + md_table(table),
                f"### No shared prefix ({n} requests of 2,100 unique tokens, all at once)\n\n"
                f"Output throughput {thr[True]:.1f} tok/s with caching, {thr[False]:.1f} without."],
        notes=["The first request misses (nothing is cached yet); the numbers above are the second "
               "request's. Requests arrive far enough apart that TTFT is mostly the prefill itself."])
