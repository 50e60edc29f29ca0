"""The KV cache manager: a narrow facade over the block pool (vLLM V1).

Three calls make up the interface the schedulers use, as in
``vllm/v1/core/kv_cache_manager.py``:

* ``get_computed_blocks(req)``: read-only prefix lookup (kv-semantics H3);
* ``allocate_slots(req, ...)``: the feasibility check, then the mutation
  (A1-A4); returns None and changes nothing when the blocks do not fit;
* ``free(req)``: return a request's blocks, tail first (B6).

A few more serve runs of decode steps that the schedulers skip ahead over
(DESIGN.md, "skipping time, not rules"), in kv/decode_runs.py:
``decode_run_first_allocations`` and ``nth_decode_run_allocation`` say when
the blocks of a run would be taken, ``allocate_decode_steps`` performs those
steps' allocations and caching, exactly as one ``allocate_slots(req, 1)`` per
request per step would.

``fork`` adds copy-on-write sharing for parallel sampling and beam search
(kv-semantics V5), which V1 does not have but V0 and the vLLM paper do.

A request here is any object with ``request_id``, ``num_tokens``,
``num_computed_tokens``, ``block_hashes`` (hashes of its full blocks so far),
``private_keys`` (no other request can hold its keys: its blocks stay out of
the map until it is freed unfinished, kv/block_pool.py) and, in debug mode,
``all_token_ids``.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvsim.kv.block_pool import NULL_BLOCK_ID, BlockPool
from kvsim.kv.chunk_runs import ChunkRunSteps
from kvsim.kv.decode_runs import DecodeRunSteps


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class PoolQueries:
    """The queries a KV manager answers straight from its ``self.pool`` (a
    ``BlockPool``): shared by the single-group and the hybrid managers."""

    @property
    def num_usable_blocks(self) -> int:
        return self.pool.num_usable_blocks

    def get_num_free_blocks(self) -> int:
        return self.pool.get_num_free_blocks()

    @property
    def usage(self) -> float:
        return self.pool.get_usage()

    def free_queue(self) -> list[int]:
        """The pool's free queue, head first (tests, debugging)."""
        return self.pool.free_queue()


class KVCacheManager(PoolQueries, DecodeRunSteps, ChunkRunSteps):
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
        self._num_hashed_reqs = 0     # requests holding blocks whose blocks get a hash (not private)

    # -------------------------------------------------------------- queries
    # (num_usable_blocks, get_num_free_blocks, usage, free_queue: PoolQueries)

    def get_blocks(self, request_id: str) -> list[int]:
        return self.req_to_blocks.get(request_id, [])

    def num_blocks_for(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` slots of one request (A1: capped at max_model_len)."""
        cap = self.max_model_len                          # (min(), spelled as its comparison)
        return -(-(num_tokens if num_tokens <= cap else cap) // self.block_size)

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
        num_evictable = list(map(ref.__getitem__, new_computed_blocks)).count(0)
        return num_new + num_evictable

    def has_evictable_hits(self, blocks: Sequence[int]) -> bool:
        """Whether any of these prefix-hit blocks sits in the free queue."""
        ref = self.pool.ref_cnt
        return 0 in map(ref.__getitem__, blocks)

    def align_chunk(self, req, num_new_tokens: int, num_new_computed_tokens: int = 0) -> int:
        """The chunk the scheduler may give ``req``: unchanged with one group
        (the hybrid manager cuts Mamba prefills at block boundaries)."""
        return num_new_tokens

    def decode_run_head_limit(self, head, reqs, max_steps: int) -> None:
        """None: chunked's own rule for a blocked waiting head holds with one
        group (free blocks only shrink in a run); see kv/hybrid_runs.py."""
        return None

    # ------------------------------------------------------------ mutations
    def close(self) -> None:
        """The run is over: nothing here is a reference cycle (the radix manager's tree is)."""

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
                if self._hashes_blocks_of(req):
                    self._num_hashed_reqs += 1
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

    def free(self, req, finished: bool = False) -> None:
        """Return all of ``req``'s blocks, tail block first (B6). ``finished``: it
        never runs again (else, a preemption, it may look its prefix up again)."""
        blocks = self.req_to_blocks.pop(req.request_id, None)
        num_cached = self.num_cached_block.pop(req.request_id, None)
        if num_cached is not None and self._hashes_blocks_of(req):
            self._num_hashed_reqs -= 1
        if not blocks:
            return
        if req.private_keys and num_cached is not None:
            if num_cached and not finished:
                # It may look its prefix up again: its private blocks enter the map.
                self.pool.publish(blocks[:num_cached], req.block_hashes[:num_cached])
            # Its cached blocks go to the tail, private or not (kv/block_pool.py);
            # no other request can hold a private request's blocks.
            self.pool.free_request_blocks(blocks[::-1], len(blocks) - num_cached, unshared=True)
        elif self._any_forks or num_cached is None:
            self.pool.free_blocks(blocks[::-1])
        else:
            # Its first num_cached blocks hold their hash, the others none (A4);
            # a fork may hash a block its parent holds past its own count.
            self.pool.free_request_blocks(blocks[::-1], len(blocks) - num_cached)

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
        if child.request_id not in self.num_cached_block:
            self._num_hashed_reqs += 1            # (a sibling: never private)
        self.num_cached_block[child.request_id] = self.num_cached_block.get(parent.request_id, 0)

    # -------------------------------------------------------------- private

    def _hashes_blocks_of(self, req) -> bool:
        """Whether ``req``'s full blocks get their hash in the pool when they fill:
        not a private request's (kv/block_pool.py), but in debug mode, which
        checks every hit against its tokens."""
        return not req.private_keys or self.debug

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
            if self._hashes_blocks_of(req):
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
