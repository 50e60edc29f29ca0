"""One KV-cache group's block table and rules (vLLM ``single_type_kv_cache_manager.py``).

vLLM 0.33 gives every KV-cache group (:mod:`kvsim.specs.kv_groups`) its own
manager; all of them take block ids from one shared :class:`BlockPool`. A
manager keeps, per request, the group's block table and how many of its
blocks are hashed. The rules that differ between attention types:

======================  =============================  ==============================
manager                 tokens it may drop             prefix hit
======================  =============================  ==============================
FullAttentionManager    none                           longest run from the left
SlidingWindowManager    all but the last window - 1    rightmost run of window - 1
                                                        tokens, nulls before it
ChunkedLocalAttention   whole chunks before the        the blocks of the current
                        current one                    chunk, nulls before it
MambaManager            all but the last state         the rightmost cached state
======================  =============================  ==============================

(``MambaManager`` is in :mod:`kvsim.kv.mamba`.) Dropped blocks are freed at once and replaced by the null block (block 0) in
the table (``remove_skipped_blocks``), so a sliding-window request holds
about ``window / block_size`` blocks however long it gets. A table of a
sliding-window group looks like ``[0, 0, 0, b7, b8, b9]``.

Prefix-cache keys are ``(block hash, group id)`` (vLLM
``BlockHashWithGroupId``): the same token block has one cached block per
group.

Not modelled (vLLM features kvsim does not drive): EAGLE/MTP block drops,
fine-grained hash hits (a hash block smaller than a group's block), Mamba
prefill checkpoints and speculative state blocks, sparse retention
(``prefix_cache_retention_interval``), KV-connector external tokens,
cross-attention, DCP/PCP.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvsim.kv.block_pool import NULL_BLOCK_ID, BlockPool
from kvsim.specs.kv_groups import CHUNKED, FULL, SLIDING, LayerKVSpec

NULL = NULL_BLOCK_ID


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def null_head_len(blocks: Sequence[int]) -> int:
    """Leading null blocks of a table (vLLM ``null_head_len``): bisect, as nulls form
    a prefix of sliding and chunked tables, then check (a Mamba table has null gaps)."""
    if not blocks or blocks[0] != NULL:
        return 0
    lo, hi = 1, len(blocks)
    while lo < hi:
        mid = (lo + hi) // 2
        if blocks[mid] == NULL:
            lo = mid + 1
        else:
            hi = mid
    if blocks[:lo].count(NULL) == lo:
        return lo
    return next(i for i, b in enumerate(blocks) if b != NULL)


def cached_blocks(pool: BlockPool, block_hash: int, group_ids: Sequence[int]) -> list[int] | None:
    """vLLM BlockPool.get_cached_block: one block per group, or None if any group misses."""
    out = []
    for g in group_ids:
        b = pool.get_cached_block((block_hash, g))
        if b is None:
            return None
        out.append(b)
    return out


class SingleTypeManager:
    """vLLM ``SingleTypeKVCacheManager``: one group's tables, allocation, caching, freeing."""

    kind = FULL

    def __init__(self, spec: LayerKVSpec, pool: BlockPool, group_id: int, *,
                 enable_caching: bool, admission_cap: int | None = None) -> None:
        self.spec = spec
        self.block_size = spec.block_size
        self.pool = pool
        self.group_id = group_id
        self.enable_caching = enable_caching
        # vLLM max_admission_blocks_per_request: sliding and chunked groups only.
        self.admission_cap = admission_cap
        self.req_to_blocks: dict[str, list[int]] = {}
        self.num_cached_block: dict[str, int] = {}

    # ------------------------------------------------------------- sizing
    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Tokens attention no longer reads once ``num_computed_tokens`` are computed."""
        return 0

    def get_num_blocks_to_allocate(self, rid: str, num_tokens: int, new_computed: Sequence[int],
                                   total_computed_tokens: int, apply_admission_cap: bool = False) -> int:
        """Free blocks an allocation for ``num_tokens`` slots uses up (vLLM, same name).

        Hit blocks that sit in the free queue count, as new blocks do; hit
        blocks below the window are not taken (they become nulls).
        """
        required = cdiv(num_tokens, self.block_size)
        if apply_admission_cap and self.admission_cap is not None:
            required = min(required, self.admission_cap)
        held = len(self.req_to_blocks.get(rid, ()))
        if rid in self.num_cached_block:
            return max(required - held, 0)      # a running request gets no new hits
        skipped_blocks = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        num_new = max(required - max(skipped_blocks, len(new_computed) + held), 0)
        ref = self.pool.ref_cnt
        kept = new_computed[max(0, skipped_blocks - held):]
        return num_new + sum(1 for b in kept if ref[b] == 0 and b != NULL)

    # ---------------------------------------------------------- mutations
    def add_local_computed_blocks(self, rid: str, new_computed: Sequence[int],
                                  num_local_computed_tokens: int) -> None:
        """Take the prefix-hit blocks, nulls in place of those below the window."""
        blocks = self.req_to_blocks.setdefault(rid, [])
        skipped = self.get_num_skipped_tokens(num_local_computed_tokens) // self.block_size
        if skipped > 0:
            new_computed = new_computed[skipped:]
        if self.enable_caching:
            self.pool.touch(new_computed)
        blocks.extend([NULL] * skipped)
        blocks.extend(new_computed)
        self.num_cached_block[rid] = len(blocks)

    def allocate_new_blocks(self, rid: str, num_tokens: int) -> list[int]:
        """Blocks so that the table holds ``num_tokens`` slots."""
        blocks = self.req_to_blocks.setdefault(rid, [])
        num_new = cdiv(num_tokens, self.block_size) - len(blocks)
        if num_new <= 0:
            return []
        new = self.pool.get_new_blocks(num_new)
        blocks.extend(new)
        return new

    def cache_blocks(self, req, num_tokens: int) -> None:
        """Hash the table's blocks that are full at ``num_tokens`` tokens (nulls skipped)."""
        rid = req.request_id
        done = self.num_cached_block.get(rid, 0)
        num_full = num_tokens // self.block_size
        if done >= num_full:
            return
        blocks = self.req_to_blocks[rid]
        g = self.group_id
        keys = [(h, g) for h in req.block_hashes[done:num_full]]
        self.pool.cache_full_blocks(blocks[done:num_full], keys, 0, num_full - done)
        self.num_cached_block[rid] = num_full

    def remove_skipped_blocks(self, rid: str, num_computed_tokens: int) -> None:
        """Free the blocks attention no longer reads, nulls in their place."""
        skipped = self.get_num_skipped_tokens(num_computed_tokens)
        if skipped <= 0:
            return
        blocks = self.req_to_blocks.get(rid)
        if not blocks:
            return
        self._remove_blocks_in_range(rid, 0, min(skipped // self.block_size, len(blocks)))

    def _remove_blocks_in_range(self, rid: str, first: int, last: int) -> None:
        """Free ``[first, last)`` from the back, stopping at the first null (already freed)."""
        blocks = self.req_to_blocks[rid]
        freed = []
        for i in range(min(last, len(blocks)) - 1, first - 1, -1):
            b = blocks[i]
            if b == NULL:
                break
            freed.append(b)
            blocks[i] = NULL
        if freed:
            self.pool.free_blocks(freed)

    def free(self, rid: str) -> None:
        """Return the request's blocks, tail first, leading nulls left out."""
        blocks = self.pop_blocks(rid)
        if blocks:
            self.pool.free_blocks(blocks[::-1])

    def pop_blocks(self, rid: str) -> list[int]:
        blocks = self.req_to_blocks.pop(rid, [])
        self.num_cached_block.pop(rid, None)
        k = null_head_len(blocks)
        return blocks[k:] if k else blocks

    def new_step_starts(self) -> None:
        return None

    # ------------------------------------------------------------ lookups
    @classmethod
    def find_longest_cache_hit(cls, pool: BlockPool, block_hashes: Sequence[int], max_length: int,
                               group_ids: Sequence[int], spec: LayerKVSpec) -> tuple[list[list[int]], int]:
        """The longest run of cached blocks from the left (FullAttentionManager)."""
        bs = spec.block_size
        computed: list[list[int]] = [[] for _ in group_ids]
        for h in block_hashes[:max_length // bs]:
            hit = cached_blocks(pool, h, group_ids)
            if hit is None:
                break
            for lst, b in zip(computed, hit):
                lst.append(b)
        return computed, len(computed[0]) * bs


class FullAttentionManager(SingleTypeManager):
    kind = FULL


class WindowManager(SingleTypeManager):
    """What sliding-window and chunked-local groups share: a table whose dropped
    blocks are exactly its leading nulls, counted in ``num_dropped`` (so that a
    step with nothing to drop costs one comparison, not a scan)."""

    def __init__(self, spec: LayerKVSpec, pool: BlockPool, group_id: int, **kwargs) -> None:
        super().__init__(spec, pool, group_id, **kwargs)
        self.num_dropped: dict[str, int] = {}

    def add_local_computed_blocks(self, rid, new_computed, num_local_computed_tokens) -> None:
        super().add_local_computed_blocks(rid, new_computed, num_local_computed_tokens)
        self.num_dropped[rid] = self.get_num_skipped_tokens(num_local_computed_tokens) // self.block_size

    def remove_skipped_blocks(self, rid: str, num_computed_tokens: int) -> None:
        """vLLM's rule (free from the window's edge back to the first null) with the
        nulls counted: blocks ``[num_dropped, k)`` go, the last one first."""
        k = self.get_num_skipped_tokens(num_computed_tokens) // self.block_size
        done = self.num_dropped.get(rid, 0)
        if k <= done:
            return
        blocks = self.req_to_blocks.get(rid)
        if not blocks:
            return
        k = min(k, len(blocks))
        if k <= done:
            return
        freed = blocks[done:k][::-1]
        blocks[done:k] = [NULL] * (k - done)
        self.num_dropped[rid] = k
        self.pool.free_blocks(freed)

    def pop_blocks(self, rid: str) -> list[int]:
        blocks = self.req_to_blocks.pop(rid, [])
        self.num_cached_block.pop(rid, None)
        k = self.num_dropped.pop(rid, 0)
        return blocks[k:] if k else blocks


class SlidingWindowManager(WindowManager):
    """vLLM SlidingWindowManager: keeps the last ``sliding_window - 1`` computed tokens."""

    kind = SLIDING

    def __init__(self, spec: LayerKVSpec, pool: BlockPool, group_id: int, **kwargs) -> None:
        super().__init__(spec, pool, group_id, **kwargs)
        self.sliding_window = spec.sliding_window

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        # The next token reads tokens [c - window + 1, c]: the ones before are skipped.
        return max(0, num_computed_tokens - self.sliding_window + 1)

    @classmethod
    def find_longest_cache_hit(cls, pool, block_hashes, max_length, group_ids, spec):
        """From the right: the first run of ``cdiv(window - 1, block_size)`` cached
        blocks ends the hit; blocks before the run are nulls. Without such a run,
        the cached run that starts at block 0 (vLLM, same name)."""
        bs = spec.block_size
        need = cdiv(spec.sliding_window - 1, bs)
        max_blocks = max_length // bs
        computed = [[NULL] * max_blocks for _ in group_ids]
        run = 0
        for i in range(max_blocks - 1, -1, -1):
            hit = cached_blocks(pool, block_hashes[i], group_ids)
            if hit is None:
                run = 0
                continue
            for lst, b in zip(computed, hit):
                lst[i] = b
            run += 1
            if run >= need:
                for lst in computed:
                    del lst[i + run:]
                return computed, len(computed[0]) * bs
        for lst in computed:
            del lst[run:]
        return computed, len(computed[0]) * bs


class ChunkedLocalAttentionManager(WindowManager):
    """vLLM ChunkedLocalAttentionManager: attention reads the current chunk only."""

    kind = CHUNKED

    def __init__(self, spec: LayerKVSpec, pool: BlockPool, group_id: int, **kwargs) -> None:
        super().__init__(spec, pool, group_id, **kwargs)
        self.attention_chunk_size = spec.attention_chunk_size

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return num_computed_tokens // self.attention_chunk_size * self.attention_chunk_size

    @classmethod
    def find_longest_cache_hit(cls, pool, block_hashes, max_length, group_ids, spec):
        """Blocks before the chunk of token ``max_length`` count as hits (nulls);
        then the cached blocks of that chunk from its start."""
        bs = spec.block_size
        max_blocks = max_length // bs
        start = max_length // spec.attention_chunk_size * spec.attention_chunk_size if max_length > 0 else 0
        first = start // bs
        computed = [[NULL] * first for _ in group_ids]
        for i in range(first, max_blocks):
            hit = cached_blocks(pool, block_hashes[i], group_ids)
            if hit is None:
                break
            for lst, b in zip(computed, hit):
                lst.append(b)
        return computed, len(computed[0]) * bs


def admission_cap(spec: LayerKVSpec, max_in_flight_tokens: int, max_model_len: int) -> int | None:
    """vLLM ``max_admission_blocks_per_request``: blocks a sliding or chunked request
    ever holds (the window plus what is in flight), the cap of the whole-prompt gate."""
    if spec.kind == SLIDING:
        tokens = min(spec.sliding_window - 1 + max_in_flight_tokens, max_model_len)
        return cdiv(tokens, spec.block_size) + 1
    if spec.kind == CHUNKED:
        return cdiv(min(spec.attention_chunk_size + max_in_flight_tokens, max_model_len),
                    spec.block_size)
    return None
