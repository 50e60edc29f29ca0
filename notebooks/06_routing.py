# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 5. Routing a fleet
#
# One engine is rarely enough, so a service runs several **replicas** of it
# and puts a **router** in front. A web load balancer spreads requests evenly
# and is done; an LLM router has one more thing to care about: every replica
# keeps a **prefix cache** (notebook 4), and a request is cheap only where
# its prefix is cached. Spreading evenly spreads the cache too.
#
# This notebook serves the same traffic with one replica and with fleets
# behind different routers (round robin, least loaded, SGLang's prefix-aware
# rule, session affinity), and shows what each one trades: hit rate, time to
# first token, and balance. The last section splits prefill and decode onto
# different GPUs (disaggregated serving).

# %% tags=["parameters"]
import os

# CI runs the notebooks with KVSIM_NOTEBOOK_FAST=1: same story, smaller sizes.
FAST = os.environ.get("KVSIM_NOTEBOOK_FAST") == "1"
NUM_REQUESTS = 240 if FAST else 1200        # requests per run
REPLICAS = [1, 2, 4, 8] if FAST else [1, 2, 4, 8, 16]

# %%
# %matplotlib inline
import copy

import pandas as pd
from IPython.display import display

import kvsim
from kvsim import plots_fleet

# %% [markdown]
# ## 1. A fleet is one line of YAML
#
# The scenario is an ordinary one (notebook 2) plus a `cluster:` section:
# `replicas: N` identical copies of the engine, and a `router`. Every prompt
# starts with one of 64 system prompts of 2,000 tokens, then a short user
# message. Llama-3.1-8B on one H100 per replica.

# %%
BASE = {
    "name": "routing", "seed": 0, "model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm", "tp": 1},
    "engine": {"max_model_len": 8192, "max_num_batched_tokens": 4096, "max_num_seqs": 128},
    "cost_model": {"type": "roofline"},
    "workload": {"num_requests": NUM_REQUESTS, "arrival": {"type": "poisson", "rate": 8.0},
                 "prefix": {"shared_prompt_tokens": 2000, "num_groups": 64},
                 "prompt_len": {"type": "lognormal", "median": 150, "sigma": 0.5, "min": 16, "max": 1000},
                 "output_len": {"type": "lognormal", "median": 100, "sigma": 0.5, "min": 8, "max": 400}},
    "slo": {"ttft_ms": 500, "tpot_ms": 50},
}


def fleet(replicas, router, **workload):
    sc = copy.deepcopy(BASE)
    sc["workload"].update(workload)
    sc["cluster"] = {"replicas": replicas, "router": router}
    return kvsim.simulate(sc)


r = fleet(4, "round_robin")
print(f"fleet: {r.summary['completed']} requests, hit rate {r.summary['prefix_cache_hit_rate']:.1%}, "
      f"p99 TTFT {r.summary['p99_ttft_ms']:.0f} ms")
per_replica = pd.DataFrame.from_dict(r.per_replica, orient="index")
per_replica[["routed", "completed", "prefix_cache_hit_rate", "kv_cache_usage_mean", "median_ttft_ms",
             "computed_tokens"]]

# %% [markdown]
# `r.summary` is what a client in front of the router measures (the
# `vllm bench serve` numbers); `r.per_replica` is what each replica's own
# `/metrics` would say; `r.requests.replica` names the replica that served
# each request. Round robin gives every replica exactly a quarter of the
# requests.

# %%
assert per_replica["routed"].tolist() == [NUM_REQUESTS // 4] * 4
assert r.requests["replica"].nunique() == 4

# %% [markdown]
# ## 2. Round robin spreads the cache
#
# The same traffic on more and more replicas. Round robin sends every system
# prompt to every replica, and each replica computes a system prompt once
# before it can hit it: with N replicas, up to N misses per system prompt
# instead of one. The prefix-aware router (SGLang's `cache_aware` rule: the
# replica whose cached prefix matches most, unless the load is too uneven)
# sends a system prompt back where it went before.

# %%
rows = []
for router in ("round_robin", "least_loaded", "prefix_aware"):
    for n in REPLICAS:
        s = fleet(n, router).summary
        rows.append({"router": router, "replicas": n, "hit_rate": s["prefix_cache_hit_rate"],
                     "median_ttft_ms": s["median_ttft_ms"], "p99_ttft_ms": s["p99_ttft_ms"],
                     "imbalance_routed": s["imbalance_routed"]})
sweep = pd.DataFrame(rows)
display(sweep.pivot(index="replicas", columns="router", values="hit_rate").map("{:.1%}".format))

# %%
from kvsim.plots import metric_lines

metric_lines(sweep, "replicas", ["hit_rate", "median_ttft_ms"], group="router",
             ylabels=["Prefix cache hit rate", "Median TTFT (ms)"], logx=True, title="routing",
             what="the same traffic on more replicas")

# %% [markdown]
# Round robin and least loaded lose the hit rate as replicas are added (least
# loaded places by queue length, which knows nothing of prefixes either); the
# prefix-aware router keeps one replica's hit rate at every size, and its
# median TTFT is the lowest: a hit skips most of a 2,150-token prefill.

# %%
hit = sweep.pivot(index="replicas", columns="router", values="hit_rate")
assert hit["round_robin"].is_monotonic_decreasing and hit["round_robin"].iloc[-1] < 0.5 * hit["round_robin"].iloc[0]
assert (hit["prefix_aware"] >= hit["prefix_aware"].iloc[0] - 0.03).all()

# %% [markdown]
# ## 3. Where the requests went, over time
#
# `plots_fleet.replica_timeline` draws each replica's load (running + waiting
# requests) and its hit rate per time window. Under round robin the hit rates
# climb slowly as each replica warms its own copy of every system prompt;
# under prefix-aware routing they are high from the start, and the load is
# less even: locality is bought with balance.

# %%
rr, pa = fleet(4, "round_robin"), fleet(4, "prefix_aware")
plots_fleet.replica_timeline(rr.steps, rr.requests, title="round robin, 4 replicas")

# %%
plots_fleet.replica_timeline(pa.steps, pa.requests, title="prefix-aware, 4 replicas")

# %%
print(f"imbalance (max / mean requests per replica): round robin {rr.summary['imbalance_routed']:.2f}, "
      f"prefix-aware {pa.summary['imbalance_routed']:.2f}")
assert pa.summary["imbalance_routed"] > rr.summary["imbalance_routed"] == 1.0

# %% [markdown]
# ## 4. Conversations: session affinity
#
# In a multi-turn chat each turn resends the whole conversation, so the
# cached prefix of a turn is the previous turn, on the replica that served it.
# Round robin sends the next turn to that replica only by chance (about one
# time in N). Session affinity (llm-d's scorer) sends it back on purpose;
# prefix-aware routing finds the same replica by matching the prefix.

# %%
chat = dict(prefix={"shared_prompt_tokens": 0, "num_groups": 1},
            sessions={"turns": 6, "think_time_s": 5.0}, arrival={"type": "poisson", "rate": 1.5},
            prompt_len={"type": "lognormal", "median": 200, "sigma": 0.5, "min": 16, "max": 800},
            output_len={"type": "lognormal", "median": 200, "sigma": 0.5, "min": 16, "max": 600})
rows = []
for router in ("round_robin", "session_affinity", "prefix_aware"):
    s = fleet(8, router, **chat).summary
    rows.append({"router": router, "hit_rate": s["prefix_cache_hit_rate"], "p99_ttft_ms": s["p99_ttft_ms"],
                 "imbalance_routed": s["imbalance_routed"]})
chats = pd.DataFrame(rows).set_index("router")
chats

# %%
assert chats.loc["session_affinity", "hit_rate"] > 2 * chats.loc["round_robin", "hit_rate"]
assert chats.loc["prefix_aware", "hit_rate"] > 2 * chats.loc["round_robin", "hit_rate"]

# %% [markdown]
# ## 5. How many replicas?
#
# Dividing a target rate by one replica's capacity assumes a perfect balancer
# and no cache locality. `kvsim plan` with a `plan.fleet` section simulates
# the fleets instead: for each router, the fewest replicas whose p99 TTFT and
# TPOT meet the SLOs at the target rate (doubling the fleet, then bisecting;
# docs/plan.md). The same search from Python, at 160 req/s:

# %%
from kvsim.plan import format_table, parse_plan, run_plan

plan = parse_plan({**BASE, "plan": {"slo": {"p99_ttft_ms": 500, "p99_tpot_ms": 50}, "target_rate": 160,
                                    "seeds": 1, "fleet": {"routers": ["round_robin", "prefix_aware"],
                                                          "max_replicas": 16}}})
rows = run_plan(plan, workers=1)
print(format_table(rows, plan))
sizes = {row["router"]: row["num_gpus"] for row in rows}

# %% [markdown]
# With round robin every replica prefills most system prompts itself, so the
# fleet computes more tokens for the same traffic and needs more GPUs; the
# prefix-aware router serves it with fewer. The `binding` column says what
# breaks with one replica fewer.

# %%
assert all(row["status"] == "ok" for row in rows)
assert sizes["prefix_aware"] <= sizes["round_robin"]

# %% [markdown]
# ## 6. Disaggregated prefill and decode
#
# A mixed replica runs prefill chunks and decodes in the same steps, so a
# long prompt makes every running decode wait for its chunk: the inter-token
# latency (ITL) has a long tail. **Disaggregated** serving puts prefill on
# some GPUs and decode on others. vLLM's way (NixlConnector behind its proxy,
# docs/fleet.md): the proxy sends the request to a prefill replica with
# `max_tokens=1`, which keeps the prompt's KV blocks until a decode replica
# has pulled them over the network; the decode replica then streams every
# token the client sees. Four GPUs, long prompts (median 6,000 tokens):
# four mixed replicas against two prefill + two decode.

# %%
LONG = {**copy.deepcopy(BASE), "name": "pd"}
LONG["engine"] = {"max_model_len": 16384, "max_num_batched_tokens": 2048, "max_num_seqs": 256}
LONG["workload"] = {"num_requests": 200 if FAST else 800, "arrival": {"type": "poisson", "rate": 6.0},
                    "prompt_len": {"type": "lognormal", "median": 6000, "sigma": 0.4, "min": 1000,
                                   "max": 14000},
                    "output_len": {"type": "lognormal", "median": 250, "sigma": 0.5, "min": 16, "max": 1000}}
layouts = {
    "4 mixed": {"replicas": 4, "router": "least_loaded"},
    "2 P + 2 D": {"pools": [{"name": "prefill", "role": "prefill", "replicas": 2},
                            {"name": "decode", "role": "decode", "replicas": 2}],
                  "router": "least_loaded", "decode_router": "least_loaded", "link": "roce-400g"},
}
pd_rows = {}
for label, cluster in layouts.items():
    s = kvsim.simulate({**LONG, "cluster": cluster}).summary
    pd_rows[label] = {k: s[k] for k in ("mean_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p99_itl_ms")}
    pd_rows[label]["mean_kv_transfer_ms"] = s.get("mean_kv_transfer_ms")
pd_table = pd.DataFrame.from_dict(pd_rows, orient="index").round(1)
pd_table

# %% [markdown]
# The decode replicas never run a prefill chunk, so the ITL tail collapses.
# The time to first token pays for it: two GPUs prefill what four shared,
# the KV moves over the link (`mean_kv_transfer_ms`), and the first token
# comes out of one more step on the decode replica. Which wins depends on
# the SLOs; `kvsim plan` sizes P + D fleets too (docs/plan.md).

# %%
assert pd_table.loc["2 P + 2 D", "p99_itl_ms"] < pd_table.loc["4 mixed", "p99_itl_ms"] / 2
assert pd_table.loc["2 P + 2 D", "mean_ttft_ms"] > pd_table.loc["4 mixed", "mean_ttft_ms"]
