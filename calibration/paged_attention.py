"""Decode attention over a paged KV cache: a Triton kernel and a plain torch reference.

Layout (vLLM-style, one layer)::

    k_cache, v_cache : [num_blocks, block_size, num_kv_heads, head_dim]
    block_table      : [num_seqs, max_blocks_per_seq]  (int32 block ids)
    context_lens     : [num_seqs]                       (tokens in the cache per sequence)
    q                : [num_seqs, num_heads, head_dim]  (one new token per sequence)

Query head ``h`` reads KV head ``h // (num_heads // num_kv_heads)`` (GQA).
One Triton program handles one (sequence, query head): it walks the
sequence's block table, loads each block's keys and values and keeps a
running (online) softmax, so the KV is streamed once, as vLLM's
PagedAttention does. On a CPU set ``TRITON_INTERPRET=1`` before importing
triton (the harness and the tests do).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl


@triton.jit
def _paged_decode_kernel(q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, out_ptr, scale,
                         stride_qs, stride_qh,
                         stride_kb, stride_kt, stride_kh,
                         stride_ts, stride_os, stride_oh,
                         GROUP: tl.constexpr, BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // GROUP
    offs_d = tl.arange(0, HEAD_DIM)
    offs_t = tl.arange(0, BLOCK)
    q = tl.load(q_ptr + seq * stride_qs + head * stride_qh + offs_d).to(tl.float32)
    length = tl.load(lens_ptr + seq)
    # loop-carried scalars typed once, so the compiled kernel's loop is type-stable
    m_i = tl.full([], -float("inf"), tl.float32)
    l_i = tl.full([], 0.0, tl.float32)
    acc = tl.zeros([HEAD_DIM], dtype=tl.float32)
    num_blocks = tl.cdiv(length, BLOCK)
    for b in range(0, num_blocks):
        # int64: block_id * stride overflows 32 bits in caches past 2 GiB
        block_id = tl.load(table_ptr + seq * stride_ts + b).to(tl.int64)
        tok = b * BLOCK + offs_t
        mask = tok < length
        base = block_id * stride_kb + kv_head * stride_kh
        kv_off = base + offs_t[:, None] * stride_kt + offs_d[None, :]
        k = tl.load(k_ptr + kv_off, mask=mask[:, None], other=0.0).to(tl.float32)
        s = tl.sum(k * q[None, :], axis=1) * scale
        s = tl.where(mask, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new)
        v = tl.load(v_ptr + kv_off, mask=mask[:, None], other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        m_i = m_new
    out = acc / l_i
    tl.store(out_ptr + seq * stride_os + head * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty))


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_table: torch.Tensor, context_lens: torch.Tensor) -> torch.Tensor:
    num_seqs, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    if head_dim & (head_dim - 1) or block_size & (block_size - 1):
        raise ValueError("head_dim and block_size must be powers of two for this kernel")
    out = torch.empty_like(q)
    _paged_decode_kernel[(num_seqs, num_heads)](
        q, k_cache, v_cache, block_table, context_lens, out, 1.0 / math.sqrt(head_dim),
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_table.stride(0), out.stride(0), out.stride(1),
        GROUP=num_heads // num_kv_heads, BLOCK=block_size, HEAD_DIM=head_dim)
    return out


def reference_decode_attention(q, k_cache, v_cache, block_table, context_lens) -> torch.Tensor:
    """The same computation, one sequence at a time, in plain torch (for checking the kernel)."""
    num_seqs, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    for s in range(num_seqs):
        n = int(context_lens[s])
        blocks = block_table[s, : -(-n // block_size)].long()
        k = k_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:n].float()   # [n, kvh, d]
        v = v_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:n].float()
        k = k.repeat_interleave(group, dim=1)                                   # [n, h, d]
        v = v.repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[s].float(), k) / math.sqrt(head_dim)
        out[s] = torch.einsum("hn,nhd->hd", scores.softmax(dim=-1), v).to(q.dtype)
    return out


def make_paged_cache(context_lens: list[int], num_kv_heads: int, head_dim: int, block_size: int,
                     dtype, device, generator: torch.Generator | None = None):
    """Random K/V caches and a shuffled block table holding ``context_lens`` tokens per sequence."""
    blocks_per_seq = [-(-n // block_size) for n in context_lens]
    total = sum(blocks_per_seq)
    shape = (total, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=generator, dtype=torch.float32).to(device=device, dtype=dtype)
    v_cache = torch.randn(shape, generator=generator, dtype=torch.float32).to(device=device, dtype=dtype)
    # Blocks of one sequence are scattered, as after many allocations and frees.
    perm = torch.randperm(total, generator=generator)
    table = torch.zeros((len(context_lens), max(blocks_per_seq)), dtype=torch.int32)
    start = 0
    for i, nb in enumerate(blocks_per_seq):
        table[i, :nb] = perm[start:start + nb].to(torch.int32)
        start += nb
    lens = torch.tensor(context_lens, dtype=torch.int32)
    return k_cache, v_cache, table.to(device), lens.to(device)
