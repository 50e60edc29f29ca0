"""``kvsim report fleet_routing``: prefix-cache hit rate of a fleet under round robin and
prefix-aware routing, as replicas are added (issue 14, report (a)).

The same traffic is served by 1, 2, 4, 8 and 16 replicas behind each router,
on three workloads built from ``scenarios/fleet_routing.yaml``:

* **shared system prompts**: 64 system prompts of 2,000 tokens; every
  replica's cache holds them all;
* **multi-turn chat**: sessions of 6 turns, each turn resending the
  conversation so far (no system prompt);
* **small cache**: the shared-prompt workload with each replica's cache cut
  to 2,048 blocks (32k tokens, about 12 of the 64 system prompts).

The claim is checked per workload: under round robin the hit rate falls at
every step from 1 to 16 replicas; under prefix-aware routing (SGLang's
cache-aware rule, kvsim/fleet/routers.py) it stays within
``RECOVER_POINTS`` of one replica's. Why round robin loses is counted, not
assumed: a request whose replica had never seen its system prompt must
compute it, so the number of distinct (replica, system prompt) pairs bounds
the hits from below (``cold_misses``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvsim.reports.framework import Report, ReportContext, check, md_table, pct, simulate_scenario
from kvsim.workload import build_workload

REPLICAS = (1, 2, 4, 8, 16)
ROUTERS = ("round_robin", "prefix_aware")
RECOVER_POINTS = 0.03          # "recovers": within 3 points of one replica's hit rate
SGLANG_HIT_RATIO = 3.8         # SGLang v0.4: "3.8x higher cache hit rate" than round robin

MULTI_TURN = ["workload.prefix={shared_prompt_tokens: 0, num_groups: 1}",
              "workload.sessions={turns: 6, think_time_s: 5.0}",
              "workload.arrival.rate=1.5",
              "workload.prompt_len={type: lognormal, median: 200, sigma: 0.5, min: 16, max: 800}",
              "workload.output_len={type: lognormal, median: 200, sigma: 0.5, min: 16, max: 600}"]
WORKLOADS = {
    "shared system prompts": [],
    "multi-turn chat": MULTI_TURN,
    "small cache": ["engine.num_gpu_blocks_override=2048"],
}


def run(ctx: ReportContext) -> Report:
    name = "fleet_routing"
    path = ctx.scenario(name)
    requests = 240 if ctx.fast else 1600
    replicas = (1, 4, 16) if ctx.fast else REPLICAS
    rows = []
    for workload, overrides in WORKLOADS.items():
        for router in ROUTERS:
            for n in replicas:
                if router != ROUTERS[0] and n == 1:       # one replica: the router has no choice
                    rows.append({**next(r for r in rows if r["workload"] == workload and r["replicas"] == 1),
                                 "router": router})
                    continue
                r = simulate_scenario(path, [*overrides, f"workload.num_requests={requests}",
                                             f"cluster.replicas={n}", f"cluster.router={router}"])
                s = r.summary
                rows.append({"workload": workload, "router": router, "replicas": n,
                             "hit_rate": s["prefix_cache_hit_rate"],
                             "p99_ttft_ms": s["p99_ttft_ms"], "imbalance_routed": s["imbalance_routed"],
                             "slo_attainment": s["slo_attainment"], "preemptions": s["num_preemptions"],
                             "cold_bound": cold_bound(r) if workload != "multi-turn chat" else float("nan")})
    table = pd.DataFrame(rows)
    checks, numbers = [], {}
    largest = max(replicas)
    for workload in WORKLOADS:
        part = table[table["workload"] == workload]
        rr = part[part["router"] == "round_robin"].set_index("replicas")["hit_rate"]
        pa = part[part["router"] == "prefix_aware"].set_index("replicas")["hit_rate"]
        falls = all(rr[a] > rr[b] for a, b in zip(replicas, replicas[1:]))
        checks.append(check(f"{workload}: round robin, hit rate as replicas grow",
                            ", ".join(pct(rr[n]) for n in replicas), "falls",
                            falls, f"lower at every step {'-'.join(map(str, replicas))}"))
        recovered = pa[largest] >= pa[1] - RECOVER_POINTS
        checks.append(check(f"{workload}: prefix-aware, {largest} replicas vs 1",
                            f"{pct(pa[largest])} vs {pct(pa[1])}", "recovers", recovered,
                            f">= one replica's - {100 * RECOVER_POINTS:.0f} points"))
        numbers[workload] = {"round_robin": rr.to_dict(), "prefix_aware": pa.to_dict()}
    # With every system prompt fitting every cache, round robin's misses are exactly its first
    # sightings (the same rule as one engine's: a block is computed once per cache).
    shared = table[(table["workload"] == "shared system prompts") & (table["router"] == "round_robin")]
    gap = float((shared["hit_rate"] - shared["cold_bound"]).abs().max())
    checks.append(check("shared system prompts, round robin: misses are first sightings",
                        f"hit rate = bound (max gap {gap:.1e})", "each replica computes a prefix once",
                        gap < 1e-12, "exact"))
    ratio = {w: numbers[w]["prefix_aware"][largest] / numbers[w]["round_robin"][largest] for w in WORKLOADS}
    shown = table.drop(columns=["cold_bound"]).assign(
        hit_rate=table["hit_rate"].map(pct), slo_attainment=table["slo_attainment"].map(pct))
    cold = table[(table["router"] == "round_robin") & table["cold_bound"].notna()][
        ["workload", "replicas", "hit_rate", "cold_bound"]]
    cold = cold.assign(hit_rate=cold["hit_rate"].map(pct), cold_bound=cold["cold_bound"].map(pct))
    figure = ctx.save(_figure(table, replicas, name), name)
    ratios = ", ".join(f"{w} {ratio[w]:.1f}x" for w in WORKLOADS)
    return Report(
        name, "Fleet routing: prefix-cache hit rate as replicas are added",
        "With several replicas and no shared cache state, each replica's prefix-cache hit rate is "
        "independent and lower: under round-robin routing the fleet's hit rate falls as replicas "
        "are added, on a shared-system-prompt workload and on a multi-turn workload; a "
        "prefix-aware router, which sends a request where its prefix is cached, recovers it.",
        "Issue 14 (report (a)); SGLang v0.4 release blog (LMSYS, Dec 2024): the cache-aware "
        "load balancer of sgl-router gives 'up to 1.9x throughput with 3.8x higher cache hit "
        "rate' than round robin; Srivatsa et al., Preble (ICLR 2025): distributing requests "
        "without regard to prompt sharing loses the reuse; llm-d's precise prefix-cache scorer "
        "(llm-d docs) makes the same argument.",
        checks, "kvsim report fleet_routing", figure,
        numbers={"hit_rate": numbers, "ratio_at_largest": ratio},
        tables=[f"### Every run ({requests} requests each, the same traffic for every fleet size)\n\n"
                + md_table(shown),
                "### Why round robin loses: first sightings\n\n"
                "`cold_bound` is the most the hit rate could be if every request hit everything "
                "but the system prompt of its first visit to each replica (one miss per distinct "
                "(replica, system prompt) pair, counted from requests.csv). Round robin's hit rate "
                "follows it down as replicas are added; with the small cache it is further below, "
                "because evictions add misses.\n\n" + md_table(cold)],
        notes=[f"Prefix-aware vs round robin hit rate with {largest} replicas: {ratios}. SGLang's "
               f"blog reports {SGLANG_HIT_RATIO}x on its own benchmark; the ratio depends on the "
               f"workload (how many requests share each prefix, how many replicas), so it is not a "
               f"check here.",
               "Where kvsim differs (small cache): one replica's cache holds only about 12 of the 64 "
               "system prompts, so even one replica evicts and recomputes them. Round robin gives "
               "every replica all 64 to hold whatever the fleet size, so each replica thrashes as "
               "the single one does and the hit rate stays about flat (it does not fall: first "
               "sightings, which is what more replicas add, are few next to the evictions; "
               "`cold_bound` above is far from binding). The claim's fall needs caches that hold "
               "the working set (the first workload) or conversations (the second). Prefix-aware "
               "routing gives each replica its share, so the fleet's caches add up and the hit "
               "rate rises far above one replica's: 'recovers' understates it.",
               "The price of locality is balance: `imbalance_routed` (max / mean requests per "
               "replica) grows with prefix-aware routing, which SGLang's rule bounds with its "
               "balance thresholds (balance_abs_threshold 64, balance_rel_threshold 1.5).",
               "Routers read exact replica state at the arrival instant (no scrape delay); "
               "prefix-aware is SGLang's approximate mode (a router-side tree of what it routed)."])


def cold_bound(result) -> float:
    """Highest hit rate possible when each request misses its system prompt on its replica's
    first sight of it: 1 - (first-sighting prefix tokens + unshared tokens) / prompt tokens."""
    sc = result.scenario
    shared = sc.workload.prefix.shared_prompt_tokens
    req = result.requests
    # The workload again, drawn as simulate() drew it: a request's group is its first token.
    specs = build_workload(sc.workload, rng=np.random.default_rng(sc.seed), base_dir=sc.base_dir).requests()
    groups = {s.request_id: int(s.prompt_token_ids[0]) for s in specs}
    first = ~req.assign(group=req["request_id"].map(groups)).duplicated(["replica", "group"])
    block = sc.sched_config.block_size
    hittable = (shared // block) * block
    possible = hittable * int((~first).sum())
    return possible / float(req["num_prompt_tokens"].sum())


def _figure(table: pd.DataFrame, replicas, name: str):
    from kvsim.plots import _colors, _new_figure, _suptitle

    fig = _new_figure((12.0, 4.0))
    axes = fig.subplots(1, len(WORKLOADS), sharey=True)
    for ax, workload in zip(axes, WORKLOADS):
        part = table[table["workload"] == workload]
        for color, router in zip(_colors(len(ROUTERS)), ROUTERS):
            own = part[part["router"] == router]
            ax.plot(own["replicas"], 100 * own["hit_rate"], "o-", color=color, label=router)
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(replicas), [str(n) for n in replicas])
        ax.set_xlabel("Replicas (same traffic)")
        ax.set_title(workload)
        ax.set_ylim(0, 100)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("Prefix cache hit rate (%)")
    axes[0].legend(fontsize="small")
    _suptitle(fig, name, "hit rate vs replicas, round robin and prefix-aware")
    return fig
