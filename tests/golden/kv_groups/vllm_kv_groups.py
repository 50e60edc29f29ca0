"""Expected KV-cache groups from the real vLLM 0.33 planning code (run by hand).

    /work/venv-vllm/bin/python tests/golden/kv_groups/vllm_kv_groups.py \
        > tests/golden/kv_groups/vllm_kv_groups.json

Each case is a list of layer specs in kvsim's terms (kind, block_size,
bytes per token or state bytes, window, chunk); the script builds vLLM's
``FullAttentionSpec`` / ``SlidingWindowSpec`` / ``ChunkedLocalAttentionSpec`` /
``MambaSpec`` for them, runs ``vllm.v1.core.kv_cache_planning.get_kv_cache_groups``
and ``get_kv_cache_config_from_groups`` with a layer-outermost layout, and
``kv_cache_utils.get_max_concurrency_for_kv_cache_config``, and records the
groups (layer indices, kind, block size), ``num_blocks`` and the maximum
concurrency. tests/test_kv_groups.py checks kvsim.specs.kv_groups against it.
Cases 1-9 are the vectors of vLLM's tests/v1/core/test_kv_cache_utils.py
(test_get_kv_cache_config_one_worker); the rest are real model layouts.
"""

import json
import sys
from types import SimpleNamespace

import torch

from vllm.v1.core import kv_cache_planning as planning
from vllm.v1.core.kv_cache_utils import get_max_concurrency_for_kv_cache_config
from vllm.v1.kv_cache_interface import (ChunkedLocalAttentionSpec, FullAttentionSpec,
                                        MambaSpec, SlidingWindowSpec)
from vllm.v1.kv_cache_layout import KVCacheLayout

P = 16 * 2 * 64 * 4 * 2  # vLLM test: block 16, 2 KV heads, head 64, float32, K and V


def full(head=64, block=16, window=None):
    return ("full", block, head, window)


def sw(head=64, block=16, window=1):
    return ("sliding", block, head, window)


def chunked(head=64, block=16, chunk=4):
    return ("chunked", block, head, chunk)


def mamba(state_elems, block=16):
    return ("mamba", block, state_elems, None)


def vllm_spec(kind, block, size, extra, padded=None):
    common = dict(block_size=block, num_kv_heads=2, dtype=torch.float32)
    if kind == "full":
        return FullAttentionSpec(head_size=size, sliding_window=extra, **common)
    if kind == "sliding":
        return SlidingWindowSpec(head_size=size, sliding_window=extra, **common)
    if kind == "chunked":
        return ChunkedLocalAttentionSpec(head_size=size, attention_chunk_size=extra, **common)
    return MambaSpec(block_size=block, shapes=((size,),), dtypes=(torch.float32,),
                     page_size_padded=padded)


CASES = {
    "1_all_full": ([full(), full()], P * 2 * 32, False),
    "2_all_sliding": ([sw(), sw()], P * 2 * 32, False),
    "3_full_sliding_hybrid_off": ([full(), sw()], P * 2 * 32, True),
    "4_full_sliding": ([full(), sw()], P * 2 * 32, False),
    "5_2full_4sliding": ([full()] * 2 + [sw()] * 4, P * 2 * 32, False),
    "6_3full_7sliding": ([full()] * 3 + [sw()] * 7, P * 3 * 32, False),
    "7_6full_5sliding": ([full()] * 6 + [sw()] * 5, P * 6 * 32, False),
    "8_uniform_type": ([full(head=128), full(head=64)], P * 3 * 32, False),
    "9_block_size_scaled": ([full(head=64), sw(head=32)], P * 32, False),
    "10_padded_page": ([full(head=64), sw(head=96)], P * 2 * 32, False),
    "gemma3_like_5to1": ([sw(window=1024), sw(window=1024), sw(window=1024), sw(window=1024),
                          sw(window=1024), full()] * 5 + [sw(window=1024)] * 2,
                         P * 6 * 1000, False),
    "gemma3_like_hybrid_off": ([sw(window=1024)] * 5 + [full()] + [sw(window=1024)] * 5
                               + [full()], P * 12 * 1000, True),
    "gptoss_like_alternate": ([sw(window=128), full()] * 12, P * 12 * 1000, False),
    "llama4_like_3to1": ([chunked(chunk=8192)] * 3 + [full()], P * 4 * 1000, False),
    "all_chunked": ([chunked(chunk=64)] * 3, P * 3 * 100, False),
    "qwen3next_like_3to1": ([mamba(P // 4 - 100)] * 3 + [full()], P * 1000, False),
    # Layouts vLLM refuses or merges only with the hybrid manager off (found by a
    # differential campaign, tests/golden/oracle/README.md): promoted sliding
    # layers of two windows cannot share the one full-attention group.
    "two_windows": ([sw(window=32), sw(window=64), full()] * 2, P * 6 * 100, False),
    "two_windows_hybrid_off": ([sw(window=32), sw(window=64), full()] * 2, P * 6 * 100, True),
    "two_chunks_hybrid_off": ([chunked(chunk=32), chunked(chunk=64), full()], P * 3 * 100, True),
    "sliding_chunked_full_hybrid_off": ([sw(window=32), chunked(chunk=64), full()], P * 3 * 100,
                                        True),
    "qwen3next_like_hybrid_off": ([mamba(P // 4 - 100)] * 3 + [full()], P * 1000, True),
}

SEQ_LENS = (1, 100, 1000, 5000, 40000)
IN_FLIGHT = (2048, 16384)


def config(disable_hybrid: bool, max_model_len: int, in_flight: int, block: int):
    return SimpleNamespace(
        scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=disable_hybrid),
        cache_config=SimpleNamespace(
            num_gpu_blocks_override=None, prefix_cache_retention_interval=None,
            mamba_cache_mode="none",
            get_resolved_kv_cache_layout=lambda: KVCacheLayout.LBNHC),
        attention_config=SimpleNamespace(hisparse_config=None),
        model_config=SimpleNamespace(max_model_len=max_model_len,
                                     supports_kv_cache_grouping=False),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
        max_in_flight_tokens=in_flight,
    )


def run_case(layers, memory, disable_hybrid):
    specs = {}
    attn_page = None
    for kind, block, size, extra in layers:
        if kind != "mamba":
            attn_page = vllm_spec(kind, block, size, extra).page_size_bytes
    for i, (kind, block, size, extra) in enumerate(layers):
        # Mamba pages are padded to the attention page, as the platform does.
        specs[f"layer_{i}"] = vllm_spec(kind, block, size, extra,
                                        padded=attn_page if kind == "mamba" else None)
    cfg = config(disable_hybrid, 16, 0, 16)
    groups = planning.get_kv_cache_groups(cfg, dict(specs))
    kv_config = planning.get_kv_cache_config_from_groups(cfg, groups, memory)
    out = {
        "layers": [list(x) for x in layers],
        "memory": memory,
        "disable_hybrid_kv_cache_manager": disable_hybrid,
        "num_blocks": kv_config.num_blocks,
        "groups": [],
        "max_concurrency": {},
    }
    for g in groups:
        spec = g.kv_cache_spec
        first = getattr(spec, "kv_cache_specs", None)
        one = next(iter(first.values())) if first else spec
        out["groups"].append({
            "layers": [int(name.split("_")[1]) for name in g.layer_names],
            "type": type(one).__name__,
            "block_size": one.block_size,
            "sliding_window": getattr(one, "sliding_window", None),
            "uniform_type": first is not None,     # UniformTypeKVCacheSpecs: no scheduler manager
        })
    for seq_len in SEQ_LENS:
        for in_flight in IN_FLIGHT:
            cfg_len = config(disable_hybrid, seq_len, in_flight, 16)
            out["max_concurrency"][f"{seq_len},{in_flight}"] = (
                get_max_concurrency_for_kv_cache_config(cfg_len, kv_config))
    return out


def main() -> None:
    results = {}
    for name, (layers, memory, disable_hybrid) in CASES.items():
        try:
            results[name] = run_case(layers, memory, disable_hybrid)
        except (ValueError, NotImplementedError, AssertionError) as exc:
            results[name] = {"layers": [list(x) for x in layers], "memory": memory,
                             "disable_hybrid_kv_cache_manager": disable_hybrid,
                             "error": type(exc).__name__, "message": str(exc)}
    json.dump({"vllm": "0.33.0", "bytes_per_token_layer_unit": "float32 x 2 KV heads",
               "cases": results}, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
