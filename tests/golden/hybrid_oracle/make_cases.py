#!/usr/bin/env python3
"""Write the inputs of the hybrid-KV golden cases (models that mix layer types).

Each case is ``<case>/config.json`` (the oracle's keys plus ``layers``, one
KV spec per layer of the fake model: ``full``, ``sliding:W``, ``chunked:C``,
``mamba``; and ``disable_hybrid_kv_cache_manager``) and ``<case>/workload.jsonl``
(the oracle's format). ``regenerate.sh`` runs the real vLLM 0.33 scheduler on
them through ``tests/golden/oracle/run_hybrid_cases.py``, which writes
``expected.jsonl`` (the step trace) and ``groups.json`` (the KV-cache groups
vLLM made of the layers).

Standard library + numpy, deterministic (one ``default_rng`` per case); the
conventions of ``tests/golden/oracle/make_cases.py`` (prompt ids below
50,000, generated ids ``1e6 * (line + 1) + k``, arrivals on a 1/8 s grid,
``num_gpu_blocks`` counts the null block).

Usage:  python make_cases.py [--only NAME ...] [--list]
"""
from __future__ import annotations

import argparse
import json
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
GEN_STRIDE = 1_000_000
GRID = 8


def grid(t: float) -> float:
    return round(t * GRID) / GRID


def tokens(rng, n) -> list[int]:
    return [int(t) for t in rng.integers(1, 50_000, int(n))]


def mix(name: str, seed: int, description: str, layers: list[str], *, bs: int, nblocks: int,
        budget: int, seqs: int, mml: int, n: int, caching: bool = True, threshold: int = 0,
        disable_hybrid: bool = False, prefix_len=(8, 200), tail_len=(1, 160),
        max_tokens=(1, 64), policy: str = "fcfs") -> tuple[dict, list[dict]]:
    """Random lengths, shared prefixes with Zipf-like popularity, follow-ups that
    quote an earlier request's prompt and outputs, bursty arrivals."""
    rng = np.random.default_rng(seed)
    config = {"description": description, "block_size": bs, "num_gpu_blocks": nblocks,
              "max_num_batched_tokens": budget, "max_num_seqs": seqs,
              "enable_prefix_caching": caching, "enable_chunked_prefill": True,
              "long_prefill_token_threshold": threshold, "max_model_len": mml, "policy": policy,
              "layers": layers, "disable_hybrid_kv_cache_manager": disable_hybrid}
    k = int(rng.integers(2, 7))
    prefixes = [tokens(rng, rng.integers(*prefix_len)) for _ in range(k)]
    weights = 1.0 / np.arange(1, k + 1)
    weights /= weights.sum()
    reqs: list[dict] = []
    t = 0.0
    for i in range(n):
        if rng.random() > 0.25:
            t = grid(t + rng.exponential(1.2))
        out = int(rng.integers(*max_tokens))
        u = rng.random()
        prompt = None
        if u < 0.2 and reqs:
            j = int(rng.integers(0, len(reqs)))
            prev = reqs[j]
            quoted = [GEN_STRIDE * (j + 1) + q for q in range(prev["max_tokens"])]
            cand = prev["prompt_token_ids"] + quoted + tokens(rng, rng.integers(1, 40))
            if len(cand) + out < mml:
                prompt = cand
        if prompt is None and u < 0.8:
            prompt = prefixes[int(rng.choice(k, p=weights))] + tokens(rng, rng.integers(*tail_len))
        if prompt is None:
            prompt = tokens(rng, rng.integers(1, 300))
        prompt = prompt[:mml - 2]
        out = min(out, mml - 1 - len(prompt))
        prio = int(rng.integers(0, 3)) if policy == "priority" else 0
        reqs.append({"id": f"r{i}", "arrival_time": float(t), "prompt_token_ids": prompt,
                     "max_tokens": max(out, 1), "priority": prio})
    return config, reqs


GEMMA = ["sliding:32"] * 5 + ["full"]
CASES = {
    "sliding_only": lambda: mix(
        "sliding_only", 1, "Every layer slides (Mistral-7B's 4096-window layout, scaled): one "
        "sliding-window group, the unitary coordinator; blocks leave the window during "
        "decode and chunked prefill.", ["sliding:24"] * 4,
        bs=4, nblocks=120, budget=64, seqs=16, mml=384, n=80),
    "gemma_5to1": lambda: mix(
        "gemma_5to1", 2, "Gemma 3's 5 sliding : 1 full pattern, twice: 10 sliding layers in 5 "
        "groups of 2, 2 full layers in 1; tight memory, preemptions, shared prefixes.",
        GEMMA * 2, bs=4, nblocks=420, budget=96, seqs=24, mml=384, n=90),
    "gemma_5to1_caching_off": lambda: mix(
        "gemma_5to1_caching_off", 3, "Gemma 3's pattern without prefix caching: freed "
        "out-of-window blocks are unhashed and reused first (LIFO).", GEMMA * 2,
        bs=4, nblocks=480, budget=128, seqs=16, mml=384, n=70, caching=False),
    "gemma_hybrid_off": lambda: mix(
        "gemma_hybrid_off", 4, "Gemma 3's pattern with --disable-hybrid-kv-cache-manager: "
        "sliding layers are promoted to full attention, one group, nothing is dropped.",
        GEMMA * 2, bs=4, nblocks=120, budget=96, seqs=24, mml=384, n=60, disable_hybrid=True),
    "gptoss_alternating": lambda: mix(
        "gptoss_alternating", 5, "gpt-oss: sliding (window 128 scaled to 16) and full layers "
        "alternate, two groups; long prompts, the long-prefill threshold.",
        ["sliding:16", "full"] * 2, bs=4, nblocks=150, budget=80, seqs=32, mml=512, n=90,
        threshold=40),
    "sliding_long_prompts": lambda: mix(
        "sliding_long_prompts", 6, "Prompts far longer than the window, a small token budget: "
        "the sliding group frees blocks between prefill chunks; the whole-prompt gate caps "
        "it at window + in-flight tokens (max_admission_blocks_per_request).",
        ["sliding:20", "full", "sliding:20", "sliding:20"], bs=4, nblocks=200, budget=32,
        seqs=8, mml=768, n=40, prefix_len=(100, 300), tail_len=(50, 300)),
    "llama4_chunked": lambda: mix(
        "llama4_chunked", 7, "Llama 4: 3 chunked-local layers (chunk 16) : 1 full, with "
        "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1 (the hybrid manager on).",
        ["chunked:16"] * 3 + ["full"], bs=4, nblocks=160, budget=64, seqs=16, mml=384, n=70),
    "qwen3next_mamba": lambda: mix(
        "qwen3next_mamba", 8, "Qwen3-Next: 3 Gated DeltaNet (Mamba) layers : 1 full, twice, "
        "prefix caching on (mamba_cache_mode align): block-aligned prefill chunks, one state "
        "kept per block, shared-prefix junctions.", (["mamba"] * 3 + ["full"]) * 2,
        bs=8, nblocks=140, budget=64, seqs=16, mml=512, n=80),
    "qwen3next_mamba_caching_off": lambda: mix(
        "qwen3next_mamba_caching_off", 9, "Qwen3-Next's pattern without prefix caching: one "
        "Mamba block per request (block = max_model_len).", (["mamba"] * 3 + ["full"]) * 2,
        bs=8, nblocks=120, budget=64, seqs=16, mml=512, n=60, caching=False),
    "gemma_priority": lambda: mix(
        "gemma_priority", 10, "Gemma 3's pattern, priority policy: victims by priority, "
        "tight memory.", GEMMA, bs=4, nblocks=200, budget=64, seqs=16, mml=256, n=60,
        policy="priority"),
}


def differential(seed: int) -> tuple[dict, list[dict]]:
    """A random hybrid case (``differential.sh --hybrid``): a layer family (all
    sliding, Gemma-like k:1, gpt-oss alternating, two windows + full, chunked
    local + full, Mamba + full, sliding + chunked + full), block size, window
    or chunk, budgets, cache size, caching, the hybrid manager on or off,
    threshold, policy, and 15-89 requests of ``mix``."""
    rng = np.random.default_rng(70_000 + seed)
    fam = rng.choice(["sliding", "gemma", "alt", "windows", "chunked", "mamba", "local_mix"])
    bs = int(rng.choice([4, 8, 16])) if fam != "mamba" else int(rng.choice([8, 16]))
    w = int(rng.integers(bs + 1, 8 * bs))
    if fam == "sliding":
        layers = [f"sliding:{w}"] * int(rng.integers(1, 5))
    elif fam == "gemma":
        layers = ([f"sliding:{w}"] * int(rng.integers(1, 6)) + ["full"]) * int(rng.integers(1, 3))
    elif fam == "alt":
        layers = [f"sliding:{w}", "full"] * int(rng.integers(1, 3))
    elif fam == "windows":
        w2 = int(rng.integers(bs + 1, 8 * bs))
        layers = [f"sliding:{w}", f"sliding:{w2}", "full"] * int(rng.integers(1, 3))
    elif fam == "local_mix":
        c = bs * int(rng.integers(2, 8))
        layers = [f"sliding:{w}", f"chunked:{c}", "full"] * int(rng.integers(1, 3))
    elif fam == "chunked":
        c = bs * int(rng.integers(2, 8))
        layers = [f"chunked:{c}"] * int(rng.integers(1, 4)) + ["full"]
    else:
        layers = (["mamba"] * int(rng.integers(1, 4)) + ["full"]) * int(rng.integers(1, 3))
    mml = int(rng.choice([256, 384, 512]))
    budget = int(rng.choice([32, 64, 96, 128, 256]))
    seqs = int(min(budget, rng.choice([4, 8, 16, 32])))
    caching = bool(rng.random() < 0.8)
    per_request = -(-mml // bs)
    # Room for one max_model_len request in every group (at most 6 per layer kind).
    nblocks = int(per_request * len(set(layers)) * 6 * rng.uniform(1.05, 3.0)) + 1
    disable = bool(rng.random() < 0.15)
    threshold = int(rng.choice([0, 0, 0, 24, 40]))
    policy = "priority" if rng.random() < 0.25 else "fcfs"
    n = int(rng.integers(15, 90))
    name = f"differential_{seed}"
    return mix(name, 80_000 + seed, f"Hybrid differential case (seed {seed}, {fam}): "
               f"{', '.join(layers)}; block_size {bs}, {nblocks} blocks, budget {budget}, "
               f"max_num_seqs {seqs}, max_model_len {mml}, caching {'on' if caching else 'off'}, "
               f"hybrid manager {'off' if disable else 'on'}, threshold {threshold}, {policy}.",
               layers, bs=bs, nblocks=nblocks, budget=budget, seqs=seqs, mml=mml, n=n,
               caching=caching, threshold=threshold, disable_hybrid=disable, policy=policy,
               max_tokens=(1, int(rng.choice([16, 64, 150]))))


# Seeds of ``differential`` kept as golden cases: picked from seeds 0-399 (all
# of which match, tests/golden/oracle/README.md), one per layer family that
# has no hand-made case (two windows + full, sliding + chunked + full) or
# with preemptions (Gemma-like, chunked local), and Mamba.
DIFFERENTIAL_SEEDS = (96, 150, 111, 74, 326)
CASES.update({f"differential_{s}": (lambda s: lambda: differential(s))(s)
              for s in DIFFERENTIAL_SEEDS})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--differential", nargs=2, type=int, metavar=("FROM", "TO"),
                    help="write the random cases of seeds FROM..TO-1 to --out instead")
    ap.add_argument("--out", default=HERE, help="folder for <case>/ (default: here)")
    args = ap.parse_args()
    cases = dict(CASES)
    if args.differential:
        cases = {f"differential_{s}": (lambda s: lambda: differential(s))(s)
                 for s in range(*args.differential)}
    names = args.only or list(cases)
    if args.list:
        print("\n".join(names))
        return
    for name in names:
        config, reqs = cases[name]()
        d = os.path.join(args.out, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(config, f, indent=1)
            f.write("\n")
        with open(os.path.join(d, "workload.jsonl"), "w") as f:
            for r in reqs:
                f.write(json.dumps(r, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
