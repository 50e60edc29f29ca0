"""Decode runs of the single-group KV manager: a run's blocks and caching in one call.

A mixin of :class:`~kvsim.kv.manager.KVCacheManager`, split out by concern.
While every request of a batch decodes one token per step, step ``s`` (1-based)
of a run writes token ``c + s - 1`` of a request that had ``c`` computed
tokens: it needs a new block when that token lies past the blocks held (A5),
then one every ``block_size`` steps, and it fills block ``j`` at the step
that writes the block's last token. So each request's allocations and fills
are arithmetic progressions of steps, and a run's work is known up front:

* ``decode_run_first_allocations`` / ``nth_decode_run_allocation``: when the
  blocks would be taken (the scheduler's question: how many steps fit);
* ``allocate_decode_steps``: steps ``first..last`` of the run, exactly as one
  ``allocate_slots(req, 1)`` per request per step would do them: the same
  blocks popped in the same order, the same hashes stored in the same order;
* ``allocate_decode_step``: one such step, checked first (the scheduler's
  plain decodes of a step that also has other work, sched/chunked_runs.py).

A step of the run is named by its key ``step * num_seqs + index``: sorted,
the keys are the step path's order (step by step, batch order within a step).
Chunk runs (a prompt chunked while the others decode) are kv/chunk_runs.py's.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate
from operator import sub


class DecodeRunSteps:
    """``decode_run_*`` and ``allocate_decode_steps`` for ``KVCacheManager``
    (which owns ``pool``, ``block_size``, ``req_to_blocks``,
    ``num_cached_block``, ``enable_caching``, ``debug``, ``_any_forks`` and
    ``_cache_full_blocks``)."""

    def decode_run_first_allocations(self, reqs: Sequence, num_computed: Sequence[int]) -> list[int] | None:
        """For a run of one-token steps: the step at which each request first needs a block.

        ``reqs`` decode one token each per step, in this order, from
        ``num_computed`` tokens each. Step s (1-based) writes token c + s - 1,
        which needs a new block when it lies past the blocks held (A5); after
        that, one every ``block_size`` steps. None when a run cannot be planned
        ahead (copy-on-write).
        """
        if self._any_forks:
            return None
        bs = self.block_size
        blocks_of = self.req_to_blocks
        return [s if (s := len(blocks_of[r.request_id]) * bs - c + 1) > 1 else 1
                for r, c in zip(reqs, num_computed)]

    def nth_decode_run_allocation(self, first_allocations: Sequence[int], n: int,
                                  max_steps: int) -> tuple[int, int] | None:
        """(step, batch index) of the ``n``-th block (1-based) a run allocates, in
        pop order (step by step, batch order within a step), or None when it
        allocates fewer than ``n`` within ``max_steps`` steps."""
        bs = self.block_size

        def allocated_by(step: int) -> int:
            return sum((step - s0) // bs + 1 for s0 in first_allocations if s0 <= step)

        if n < 1:
            return (1, 0)
        if len(first_allocations) * (max_steps // bs + 1) < n or allocated_by(max_steps) < n:
            return None                           # (the first: at most one block per bs steps each)
        lo, hi = 1, max_steps                     # the first step by which n blocks are taken
        while lo < hi:
            mid = (lo + hi) // 2
            if allocated_by(mid) >= n:
                hi = mid
            else:
                lo = mid + 1
        rank = n - allocated_by(lo - 1)
        for i, s0 in enumerate(first_allocations):
            if s0 <= lo and (lo - s0) % bs == 0:
                rank -= 1
                if rank == 0:
                    return lo, i
        raise AssertionError("unreachable: the step takes fewer blocks than counted")

    def allocate_decode_step(self, reqs: Sequence, num_computed: Sequence[int]) -> bool:
        """One decode step of ``reqs`` (one token each, from ``num_computed``):
        what ``allocate_slots(req, 1)`` does for each, in this order, when the
        blocks the step needs are all free. False, with nothing changed,
        otherwise (the step path would preempt) or under copy-on-write.

        ``allocate_decode_steps(reqs, num_computed, first, 1, 1)`` with the
        feasibility check before it, in fewer passes: a request needs a block
        exactly when its held blocks are full (``decode_run_first_allocations``
        says step 1), and takes it in batch order.
        """
        if self._any_forks:
            return False
        bs = self.block_size
        blocks_of = self.req_to_blocks
        grow = [held for r, c in zip(reqs, num_computed)
                if len(held := blocks_of[r.request_id]) * bs <= c]
        if grow:
            if len(grow) > self.pool.get_num_free_blocks():
                return False
            for held, block in zip(grow, self.pool.get_new_blocks(len(grow))):
                held.append(block)
        if self.enable_caching:
            starts = self._fill_starts(reqs, num_computed, 1)
            keys = _step_keys(starts, 1, 1, bs, len(reqs)) if starts else None
            if keys:
                self._cache_decode_steps(reqs, num_computed, keys, 1)
        return True

    def allocate_decode_steps(self, reqs: Sequence, num_computed: Sequence[int],
                              first_allocations: Sequence[int], first_step: int,
                              last_step: int, chunk: int = 0, chunk_left: int = 0) -> list[int]:
        """Steps ``first_step..last_step`` of a decode run: blocks, then caching (A2-A5).

        ``num_computed`` and ``first_allocations`` describe the requests before
        step 1 of the run (``decode_run_first_allocations``). Does what
        ``allocate_slots(req, 1)`` does for each request in each step (the
        blocks the steps need, known to fit; the blocks they fill, hashed),
        in the same order. Returns the free blocks after each step.

        Popping every block before caching any is the same as interleaving:
        popped blocks are free and cached ones are held, so evictions and
        insertions touch different blocks and leave the same hash map, each
        hash's blocks in the same order (B8). (Not always its hashes in the
        same dict order: a pop that evicts the last free holder of a hash a
        fill of the step stores moves that hash to the end; nothing reads
        that order.)

        ``chunk``: a chunk run, whose last request prefills (kv/chunk_runs.py).
        """
        if chunk:
            return self.allocate_chunk_steps(reqs, num_computed, first_allocations, first_step,
                                             last_step, chunk, chunk_left)
        pool = self.pool
        bs = self.block_size
        num_seqs = len(reqs)
        blocks_of = self.req_to_blocks
        free = pool.get_num_free_blocks()
        num_steps = last_step - first_step + 1
        keys = _step_keys(first_allocations, first_step, last_step, bs, num_seqs)
        if not keys:
            out = [free] * num_steps
        elif num_steps == 1:
            for key, block in zip(keys, pool.get_new_blocks(len(keys))):
                blocks_of[reqs[key % num_seqs].request_id].append(block)
            out = [free - len(keys)]
        else:
            taken = [0] * num_steps
            for key, block in zip(keys, pool.get_new_blocks(len(keys))):
                blocks_of[reqs[key % num_seqs].request_id].append(block)
                taken[key // num_seqs - first_step] += 1
            out = list(accumulate(taken, sub, initial=free))[1:]
        if self.enable_caching:
            starts = self._fill_starts(reqs, num_computed, last_step)
            keys = _step_keys(starts, first_step, last_step, bs, num_seqs) if starts else None
            if keys:
                self._cache_decode_steps(reqs, num_computed, keys, last_step)
        return out

    def _fill_starts(self, reqs: Sequence, num_computed: Sequence[int], last_step: int) -> list[int] | None:
        """The step of a run in which each request's first uncached block fills:
        step s leaves a request with c + s tokens, so block j is full at step
        (j + 1) * bs - c (``_step_keys``' progressions of fills). A private
        request's blocks get no hash (kv/block_pool.py): its count of cached
        blocks is brought to ``last_step`` here and its progression starts
        past the run (a running request's count is that of the blocks its
        computed tokens fill, A4, so the run's end sets it). None when no fill
        needs a hash."""
        bs = self.block_size
        cached = self.num_cached_block
        if self.debug:                            # (_hashes_blocks_of: every request, hoisted)
            return [(cached[r.request_id] + 1) * bs - c for r, c in zip(reqs, num_computed)]
        if not self._num_hashed_reqs:
            # Every request holding blocks is private (W1's every run): only the counts.
            for r, c in zip(reqs, num_computed):
                cached[r.request_id] = (c + last_step) // bs
            return None
        starts = []
        hashed = False
        for r, c in zip(reqs, num_computed):
            if r.private_keys:
                cached[r.request_id] = (c + last_step) // bs     # its blocks full after the last step
                starts.append(last_step + 1)
            else:
                hashed = True
                starts.append((cached[r.request_id] + 1) * bs - c)
        return starts if hashed else None

    def _cache_decode_steps(self, reqs: Sequence, num_computed: Sequence[int],
                            keys: list[int], last_step: int) -> None:
        """A4 for every block the run's steps fill up to ``last_step``, in
        (step, batch index) order, as the step path hashes them (the order
        matters when two blocks share a hash, B8). ``keys``: the sorted
        ``step * num_seqs + index`` of each fill."""
        bs = self.block_size
        num_seqs = len(reqs)
        blocks_of = self.req_to_blocks
        if self.debug:
            for key in keys:
                i = key % num_seqs
                r = reqs[i]
                self._cache_full_blocks(r, blocks_of[r.request_id], num_computed[i] + key // num_seqs)
            return
        # Each fill caches one block, j = (c + s) // bs - 1: the blocks and
        # their hashes in fill order, stored by the pool one by one (what
        # _cache_full_blocks does one block at a time, without its checks).
        # (No key is a private request's: ``_fill_starts``.)
        blocks, hashes = [], []
        cached = self.num_cached_block
        for key in keys:
            i = key % num_seqs
            r = reqs[i]
            j = (num_computed[i] + key // num_seqs) // bs - 1
            blocks.append(blocks_of[r.request_id][j])
            hashes.append(r.block_hashes[j])
            cached[r.request_id] = j + 1          # keys ascend: the last fill of each is its count
        if blocks:
            self.pool.cache_blocks_in_order(blocks, hashes)

    def first_step_caching(self, reqs: Sequence, num_computed: Sequence[int], block_hash: int,
                           max_steps: int) -> int | None:
        """The first step of a decode run in which one of ``reqs`` hashes a block
        equal to ``block_hash`` (A4), or None if none does within ``max_steps``."""
        if not self.enable_caching:
            return None
        bs = self.block_size
        cached = self.num_cached_block
        first = None
        for i, r in enumerate(reqs):
            lo = cached[r.request_id]
            hi = (num_computed[i] + max_steps) // bs
            if hi > lo and block_hash in r.block_hashes[lo:hi]:
                j = r.block_hashes.index(block_hash, lo, hi)
                s = (j + 1) * bs - num_computed[i]
                first = s if first is None else min(first, s)
        return first


def _step_keys(first_steps: Sequence[int], first_step: int, last_step: int, bs: int,
               num_seqs: int) -> list[int]:
    """Sorted ``step * num_seqs + index`` of every step in ``first_step..last_step``
    of each progression ``s0, s0 + bs, ...`` of ``first_steps`` (``index``: its
    place). From step 1 a progression's steps below 1 count as well (a block
    that was full before the run is cached at its first step)."""
    if first_step == 1:
        if last_step <= bs and min(first_steps) >= 1:
            # No progression has two steps within the run: one key each.
            keys = [s0 * num_seqs + i for i, s0 in enumerate(first_steps) if s0 <= last_step]
            keys.sort()
            return keys
        starts = [(s0, i) for i, s0 in enumerate(first_steps) if s0 <= last_step]
    else:
        starts = [(s, i) for i, s0 in enumerate(first_steps)
                  if (s := s0 if s0 >= first_step else s0 + -(-(first_step - s0) // bs) * bs) <= last_step]
        if last_step - first_step < bs:
            keys = [s * num_seqs + i for s, i in starts]
            keys.sort()
            return keys
    stride = bs * num_seqs
    end = last_step * num_seqs + num_seqs
    keys = []
    for s, i in starts:
        keys.extend(range(s * num_seqs + i, end, stride))
    keys.sort()
    return keys


def allocate_decode_step_by_run(kv, reqs: Sequence, num_computed: Sequence[int]) -> bool:
    """``allocate_decode_step`` from a manager's run methods (the radix and
    hybrid managers): step 1 of a run, when its blocks fit."""
    first = kv.decode_run_first_allocations(reqs, num_computed)
    if first is None or kv.nth_decode_run_allocation(first, kv.get_num_free_blocks() + 1, 1) is not None:
        return False
    kv.allocate_decode_steps(reqs, num_computed, first, 1, 1)
    return True
