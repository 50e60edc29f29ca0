"""Chained block hashes, computed for a whole sequence at once.

vLLM hashes block i as ``H(hash_{i-1}, tokens of block i, extra keys)`` with
sha256 (kv-semantics H1; ``vllm/v1/core/kv_cache_utils.py`` ``hash_block_tokens``):
two blocks get the same hash exactly when the *whole* prefix up to and
including them is the same (and the cache salt matches), and no one can make
two different prefixes meet. kvsim chains BLAKE2b the same way::

    h_{-1}     = 16 zero bytes, or BLAKE2b-128("kvsim-salt\\0" || cache salt) (isolates tenants, H1)
    h_i        = BLAKE2b-128(h_{i-1} || the block's token ids as int64 little-endian)
    block_hash = int.from_bytes(h_i, "little")        (in [0, 2**128))

BLAKE2b (RFC 7693) is a cryptographic hash, as collision resistant as sha256
for this use (a 128-bit digest: 2**64 work for a birthday collision, far
beyond any simulated cache) and, from Python, as fast as any: the cost is one
``hashlib`` call per block, about 1 us, where the 64-bit polynomial hash it
replaced cost 0.2 us per block in numpy. Measured (CPU time, alternating
runs): W1's 10,000 requests hashed by content (91 blocks each) cost 111 us per
request instead of 22 (simulate() +0.8 s); W1 as it runs, with fresh ids,
hashes nothing and is unchanged; W2's block-id keys cost about 120 us per
request instead of 45 (128-bit keys are slower Python ints). The
polynomial was linear in the
token ids, so prompts whose different prefixes shared every block hash could
be written down, and such a prompt "hit" blocks holding other tokens
(tests/test_hash_collisions.py keeps that construction as a regression test).

Requests whose tokens are all *fresh* (a prompt that is a run of counter ids
no other request holds, then generated ids) skip the content hash:
``fresh_block_hashes`` names each block by its last token id, mapped to the
negative numbers, so the two kinds never meet. Prompts made of named content
blocks (Mooncake ``hash_ids``) are hashed over their block ids instead of
their tokens (``content_block_id_hashes``), with the same chained BLAKE2b.
Either way no token id is read on arrival (except in debug mode).
"""

from __future__ import annotations

from collections.abc import Sequence
from hashlib import blake2b

import numpy as np

DIGEST_BYTES = 16                        # 128-bit digests
_ZERO = bytes(DIGEST_BYTES)
_LENGTH_BITS = 32                        # a block-id key is (chain << 32) | prefix length


def salt_hash(cache_salt: str | None) -> bytes:
    """Initial value of the chain: isolates tenants that use a cache salt (H1)."""
    if not cache_salt:
        return _ZERO
    return blake2b(b"kvsim-salt\0" + cache_salt.encode(), digest_size=DIGEST_BYTES).digest()


def _block_id_chain_start(cache_salt: str | None) -> bytes:
    """Block-id chains start elsewhere than token chains (domain separation).

    (A prefix string, not BLAKE2b's ``person`` parameter: keyword arguments
    cost a third of a call.)
    """
    if not cache_salt:
        return _BLOCK_ID_START
    return blake2b(b"kvsim-block-ids\0" + salt_hash(cache_salt), digest_size=DIGEST_BYTES).digest()


_BLOCK_ID_START = blake2b(b"kvsim-block-ids\0" + _ZERO, digest_size=DIGEST_BYTES).digest()


def block_hashes(token_ids: np.ndarray, block_size: int, cache_salt: str | None = None) -> list[int]:
    """Hashes of every *full* block of ``token_ids`` (H2: partial blocks have none).

    The chain is the module docstring's; the token ids are turned into bytes
    once and each block is a slice of them (this runs once per arriving
    request, over its whole sequence).
    """
    num_full = len(token_ids) // block_size
    if num_full == 0:
        return []
    data = np.ascontiguousarray(token_ids[:num_full * block_size], dtype="<i8").tobytes()
    width = 8 * block_size
    parent = salt_hash(cache_salt)
    hashes = [0] * num_full
    from_bytes = int.from_bytes
    for i, offset in enumerate(range(0, len(data), width)):
        parent = blake2b(parent + data[offset:offset + width], digest_size=DIGEST_BYTES).digest()
        hashes[i] = from_bytes(parent, "little")
    return hashes


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
    fixed by ``L`` and the ids of the blocks it touches, so its key chains
    BLAKE2b over those block ids (one call per content block, not per KV
    block: about 30 times less work than hashing the tokens)::

        c_{-1} = BLAKE2b-128("kvsim-block-ids\\0" || salt_hash(cache_salt))
        c_m    = BLAKE2b-128(c_{m-1} || block_ids[m] as int64 little-endian)
        key(L) = (first 96 bits of c_{(L - 1) // ids_per_block}) << 32 | L

    The blocks that end with a generated id are named by that id as in
    ``fresh_block_hashes``. Keys live in the content hashes' range, so a run
    must name *every* sequence holding these tokens this way (a Mooncake trace
    does: all its prompts are such blocks, and no workload quotes them).
    """
    num_full = num_tokens // block_size
    num_prompt = min(prompt_len // block_size, num_full)
    keys: list[int] = []
    if num_prompt:
        check_block_id_prompt(prompt_len)
        top = num_prompt * block_size               # the longest prefix with a key
        last_block = (top - 1) // ids_per_block
        ids = np.asarray(block_ids[:last_block + 1], dtype="<i8").tobytes()
        parent = _block_id_chain_start(cache_salt)
        for m, offset in enumerate(range(0, len(ids), 8)):
            parent = blake2b(parent + ids[offset:offset + 8], digest_size=DIGEST_BYTES).digest()
            chain = int.from_bytes(parent[:12], "little") << _LENGTH_BITS
            # The prefixes ending in content block m: L in (m * ids_per_block, ...], multiples
            # of block_size; chain | L == chain + L (its low 32 bits are 0). A comprehension:
            # iterating a range of 128-bit ints is slower.
            first = -(-(m * ids_per_block + 1) // block_size) * block_size
            last = min((m + 1) * ids_per_block, top)
            keys += [chain + length for length in range(first, last + 1, block_size)]
    keys += _generated_block_keys(num_prompt, prompt_len, output_start, num_full, block_size)
    return keys


def check_block_id_prompt(prompt_len: int) -> None:
    """A prompt ``content_block_id_hashes`` can name: its lengths fit the key's low bits."""
    if prompt_len >= 1 << _LENGTH_BITS:
        raise ValueError(f"prompt of {prompt_len} tokens: block-id hashes need < 2**32")


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
