"""Copy-on-write block sharing for parallel sampling and beam search.

The vLLM paper (Kwon et al., SOSP'23, sec. 4.4 and Fig. 15) shows that paged
KV blocks let the sequences of one request share memory: the ``n`` samples of
parallel sampling share their prompt, and the beams of beam search share the
prompt *and* the generated tokens they have in common. This module measures
that saving on the real :class:`~kvsim.kv.manager.KVCacheManager` (its
``fork`` takes a reference on every parent block; the first write into a
shared, partially filled block copies it, kv-semantics V5) and compares it
with what the same sequences would hold if each kept its own copy.

One request at a time, step by step::

    prefill:  the prompt's KV is written once (one sequence)
    parallel: fork n-1 children; every step each live sample writes one token
    beam:     every step the W new beams each pick a parent among the W
              current beams; children are forked from their parents, the old
              beams are freed, then every new beam writes one token

Memory is counted after every decode step: ``blocks_shared`` is the number of
blocks the pool has in use, ``blocks_unshared`` the sum over live sequences of
``ceil(tokens / block_size)``. The saving is ``1 - sum(shared) / sum(unshared)``
over all steps of all requests: the time-averaged fraction of blocks saved,
the quantity of the paper's Fig. 15.

Beam divergence model (a stated assumption; the paper does not give one):
every step each of the W new beams draws its parent uniformly at random, with
replacement, from the W current beams (a Wright-Fisher process, drawn from a
seeded ``numpy.random.Generator``). Parents that get no child die. Under this
model the beams' lines of descent merge, on average, about ``2 W`` steps back,
so all beams share their prompt and most of their output. Real beams are
chosen by score, which can keep lines apart longer or shorter than this.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvsim.kv.manager import KVCacheManager

MODES = ("parallel", "beam")


@dataclass
class _Seq:
    """The fields of a request the KV manager reads (caching is off here)."""

    request_id: str
    num_computed_tokens: int = 0
    block_hashes: tuple = ()
    private_keys: bool = False

    @property
    def num_tokens(self) -> int:
        # The token sampled from the last computed position is not in the KV yet.
        return self.num_computed_tokens + 1


@dataclass(frozen=True)
class SharingResult:
    """Block-steps held with copy-on-write sharing vs each sequence on its own."""

    mode: str                   # "parallel" | "beam"
    width: int                  # n samples or beam width
    block_size: int
    num_requests: int
    num_steps: int              # decode steps counted, all requests together
    block_steps_shared: int     # sum over steps of blocks in use (with sharing)
    block_steps_unshared: int   # sum over steps of blocks if nothing were shared
    num_cow_copies: int

    @property
    def saving(self) -> float:
        """Fraction of blocks sharing saves, time-averaged (vLLM paper Fig. 15)."""
        if self.block_steps_unshared == 0:
            return 0.0
        return 1.0 - self.block_steps_shared / self.block_steps_unshared


@dataclass(frozen=True)
class _Count:
    steps: int
    shared: int
    unshared: int
    copies: int


def parallel_sampling(prompt_len: int, output_lens: Sequence[int], block_size: int = 16) -> _Count:
    """One request with ``len(output_lens)`` samples of one prompt.

    The prefill writes the prompt once and samples every sample's first token;
    then sample ``i`` writes ``output_lens[i] - 1`` more tokens (its last
    sampled token is never written), one per step, and is freed when done.
    """
    _check_lengths(prompt_len, output_lens)
    n = len(output_lens)
    kv = _manager(n, prompt_len + max(output_lens), block_size)
    parent = _Seq("s0")
    _write(kv, parent, prompt_len)
    samples = [parent] + [_Seq(f"s{i}") for i in range(1, n)]
    for child in samples[1:]:
        kv.fork(parent, child)
        child.num_computed_tokens = parent.num_computed_tokens
    remaining = [out - 1 for out in output_lens]
    steps = shared = unshared = 0
    live = list(range(n))
    while True:
        for i in [i for i in live if remaining[i] <= 0]:
            kv.free(samples[i])
        live = [i for i in live if remaining[i] > 0]
        if not live:
            break
        for i in live:
            _write(kv, samples[i], 1)
            remaining[i] -= 1
        steps += 1
        shared += _in_use(kv)
        unshared += sum(_blocks(samples[i], block_size) for i in live)
    return _Count(steps, shared, unshared, kv.num_cow_copies)


def beam_search(prompt_len: int, output_len: int, width: int, rng: np.random.Generator,
                block_size: int = 16) -> _Count:
    """One request decoded by beam search of ``width`` beams for ``output_len`` tokens.

    The prefill writes the prompt once; the first ``width`` beams all descend
    from it. Then, for ``output_len - 1`` steps, the new beams pick their
    parents (module docstring), are forked, the old beams freed, and each new
    beam writes one token.
    """
    _check_lengths(prompt_len, [output_len])
    if width < 1:
        raise ValueError(f"beam width must be >= 1, got {width}")
    kv = _manager(width, prompt_len + output_len, block_size)
    root = _Seq("p")
    _write(kv, root, prompt_len)
    beams = [root]
    steps = shared = unshared = 0
    for t in range(output_len - 1):
        if t == 0:
            parents = [0] * width            # every first beam extends the prompt
        else:
            parents = sorted(int(p) for p in rng.integers(0, width, size=width))
        children = []
        for j, p in enumerate(parents):
            child = _Seq(f"b{t}.{j}", beams[p].num_computed_tokens)
            kv.fork(beams[p], child)
            children.append(child)
        for old in beams:
            kv.free(old)
        beams = children
        for b in beams:
            _write(kv, b, 1)
        steps += 1
        shared += _in_use(kv)
        unshared += sum(_blocks(b, block_size) for b in beams)
    for b in beams:
        kv.free(b)
    return _Count(steps, shared, unshared, kv.num_cow_copies)


def measure_sharing(mode: str, width: int, prompt_lens: Sequence[int], output_lens: Sequence[int],
                    *, block_size: int = 16, seed: int = 0) -> SharingResult:
    """Run every (prompt, output) pair as one request and add up the block-steps.

    ``parallel``: every sample of a request generates that request's output
    length. ``beam``: every beam does. ``seed`` seeds the beam parent draws.
    """
    if mode not in MODES:
        raise ValueError(f"mode: {mode!r} is not one of {', '.join(MODES)}")
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    if len(prompt_lens) != len(output_lens):
        raise ValueError(f"{len(prompt_lens)} prompt lengths but {len(output_lens)} output lengths")
    rng = np.random.default_rng(seed)
    steps = shared = unshared = copies = 0
    for p, o in zip(prompt_lens, output_lens):
        p, o = int(p), int(o)
        if mode == "parallel":
            c = parallel_sampling(p, [o] * width, block_size)
        else:
            c = beam_search(p, o, width, rng, block_size)
        steps += c.steps
        shared += c.shared
        unshared += c.unshared
        copies += c.copies
    return SharingResult(mode, width, block_size, len(prompt_lens), steps, shared, unshared, copies)


# ------------------------------------------------------------------ private


def _manager(num_seqs: int, max_tokens: int, block_size: int) -> KVCacheManager:
    # Room for every sequence's own copy plus one in-flight copy each: never runs out.
    blocks = num_seqs * (math.ceil(max_tokens / block_size) + 1) + 2
    return KVCacheManager(blocks, block_size, max_model_len=max_tokens + 1, enable_caching=False)


def _write(kv: KVCacheManager, seq: _Seq, num_tokens: int) -> None:
    if kv.allocate_slots(seq, num_tokens) is None:
        raise AssertionError(f"sequence {seq.request_id}: the pool ran out of blocks")
    seq.num_computed_tokens += num_tokens


def _in_use(kv: KVCacheManager) -> int:
    return kv.num_usable_blocks - kv.get_num_free_blocks()


def _blocks(seq: _Seq, block_size: int) -> int:
    return -(-seq.num_computed_tokens // block_size)


def _check_lengths(prompt_len: int, output_lens: Sequence[int]) -> None:
    if prompt_len < 1:
        raise ValueError(f"prompt length must be >= 1, got {prompt_len}")
    if not output_lens or min(output_lens) < 1:
        raise ValueError(f"output lengths must be >= 1, got {list(output_lens)}")
