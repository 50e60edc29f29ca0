"""``kvsim report quickstart``: The README's quickstart scenario runs end to end; its
prefix-cache hits are exact.
"""

from __future__ import annotations

import pandas as pd

from kvsim.reports.framework import Report, ReportContext, check, md_table, simulate_scenario

def run(ctx: ReportContext) -> Report:
    name = "quickstart"
    over = ["workload.num_requests=30"] if ctx.fast else []
    res = simulate_scenario(ctx.scenario(name), over)
    s = res.summary
    n = res.scenario.workload.num_requests
    from kvsim.plots import kv_timeline
    figure = ctx.save(kv_timeline(res.steps, title=name), name)
    keys = ["completed", "failed", "duration", "request_throughput", "output_throughput",
            "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_itl_ms",
            "prefix_cache_hit_rate", "num_preemptions", "kv_cache_usage_max", "request_goodput"]
    table = pd.DataFrame([{"key": k, "value": s[k]} for k in keys if k in s])
    # Prefix caching (kv-semantics H3): each request but the first of its group hits the
    # group's whole system prompt, 256 tokens = 16 full blocks; the cache never fills here.
    wl = res.scenario.workload
    shared = wl.prefix.shared_prompt_tokens // res.scenario.sched_config.block_size \
        * res.scenario.sched_config.block_size
    groups_used = min(wl.prefix.num_groups, n)
    cached = int(res.requests["num_cached_tokens"].sum())
    expected = shared * (n - groups_used)
    checks = [check("requests completed", f"{s['completed']} of {n}", f"{n}",
                     s["completed"] == n and s["failed"] == 0, "all, none failed"),
              check("prompt tokens served from the prefix cache", cached,
                     f"{expected} = {shared} x ({n} - {groups_used} first-of-group requests)",
                     cached == expected, "exact")]
    return Report(
        name, "Quickstart (the README's example)",
        "scenarios/quickstart.yaml runs end to end: Llama-3.1-8B on one H100, vLLM V1 chunked "
        "prefill, 500 chat-like requests at 8 req/s with four shared system prompts.",
        "README.md", checks, "kvsim report quickstart   (the run alone: kvsim run "
        "scenarios/quickstart.yaml --out out/quickstart)", figure,
        numbers={"summary": s}, tables=["### Summary\n\n" + md_table(table)])
