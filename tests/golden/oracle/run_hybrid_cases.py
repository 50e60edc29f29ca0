#!/usr/bin/env python3
"""Run the vLLM oracle on models whose layers mix KV-cache types (one interpreter).

``vllm_oracle.py`` gives the real vLLM 0.33 ``Scheduler`` one full-attention
KV-cache group. This driver uses the oracle's own ``load_workload``,
``make_request`` and ``run`` (the same step loop, fake model output and trace
format) but builds the scheduler from *per-layer* KV specs, the way vLLM's
engine does: every layer of the fake model gets a spec (``FullAttentionSpec``,
``SlidingWindowSpec``, ``ChunkedLocalAttentionSpec``, ``MambaSpec``), vLLM's
``get_kv_cache_groups`` groups them (``disable_hybrid_kv_cache_manager`` as
the case says), and ``resolve_kv_cache_block_sizes`` gives the scheduler and
hash block sizes. The groups vLLM made are written to ``groups.json`` next to
the trace, so the kvsim test can check its own grouping against them.

Per-layer pages: attention layers use one KV head of size 1 in float32
(8 bytes per token), a Mamba layer a float32 state of ``2 x block_size``
elements, padded to nothing: all pages are equal, as vLLM's platform code
makes them for real hybrid models (``_align_hybrid_block_size``).

A case's ``config.json`` has the oracle's keys plus ``layers`` (a list of
``"full"``, ``"sliding:W"``, ``"chunked:C"``, ``"mamba"``) and optionally
``disable_hybrid_kv_cache_manager``. Must run under the oracle's virtualenv.

Usage: run_hybrid_cases.py --oracle-dir DIR CASE_DIR [CASE_DIR ...]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

HYBRID_KEYS = ("layers", "disable_hybrid_kv_cache_manager")


def load_config(vllm_oracle, path: str) -> dict:
    """The oracle's load_config for the oracle's keys; the layer list kept aside."""
    with open(path) as f:
        user = json.load(f)
    hybrid = {k: user.pop(k) for k in HYBRID_KEYS if k in user}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(user, f)
    try:
        cfg = vllm_oracle.load_config(f.name)
    finally:
        os.unlink(f.name)
    cfg["layers"] = list(hybrid["layers"])
    cfg["disable_hybrid_kv_cache_manager"] = bool(hybrid.get("disable_hybrid_kv_cache_manager", False))
    return cfg


def layer_specs(cfg: dict) -> dict:
    import torch
    from vllm.v1.kv_cache_interface import (ChunkedLocalAttentionSpec, FullAttentionSpec,
                                            MambaSpec, SlidingWindowSpec)
    bs = cfg["block_size"]
    attn = dict(block_size=bs, num_kv_heads=1, head_size=1, dtype=torch.float32)
    specs = {}
    for i, layer in enumerate(cfg["layers"]):
        kind, _, arg = layer.partition(":")
        name = f"model.layers.{i}.attn"
        if kind == "full":
            specs[name] = FullAttentionSpec(**attn)
        elif kind == "sliding":
            specs[name] = SlidingWindowSpec(**attn, sliding_window=int(arg))
        elif kind == "chunked":
            specs[name] = ChunkedLocalAttentionSpec(**attn, attention_chunk_size=int(arg))
        elif kind == "mamba":
            align = cfg["enable_prefix_caching"]
            specs[name] = MambaSpec(block_size=bs if align else cfg["max_model_len"],
                                    shapes=((2 * bs,),), dtypes=(torch.float32,),
                                    mamba_cache_mode="align" if align else "none")
        else:
            raise SystemExit(f"config: layer {layer!r}; allowed: full, sliding:W, chunked:C, mamba")
    return specs


def build_scheduler(cfg: dict, model_dir: str):
    """vllm_oracle.build_scheduler with the case's per-layer KV specs."""
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.kv_cache_planning import get_kv_cache_groups
    from vllm.v1.core.kv_cache_utils import (resolve_cache_hit_alignment_tokens,
                                             resolve_kv_cache_block_sizes)
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.structured_output import StructuredOutputManager

    bs = cfg["block_size"]
    nblocks = cfg["num_gpu_blocks"]
    has_mamba = any(layer == "mamba" for layer in cfg["layers"])
    scheduler_config = SchedulerConfig(
        max_num_seqs=cfg["max_num_seqs"], max_num_batched_tokens=cfg["max_num_batched_tokens"],
        max_model_len=cfg["max_model_len"], is_encoder_decoder=False,
        long_prefill_token_threshold=cfg["long_prefill_token_threshold"],
        enable_chunked_prefill=cfg["enable_chunked_prefill"], policy=cfg["policy"],
        async_scheduling=False, **cfg["extra_scheduler_config"])
    model_config = ModelConfig(model=model_dir, dtype="float16", seed=42,
                               skip_tokenizer_init=True, max_model_len=cfg["max_model_len"])
    cache_config = CacheConfig(block_size=bs, gpu_memory_utilization=0.9, cache_dtype="auto",
                               enable_prefix_caching=cfg["enable_prefix_caching"])
    vllm_config = VllmConfig(scheduler_config=scheduler_config, model_config=model_config,
                             cache_config=cache_config, device_config=DeviceConfig(device="cpu"))
    if has_mamba:
        # What MambaModelConfig.verify_and_update_config sets for a hybrid model.
        align = cfg["enable_prefix_caching"]
        cache_config.mamba_cache_mode = "align" if align else "none"
        cache_config.mamba_block_size = bs if align else cfg["max_model_len"]
    # The engine core resolves the layout from the attention backends; FlashAttention's
    # NHD (layer outermost) is what the GPU runs. Pages are equal, so it decides nothing.
    cache_config.kv_cache_layout = "LBNHC"
    # The CPU platform turns the hybrid manager off; the case decides here.
    vllm_config.scheduler_config.disable_hybrid_kv_cache_manager = cfg["disable_hybrid_kv_cache_manager"]
    groups = get_kv_cache_groups(vllm_config, layer_specs(cfg))
    kv_cache_config = KVCacheConfig(num_blocks=nblocks, kv_cache_tensors=[], kv_cache_groups=groups)
    cache_config.num_gpu_blocks = nblocks
    scheduler_block_size, hash_block_size = resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)
    kv_cache_config.hash_block_size = hash_block_size
    kv_cache_config.cache_hit_alignment_tokens = resolve_cache_hit_alignment_tokens(
        kv_cache_config, vllm_config, scheduler_block_size, hash_block_size)
    sched = Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                      structured_output_manager=StructuredOutputManager(vllm_config),
                      log_stats=True, block_size=scheduler_block_size,
                      hash_block_size=hash_block_size)
    checks = {
        "hash_block_size": (hash_block_size, bs),
        "num_gpu_blocks": (sched.kv_cache_manager.block_pool.num_gpu_blocks, nblocks),
        "max_num_seqs": (sched.max_num_running_reqs, cfg["max_num_seqs"]),
        "max_num_batched_tokens": (sched.max_num_scheduled_tokens, cfg["max_num_batched_tokens"]),
        "enable_prefix_caching": (sched.kv_cache_manager.enable_caching, cfg["enable_prefix_caching"]),
        "max_model_len": (sched.max_model_len, cfg["max_model_len"]),
        "async_scheduling": (bool(sched.scheduler_config.async_scheduling), False),
    }
    bad = {k: v for k, v in checks.items() if v[0] != v[1]}
    if bad and cfg["enable_prefix_caching"]:
        raise SystemExit(f"vLLM changed the effective config (got, wanted): {bad}")
    build_scheduler.groups = [
        {"layers": [int(n.split(".")[2]) for n in g.layer_names],
         "kind": type(g.kv_cache_spec).__name__, "block_size": g.kv_cache_spec.block_size}
        for g in groups]
    caching_hash_fn = None
    if cfg["enable_prefix_caching"]:
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import init_none_hash
        caching_hash_fn = get_hash_fn_by_name(cache_config.prefix_caching_hash_algo)
        init_none_hash(caching_hash_fn)
    return sched, hash_block_size, caching_hash_fn, vllm_config


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--oracle-dir", required=True, help="folder holding vllm_oracle.py")
    ap.add_argument("case_dirs", nargs="+")
    args = ap.parse_args()
    sys.path.insert(0, os.path.abspath(args.oracle_dir))
    import vllm_oracle  # noqa: E402  (path set just above)

    if os.environ.get("PYTHONHASHSEED") != "0":
        env = dict(os.environ)
        env.update(vllm_oracle._ENV)
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__)] + sys.argv[1:], env)
    for k, v in vllm_oracle._ENV.items():
        os.environ.setdefault(k, v)
    import logging
    logging.disable(logging.WARNING)
    import vllm

    vllm_oracle.build_scheduler = build_scheduler
    failed = []
    for d in args.case_dirs:
        name = os.path.basename(os.path.normpath(d))
        t0 = time.time()
        try:
            cfg = load_config(vllm_oracle, os.path.join(d, "config.json"))
            workload = vllm_oracle.load_workload(os.path.join(d, "workload.jsonl"), cfg)
            totals = vllm_oracle.run(cfg, workload, os.path.join(d, "expected.jsonl"),
                                     5_000_000, "per-request")
            with open(os.path.join(d, "groups.json"), "w") as f:
                json.dump(build_scheduler.groups, f, indent=1)
                f.write("\n")
        except (SystemExit, Exception) as e:
            failed.append(name)
            print(f"{name}: FAILED: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        totals["wall_s"] = round(time.time() - t0, 2)
        print(f"{name}: vllm {vllm.__version__}: {json.dumps(totals)}", file=sys.stderr)
    if failed:
        print(f"failed cases: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
