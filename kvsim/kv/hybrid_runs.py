"""Decode runs (the engine's skip-ahead) for the hybrid KV cache manager.

A run is ``k`` steps in which every running request decodes one token
(``kvsim.sched.base.DecodeRun``). In step ``s`` request ``i`` with ``c``
computed tokens does what ``allocate_slots(req, 1)`` does: every group drops
what fell out of its window (``remove_skipped_blocks(c)``), allocates a block
when ``c`` reaches the end of its table, hashes the block ``c + 1`` fills.
With several groups blocks are *freed* during a run as well as taken, so:

* **applying** steps calls those very functions, for request ``i`` at step
  ``s`` only where one of them can act: ``c`` on a block boundary or one
  before it, one past the window's edge (sliding), on a chunk boundary
  (chunked local), one past a block boundary (Mamba), and the run's first
  step (a burst of drops after a prefill). Elsewhere all three are no-ops.
* **planning** (where the free blocks run out, whether the waiting queue may
  open) counts each step's drops and allocations per group in closed form
  (:mod:`kvsim.kv.hybrid_counts`), mirroring those functions; tests check the counts
  against what applying the steps does.

The waiting queue's head, blocked now, stays blocked while the free blocks
never exceed their count at the start of the run and nothing it could hit is
cached or evicted (``decode_run_head_limit``): its need then never drops.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvsim.kv.decode_runs import allocate_decode_step_by_run
from kvsim.kv.hybrid_counts import first_drop_step, ids_of, index_counts, table_shape
from kvsim.specs.kv_groups import CHUNKED, FULL, MAMBA, SLIDING


@dataclass
class HybridRunPlan:
    """What a run's steps will free and allocate, per (step, request): the
    ``first_allocations`` of a ``DecodeRun`` (opaque to the schedulers)."""

    num_seqs: int
    reqs: list = field(repr=False)
    num_computed: list[int] = field(repr=False)
    horizon: int = 0
    # (step * num_seqs + index, blocks freed, blocks allocated), in step order
    events: list[tuple[int, int, int]] = field(default_factory=list)
    total_allocations: int = 0


FIRST_HORIZON = 16       # steps planned first; doubled while a run may go on
MAX_BACKOFF = 15


def _steps_free_blocks_stay_at_most_now(plan: HybridRunPlan, horizon: int) -> int:
    """Steps (of the first ``horizon``) after each of which the run has freed no more
    blocks than it took (the free blocks at most what they were at its start)."""
    n = plan.num_seqs
    net = 0
    step = None
    for key, freed, allocated in plan.events:
        s = key // n
        if s > horizon:
            break
        if step is not None and s != step and net > 0:
            return step - 1
        step = s
        net += freed - allocated
    if step is not None and net > 0:
        return step - 1
    return horizon


class HybridDecodeRuns:
    """The decode-run methods of :class:`kvsim.kv.hybrid.HybridKVCacheManager`."""

    # After a blocked head allowed no run, the next 1, 3, 7, ... asks answer 0 at
    # once (the step path then runs: same results, less planning in overload).
    _head_backoff = 0
    _head_misses = 0

    def decode_run_first_allocations(self, reqs: Sequence, num_computed: Sequence[int]) -> HybridRunPlan:
        """The plan of a run of ``reqs`` from ``num_computed`` (its counts made lazily)."""
        return HybridRunPlan(len(reqs), list(reqs), list(num_computed))

    def _plan(self, plan: HybridRunPlan, max_steps: int) -> HybridRunPlan:
        """Fill in the plan's events up to ``max_steps`` (closed forms, decode_counts),
        from the state before the run's first step: plans are made (and grown)
        while the scheduler plans the run, before any step is applied."""
        if plan.horizon >= max_steps:
            return plan
        n = plan.num_seqs
        reqs = plan.reqs
        events: dict[int, list] = {}
        total = 0
        for i, r in enumerate(reqs):
            rid = r.request_id
            c0 = plan.num_computed[i]
            memo: dict = {}            # Gemma 3's sliding groups: one table shape, six tables
            for m in self.managers:
                blocks = m.req_to_blocks.get(rid, ())
                shape = table_shape(m, rid, blocks)
                found = memo.get(shape)
                if found is None:
                    found = memo[shape] = index_counts(m, rid, c0, max_steps, blocks)
                for s, dropped, a in ids_of(blocks, found):
                    e = events.setdefault(s * n + i, [[], 0])
                    e[0].extend(dropped)
                    e[1] += a
                    total += a
        # A dropped block is free once its last holder drops it (shared prefix blocks).
        ref = self.pool.ref_cnt
        held: dict[int, int] = {}
        out = []
        for key in sorted(events):
            dropped, a = events[key]
            freed = 0
            for b in dropped:
                if b < 0:
                    freed += 1
                    continue
                left = held.get(b, ref[b]) - 1
                held[b] = left
                freed += left == 0
            out.append((key, freed, a))
        plan.events = out
        plan.horizon = max_steps
        plan.total_allocations = total
        return plan

    def nth_decode_run_allocation(self, plan: HybridRunPlan, n: int, max_steps: int):
        """(step, batch index) of the allocation at which the run has taken ``n``
        blocks more than it freed, or None within ``max_steps``: with ``n`` =
        free blocks + 1, the allocation that would not fit (A2)."""
        if n < 1:
            return (1, 0)
        if self._allocations_within(plan, max_steps) < n:
            return None            # even without a single free block coming back
        horizon = min(max(plan.horizon, FIRST_HORIZON), max_steps)
        while True:
            plan = self._plan(plan, horizon)
            net = 0
            k = plan.num_seqs
            for key, freed, allocated in plan.events:
                if key // k > horizon:
                    break
                net -= freed
                if allocated and net + allocated >= n:
                    return key // k, key % k
                net += allocated
            if horizon >= max_steps:
                return None
            horizon = min(2 * horizon, max_steps)

    def _allocations_within(self, plan: HybridRunPlan, max_steps: int) -> int:
        """Blocks the run's first ``max_steps`` steps allocate (A5 in each group)."""
        total = 0
        for i, r in enumerate(plan.reqs):
            c0 = plan.num_computed[i]
            for m in self.managers:
                bs = m.block_size
                s = len(m.req_to_blocks.get(r.request_id, ())) * bs - c0 + 1
                if s <= max_steps:
                    total += (max_steps - s) // bs + 1
        return total

    allocate_decode_step = allocate_decode_step_by_run        # step 1 of a run, when it fits

    def allocate_decode_steps(self, reqs: Sequence, num_computed: Sequence[int],
                              plan: HybridRunPlan, first_step: int, last_step: int) -> list[int]:
        """Steps ``first_step..last_step``: each request's ``allocate_slots(req, 1)``
        wherever it can act (module docstring). Returns the free blocks after each step."""
        num_seqs = len(reqs)
        keys: set[int] = set()
        for i, r in enumerate(reqs):
            c0 = num_computed[i]
            for s in self._candidate_steps(r.request_id, c0, first_step, last_step):
                keys.add(s * num_seqs + i)
        pool = self.pool
        out: list[int] = []
        free = pool.get_num_free_blocks()
        step = first_step
        dropping = self._dropping
        caching = self.enable_caching
        for key in sorted(keys):
            s, i = divmod(key, num_seqs)
            while step < s:
                out.append(free)
                step += 1
            r = reqs[i]
            rid = r.request_id
            c = num_computed[i] + s - 1
            for m in dropping:
                m.remove_skipped_blocks(rid, c)
            self._grow(rid, c + 1)
            if caching:
                self._cache(r, c + 1)
            free = pool.get_num_free_blocks()
        while step <= last_step:
            out.append(free)
            step += 1
        return out

    def _candidate_steps(self, rid: str, c0: int, first: int, last: int) -> list[int]:
        """Steps of one request at which remove/allocate/cache may act (a superset)."""
        mods: set[tuple[int, int]] = set()
        for m in self.managers:
            bs = m.block_size
            if m.kind == MAMBA and not m.align:
                continue                              # one block for good
            mods.add((bs, 0))
            mods.add((bs, bs - 1))
            if m.kind == SLIDING:
                mods.add((bs, (m.sliding_window - 1) % bs))
            elif m.kind == CHUNKED:
                mods.add((m.attention_chunk_size, 0))
            elif m.kind == MAMBA:
                mods.add((bs, 1 % bs))
        steps = {1} if first <= 1 <= last and self._acts_at(rid, c0) else set()
        for mod, r in mods:
            s0 = (r - (c0 - 1)) % mod or mod          # first s >= 1 with (c0 + s - 1) % mod == r
            if s0 < first:
                s0 += -(-(first - s0) // mod) * mod
            steps.update(range(s0, last + 1, mod))
        return sorted(steps)

    def _acts_at(self, rid: str, c: int) -> bool:
        """Whether a decode step at ``c`` computed tokens may drop, allocate or cache
        off the block-boundary steps (right after a prefill or a prefix hit)."""
        caching = self.enable_caching
        for m in self.managers:
            blocks = m.req_to_blocks.get(rid, ())
            bs = m.block_size
            if len(blocks) * bs <= c or (caching and m.num_cached_block.get(rid, 0) < (c + 1) // bs):
                return True
            if m.kind != FULL and first_drop_step(m, rid, c) == 1:
                return True
        return False

    def first_step_caching(self, reqs: Sequence, num_computed: Sequence[int], block_hash: int,
                           max_steps: int) -> int | None:
        """The first step at which one of ``reqs`` hashes ``block_hash`` (any group)."""
        if not self.enable_caching:
            return None
        bs = self.block_size
        first = None
        for i, r in enumerate(reqs):
            lo = min(m.num_cached_block.get(r.request_id, 0) for m in self.managers)
            hi = (num_computed[i] + max_steps) // bs
            if hi > lo and block_hash in r.block_hashes[lo:hi]:
                j = r.block_hashes.index(block_hash, lo, hi)
                s = max((j + 1) * bs - num_computed[i], 1)
                first = s if first is None else min(first, s)
        return first

    def decode_run_head_limit(self, head, reqs: Sequence, max_steps: int) -> int:
        """Steps of a run in which the blocked waiting head certainly stays blocked.

        It cannot fit while no block comes back to the free queue (it does
        not fit now, and allocations only take), and its need never drops
        while nothing it could hit is cached or evicted. The run stops before
        the first step that may drop a block, cache or evict one of those.
        (The single-group manager has its own, cheaper rule.)
        """
        if self._head_backoff:
            # The last tries found no run: skip a few (0 is always a safe answer).
            self._head_backoff -= 1
            return 0
        limit = self._head_limit(head, reqs, max_steps)
        if limit == 0:
            self._head_misses = min(2 * self._head_misses + 1, MAX_BACKOFF)
            self._head_backoff = self._head_misses
        else:
            self._head_misses = 0
        return limit

    def _head_limit(self, head, reqs: Sequence, max_steps: int) -> int:
        computed = [r.num_computed_tokens for r in reqs]
        first_drop = max_steps + 1
        for i, r in enumerate(reqs):
            for m in self._dropping:
                first_drop = min(first_drop, first_drop_step(m, r.request_id, computed[i]))
        plan = HybridRunPlan(len(reqs), list(reqs), computed)
        limit = min(first_drop - 1, max_steps)
        if limit < FIRST_HORIZON <= max_steps:
            # Drops soon: allocations may balance them; count the first steps exactly.
            plan = self._plan(plan, FIRST_HORIZON)
            limit = max(limit, _steps_free_blocks_stay_at_most_now(plan, FIRST_HORIZON))
        if limit <= 0:
            return 0
        if not self.enable_caching or head.num_computed_tokens:
            return limit
        bs = self.block_size
        wanted = set(head.block_hashes[:(head.num_tokens - 1) // bs])
        if not wanted:
            return limit
        if self._hit_waits_for_this_step(head):
            return 0
        for i, r in enumerate(reqs):          # a running request caches a block the head wants
            lo = min(m.num_cached_block.get(r.request_id, 0) for m in self.managers)
            hi = (computed[i] + limit) // bs
            hashes = r.block_hashes
            for j in range(lo, hi):
                if hashes[j] in wanted:
                    limit = min(limit, max((j + 1) * bs - computed[i], 1) - 1)
                    break
        if limit == 0:
            return 0
        # The run pops blocks from the free queue's head (and drops none before
        # the limit): the first block the head could hit is evicted no earlier
        # than after the blocks in front of it.
        total = self._allocations_within(plan, limit)
        pos = 0
        block_hash = self.pool.block_hash
        for b in self.pool.iter_free_queue():
            if pos >= total:
                break
            key = block_hash[b]
            if key is not None and key[0] in wanted:
                limit = min(limit, self._step_of_allocation(plan, pos + 1, limit) - 1)
                break
            pos += 1
        return max(limit, 0)

    def _step_of_allocation(self, plan: HybridRunPlan, n: int, max_steps: int) -> int:
        """The step of the run's ``n``-th allocation (at most ``max_steps`` allocate
        that many, by the caller's count)."""
        lo, hi = 1, max_steps
        while lo < hi:
            mid = (lo + hi) // 2
            if self._allocations_within(plan, mid) >= n:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def _hit_waits_for_this_step(self, head) -> bool:
        """vLLM MambaManager: a hit whose last state was cached in the current step
        waits a step; the run's first step is a new one, so let the step path see it."""
        mambas = [m for m in self.managers if m.kind == MAMBA and m.cached_this_step]
        if not mambas:
            return False
        blocks, _, _ = self.find_longest_cache_hit(head.block_hashes, head.num_tokens - 1)
        for m in mambas:
            hit = blocks[m.group_id]
            if hit and self.pool.block_hash[hit[-1]] in m.cached_this_step:
                return True
        return False

