"""``kvsim capacity``: how much KV cache a model gets on a GPU, as vLLM sizes it.

    kvsim capacity --model llama-3.1-8b --gpu h100-sxm [--tp 2] [--dp 4 --enable-expert-parallel]
        [--gpu-memory-utilization 0.9] [--block-size 16] [--kv-cache-dtype fp8]
        [--max-num-batched-tokens 8192] [--num-gpu-blocks-override N] [--seq-len 640]
        [--max-model-len 32768] [--disable-hybrid-kv-cache-manager]
    kvsim capacity --list
"""

from __future__ import annotations

import argparse
import sys

from kvsim.specs import catalog
from kvsim.specs.capacity import KVCapacity, default_max_num_batched_tokens, kv_capacity
from kvsim.specs.gpu import GIB
from kvsim.specs.model import KV_CACHE_DTYPE_BYTES


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "capacity",
        help="KV-cache size of a model on a GPU (vLLM's sizing)",
        description="Print weights, KV bytes per token, number of KV blocks and token "
                    "capacity of one GPU, sized as vLLM does.")
    p.add_argument("--list", action="store_true", help="list the catalog GPUs and models")
    p.add_argument("--model", help="catalog name, or a path to a Hugging Face config.json "
                                   "or a YAML/JSON file with ModelSpec fields")
    p.add_argument("--gpu", help="catalog name, or a path to a YAML/JSON file with GPUSpec fields")
    p.add_argument("--tp", "--tensor-parallel-size", dest="tp", type=int, default=1,
                   help="tensor-parallel size (default 1)")
    p.add_argument("--dp", "--data-parallel-size", dest="dp", type=int, default=1,
                   help="data-parallel size: attention replicas whose tokens share the "
                        "experts of an MoE model (default 1)")
    p.add_argument("--enable-expert-parallel", action="store_true",
                   help="split an MoE model's experts over the tp x dp GPUs (vLLM's flag)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="fraction of total GPU memory vLLM may use (default 0.9)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block (default 16)")
    p.add_argument("--kv-cache-dtype", default="auto", choices=list(KV_CACHE_DTYPE_BYTES),
                   help="KV element type (default auto = model dtype)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="token budget per step, the size of vLLM's profile forward pass "
                        "(default: vllm serve's for the GPU, as kvsim run uses)")
    p.add_argument("--max-num-seqs", type=int, default=None,
                   help="sequences sampled in the profile run (default: vLLM's for the GPU)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="for vLLM's 'maximum concurrency' line (default: the model's "
                        "max_position_embeddings)")
    p.add_argument("--num-gpu-blocks-override", type=int, default=None,
                   help="use this many KV blocks instead of the computed number")
    p.add_argument("--seq-len", type=int, default=None,
                   help="also print how many requests of this many tokens fit at once")
    p.add_argument("--disable-hybrid-kv-cache-manager", action=argparse.BooleanOptionalAction,
                   default=None, help="one KV-cache group for all layers (default: vLLM's "
                                      "choice: off only for chunked local attention)")
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=True,
                   help="two batches in flight, which sliding-window groups reserve for "
                        "(default: on, as in vLLM 0.33)")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                   default=True, help="linear-attention state: 2 blocks per request when on "
                                      "(vLLM's 'align' Mamba cache mode), 1 when off")
    p.add_argument("--activation-gib", type=float, default=None,
                   help="activation peak of the profile run, GiB (default: estimated)")
    p.add_argument("--non-torch-gib", type=float, default=None,
                   help="non-torch memory (NCCL, cuBLAS), GiB (default 0.15, +0.75 with >1 GPU)")
    p.add_argument("--cudagraph-gib", type=float, default=None,
                   help="CUDA-graph memory, GiB (default 0.5; 0 for --enforce-eager)")
    p.set_defaults(func=run)

    def one_line_error(message: str):
        # argparse prints the whole usage block; a user error here is one line (exit 2).
        print(f"kvsim capacity: error: {message}", file=sys.stderr)
        raise SystemExit(2)

    p.error = one_line_error
    return p


def run(args: argparse.Namespace) -> int:
    if args.list:
        print(format_catalog())
        return 0
    if not args.model or not args.gpu:
        missing = " and ".join(f"--{n}" for n in ("model", "gpu") if not getattr(args, n))
        raise ValueError(f"{missing} required (or --list to see the catalog)")
    for flag in ("tp", "dp", "block_size", "max_num_batched_tokens", "max_num_seqs",
                 "num_gpu_blocks_override", "seq_len", "max_model_len"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be a positive integer, got {value}")
    overheads = {}
    for flag in ("activation_gib", "non_torch_gib", "cudagraph_gib"):
        value = getattr(args, flag)
        if value is not None:
            if value < 0:
                raise ValueError(f"--{flag.replace('_', '-')} must be >= 0, got {value}")
            overheads[flag.replace("_gib", "_bytes")] = int(round(value * GIB))
    model = catalog.load_model(args.model)
    gpu = catalog.load_gpu(args.gpu)
    budget = args.max_num_batched_tokens
    budget_source = "--max-num-batched-tokens"
    if budget is None:
        budget = default_max_num_batched_tokens(gpu)
        budget_source = f"vllm serve default for {gpu.name}"
    cap = kv_capacity(model, gpu, tp=args.tp, dp=args.dp,
                      enable_expert_parallel=args.enable_expert_parallel,
                      gpu_memory_utilization=args.gpu_memory_utilization,
                      block_size=args.block_size, kv_cache_dtype=args.kv_cache_dtype,
                      max_num_batched_tokens=budget, max_num_seqs=args.max_num_seqs,
                      num_gpu_blocks_override=args.num_gpu_blocks_override,
                      disable_hybrid_kv_cache_manager=args.disable_hybrid_kv_cache_manager,
                      enable_prefix_caching=args.enable_prefix_caching,
                      async_scheduling=args.async_scheduling, **overheads)
    max_model_len = args.max_model_len or model.max_position_embeddings
    print(format_capacity(cap, seq_len=args.seq_len, budget_source=budget_source,
                          max_model_len=max_model_len, model=model))
    return 0


def _gib(n: int | float) -> str:
    return f"{n / GIB:,.2f} GiB"


def format_capacity(cap: KVCapacity, seq_len: int | None = None, budget_source: str = "",
                    max_model_len: int | None = None, model=None) -> str:
    """An aligned, labelled table of one :class:`KVCapacity`."""
    layout = f"tp={cap.tp}" + (f", dp={cap.dp}" if cap.dp > 1 else "") + (
        f", ep={cap.expert_parallel_size}" if cap.expert_parallel_size > 1 else "")
    rows = [
        ("GPU memory (total)", _gib(cap.total_memory_bytes), f"{cap.total_memory_bytes:,} B"),
        (f"requested (x {cap.gpu_memory_utilization:g})", _gib(cap.requested_memory_bytes),
         f"{cap.requested_memory_bytes:,} B"),
        (f"weights per GPU ({layout})", _gib(cap.weight_bytes), f"{cap.weight_bytes:,} B"),
    ]
    parts = cap.weight_bytes_by_part or {}
    if cap.num_local_experts:
        if cap.expert_parallel_size > 1:
            experts = f"{cap.num_local_experts} whole experts per GPU"
        elif cap.tp * cap.dp > 1:
            experts = f"every expert, 1/{cap.tp * cap.dp} of its width"
        else:
            experts = f"all {cap.num_local_experts} experts"
        rows.append(("  routed experts", _gib(parts.get("experts", 0)), experts))
        rows.append(("  attention, dense MLP, shared experts, embeddings",
                     _gib(cap.weight_bytes - parts.get("experts", 0)), f"split tp={cap.tp}"))
    rows += [
        ("token budget (max_num_batched_tokens)", f"{cap.max_num_batched_tokens:,} tokens",
         budget_source or "as given"),
        (f"activation peak ({cap.max_num_batched_tokens} tok, {cap.max_num_seqs} seqs)",
         _gib(cap.activation_peak_bytes), f"{cap.activation_peak_bytes:,} B"),
        ("non-torch memory", _gib(cap.non_torch_bytes), f"{cap.non_torch_bytes:,} B"),
        ("CUDA graphs", _gib(cap.cudagraph_bytes), f"{cap.cudagraph_bytes:,} B"),
        ("available for KV", _gib(cap.available_kv_bytes), f"{cap.available_kv_bytes:,} B"),
        (f"KV bytes per token ({cap.kv_cache_dtype})", f"{cap.kv_bytes_per_token:,} B",
         f"{cap.kv_bytes_per_token / 1024:,.1f} KiB"),
        ("block size", f"{cap.block_size} tokens", f"{cap.block_bytes:,} B per block"),
        ("num_gpu_blocks", f"{cap.num_gpu_blocks:,}",
         "override" if cap.num_gpu_blocks_overridden else "incl. 1 null block"),
    ]
    if cap.is_hybrid:
        rows.append(("token capacity (one group)", f"{cap.token_capacity:,} tokens",
                     "each group draws from the same pool"))
    else:
        rows.append(("token capacity", f"{cap.token_capacity:,} tokens",
                     f"vLLM logs {cap.vllm_logged_tokens:,}"))
    if max_model_len is not None:
        rows.append((f"max concurrency at max_model_len {max_model_len:,}",
                     f"{cap.max_concurrency(max_model_len):,.2f}x",
                     f"vLLM logs {cap.logged_kv_cache_size_tokens(max_model_len):,} tokens"))
    if seq_len is not None:
        fit = cap.max_concurrent_requests(seq_len)
        rows.append((f"requests of {seq_len} tokens", f"{fit:,}",
                     f"{cap.blocks_per_request(seq_len)} blocks each"))
        rows.append((f"tokens that fit at {seq_len} per request", f"{fit * seq_len:,}", ""))
    title = f"{cap.model_name} on {cap.gpu_name}, per GPU ({layout})"
    text = title + "\n" + _table(rows)
    if cap.kv_groups is not None and (cap.is_hybrid or model is not None and model.is_hybrid):
        text += "\n" + _format_groups(cap, seq_len)
    return text


def _format_groups(cap: KVCapacity, seq_len: int | None) -> str:
    manager = ("hybrid KV cache manager off: every layer keeps every token"
               if cap.disable_hybrid_kv_cache_manager else "vLLM's hybrid KV cache manager")
    lines = [f"KV-cache groups: {len(cap.kv_groups.groups)} ({manager}; in-flight tokens "
             f"{cap.max_in_flight_tokens:,})"]
    rows = []
    for i, g in enumerate(cap.kv_groups.groups):
        extra = (f"window {g.spec.sliding_window}" if g.spec.sliding_window else
                 f"chunk {g.spec.attention_chunk_size}" if g.spec.attention_chunk_size else "")
        blocks = (f"{g.max_blocks_per_request(seq_len, cap.max_in_flight_tokens)} blocks at "
                  f"{seq_len} tokens" if seq_len else "")
        rows.append((f"group {i}", g.kind, f"{len(g.layers)} layers", extra,
                     f"{g.spec.block_size} tok/block", blocks))
    return "\n".join(lines) + "\n" + _table(rows)


def format_catalog() -> str:
    gpu_rows = []
    for name in catalog.list_gpus():
        g = catalog.load_gpu(name)
        low = "".join(f", {v:g} {k}" for k, v in (("fp8", g.fp8_tflops), ("fp4", g.fp4_tflops)) if v)
        gpu_rows.append((name, _gib(g.memory_bytes), f"{g.hbm_bandwidth_gbps:g} GB/s",
                         f"{g.bf16_tflops:g} TFLOPS bf16{low}"))
    model_rows = []
    for name in catalog.list_models():
        m = catalog.load_model(name)
        kind = "MLA" if m.is_mla else ("MHA" if m.num_kv_heads == m.num_attention_heads
                                      else "GQA" if m.num_kv_heads > 1 else "MQA")
        if m.is_hybrid:
            kind += "+" + "/".join(sorted({t.split("_")[0] for t in m.layer_types}))
        if m.is_moe:
            kind += f"+MoE {m.num_experts_per_tok}/{m.num_experts}"
        model_rows.append((name, f"{m.num_params() / 1e9:.2f}B params", kind,
                           f"{m.kv_bytes_per_token():,} B KV/token"))
    aliases = {**catalog.gpu_aliases(), **catalog.model_aliases()}
    alias_line = ", ".join(f"{a} -> {c}" for a, c in aliases.items())
    return ("GPUs:\n" + _table(gpu_rows) + "\n\nModels:\n" + _table(model_rows)
            + "\n\nAliases: " + alias_line)


def _table(rows) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for r in rows:
        first = f"  {r[0]:<{widths[0]}}"
        rest = "  ".join(f"{c:>{w}}" for c, w in zip(r[1:], widths[1:]))
        lines.append(f"{first}  {rest}".rstrip())
    return "\n".join(lines)
