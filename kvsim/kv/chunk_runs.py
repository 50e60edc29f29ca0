"""Chunk runs of the single-group KV manager: a prompt chunked while the others decode.

A mixin of :class:`~kvsim.kv.manager.KVCacheManager`, as kv/decode_runs.py is.
In a chunk run (sched/chunked_runs.py) the batch's last request takes a
prefill chunk of ``chunk`` tokens every step while the others decode one
token each. Each step, ``allocate_slots`` would give each decode its new
block at a block boundary, in running order, then the chunked request the
blocks its chunk reaches (A1, A2); and hash each block as it fills (A4). So
a step's pops and fills are the decodes' (decode_runs.py's keys ``step *
num_seqs + index``) followed by one contiguous segment of the chunked
request's, which is taken as a slice rather than block by block::

    pop order of steps 1..3:  d0 d2 [P P P P] | d1 [P P P P] | [P P P P P]
                              step 1            step 2        step 3

The decodes' blocks and the chunk's are all known to fit (``chunk_run_steps_that_fit``).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from itertools import accumulate
from operator import sub

from kvsim.kv.decode_runs import _step_keys


class ChunkRunSteps:
    """``chunk_run_steps_that_fit`` and ``allocate_chunk_steps`` for ``KVCacheManager``
    (which owns ``pool``, ``block_size``, ``req_to_blocks``, ``num_cached_block``,
    ``enable_caching``, ``debug`` and ``_cache_full_blocks``)."""

    chunk_runs = True           # sched/chunked_runs.py plans chunk runs on this manager

    def chunk_run_steps_that_fit(self, reqs: Sequence, num_computed: Sequence[int],
                                 first_allocations: Sequence[int], chunk: int, chunk_left: int,
                                 max_steps: int) -> int:
        """A2/P1: the most steps (<= ``max_steps``) whose blocks, the decodes'
        (``first_allocations``, of ``reqs[:-1]``) and the chunked request's
        (``chunk`` tokens a step, ``chunk_left`` in all), are all free; the
        step after them would preempt."""
        bs = self.block_size
        free = self.pool.get_num_free_blocks()
        held = len(self.req_to_blocks[reqs[-1].request_id])
        c = num_computed[-1]

        def allocated_by(step: int) -> int:
            own = -(-(c + min(step * chunk, chunk_left)) // bs) - held
            return (own if own > 0 else 0) + sum((step - s0) // bs + 1
                                                 for s0 in first_allocations if s0 <= step)

        if allocated_by(max_steps) <= free:
            return max_steps
        lo, hi = 0, max_steps - 1                 # the last step that fits
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if allocated_by(mid) <= free:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def allocate_chunk_steps(self, reqs: Sequence, num_computed: Sequence[int],
                             first_allocations: Sequence[int], first_step: int, last_step: int,
                             chunk: int, chunk_left: int) -> list[int]:
        """Steps ``first_step..last_step`` of a chunk run: what ``allocate_slots``
        does for each decode (one token) and then the chunked request
        (``chunk`` tokens, the rest of its ``chunk_left`` in its last) in each
        step, in that order; returns the free blocks after each step
        (``allocate_decode_steps``' contract)."""
        pool, bs, n = self.pool, self.block_size, len(reqs)
        blocks_of = self.req_to_blocks
        last = reqs[-1]
        own = blocks_of[last.request_id]
        c = num_computed[-1]
        end = c + chunk_left
        free = pool.get_num_free_blocks()
        keys = _step_keys(first_allocations, first_step, last_step, bs, n) if first_allocations else []
        segments = _segments(len(own), c, chunk, end, first_step, last_step, bs, ceil=True)
        taken = [0] * (last_step - first_step + 1)
        total = len(keys) + sum(m for _, m in segments)
        if total:
            got = pool.get_new_blocks(total)
            pos = 0
            for key, step, m in _in_order(keys, segments, n):
                if m:
                    own += got[pos:pos + m]
                    taken[step - first_step] += m
                    pos += m
                else:
                    blocks_of[reqs[key % n].request_id].append(got[pos])
                    taken[key // n - first_step] += 1
                    pos += 1
        out = list(accumulate(taken, sub, initial=free))[1:]
        if self.enable_caching:
            # The decodes' fills (kv/decode_runs.py ``_fill_starts``); the
            # chunked request's blocks as its chunks complete them.
            cached = self.num_cached_block
            starts = self._fill_starts(reqs[:-1], num_computed, last_step) if n > 1 else None
            keys = _step_keys(starts, first_step, last_step, bs, n) if starts else []
            segments = _segments(cached[last.request_id], c, chunk, end, first_step, last_step, bs,
                                 ceil=False)
            if keys or segments:
                self._cache_chunk_steps(reqs, num_computed, keys, segments, chunk, end)
        return out

    def _cache_chunk_steps(self, reqs: Sequence, num_computed: Sequence[int], keys: list[int],
                           segments: list[tuple[int, int]], chunk: int, end: int) -> None:
        """A4 for the blocks the steps fill, in the step path's order (B8): each
        step's decode fills (``keys``), then the chunk's (``segments``)."""
        bs, n = self.block_size, len(reqs)
        blocks_of, cached = self.req_to_blocks, self.num_cached_block
        last = reqs[-1]
        rid = last.request_id
        if self.debug:
            for key, step, m in _in_order(keys, segments, n):
                if m:
                    self._cache_full_blocks(last, blocks_of[rid], min(num_computed[-1] + step * chunk, end))
                else:
                    i = key % n
                    r = reqs[i]
                    self._cache_full_blocks(r, blocks_of[r.request_id], num_computed[i] + key // n)
            return
        # A private request's blocks get no hash (kv/block_pool.py): only its count.
        blocks, hashes = [], []
        own, own_hashes = blocks_of[rid], last.block_hashes
        for key, _, m in _in_order(keys, segments, n):
            if m:
                j = cached[rid]
                if not last.private_keys:
                    blocks += own[j:j + m]
                    hashes += own_hashes[j:j + m]
                cached[rid] = j + m
            else:
                i = key % n
                r = reqs[i]
                j = (num_computed[i] + key // n) // bs - 1
                blocks.append(blocks_of[r.request_id][j])       # (not private: _fill_starts)
                hashes.append(r.block_hashes[j])
                cached[r.request_id] = j + 1      # keys ascend: the last fill of each is its count
        if blocks:
            self.pool.cache_blocks_in_order(blocks, hashes)


def _segments(have: int, computed: int, chunk: int, end: int, first_step: int, last_step: int,
              bs: int, *, ceil: bool) -> list[tuple[int, int]]:
    """(step, blocks) for each step of ``first_step..last_step`` in which the
    chunked request's blocks grow past ``have``: the blocks its tokens reach
    (``ceil``: to allocate) or fill (to cache) after ``computed + step * chunk``,
    at most ``end``."""
    out = []
    for step in range(first_step, last_step + 1):
        tokens = min(computed + step * chunk, end)
        need = -(-tokens // bs) if ceil else tokens // bs
        if need > have:
            out.append((step, need - have))
            have = need
    return out


def _in_order(keys: list[int], segments: list[tuple[int, int]], n: int):
    """(key, step, blocks) in the step path's order: each decode key (blocks 0),
    and each step's chunk segment after that step's decode keys."""
    i = 0
    for step, m in segments:
        end = step * n + n - 1                  # the chunked request's key: last of its step
        j = bisect_left(keys, end, i)
        for key in keys[i:j]:
            yield key, 0, 0
        i = j
        yield end, step, m
    for key in keys[i:]:
        yield key, 0, 0
