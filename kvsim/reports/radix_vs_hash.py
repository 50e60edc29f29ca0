"""``kvsim report radix_vs_hash``: SGLang's radix cache vs vLLM's hash-based prefix cache:
is the radix hit rate 20-40% higher on multi-turn and shared-prefix workloads?

Both caches run behind the same vLLM V1 scheduler (``engine.prefix_cache``:
``hash`` or ``radix``, kvsim/kv/radix_manager.py), so what differs is only the
cache: token-granular matching and whole-leaf LRU eviction (radix) against
hashed full blocks cached at schedule time (hash). The report also runs vLLM
without prefix caching, the baseline the SGLang paper compared against.
"""

from __future__ import annotations

import pandas as pd

from kvsim.metrics.prefix_cache import prefix_cache_stats
from kvsim.reports.framework import Report, ReportContext, check, md_table, pct, simulate_scenario

CLAIM_LOW, CLAIM_HIGH = 0.20, 0.40    # "20-40% higher cache hit rates" (relative)
OFF_MIN_GAIN = 0.20                    # radix over no caching: at least 20 points of hit rate
PRESSURE_BLOCKS = 1200                 # the KV-pressure runs' cache: 19,184 tokens

VARIANTS = {                           # name -> overrides on top of the scenario
    "hash": ["engine.prefix_cache=hash"],                               # vLLM's APC
    "radix": [],                                                        # page size 1
    "radix p16": ["engine.radix={page_size: 16}"],                      # pages = blocks
    "off": ["engine.prefix_cache=hash", "engine.enable_prefix_caching=false"],   # no caching
}


def workloads(fast: bool) -> dict[str, list[str]]:
    """Workload name -> overrides of the scenario (multi-turn sessions)."""
    n = 120 if fast else 800
    single = ["workload.sessions={turns: 1}", "workload.prefix={shared_prompt_tokens: 1030, num_groups: 8}",
              "workload.arrival={type: poisson, rate: 8.0}"]
    few = 60 if fast else 200
    return {
        "multi-turn": [f"workload.num_requests={n}"],
        "KV pressure": [f"workload.num_requests={n}", f"engine.num_gpu_blocks_override={PRESSURE_BLOCKS}"],
        "shared prefix": [f"workload.num_requests={n}", *single],
        "burst": [f"workload.num_requests={few}", *single, "workload.arrival={type: all_at_once}"],
        "n=4": [f"workload.num_requests={few}", *single, "workload.n=4"],
    }


def run(ctx: ReportContext) -> Report:
    name = "radix_vs_hash"
    path = ctx.scenario(name)
    rows, stats = [], {}
    for wname, wover in workloads(ctx.fast).items():
        for vname, vover in VARIANTS.items():
            res = simulate_scenario(path, [*wover, *vover])
            st = prefix_cache_stats(res.requests, res.scenario.sched_config.block_size)
            stats[wname, vname] = st
            s = res.summary
            rows.append({"workload": wname, "cache": vname, "hit_rate": st["hit_rate"],
                         "hit_tokens": st["hits"], "hit_blocks": st["hit_blocks"],
                         "partial_block_tokens": st["partial_block_hit_tokens"],
                         "median_ttft_ms": s["median_ttft_ms"], "preemptions": s["num_preemptions"]})
    df = pd.DataFrame(rows)

    def rate(w, v):
        return stats[w, v]["hit_rate"]

    def gain(w):
        return rate(w, "radix") / rate(w, "hash") - 1

    mt, sp = gain("multi-turn"), gain("shared prefix")
    hash_partial = sum(stats[w, "hash"]["partial_block_hit_tokens"] for w in workloads(ctx.fast))
    # What the radix cache hits beyond the hash cache, against its partial-block tokens.
    extra = stats["multi-turn", "radix"]["hits"] - stats["multi-turn", "hash"]["hits"]
    partial = stats["multi-turn", "radix"]["partial_block_hit_tokens"]
    per_hit = partial / max(stats["multi-turn", "radix"]["hit_requests"], 1)
    same_step = _same_step_hits(path)

    wide = df.pivot(index="cache", columns="workload", values="hit_rate").loc[list(VARIANTS)]
    wide = wide[list(workloads(ctx.fast))].reset_index()
    from kvsim.plots import metric_bars
    fig = metric_bars(wide, "cache", list(workloads(ctx.fast)),
                      ylabels=[f"hit rate, {w}" for w in workloads(ctx.fast)], title=name,
                      what="prefix-cache hit rate (hits / queries, vLLM's counters)")
    figure = ctx.save(fig, name)
    checks = [
        check("multi-turn: radix hit rate over hash, relative", f"{mt:+.2%} ({pct(rate('multi-turn', 'radix'))} "
              f"vs {pct(rate('multi-turn', 'hash'))})", "+20% to +40%", CLAIM_LOW <= mt <= CLAIM_HIGH,
              f"{CLAIM_LOW:.0%}-{CLAIM_HIGH:.0%}"),
        check("shared prefix: radix hit rate over hash, relative", f"{sp:+.2%} ({pct(rate('shared prefix', 'radix'))} "
              f"vs {pct(rate('shared prefix', 'hash'))})", "+20% to +40%", CLAIM_LOW <= sp <= CLAIM_HIGH,
              f"{CLAIM_LOW:.0%}-{CLAIM_HIGH:.0%}"),
        check("multi-turn: radix over vLLM without prefix caching (the SGLang paper's baseline)",
              f"{pct(rate('multi-turn', 'radix'))} vs {pct(rate('multi-turn', 'off'))}",
              "higher", rate("multi-turn", "radix") - rate("multi-turn", "off") >= OFF_MIN_GAIN,
              f">= {OFF_MIN_GAIN:.0%} points"),
        check("hash cache: hit tokens beyond whole blocks, all workloads", hash_partial, "0 (full blocks only)",
              hash_partial == 0, "exact"),
        check("multi-turn: extra radix hits are its partial-block tokens", f"{extra} extra, {partial} partial",
              "equal when nothing is evicted", extra == partial, "exact"),
        check("two equal prompts in one step: the second one's hit, hash / radix",
              f"{same_step['hash']} / {same_step['radix']} tokens", "1024 / 0 (schedule time vs after the step)",
              same_step == {"hash": 1024, "radix": 0}, "exact"),
    ]
    table = df.copy()
    table["hit_rate"] = table["hit_rate"].map(pct)
    return Report(
        name, "Radix cache vs hash-based prefix cache",
        "SGLang's RadixAttention (a radix tree of token ids) produces 20-40% higher cache hit rates "
        "than vLLM's hash-based approach on multi-turn workloads.",
        "The seed's claim; no primary source found for the 20-40% figure. Zheng et al., SGLang "
        "(NeurIPS'24, arXiv 2312.07104) report 50-99% hit rates, against vLLM versions without "
        "automatic prefix caching; vLLM docs, 'Automatic Prefix Caching'; kv-semantics.md A4, G1-G5.",
        checks, f"kvsim report {name}", figure,
        numbers={"multi_turn_gain": mt, "shared_prefix_gain": sp, "hash_partial_tokens": hash_partial,
                 "multi_turn_extra_hits": extra, "multi_turn_partial_tokens": partial,
                 "same_step": same_step,
                 "hit_rate": {f"{w} | {v}": s["hit_rate"] for (w, v), s in stats.items()}},
        tables=["### Hit rate, hits in tokens and whole 16-token blocks, per workload and cache\n\n"
                + md_table(table)],
        notes=[
            "kvsim does not reproduce the 20-40%: behind the same scheduler the radix cache hits "
            f"{mt:+.2%} (multi-turn) and {sp:+.2%} (shared prefix) more than the hash cache. Both "
            "keep every full block of a conversation (vLLM hashes decode blocks too, A4), so the "
            "radix cache's only extra is the tail of each shared prefix that does not fill a "
            f"16-token block: {per_hit:.1f} tokens per hit on average (about 7.5 expected), "
            "against prompts of hundreds to thousands of tokens (the 'partial_block_tokens' "
            "column).",
            "Against vLLM without prefix caching, as in the SGLang paper's comparison (its vLLM "
            "baseline predates automatic prefix caching, now on by default in V1), the radix cache "
            "hits every shared token and vLLM none: that is where a large hit-rate gap comes from.",
            "Where the radix cache does worse here: it takes tokens in after the step (G3), while "
            "vLLM hashes blocks when they are scheduled (A4), so requests admitted in the same step "
            f"with the same prompt all miss (burst: {gain('burst'):+.1%}; parallel sampling, n = 4: "
            f"{gain('n=4'):+.1%}); a preempted "
            "request keeps only what was inserted (its prompt), not its decoded tokens. SGLang "
            "itself softens the first with what kvsim does not model: for n > 1 its frontend "
            "sends the prompt once with max_new_tokens 0 before the n samples "
            "(tokenizer_manager.py, 'Cache the common prefix for parallel sampling'), and its "
            "cache-aware policies (lpm, dfs-weight; the default is fcfs) defer a request that "
            "shares an uncached prefix with another waiting one (in-batch prefix caching, G7).",
            "Under KV pressure the two evict differently (radix: whole least-recently-used leaves, "
            "G5; hash: blocks from the head of the free queue, freed tail first, B6): with "
            f"{PRESSURE_BLOCKS} blocks of 16 tokens the radix hit rate is {gain('KV pressure'):+.2%} off the hash one.",
            "The combination is vLLM's scheduler with SGLang's cache (docs/kv_tiers.md, section 1): "
            "SGLang's own scheduler (prefill-first, its admission budget G6, retraction G8) is not "
            "simulated, so TTFT and preemption counts are vLLM's, not SGLang's.",
        ])


def _same_step_hits(path) -> dict[str, int]:
    """Two requests with the same 1,030-token system prompt, both admitted in the first step:
    the second one's hit under each cache."""
    out = {}
    for cache in ("hash", "radix"):
        res = simulate_scenario(path, ["workload.num_requests=2", "workload.sessions={turns: 1}",
                                       "workload.prefix={shared_prompt_tokens: 1030, num_groups: 1}",
                                       "workload.arrival={type: all_at_once}",
                                       f"engine.prefix_cache={cache}"])
        out[cache] = int(res.requests["num_cached_tokens"].iloc[1])
    return out
