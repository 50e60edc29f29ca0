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
  (:func:`decode_counts`), mirroring those functions; tests check the counts
  against what applying the steps does.

The waiting queue's head, blocked now, stays blocked while the free blocks
never exceed their count at the start of the run and nothing it could hit is
cached or evicted (``decode_run_head_limit``): its need then never drops.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvsim.kv.single_type import NULL, cdiv, null_head_len
from kvsim.specs.kv_groups import CHUNKED, MAMBA, SLIDING


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


def decode_counts(m, rid: str, c0: int, max_steps: int) -> list[tuple[int, int, int]]:
    """(step, freed, allocated) of steps 1..max_steps of one group of one request,
    where either is non-zero; the request decodes one token per step from ``c0``."""
    blocks = m.req_to_blocks.get(rid, ())
    bs = m.block_size
    length = len(blocks)
    out: dict[int, list[int]] = {}
    if m.kind == MAMBA and m.align:
        return _mamba_counts(m, rid, c0, max_steps)
    s = length * bs - c0 + 1                  # c reaches the end of the table (A5)
    while s <= max_steps:
        out.setdefault(max(s, 1), [0, 0])[1] += 1
        s += bs
    if m.kind in (SLIDING, CHUNKED):
        a = null_head_len(blocks)
        c = c0
        while True:
            k = m.get_num_skipped_tokens(c) // bs
            if k > a:
                out.setdefault(c - c0 + 1, [0, 0])[0] += k - a
                a = k
            # the next c at which more than a blocks are out of the window
            if m.kind == SLIDING:
                c = max(c + 1, (a + 1) * bs + m.sliding_window - 1)
            else:
                size = m.attention_chunk_size
                c = max(c // size + 1, -(-(a + 1) * bs // size)) * size
            if c - c0 + 1 > max_steps:
                break
    return sorted((s, f, n) for s, (f, n) in out.items())


def _mamba_counts(m, rid: str, c0: int, max_steps: int) -> list[tuple[int, int, int]]:
    """MambaManager in "align" mode, stepped on its own state (see single_type)."""
    blocks = m.req_to_blocks.get(rid, ())
    bs = m.block_size
    live = {i for i, b in enumerate(blocks) if b != NULL}
    length = len(blocks)
    retired = m.num_retired_blocks.get(rid, 0)
    lsi = m.last_state_block_idx.get(rid)
    out = []
    s = 1
    while s <= max_steps:
        c = c0 + s - 1
        freed = allocated = 0
        k = min((c - 1) // bs, length) if c > 1 else 0
        if retired < k:
            freed += len([i for i in live if retired <= i < k])
            live = {i for i in live if not retired <= i < k}
            retired = k
        if lsi is not None and lsi < cdiv(c, bs) - 1 and lsi in live:
            live.discard(lsi)
            freed += 1
        if cdiv(c + 1, bs) > length:
            lsi = length - 1
            live.add(length)
            length += 1
            allocated = 1
        if freed or allocated:
            out.append((s, freed, allocated))
        # next candidate: c one past, or on, a block boundary
        nxt = c + 1
        r = nxt % bs
        if r > 1:
            nxt += bs - r
        s = nxt - c0 + 1
    return out


class HybridDecodeRuns:
    """The decode-run methods of :class:`kvsim.kv.hybrid.HybridKVCacheManager`."""

    _last_plan: HybridRunPlan | None = None

    def decode_run_first_allocations(self, reqs: Sequence, num_computed: Sequence[int]) -> HybridRunPlan:
        """The counts of a run of ``reqs`` from ``num_computed``, planned lazily (the
        one ``decode_run_head_limit`` just made, if it is for the same batch)."""
        last = self._last_plan
        if (last is not None and len(last.reqs) == len(reqs) and last.num_computed == list(num_computed)
                and all(a is b for a, b in zip(last.reqs, reqs))):
            return last
        return HybridRunPlan(len(reqs), list(reqs), list(num_computed))

    def _plan(self, plan: HybridRunPlan, max_steps: int) -> HybridRunPlan:
        """Fill in the plan's events up to ``max_steps`` (closed forms, decode_counts)."""
        if plan.horizon >= max_steps:
            return plan
        n = plan.num_seqs
        reqs = plan.reqs
        events: dict[int, list[int]] = {}
        total = 0
        for i, r in enumerate(reqs):
            for m in self.managers:
                for s, f, a in decode_counts(m, r.request_id, plan.num_computed[i], max_steps):
                    e = events.setdefault(s * n + i, [0, 0])
                    e[0] += f
                    e[1] += a
                    total += a
        plan.events = sorted((k, f, a) for k, (f, a) in events.items())
        plan.horizon = max_steps
        plan.total_allocations = total
        return plan

    def nth_decode_run_allocation(self, plan: HybridRunPlan, n: int, max_steps: int):
        """(step, batch index) of the allocation at which the run has taken ``n``
        blocks more than it freed, or None within ``max_steps``: with ``n`` =
        free blocks + 1, the allocation that would not fit (A2)."""
        plan = self._plan(plan, max_steps)
        if n < 1:
            return (1, 0)
        net = 0
        k = plan.num_seqs
        for key, freed, allocated in plan.events:
            if key // k > max_steps:
                break
            net -= freed
            if allocated and net + allocated >= n:
                return key // k, key % k
            net += allocated
        return None

    def allocate_decode_steps(self, reqs: Sequence, num_computed: Sequence[int],
                              plan: HybridRunPlan, first_step: int, last_step: int) -> list[int]:
        """Steps ``first_step..last_step``: each request's ``allocate_slots(req, 1)``
        wherever it can act (module docstring). Returns the free blocks after each step."""
        num_seqs = len(reqs)
        keys: set[int] = set()
        for i, r in enumerate(reqs):
            c0 = num_computed[i]
            for s in self._candidate_steps(c0, first_step, last_step):
                keys.add(s * num_seqs + i)
        pool = self.pool
        out: list[int] = []
        free = pool.get_num_free_blocks()
        step = first_step
        managers = self.managers
        caching = self.enable_caching
        for key in sorted(keys):
            s, i = divmod(key, num_seqs)
            while step < s:
                out.append(free)
                step += 1
            r = reqs[i]
            rid = r.request_id
            c = num_computed[i] + s - 1
            for m in managers:
                m.remove_skipped_blocks(rid, c)
            for m in managers:
                m.allocate_new_blocks(rid, c + 1)
            if caching:
                for m in managers:
                    m.cache_blocks(r, c + 1)
            free = pool.get_num_free_blocks()
        while step <= last_step:
            out.append(free)
            step += 1
        return out

    def _candidate_steps(self, c0: int, first: int, last: int) -> list[int]:
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
        steps = {1} if first <= 1 <= last else set()
        for mod, r in mods:
            s0 = (r - (c0 - 1)) % mod or mod          # first s >= 1 with (c0 + s - 1) % mod == r
            if s0 < first:
                s0 += -(-(first - s0) // mod) * mod
            steps.update(range(s0, last + 1, mod))
        return sorted(steps)

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

        Its need never drops while nothing it could hit is cached or evicted,
        and it cannot fit while the free blocks stay at most what they are now
        (it does not fit now). The run stops before the first step that breaks
        either. (The single-group manager has its own, cheaper rule.)
        """
        computed = [r.num_computed_tokens for r in reqs]
        plan = self._plan(HybridRunPlan(len(reqs), list(reqs), computed), max_steps)
        self._last_plan = plan
        limit = max_steps
        n = plan.num_seqs
        net = 0
        step = None
        for key, freed, allocated in plan.events:
            s = key // n
            if step is not None and s != step and net > 0:
                limit = step - 1
                break
            step = s
            net += freed - allocated
        else:
            if step is not None and net > 0:
                limit = min(limit, step - 1)
        if not self.enable_caching or head.num_computed_tokens or limit == 0:
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
        # The run pops blocks from the free queue's head: the first one the head
        # could hit is evicted no earlier than after the blocks in front of it.
        pos = 0
        block_hash = self.pool.block_hash
        for b in self.pool.iter_free_queue():
            if pos >= plan.total_allocations:
                break
            key = block_hash[b]
            if key is not None and key[0] in wanted:
                nth = self.nth_allocation_only(plan, pos + 1)
                if nth is not None:
                    limit = min(limit, nth - 1)
                break
            pos += 1
        return max(limit, 0)

    def nth_allocation_only(self, plan: HybridRunPlan, n: int) -> int | None:
        """The step of the run's ``n``-th allocation, frees not counted."""
        taken = 0
        for key, _, allocated in plan.events:
            taken += allocated
            if taken >= n:
                return key // plan.num_seqs
        return None

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

