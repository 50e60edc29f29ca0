"""The KV cache manager: a narrow facade over the block pool (vLLM V1).

Three calls make up the interface the schedulers use, as in
``vllm/v1/core/kv_cache_manager.py``:

* ``get_computed_blocks(req)``: read-only prefix lookup (kv-semantics H3);
* ``allocate_slots(req, ...)``: the feasibility check, then the mutation
  (A1-A4); returns None and changes nothing when the blocks do not fit;
* ``free(req)``: return a request's blocks, tail first (B6).

``fork`` adds copy-on-write sharing for parallel sampling and beam search
(kv-semantics V5), which V1 does not have but V0 and the vLLM paper do.

A request here is any object with ``request_id``, ``num_tokens``,
``num_computed_tokens``, ``block_hashes`` (hashes of its full blocks so far)
and, in debug mode, ``all_token_ids``.
"""

from __future__ import annotations

from kvsim.kv.block_pool import NULL_BLOCK_ID, BlockPool


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    """Blocks per request, prefix hits, allocation and freeing."""

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

    @property
    def num_usable_blocks(self) -> int:
        return self.pool.num_usable_blocks

    def get_num_free_blocks(self) -> int:
        return self.pool.get_num_free_blocks()

    @property
    def usage(self) -> float:
        return self.pool.get_usage()

    def get_blocks(self, request_id: str) -> list[int]:
        return self.req_to_blocks.get(request_id, [])

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

    def num_blocks_to_allocate(self, req, num_tokens: int, new_computed_blocks=()) -> int:
        """Free blocks an allocation for ``num_tokens`` slots would use up (A2).

        Reviving a cached block that sits in the free queue uses up one free
        block, exactly like allocating a new one.
        """
        held = len(self.req_to_blocks.get(req.request_id, ()))
        required = cdiv(num_tokens, self.block_size)
        if req.request_id in self.num_cached_block:
            # A request that already holds blocks gets no new prefix hits.
            return max(required - held, 0) + self._cow_blocks_needed(req, num_tokens)
        num_new = max(required - len(new_computed_blocks) - held, 0)
        ref = self.pool.ref_cnt
        num_evictable = sum(1 for b in new_computed_blocks if ref[b] == 0)
        return num_new + num_evictable

    # ------------------------------------------------------------ mutations

    def allocate_slots(self, req, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks=(), num_lookahead_tokens: int = 0) -> list[int] | None:
        """Allocate blocks for ``num_new_tokens`` more tokens of ``req`` (A1-A4).

        Returns the newly allocated block ids, or None (nothing changed).
        """
        if num_new_tokens <= 0:
            raise ValueError("num_new_tokens must be > 0")
        blocks = self.req_to_blocks.get(req.request_id)
        if blocks is not None and not new_computed_blocks and not self._any_forks:
            return self._extend_running(req, blocks, num_new_tokens, num_lookahead_tokens)
        num_computed = req.num_computed_tokens + num_new_computed_tokens
        need = min(num_computed + num_new_tokens + num_lookahead_tokens, self.max_model_len)
        if self.num_blocks_to_allocate(req, need, new_computed_blocks) > self.pool.get_num_free_blocks():
            return None

        rid = req.request_id
        if new_computed_blocks:
            self.pool.touch(new_computed_blocks)
        blocks = self.req_to_blocks.setdefault(rid, [])
        if rid not in self.num_cached_block:
            # First allocation since admission: the hits count as cached.
            blocks.extend(new_computed_blocks)
            self.num_cached_block[rid] = len(new_computed_blocks)
        self._copy_on_write(req, blocks)
        num_new_blocks = cdiv(need, self.block_size) - len(blocks)
        new_blocks = self.pool.get_new_blocks(num_new_blocks) if num_new_blocks > 0 else []
        blocks.extend(new_blocks)

        if self.enable_caching:
            # A4: cache at schedule time, up to the tokens computed by this step.
            num_full = min(num_computed + num_new_tokens, req.num_tokens) // self.block_size
            cached = self.num_cached_block[rid]
            if num_full > cached:
                self.pool.cache_full_blocks(blocks, req.block_hashes, cached, num_full,
                                            getattr(req, "all_token_ids", None) if self.debug else None,
                                            self.block_size)
                self.num_cached_block[rid] = num_full
        return new_blocks

    def _extend_running(self, req, blocks: list[int], num_new_tokens: int,
                        num_lookahead_tokens: int) -> list[int] | None:
        """``allocate_slots`` for a request that already holds blocks (the hot path).

        Same rules as the general path (A1, A2, A4) with nothing to revive:
        a running request gets no new prefix hits.
        """
        bs = self.block_size
        num_computed = req.num_computed_tokens
        need = num_computed + num_new_tokens + num_lookahead_tokens
        if need > self.max_model_len:
            need = self.max_model_len
        num_new_blocks = -(-need // bs) - len(blocks)
        if num_new_blocks > 0:
            if num_new_blocks > self.pool.get_num_free_blocks():
                return None
            new_blocks = self.pool.get_new_blocks(num_new_blocks)
            blocks.extend(new_blocks)
        else:
            new_blocks = []
        if self.enable_caching:
            rid = req.request_id
            num_full = min(num_computed + num_new_tokens, req.num_tokens) // bs
            cached = self.num_cached_block[rid]
            if num_full > cached:
                self.pool.cache_full_blocks(blocks, req.block_hashes, cached, num_full,
                                            req.all_token_ids if self.debug else None, bs)
                self.num_cached_block[rid] = num_full
        return new_blocks

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

    # -------------------------------------------------------------- private

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
