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
# # 3. Chunked prefill
#
# A step of a continuous-batching engine computes some prefill tokens (new
# prompts) and one decode token per running request. A prefill of a long
# prompt is thousands of tokens of compute; a decode token is tiny but
# memory-bound. How they share a step decides two latencies:
#
# * **TTFT** (time to first token): how soon a new prompt is prefilled;
# * **ITL** (inter-token latency): how long running requests wait between tokens.
#
# vLLM's V0 scheduler (kvsim `continuous`) is **prefill-first**: when a
# prompt is waiting, the next step prefills it whole, and running requests
# get no token in that step — a **stall** as long as the prefill. vLLM V1
# (kvsim `chunked`, Sarathi-Serve's idea) is **decode-first**: every step
# serves all running decodes, then fills the rest of a token budget,
# `max_num_batched_tokens`, with a **chunk** of the waiting prompt. The chunk
# size is the knob: small chunks keep steps short (low ITL) but spread a
# prefill over many steps (higher TTFT); large chunks do the opposite.

# %% tags=["parameters"]
import os

# CI runs the notebooks with KVSIM_NOTEBOOK_FAST=1: same story, smaller sizes.
FAST = os.environ.get("KVSIM_NOTEBOOK_FAST") == "1"
NUM_REQUESTS = 120 if FAST else 600
CHUNKS = [256, 4096] if FAST else [256, 512, 1024, 2048, 4096, 8192]

# %%
# %matplotlib inline
import pandas as pd

import kvsim
from kvsim import plots

# Llama-3.1-8B on one H100 (roofline costs); chat-like prompts with a long
# tail, medium answers, Poisson arrivals at 16 req/s: a busy server, with
# about a hundred requests decoding at any time.
BASE = {
    "name": "chunked", "seed": 0, "model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm"},
    "engine": {"scheduler": "chunked", "max_model_len": 16384, "max_num_seqs": 256,
               "max_num_batched_tokens": 2048, "enable_prefix_caching": False},
    "cost_model": {"type": "roofline"},
    "workload": {"num_requests": NUM_REQUESTS, "arrival": {"type": "poisson", "rate": 16.0},
                 "prompt_len": {"type": "lognormal", "median": 800, "sigma": 0.8, "max": 8000},
                 "output_len": {"type": "lognormal", "median": 300, "sigma": 0.5, "max": 1000}},
}

def run(scheduler, budget=None):
    engine = dict(BASE["engine"], scheduler=scheduler)
    if budget is None:                   # vLLM V0: the budget is max_model_len, no chunking
        engine.pop("max_num_batched_tokens")
    else:
        engine["max_num_batched_tokens"] = budget
    return kvsim.simulate({**BASE, "name": f"{scheduler}-{budget}", "engine": engine})

# %% [markdown]
# ## Prefill-first: stalls
#
# The batch timeline shows, per engine step, decode tokens (blue) and prefill
# tokens (orange). Prefill-first steps that take a whole prompt carry **no
# decode tokens**: every running request stalls for the length of that step.

# %%
prefill_first = run("continuous")
chunked = run("chunked", 512)

def window(result, start_s=4.0, length_s=1.5):
    """The steps that start in a 1.5 s window of steady load, each drawn separately."""
    s = result.steps
    return s[(s["start_time_s"] >= start_s) & (s["start_time_s"] < start_s + length_s)]

plots.batch_timeline(window(prefill_first), title="continuous (prefill-first), 4.0-5.5 s")

# %%
plots.batch_timeline(window(chunked), title="chunked, 512-token budget, 4.0-5.5 s",
                     token_budget=512)

# %% [markdown]
# The same window on a time axis: decode tokens per step, and in red the
# steps in which requests that were decoding got no token (a stall). The
# width of a red band is how long every running request waited.

# %%
from matplotlib.figure import Figure

def still_decoding(steps):
    # Requests that decoded in the previous step and did not finish there.
    return (steps["num_decode_tokens"] - steps["num_finished"]).shift(1, fill_value=0) > 0

def stall_mask(steps):
    return (steps["num_prefill_tokens"] > 0) & (steps["num_decode_tokens"] == 0) & still_decoding(steps)

fig = Figure(figsize=(10, 5), layout="constrained")
axes = fig.subplots(2, 1, sharex=True, sharey=True)
for ax, (name, result) in zip(axes, (("continuous (prefill-first)", prefill_first),
                                     ("chunked, 512-token budget", chunked))):
    s = result.steps
    w = window(result)
    ax.step(w["start_time_s"], w["num_decode_tokens"], where="post", color="tab:blue")
    stalled = stall_mask(s).loc[w.index]
    for start, duration in zip(w["start_time_s"][stalled], w["duration_s"][stalled]):
        ax.axvspan(start, start + duration, color="tab:red", alpha=0.3, linewidth=0)
    ax.set_title(f"{name}: {int(stalled.sum())} stalls in the window")
    ax.set_ylabel("decode tokens")
    ax.grid(True, alpha=0.3)
axes[-1].set_xlabel("simulated time (s)")
fig

# %% [markdown]
# With chunked prefill the decode band never drops to zero while requests are
# running: a prompt is cut into chunks that ride along with the decodes, and
# no step is longer than the budget allows.

# %%
def stalls(result):
    return int(stall_mask(result.steps).sum())

compare = pd.DataFrame({name: {"stall_steps": stalls(r), "max_itl_ms": r.itl_s.max() * 1000,
                               "p99_itl_ms": r.summary["p99_itl_ms"],
                               "median_ttft_ms": r.summary["median_ttft_ms"],
                               "p99_ttft_ms": r.summary["p99_ttft_ms"]}
                        for name, r in (("continuous", prefill_first), ("chunked 512", chunked))}).T
compare

# %%
assert compare.loc["chunked 512", "stall_steps"] == 0 < compare.loc["continuous", "stall_steps"]
assert compare.loc["chunked 512", "max_itl_ms"] < compare.loc["continuous", "max_itl_ms"]

# %% [markdown]
# ## The chunk size: ITL vs TTFT
#
# Sweep `max_num_batched_tokens` on the same requests. The p99 ITL grows with
# the chunk (a decode shares its step with up to a whole chunk of prefill);
# TTFT falls as prompts need fewer, better-used steps, until the budget is
# larger than the prompts and nothing changes any more.

# %%
rows = []
for budget in CHUNKS:
    r = run("chunked", budget)
    rows.append({"engine.max_num_batched_tokens": budget,
                 **{k: r.summary[k] for k in ("median_itl_ms", "p99_itl_ms", "median_ttft_ms",
                                              "p99_ttft_ms", "output_throughput")}})
tradeoff = pd.DataFrame(rows)
plots.tradeoff(tradeoff, "engine.max_num_batched_tokens", title="Llama-3.1-8B on H100")

# %%
tradeoff.set_index("engine.max_num_batched_tokens").round(1)

# %%
small, large = tradeoff.iloc[0], tradeoff.iloc[-1]
assert small["p99_itl_ms"] < large["p99_itl_ms"]
assert small["median_ttft_ms"] > large["median_ttft_ms"]

# %% [markdown]
# **Takeaway.** Prefill-first scheduling stalls every running request while a
# long prompt is prefilled, which shows up as ITL spikes as long as a whole
# prefill. Chunked prefill removes the stalls by capping each step's work at
# `max_num_batched_tokens`; the cap then trades ITL (small chunks) against
# TTFT (large chunks). vLLM's defaults (2048 on smaller GPUs, 8192 or 16384
# on large ones) sit in the middle of this curve; `kvsim sweep` with
# `engine.max_num_batched_tokens` finds the point that meets your SLOs.
