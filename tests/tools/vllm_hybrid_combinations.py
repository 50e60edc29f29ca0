#!/usr/bin/env python3
"""Record what vLLM 0.33's KVCacheManager does on test_prefill_hybrid_model_combinations.

vLLM's test (tests/v1/core/test_prefix_caching.py) allocates a first request
of 55 tokens in groups of the given kinds, then looks up a second one that
shares 48 tokens. Mamba runs in "align" mode (prefix caching needs it in
0.33), where a state is cached only at a chunk's end; so each case runs
twice: one 55-token chunk, and 48 + 7 (the scheduler's block-aligned split).
Prints (hit tokens, hit block ids, free blocks) per run; the values are in
tests/test_hybrid_vectors.py. Run with the oracle's interpreter:
    PYTHONHASHSEED=0 /work/venv-vllm/bin/python tests/tools/vllm_hybrid_combinations.py
"""
import os, sys
os.environ.setdefault("PYTHONHASHSEED","0")
import logging; logging.disable(logging.WARNING)
import torch
from math import lcm
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec, SlidingWindowSpec
from vllm.v1.request import Request
init_none_hash(sha256)
bs=16
def spec(k):
    if k=="full": return FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=1, dtype=torch.float32)
    if k=="sliding": return SlidingWindowSpec(block_size=bs, num_kv_heads=1, head_size=1, dtype=torch.float32, sliding_window=2*bs)
    if k=="sliding_large": return SlidingWindowSpec(block_size=bs, num_kv_heads=1, head_size=1, dtype=torch.float32, sliding_window=4*bs)
    return MambaSpec(block_size=bs, shapes=((1,),), dtypes=(torch.float32,), mamba_cache_mode="align")
def req(rid, toks):
    sp = SamplingParams(max_tokens=17); sp.update_from_generation_config({}, eos_token_id=100)
    return Request(request_id=rid, prompt_token_ids=toks, sampling_params=sp, pooling_params=None, block_hasher=get_request_block_hasher(bs, sha256))
for kinds in [["full","sliding"],["full","mamba"],["sliding","mamba"],["sliding","sliding_large"],["full","sliding","sliding"],["full","mamba","mamba"],["full","sliding","mamba"],["full","sliding","sliding_large"],["full","full","sliding"],["full","full","mamba"],["full","sliding","full","sliding_large"],["full","mamba","full","mamba"],["sliding","mamba","sliding_large","mamba"],["full","full","sliding","mamba"]]:
    cfg = KVCacheConfig(num_blocks=10*len(kinds), kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec([f"l{i}"], spec(k)) for i,k in enumerate(kinds)])
    m = KVCacheManager(cfg, max_model_len=8192, scheduler_block_size=bs, hash_block_size=bs, enable_caching=True)
    common=[i for i in range(3) for _ in range(16)]
    r0=req("0", common+[3]*7)
    out=[]
    for chunks in ([55],[48,7]):
        m = KVCacheManager(cfg, max_model_len=8192, scheduler_block_size=bs, hash_block_size=bs, enable_caching=True)
        r0=req("0", common+[3]*7)
        cb, n = m.get_computed_blocks(r0)[:2]
        first=True
        for c in chunks:
            m.allocate_slots(r0, c, n if first else 0, cb if first else None); r0.num_computed_tokens += c; first=False
        m.new_step_starts()
        r1=req("1", common+[4]*5)
        cb, n = m.get_computed_blocks(r1)[:2]
        out.append((n, cb.get_block_ids() if n else None, m.block_pool.get_num_free_blocks()))
    print(kinds, out)
