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
# # 1. Why the KV cache limits batch size
#
# An LLM serving engine keeps, for every token of every request in flight, the
# keys and values of every attention layer: the **KV cache**. Decoding is
# memory-bound, so throughput comes from batching many requests into one step
# — and the batch can only be as large as the KV cache that holds them.
#
# This notebook measures that limit with kvsim:
#
# 1. how many bytes one token costs, for MHA, GQA and MLA models, in 16-bit and fp8;
# 2. how many tokens fit on real GPUs once the weights are loaded (sized as vLLM does);
# 3. how much of that memory a **contiguous** allocator (one max-length slab
#    per request, as before PagedAttention) wastes, against **paging**.

# %% tags=["parameters"]
import os

# CI runs the notebooks with KVSIM_NOTEBOOK_FAST=1: same story, smaller sizes.
# (This one only does arithmetic and allocator bookkeeping: it is fast either way.)
FAST = os.environ.get("KVSIM_NOTEBOOK_FAST") == "1"
NUM_REQUESTS = 2000      # sampled chat requests, more than an H100 holds even when paged

# %%
# %matplotlib inline
import numpy as np
import pandas as pd

from kvsim import plots
from kvsim.kv.contiguous import ContiguousAllocator, paged_usage
from kvsim.specs import kv_capacity, load_gpu, load_model

# %% [markdown]
# ## 1. Bytes per token
#
# Per layer, standard attention stores a key and a value vector for each KV head:
#
#     kv_bytes_per_token = 2 (K and V) x layers x kv_heads x head_dim x bytes_per_element
#
# * **MHA** (Llama-2-7B): every query head has its own KV head (32).
# * **GQA** (Llama-3.1-8B, Mistral-7B): 8 KV heads shared by 32 query heads: 4x less.
# * **MLA** (DeepSeek-V2-Lite): one compressed latent per layer
#   (`kv_lora_rank + qk_rope_head_dim` = 512 + 64 values), no separate K and V.
# * **fp8** KV (`--kv-cache-dtype fp8`) halves any of them.

# %%
models = ["llama-2-7b", "llama-3.1-8b", "mistral-7b", "deepseek-v2-lite"]
rows = []
for name in models:
    m = load_model(name)
    kind = "MLA" if m.is_mla else ("MHA" if m.num_kv_heads == m.num_attention_heads else "GQA")
    for dtype in ("auto", "fp8"):
        rows.append({"model": name, "attention": kind, "kv_cache_dtype": dtype,
                     "kv_bytes_per_token": m.kv_bytes_per_token(dtype),
                     "KiB_per_token": m.kv_bytes_per_token(dtype) / 1024,
                     "GiB_per_100k_tokens": m.kv_bytes_per_token(dtype) * 100_000 / 2**30})
per_token = pd.DataFrame(rows)
per_token

# %%
llama2 = per_token.query("model == 'llama-2-7b' and kv_cache_dtype == 'auto'")["kv_bytes_per_token"].item()
llama3 = per_token.query("model == 'llama-3.1-8b' and kv_cache_dtype == 'auto'")["kv_bytes_per_token"].item()
mla = per_token.query("model == 'deepseek-v2-lite' and kv_cache_dtype == 'auto'")["kv_bytes_per_token"].item()
assert llama2 == 2 * 32 * 32 * 128 * 2 == 524_288        # MHA: 512 KiB per token
assert llama3 == 2 * 32 * 8 * 128 * 2 == 131_072         # GQA: 4x less
print(f"GQA saves {llama2 / llama3:.0f}x over MHA; MLA a further {llama3 / mla:.1f}x; fp8 another 2x")

# %% [markdown]
# ## 2. Capacity on real GPUs
#
# vLLM gives the KV cache what is left of `gpu_memory_utilization` x memory
# after the weights, the activation peak of a profiling forward pass and some
# overheads (`kvsim.specs.kv_capacity`, kv-semantics D2-D3). The token
# capacity divided by the tokens per request is the most requests the engine
# can hold at once — the batch-size ceiling.

# %%
gpus = ["l4", "a10g", "a100-40gb", "a100-80gb-sxm", "h100-sxm", "h200"]
request_tokens = 2048     # a typical chat request: prompt + answer
rows = []
for model_name in ("llama-2-7b", "llama-3.1-8b"):
    model = load_model(model_name)
    for gpu_name in gpus:
        for dtype in ("auto", "fp8"):
            cap = kv_capacity(model, load_gpu(gpu_name), kv_cache_dtype=dtype)
            rows.append({"model": model_name, "gpu": gpu_name, "kv_cache_dtype": dtype,
                         "weights_GiB": cap.weight_bytes / 2**30,
                         "kv_GiB": cap.available_kv_bytes / 2**30,
                         "token_capacity": cap.token_capacity,
                         f"requests_of_{request_tokens}": cap.token_capacity // request_tokens})
capacity = pd.DataFrame(rows)
capacity.pivot_table(index="gpu", columns=["model", "kv_cache_dtype"],
                     values=f"requests_of_{request_tokens}", sort=False)

# %%
from matplotlib.figure import Figure

fig = Figure(figsize=(9, 4), layout="constrained")
ax = fig.subplots()
for i, (label, part) in enumerate(capacity.groupby(["model", "kv_cache_dtype"], sort=False)):
    xs = np.arange(len(gpus)) + (i - 1.5) * 0.2
    ax.bar(xs, part[f"requests_of_{request_tokens}"], width=0.2, label=" ".join(label))
ax.set_xticks(np.arange(len(gpus)), gpus)
ax.set_yscale("log")
ax.set_ylabel(f"requests of {request_tokens} tokens that fit")
ax.set_title("KV capacity after the weights, as vLLM sizes it")
ax.legend(fontsize="small")
fig

# %% [markdown]
# On a 24 GB L4 the 16 GB of Llama-3.1-8B weights leave room for only about a
# dozen 2k-token requests; the MHA Llama-2-7B, although its weights are
# smaller, fits half as many (4x the bytes per token). An H100 holds
# hundreds. GQA, MLA and fp8 KV all raise the ceiling by shrinking the bytes
# per token, not by adding memory.
#
# ## 3. Contiguous slabs vs paging
#
# Before PagedAttention, engines reserved one contiguous slab per request, big
# enough for its *maximum* length (`max_model_len`), because the final length
# is unknown when it starts. The vLLM paper (Kwon et al., SOSP'23, Fig. 2)
# splits the resulting waste into reserved-but-unused slots, internal
# fragmentation (slots the request never reaches) and external fragmentation
# (gaps too small for the next request).
#
# We fill an H100's Llama-3.1-8B KV cache with chat requests (lognormal
# lengths) midway through their answers, first with max-length slabs
# (`ContiguousAllocator`, first fit), then paged in 16-token blocks
# (`paged_usage`), and count how many requests each holds.

# %%
rng = np.random.default_rng(0)
model, gpu = load_model("llama-3.1-8b"), load_gpu("h100-sxm")
cap = kv_capacity(model, gpu)
bytes_per_token = cap.kv_bytes_per_token
max_model_len, block_size = 8192, 16
capacity_tokens = cap.num_usable_blocks * block_size

prompt = np.clip(rng.lognormal(np.log(600), 0.7, NUM_REQUESTS), 16, 4096).astype(int)
output = np.clip(rng.lognormal(np.log(200), 0.6, NUM_REQUESTS), 8, 1024).astype(int)
progress = rng.uniform(0, 1, NUM_REQUESTS)            # how far into its answer each request is
used = prompt + (progress * output).astype(int)

# Contiguous: admit requests in order until the next max-length slab does not fit.
slabs = ContiguousAllocator(capacity_tokens, bytes_per_token)
n_contiguous = 0
while n_contiguous < NUM_REQUESTS and slabs.can_allocate(max_model_len):
    i = n_contiguous
    slabs.allocate(i, max_model_len, final_tokens=int(prompt[i] + output[i]))
    slabs.set_used(i, int(used[i]))
    n_contiguous += 1

# Paged: admit requests in order while their blocks fit.
blocks_needed = np.ceil(used / block_size).astype(int)
n_paged = int(np.searchsorted(np.cumsum(blocks_needed), cap.num_usable_blocks, side="right"))
print(f"contiguous slabs hold {n_contiguous} requests; paged blocks hold {n_paged} "
      f"({n_paged / n_contiguous:.1f}x)" + (" (all the sampled requests)" if n_paged == NUM_REQUESTS else ""))

# %%
def row(system, usage):
    return {"system": system, "used_bytes": usage.used_bytes,
            "reserved_unused_bytes": usage.reserved_unused_bytes,
            "internal_fragmentation_bytes": usage.internal_fragmentation_bytes,
            "external_fragmentation_bytes": usage.external_fragmentation_bytes,
            "free_bytes": usage.free_bytes}

contiguous = slabs.usage(next_request_tokens=max_model_len)
paged_same = paged_usage([int(u) for u in used[:n_contiguous]], block_size, bytes_per_token,
                         cap.num_usable_blocks)
paged_full = paged_usage([int(u) for u in used[:n_paged]], block_size, bytes_per_token,
                         cap.num_usable_blocks)
memory = pd.DataFrame([row(f"contiguous\n({n_contiguous} requests)", contiguous),
                       row(f"paged, same requests\n({n_contiguous})", paged_same),
                       row(f"paged, filled\n({n_paged} requests)", paged_full)])
plots.memory_waste(memory, title="Llama-3.1-8B on H100")

# %%
share = contiguous.used_bytes / (contiguous.total_bytes - contiguous.free_bytes)
print(f"contiguous: {share:.1%} of the reserved KV memory holds tokens "
      f"(the vLLM paper measured 20-38% for Orca-style reservation with a 2,048-token maximum; "
      f"here the maximum is {max_model_len} and a request is about 800 tokens)")
print(f"paged: {paged_full.used_bytes / (paged_full.total_bytes - paged_full.free_bytes):.1%} "
      f"(waste only in each request's last, partly filled block)")
assert n_paged > 3 * n_contiguous
l4 = capacity.query("gpu == 'l4' and kv_cache_dtype == 'auto'").set_index("model")[
    f"requests_of_{request_tokens}"]
assert 1.5 <= l4["llama-3.1-8b"] / l4["llama-2-7b"] <= 3     # "half as many" on an L4

# %% [markdown]
# **Takeaway.** The batch size of an LLM server is bounded by
# `KV memory / (bytes per token x tokens per request)`. Model architecture
# (GQA, MLA) and KV dtype set the bytes per token; the GPU's memory minus the
# weights sets the KV memory; and the allocator decides how much of it holds
# real tokens. Reserving `max_model_len` per request wastes most of the cache,
# so paging fits several times more requests in the same memory — which is
# where vLLM's throughput gain starts.
