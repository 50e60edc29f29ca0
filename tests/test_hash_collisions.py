"""Block hashes resist constructed collisions (kv-semantics H1; vLLM chains sha256).

kvsim's block hash used to be a 64-bit polynomial in the token ids,
``S = sum mix(t_j) * P**j (mod 2**64)`` with an invertible ``mix``: linear in
``mix(t)``, so two different first blocks with the same ``S`` can be written
down, and every later block of two prompts that start with them and go on
alike then shares its hash too. The second prompt "hit" the first one's
cached blocks although they held other tokens. ``old_block_hashes`` below is
that hash, kept only to build the collision and to show it is one.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import kvsim
from kvsim.kv.hashing import block_hashes, content_block_id_hashes

MASK = (1 << 64) - 1
P, K, M = 0x9E3779B97F4A7C15, 0xD6E8FEB86659FD93, 0xBF58476D1CE4E5B9


def mix(t: int) -> int:
    x = (t * M) & MASK
    return x ^ (x >> 31)


def unmix(y: int) -> int:
    x = y ^ (y >> 31) ^ (y >> 62)          # the inverse of x ^ (x >> 31) on 64 bits
    return (x * pow(M, -1, 1 << 64)) & MASK


def old_block_hashes(tokens: list[int], block_size: int) -> list[int]:
    """The polynomial hash kvsim used before (kvsim/kv/hashing.py, up to 36474cb)."""
    out, s = [], 0
    for j, t in enumerate(tokens[:len(tokens) // block_size * block_size]):
        s = (s + mix(t) * pow(P, j, 1 << 64)) & MASK
        if (j + 1) % block_size == 0:
            h = (((s * K) + j + 1) * M) & MASK
            out.append(h ^ (h >> 31))
    return out


def colliding_prompts(block_size: int = 4, num_blocks: int = 3) -> tuple[list[int], list[int]]:
    """Two prompts that differ in their first two tokens and share every old block hash."""
    rest = list(range(100, 100 + block_size * num_blocks - 2))
    a = [11, 12] + rest
    p_inv = pow(P, -1, 1 << 64)
    for d in range(1, 10_000):
        # mix(b0) = mix(a0) + d and mix(b1) = mix(a1) - d / P keep S unchanged.
        b0 = unmix((mix(a[0]) + d) & MASK)
        b1 = unmix((mix(a[1]) - d * p_inv) & MASK)
        if b0 < 2**63 and b1 < 2**63:    # token ids are non-negative int64
            return a, [b0, b1] + rest
    raise AssertionError("no collision found")


def test_the_construction_collides_under_the_old_hash():
    a, b = colliding_prompts()
    assert a != b and old_block_hashes(a, 4) == old_block_hashes(b, 4)


def test_the_chained_hash_tells_the_colliding_prompts_apart_in_every_block():
    a, b = colliding_prompts()
    ha, hb = block_hashes(np.array(a), 4), block_hashes(np.array(b), 4)
    assert len(ha) == 3 and all(x != y for x, y in zip(ha, hb))


def test_a_constructed_collision_of_the_old_hash_no_longer_hits(tmp_path):
    a, b = colliding_prompts(block_size=4, num_blocks=3)
    lines = [{"id": "a", "arrival_time": 0.0, "prompt_token_ids": a, "max_tokens": 2},
             {"id": "again", "arrival_time": 20.0, "prompt_token_ids": a, "max_tokens": 2},
             {"id": "b", "arrival_time": 40.0, "prompt_token_ids": b, "max_tokens": 2}]
    (tmp_path / "reqs.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = kvsim.simulate({
        "base_dir": str(tmp_path), "model": "llama-3.1-8b",
        "engine": {"num_gpu_blocks_override": 64, "block_size": 4, "max_model_len": 64,
                   "max_num_batched_tokens": 64},
        "cost_model": {"type": "constant", "step_time_s": 1.0},
        "workload": {"requests_file": "reqs.jsonl"}})
    cached = dict(zip(result.requests["request_id"], result.requests["num_cached_tokens"]))
    # The same prompt hits its whole cached prefix but the last block (H3: 8 of 12 tokens);
    # the colliding one hits nothing.
    assert cached == {"a": 0, "again": 8, "b": 0}


def test_salted_chains_differ_from_unsalted_ones():
    tokens = np.arange(16)
    assert set(block_hashes(tokens, 4)).isdisjoint(block_hashes(tokens, 4, cache_salt="t1"))
    assert block_hashes(tokens, 4, "t1") == block_hashes(tokens, 4, "t1")


@pytest.mark.parametrize("ids_per_block", [4, 512])
def test_block_id_keys_equal_exactly_when_the_prefixes_are_equal(ids_per_block):
    a = content_block_id_hashes([7, 8, 9], ids_per_block, 3 * ids_per_block, -1,
                                3 * ids_per_block, 4)
    b = content_block_id_hashes([7, 8, 10], ids_per_block, 3 * ids_per_block, -1,
                                3 * ids_per_block, 4)
    shared = 2 * ids_per_block // 4          # KV blocks inside the first two content blocks
    assert a[:shared] == b[:shared] and all(x != y for x, y in zip(a[shared:], b[shared:]))
    assert len(set(a)) == len(a)
