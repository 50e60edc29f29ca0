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
"""

from __future__ import annotations

import numpy as np

_P = np.uint64(0x9E3779B97F4A7C15)          # odd multiplier (golden ratio)
_K = np.uint64(0xD6E8FEB86659FD93)          # odd multiplier that separates prefix lengths
_powers = np.ones(1, dtype=np.uint64)


def _mix(x: np.ndarray) -> np.ndarray:
    """Multiply-xorshift of each token id (wrapping uint64 arithmetic)."""
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(31)
    return x


def _get_powers(n: int) -> np.ndarray:
    global _powers
    if len(_powers) < n:
        size = max(n, 2 * len(_powers))
        p = np.empty(size, dtype=np.uint64)
        p[0] = 1
        with np.errstate(over="ignore"):
            # p[j] = P**j mod 2**64 by repeated doubling of a cumulative product.
            p[1:] = _P
            np.multiply.accumulate(p, out=p)
        _powers = p
    return _powers[:n]


def salt_hash(cache_salt: str | None) -> int:
    """Initial value of the chain: isolates tenants that use a cache salt (H1)."""
    if not cache_salt:
        return 0
    acc = 1469598103934665603                 # FNV-1a over the salt's bytes
    for byte in cache_salt.encode():
        acc = ((acc ^ byte) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return acc | 1


def block_hashes(token_ids: np.ndarray, block_size: int, cache_salt: str | None = None) -> list[int]:
    """Hashes of every *full* block of ``token_ids`` (H2: partial blocks have none)."""
    num_full = len(token_ids) // block_size
    if num_full == 0:
        return []
    n = num_full * block_size
    with np.errstate(over="ignore"):
        tokens = np.asarray(token_ids[:n], dtype=np.int64).view(np.uint64)
        terms = _mix(tokens) * _get_powers(n)
        prefix = np.cumsum(terms, dtype=np.uint64)
        hashes = prefix[block_size - 1::block_size]
        lengths = np.arange(block_size, n + 1, block_size, dtype=np.uint64)
        # Fix: mix the prefix length in, so a block of 0-tokens does not repeat its parent's hash.
        hashes = _mix(hashes * _K + lengths)
        salt = salt_hash(cache_salt)
        if salt:
            hashes = hashes + np.uint64(salt)
    return hashes.tolist()
