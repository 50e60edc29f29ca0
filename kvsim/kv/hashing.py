"""Chained block hashes, computed for a whole sequence at once.

vLLM hashes block i as ``H(hash_{i-1}, tokens of block i, extra keys)``
(kv-semantics H1): two blocks get the same hash exactly when the *whole*
prefix up to and including them is the same (and the cache salt matches).
Any injective chained hash reproduces the engine (H1 allows it), so kvsim uses
a 64-bit polynomial hash of the prefix, which numpy computes for every block of
a sequence in one vectorised pass::

    S(prefix of k tokens) = sum_{j<k} mix(token_j) * P**j         (mod 2**64)
    H(prefix of k tokens) = salt + mix(S * K + k)                  (mod 2**64)
    block_hash[i] = H(prefix of (i+1) * block_size tokens)

``mix`` (a multiply and an xor-shift) spreads nearby token ids over all bits
before the positional polynomial, so the hash has no simple linear structure.
``K`` is odd, so for one length ``S -> H`` is a bijection. The length ``k``
is mixed in because ``mix(0) == 0``: without it, token 0
adds nothing to ``S``, so ``[x, y]`` and ``[x, y, 0, 0]`` (and every all-zero
prefix) got the same hash and a request hit another block under its second
block's hash (found by tests/test_kv_properties.py).
Collisions are possible in principle (64 bits); the debug mode of the block
pool stores each block's tokens so tests can check every hit is genuine.

Content hashes lie in ``[0, 2**64)``. Requests whose tokens are all *fresh*
(a prompt that is a run of counter ids no other request holds, then generated
ids) skip the content hash: ``fresh_block_hashes`` names each block by its
last token id, mapped to the negative numbers, so the two kinds never meet.
Prompts made of named content blocks (Mooncake ``hash_ids``) are hashed over
their block ids instead of their tokens (``content_block_id_hashes``).
Either way no token id is read on arrival (except in debug mode).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_P = np.uint64(0x9E3779B97F4A7C15)          # odd multiplier (golden ratio)
_K = np.uint64(0xD6E8FEB86659FD93)          # odd multiplier that separates prefix lengths
_M = np.uint64(0xBF58476D1CE4E5B9)          # odd multiplier of mix
_SHIFT = np.uint64(31)
_powers = np.ones(1, dtype=np.uint64)
_lengths = np.zeros(1, dtype=np.uint64)     # _lengths[i] = i, sliced with a step of block_size


def _get_powers(n: int) -> np.ndarray:
    global _powers
    if len(_powers) < n:
        size = max(n, 2 * len(_powers))
        p = np.empty(size, dtype=np.uint64)
        p[0] = 1
        # p[j] = P**j mod 2**64 by a cumulative product (array arithmetic wraps silently).
        p[1:] = _P
        np.multiply.accumulate(p, out=p)
        _powers = p
    return _powers[:n]


def _get_lengths(n: int, block_size: int) -> np.ndarray:
    """The prefix lengths ``block_size, 2*block_size, ..., n`` (a view, no allocation)."""
    global _lengths
    if len(_lengths) <= n:
        _lengths = np.arange(max(n + 1, 2 * len(_lengths)), dtype=np.uint64)
    return _lengths[block_size:n + 1:block_size]


def salt_hash(cache_salt: str | None) -> int:
    """Initial value of the chain: isolates tenants that use a cache salt (H1)."""
    if not cache_salt:
        return 0
    acc = 1469598103934665603                 # FNV-1a over the salt's bytes
    for byte in cache_salt.encode():
        acc = ((acc ^ byte) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return acc | 1


def block_hashes(token_ids: np.ndarray, block_size: int, cache_salt: str | None = None) -> list[int]:
    """Hashes of every *full* block of ``token_ids`` (H2: partial blocks have none).

    The formula is the module docstring's; the body reuses one buffer for every
    step (this runs once per arriving request, over its whole sequence).
    """
    num_full = len(token_ids) // block_size
    if num_full == 0:
        return []
    n = num_full * block_size
    tokens = np.asarray(token_ids[:n], dtype=np.int64).view(np.uint64)
    x = np.multiply(tokens, _M)                 # mix(token) ...
    x ^= x >> _SHIFT
    x *= _get_powers(n)                         # ... * P**j
    np.add.accumulate(x, out=x)                 # S of every prefix
    hashes = x[block_size - 1::block_size]      # S at each block end (a view into x)
    hashes *= _K                                # mix(S * K + k)
    hashes += _get_lengths(n, block_size)
    hashes *= _M
    hashes ^= hashes >> _SHIFT
    salt = salt_hash(cache_salt)
    if salt:
        hashes += np.uint64(salt)
    return hashes.tolist()


def fresh_block_hashes(prompt_start: int, prompt_len: int, output_start: int, num_tokens: int,
                       block_size: int) -> Sequence[int]:
    """Hashes of the full blocks of a sequence of fresh tokens, without reading them.

    The sequence is the prompt ``prompt_start, prompt_start + 1, ...``
    (``prompt_len`` ids >= 0 that no other request holds, except copies of the
    same prompt, n > 1) followed by the generated ids ``output_start,
    output_start - 1, ...`` (negative, held by no other request). Every id
    then sits at one position of one sequence, so the *last id of a block
    alone determines the block's whole prefix*: the block's key is that id,
    mapped to the negative numbers (``-1 - 2*id`` for a prompt id, ``2*id`` for
    a generated one). Equal keys mean equal prefixes (H1), n > 1 siblings share
    their prompt blocks as in vLLM, and no key equals a content hash (those are
    >= 0). Cache salts change nothing: the content already equals no other
    tenant's. Both kinds of key step by ``-2*block_size`` from block to block,
    so the list comes from ``range`` without any per-token work (and is that
    ``range`` when every full block is a prompt block).
    """
    if prompt_start < 0:
        raise ValueError("fresh prompt ids must be >= 0")
    num_full = num_tokens // block_size
    num_prompt = min(prompt_len // block_size, num_full)     # blocks of prompt ids only
    step = -2 * block_size
    first = -1 - 2 * (prompt_start + block_size - 1)
    keys = range(first, first + num_prompt * step, step)
    if num_prompt == num_full:
        # Only prompt blocks: the range itself (a prompt the engine refuses may be
        # 2e9 tokens long; a range of its keys takes no memory).
        return keys
    return [*keys, *_generated_block_keys(num_prompt, prompt_len, output_start, num_full, block_size)]


def content_block_id_hashes(block_ids: np.ndarray, ids_per_block: int, prompt_len: int,
                            output_start: int, num_tokens: int, block_size: int,
                            cache_salt: str | None = None) -> list[int]:
    """Hashes of a prompt made of named content blocks, then generated ids, without token ids.

    A Mooncake prompt is the concatenation of blocks of ``ids_per_block``
    tokens, block ``h`` always the same tokens and different ``h`` different
    tokens, cut to ``prompt_len``. A prefix of ``L`` prompt tokens is then
    fixed by ``L`` and the ids of the blocks it touches, so its key is a chained
    hash of those block ids (the module's polynomial, over block ids instead of
    tokens: about 500 times less work than hashing the tokens)::

        C(m) = sum_{m' <= m} mix(block_ids[m']) * P**m'
        key(L) = salt + mix(C((L - 1) // ids_per_block) * K + L)

    The blocks that end with a generated id are named by that id as in
    ``fresh_block_hashes``. Keys live in the content hashes' range, so a run
    must name *every* sequence holding these tokens this way (a Mooncake trace
    does: all its prompts are such blocks, and no workload quotes them).
    """
    num_full = num_tokens // block_size
    num_prompt = min(prompt_len // block_size, num_full)
    keys: list[int] = []
    if num_prompt:
        ids = np.asarray(block_ids, dtype=np.int64).view(np.uint64)
        chain = np.multiply(ids, _M)
        chain ^= chain >> _SHIFT
        chain *= _get_powers(len(ids))
        np.add.accumulate(chain, out=chain)
        lengths = _get_lengths(num_prompt * block_size, block_size)
        x = chain[(lengths - np.uint64(1)) // np.uint64(ids_per_block)]
        x *= _K
        x += lengths
        x *= _M
        x ^= x >> _SHIFT
        salt = salt_hash(cache_salt)
        if salt:
            x += np.uint64(salt)
        keys = x.tolist()
    keys += _generated_block_keys(num_prompt, prompt_len, output_start, num_full, block_size)
    return keys


def _generated_block_keys(first_block: int, prompt_len: int, output_start: int, num_full: int,
                          block_size: int) -> range:
    """Keys ``2 * id`` of the blocks ``first_block ..`` that end with a generated id.

    Generated token k has id ``output_start - k`` (< 0, held by one request
    only), so that id fixes the block's whole prefix.
    """
    if output_start >= 0:
        raise ValueError("generated ids must be < 0")
    # The first of these blocks ends with output k0.
    k0 = (first_block + 1) * block_size - 1 - prompt_len
    step = -2 * block_size
    first = 2 * (output_start - k0)
    return range(first, first + max(num_full - first_block, 0) * step, step)
