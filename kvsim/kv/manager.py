"""The KV cache manager: a narrow facade over the block pool (vLLM V1).

Three calls make up the interface the schedulers use, as in
``vllm/v1/core/kv_cache_manager.py``:

* ``get_computed_blocks(req)``: read-only prefix lookup (kv-semantics H3);
* ``allocate_slots(req, ...)``: the feasibility check, then the mutation
  (A1-A4); returns None and changes nothing when the blocks do not fit;
* ``free(req)``: return a request's blocks, tail first (B6).

A few more serve runs of decode steps that the schedulers skip ahead over
(DESIGN.md, "skipping time, not rules"): ``decode_run_first_allocations`` and
``nth_decode_run_allocation`` say when the blocks of a run would be taken,
``allocate_decode_steps`` performs those steps' allocations and caching,
exactly as one ``allocate_slots(req, 1)`` per request per step would.

``fork`` adds copy-on-write sharing for parallel sampling and beam search
(kv-semantics V5), which V1 does not have but V0 and the vLLM paper do.

A request here is any object with ``request_id``, ``num_tokens``,
``num_computed_tokens``, ``block_hashes`` (hashes of its full blocks so far)
and, in debug mode, ``all_token_ids``.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate
from operator import sub

from kvsim.kv.block_pool import NULL_BLOCK_ID, BlockPool, PoolQueries


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager(PoolQueries):
    """Blocks per request, prefix hits, allocation and freeing."""

    # A4: full blocks are hashed when they are scheduled, so nothing is cached
    # after a step. The radix strategy (kv/radix_manager.py) inserts after the
    # step instead (SGLang G3); the chunked scheduler asks this to know whether
    # to call its ``cache_after_step``, and whether a decode run can grow a hit.
    caches_at_schedule_time = True
    aligns_chunks = False                   # align_chunk is the identity (one group)

    def __init__(self, num_gpu_blocks: int, block_size: int, *, max_model_len: int,
                 enable_caching: bool = True, lifo_unhashed: bool = True,
                 debug: bool = False) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.debug = debug
        self.pool = BlockPool(num_gpu_blocks, enable_caching=enable_caching,
                              lifo_unhashed=lifo_unhashed, debug=debug)
        self.req_to_blocks: dict[str, list[int]] = {}
        # How many of a request's blocks already have their hash in the pool.
        self.num_cached_block: dict[str, int] = {}
        # Copy-on-write: (src, dst) block copies the GPU would perform.
        self.blocks_to_copy: list[tuple[int, int]] = []
        self.num_cow_copies = 0
        self._any_forks = False       # copy-on-write checks only once something forked

    # -------------------------------------------------------------- queries
    # (num_usable_blocks, get_num_free_blocks, usage, free_queue: PoolQueries)

    def get_blocks(self, request_id: str) -> list[int]:
        return self.req_to_blocks.get(request_id, [])

    def num_blocks_for(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` slots of one request (A1: capped at max_model_len)."""
        return -(-min(num_tokens, self.max_model_len) // self.block_size)

    def get_computed_blocks(self, req) -> tuple[list[int], int]:
        """Longest cached prefix of ``req``, as (blocks, tokens); read-only (H3, H4).

        At most ``num_tokens - 1`` tokens can hit, so a prompt that is an exact
        multiple of the block size always recomputes its whole last block
        (vLLM: the last token must be computed to sample from it).
        """
        if not self.enable_caching:
            return [], 0
        max_blocks = (req.num_tokens - 1) // self.block_size
        hits = self.pool.get_cached_prefix(req.block_hashes, max_blocks)
        if self.debug and hits:
            self._check_hit(req, hits)
        return hits, len(hits) * self.block_size

    def num_cached_prefix_blocks(self, block_hashes: Sequence[int]) -> int:
        """How many leading blocks of ``block_hashes`` are cached now (read-only)."""
        if not self.enable_caching:
            return 0
        return len(self.pool.get_cached_prefix(block_hashes, len(block_hashes)))

    def num_blocks_to_allocate(self, req, num_tokens: int, new_computed_blocks=(),
                               full_sequence: bool = False) -> int:
        """Free blocks an allocation for ``num_tokens`` slots would use up (A2).

        Reviving a cached block that sits in the free queue uses up one free
        block, exactly like allocating a new one. ``full_sequence`` (the
        whole-prompt gate) changes nothing here: vLLM caps only sliding-window
        and chunked-local groups there (the hybrid manager, kv/hybrid.py).
        """
        held = len(self.req_to_blocks.get(req.request_id, ()))
        required = self.num_blocks_for(num_tokens)
        if req.request_id in self.num_cached_block:
            # A request that already holds blocks gets no new prefix hits.
            return max(required - held, 0) + self._cow_blocks_needed(req, num_tokens)
        num_new = max(required - len(new_computed_blocks) - held, 0)
        ref = self.pool.ref_cnt
        num_evictable = sum(1 for b in new_computed_blocks if ref[b] == 0)
        return num_new + num_evictable

    def align_chunk(self, req, num_new_tokens: int, num_new_computed_tokens: int = 0) -> int:
        """The chunk the scheduler may give ``req``: unchanged with one group
        (the hybrid manager cuts Mamba prefills at block boundaries)."""
        return num_new_tokens

    def decode_run_head_limit(self, head, reqs, max_steps: int) -> None:
        """None: chunked's own rule for a blocked waiting head holds with one
        group (free blocks only shrink in a run); see kv/hybrid_runs.py."""
        return None

    # ------------------------------------------------------------ mutations
    def new_step_starts(self) -> None:
        """A new schedule() call (vLLM KVCacheManager.new_step_starts); nothing to do
        with one group (the hybrid manager's Mamba groups reset a set)."""

    def allocate_slots(self, req, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks=(), num_lookahead_tokens: int = 0,
                       num_external_computed_tokens: int = 0,
                       delay_cache_blocks: bool = False) -> list[int] | None:
        """Allocate blocks for ``num_new_tokens`` more tokens of ``req`` (A1-A4).

        ``num_external_computed_tokens`` come after the local prefix hit from a
        KV connector (sched/connector.py); with ``delay_cache_blocks`` (an
        asynchronous load) nothing is cached until the KV has arrived
        (``cache_blocks``). Returns the newly allocated block ids, or None
        (nothing changed).
        """
        if num_new_tokens <= 0 and (num_new_tokens < 0 or not num_external_computed_tokens):
            raise ValueError("num_new_tokens must be > 0")
        rid = req.request_id
        num_computed = req.num_computed_tokens + num_new_computed_tokens + num_external_computed_tokens
        need = num_computed + num_new_tokens + num_lookahead_tokens      # A1
        blocks = self.req_to_blocks.get(rid)
        if blocks is None or new_computed_blocks or self._any_forks:
            if self.num_blocks_to_allocate(req, need, new_computed_blocks) > self.pool.get_num_free_blocks():
                return None
            if new_computed_blocks:
                self.pool.touch(new_computed_blocks)
            blocks = self.req_to_blocks.setdefault(rid, [])
            if rid not in self.num_cached_block:
                # First allocation since admission: the hits count as cached.
                blocks.extend(new_computed_blocks)
                self.num_cached_block[rid] = len(new_computed_blocks)
            self._copy_on_write(req, blocks)
        bs = self.block_size
        new_blocks = []
        if need > len(blocks) * bs:         # the held blocks do not cover it (the usual decode step does)
            num_new_blocks = self.num_blocks_for(need) - len(blocks)
            if num_new_blocks > 0:
                if num_new_blocks > self.pool.get_num_free_blocks():
                    return None             # a running request: nothing to revive (A2)
                new_blocks = self.pool.get_new_blocks(num_new_blocks)
                blocks.extend(new_blocks)
        filled = num_computed + num_new_tokens
        if not delay_cache_blocks and self.enable_caching and filled // bs > self.num_cached_block[rid]:
            # Slots reserved past the known tokens (lookahead) are never cached.
            self._cache_full_blocks(req, blocks, min(filled, req.num_tokens))
        return new_blocks

    def cache_blocks(self, req, num_computed_tokens: int) -> None:
        """A4 for blocks whose KV arrived late (an asynchronous load), or that
        accepted draft tokens filled (speculative decoding: vLLM caches them in
        ``update_from_output``): hash the blocks ``num_computed_tokens`` fill."""
        self._cache_full_blocks(req, self.req_to_blocks[req.request_id],
                                min(num_computed_tokens, req.num_tokens))

    def free(self, req) -> None:
        """Return all of ``req``'s blocks, tail block first (B6)."""
        blocks = self.req_to_blocks.pop(req.request_id, None)
        self.num_cached_block.pop(req.request_id, None)
        if blocks:
            self.pool.free_blocks(blocks[::-1])

    def fork(self, parent, child) -> None:
        """Let ``child`` share all of ``parent``'s blocks (copy-on-write, V5).

        The child takes a reference on every block; the first time either one
        writes into a shared, partially filled block, that writer gets a copy
        (see ``_copy_on_write``).
        """
        self._any_forks = True
        blocks = list(self.req_to_blocks.get(parent.request_id, ()))
        ref = self.pool.ref_cnt
        for b in blocks:
            ref[b] += 1
        self.req_to_blocks[child.request_id] = blocks
        self.num_cached_block[child.request_id] = self.num_cached_block.get(parent.request_id, 0)

    # ------------------------------------------------------- decode runs

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
        if allocated_by(max_steps) < n:
            return None
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

    def allocate_decode_steps(self, reqs: Sequence, num_computed: Sequence[int],
                              first_allocations: Sequence[int], first_step: int,
                              last_step: int) -> list[int]:
        """Steps ``first_step..last_step`` of a decode run: blocks, then caching (A2-A5).

        ``num_computed`` and ``first_allocations`` describe the requests before
        step 1 of the run (``decode_run_first_allocations``). Does what
        ``allocate_slots(req, 1)`` does for each request in each step (the
        blocks the steps need, known to fit; the blocks they fill, hashed),
        in the same order. Returns the free blocks after each step.

        Popping every block before caching any is the same as interleaving:
        popped blocks are free and cached ones are held, so evictions and
        insertions touch different blocks and leave the hash map in the same
        order.
        """
        pool = self.pool
        bs = self.block_size
        num_seqs = len(reqs)
        blocks_of = self.req_to_blocks
        # Pops and fills as step * num_seqs + index: sorted, they are in the
        # order the step path pops and hashes them (the hash order matters
        # when two blocks share a hash, B8).
        stride = bs * num_seqs
        end = last_step * num_seqs + num_seqs
        free = pool.get_num_free_blocks()
        num_steps = last_step - first_step + 1
        starts = _steps_in(first_allocations, first_step, last_step, bs)
        if starts:
            keys = []
            for s, i in starts:
                keys.extend(range(s * num_seqs + i, end, stride))
            keys.sort()
            taken = [0] * num_steps
            for key, block in zip(keys, pool.get_new_blocks(len(keys))):
                blocks_of[reqs[key % num_seqs].request_id].append(block)
                taken[key // num_seqs - first_step] += 1
            out = list(accumulate(taken, sub, initial=free))[1:]
        else:
            out = [free] * num_steps
        if self.enable_caching:
            # Step s leaves a request with c + s tokens: its first uncached
            # block j is full at step (j + 1) * bs - c.
            cached = self.num_cached_block
            fills = _steps_in([(cached[r.request_id] + 1) * bs - c for r, c in zip(reqs, num_computed)],
                              first_step, last_step, bs)
            if fills:
                self._cache_decode_steps(reqs, num_computed, fills, last_step)
        return out

    def _cache_decode_steps(self, reqs: Sequence, num_computed: Sequence[int],
                            fills: list[tuple[int, int]], last_step: int) -> None:
        """A4 for every block the run's steps fill up to ``last_step``, in
        (step, batch index) order, as the step path hashes them (the order
        matters when two blocks share a hash, B8). ``fills``: (first step
        from which it fills a block every block_size steps, index)."""
        bs = self.block_size
        num_seqs = len(reqs)
        stride = bs * num_seqs
        end = last_step * num_seqs + num_seqs
        keys = []                    # step * num_seqs + index: the step fills a block
        for s, i in fills:
            keys.extend(range(s * num_seqs + i, end, stride))
        keys.sort()
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
        blocks, hashes = [], []
        for key in keys:
            i = key % num_seqs
            r = reqs[i]
            j = (num_computed[i] + key // num_seqs) // bs - 1
            blocks.append(blocks_of[r.request_id][j])
            hashes.append(r.block_hashes[j])
        self.pool.cache_blocks_in_order(blocks, hashes)
        cached = self.num_cached_block
        for _, i in fills:
            cached[reqs[i].request_id] = (num_computed[i] + last_step) // bs

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

    def has_evictable_hits(self, blocks: Sequence[int]) -> bool:
        """Whether any of these prefix-hit blocks sits in the free queue."""
        ref = self.pool.ref_cnt
        return any(ref[b] == 0 for b in blocks)

    # -------------------------------------------------------------- private

    def _cache_full_blocks(self, req, blocks: list[int], num_tokens: int) -> None:
        """A4: hash the request's blocks that are full once ``num_tokens`` of it are computed.

        Caching happens at schedule time, so a request scheduled later in the
        same step can hit them (TV5). The one place a block gets its hash.
        """
        if not self.enable_caching:
            return
        rid = req.request_id
        num_full = num_tokens // self.block_size
        done = self.num_cached_block[rid]
        if num_full > done:
            self.pool.cache_full_blocks(blocks, req.block_hashes, done, num_full,
                                        req.all_token_ids if self.debug else None, self.block_size)
            self.num_cached_block[rid] = num_full

    def _cow_blocks_needed(self, req, num_tokens: int) -> int:
        """1 when the next write lands in a shared, partially filled block."""
        blocks = self.req_to_blocks.get(req.request_id)
        if not blocks:
            return 0
        filled = req.num_computed_tokens
        last = (filled // self.block_size)
        if filled % self.block_size == 0 or last >= len(blocks) or num_tokens <= filled:
            return 0
        return 1 if self.pool.ref_cnt[blocks[last]] > 1 else 0

    def _copy_on_write(self, req, blocks: list[int]) -> None:
        filled = req.num_computed_tokens
        last = filled // self.block_size
        if filled % self.block_size == 0 or last >= len(blocks):
            return
        src = blocks[last]
        if self.pool.ref_cnt[src] <= 1 or src == NULL_BLOCK_ID:
            return
        (dst,) = self.pool.get_new_blocks(1)
        self.pool.free_blocks([src])
        blocks[last] = dst
        self.blocks_to_copy.append((src, dst))
        self.num_cow_copies += 1

    def _check_hit(self, req, hits: list[int]) -> None:
        tokens = req.all_token_ids
        bs = self.block_size
        for i, b in enumerate(hits):
            stored = self.pool.block_tokens[b]
            want = tuple(tokens[i * bs:(i + 1) * bs])
            if stored is not None and stored != want:
                raise AssertionError(f"prefix hit on block {b} holds other tokens than request {req.request_id}")


def _steps_in(first_steps: Sequence[int], first_step: int, last_step: int, bs: int) -> list[tuple[int, int]]:
    """(first step >= ``first_step``, index) of each progression ``s0, s0 + bs, ...``
    of ``first_steps`` that has a step within ``first_step..last_step``."""
    if first_step == 1:
        return [(s0, i) for i, s0 in enumerate(first_steps) if s0 <= last_step]
    return [(s, i) for i, s0 in enumerate(first_steps)
            if (s := s0 if s0 >= first_step else s0 + -(-(first_step - s0) // bs) * bs) <= last_step]
