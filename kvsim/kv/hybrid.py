"""The hybrid KV cache manager: one block pool, one block table per KV-cache group.

vLLM 0.33 runs a model whose layers mix attention types (Gemma 3, gpt-oss:
full + sliding window; Llama 4: full + chunked local; Qwen3-Next: full +
Gated DeltaNet state) with ``KVCacheManager`` over a
``HybridKVCacheCoordinator`` (``vllm/v1/core/kv_cache_coordinator.py``):
every group (:mod:`kvsim.specs.kv_groups`) has a single-type manager
(:mod:`kvsim.kv.single_type`), all draw from one :class:`BlockPool`, and a
prefix hit is the longest prefix *every* group can serve::

    full attention   [b1 b2 b3 b4 b5]            hit 5 blocks
    sliding (w=33)   [ 0  0  0 c4 c5]  -> 5      needs the 2 blocks before the end
    Mamba state      [ 0  0 m3]        -> 3      the rightmost state within 5
    fixed point      5 -> 5 -> 3 -> (full trimmed to 3) -> 3: hit 3 blocks

This class offers the same facade as :class:`kvsim.kv.manager.KVCacheManager`
(the single-group manager), so the schedulers need not know which one runs;
``SchedulerConfig.make_kv_manager`` picks this one when the model has several
groups. A hit is a tuple of per-group block lists (vLLM ``KVCacheBlocks``).

``allocate_slots`` follows vLLM ``KVCacheManager.allocate_slots``: free what
fell out of every group's window (``remove_skipped_blocks``, even if the
allocation then fails), check the blocks all groups need against the free
ones, take the hit, allocate, hash the full blocks. kvsim's steps are
synchronous (no tokens in flight at schedule time), as in the oracle.

Decode runs (the engine's skip-ahead) are exact: :mod:`kvsim.kv.hybrid_runs`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kvsim.kv.block_pool import BlockPool
from kvsim.kv.hybrid_runs import HybridDecodeRuns
from kvsim.kv.manager import PoolQueries
from kvsim.kv.mamba import MambaManager
from kvsim.kv.single_type import (NULL, ChunkedLocalAttentionManager, FullAttentionManager,
                                  SlidingWindowManager, admission_cap, cdiv)
from kvsim.specs.kv_groups import CHUNKED, FULL, MAMBA, SLIDING, KVCacheGroups

MANAGERS = {FULL: FullAttentionManager, SLIDING: SlidingWindowManager,
            CHUNKED: ChunkedLocalAttentionManager, MAMBA: MambaManager}

EMPTY: tuple = ()
EMPTY_NEW: list = []      # allocate_slots succeeded (the schedulers test for None only)


def _max_blocks(spec, block_size: int, num_tokens: int, cap: int | None) -> int:
    need = cdiv(num_tokens, block_size)
    if spec.kind == MAMBA:
        return min(need, 2)              # the running state, and for a step the last one
    return need if cap is None else min(need, cap)


def blocks_per_request(groups: KVCacheGroups, num_tokens: int, *, max_model_len: int,
                       max_in_flight_tokens: int, enable_caching: bool = True) -> int:
    """Blocks one request of ``num_tokens`` tokens holds at most in all groups
    (what the hybrid manager's tables reach; see single_type.admission_cap)."""
    n = min(num_tokens, max_model_len)
    total = 0
    for g in groups.groups:
        spec = g.spec
        bs = max_model_len if spec.kind == MAMBA and not enable_caching else spec.block_size
        total += _max_blocks(spec, bs, n, admission_cap(spec, max_in_flight_tokens, max_model_len))
    return total


class HybridKVCacheManager(PoolQueries, HybridDecodeRuns):
    """vLLM KVCacheManager + HybridKVCacheCoordinator for several KV-cache groups."""

    caches_at_schedule_time = True            # A4, as the single-group manager
    aligns_chunks = True                   # Mamba groups cut prefills at block boundaries (align_chunk)

    def __init__(self, groups: KVCacheGroups, num_gpu_blocks: int, *, max_model_len: int,
                 max_num_batched_tokens: int, long_prefill_token_threshold: int = 0,
                 enable_caching: bool = True, lifo_unhashed: bool = True,
                 max_in_flight_tokens: int | None = None) -> None:
        specs = [g.spec for g in groups.groups]
        if not specs:
            raise ValueError("the hybrid KV manager needs at least one KV-cache group")
        if enable_caching and len({s.block_size for s in specs}) > 1:
            raise ValueError(f"KV-cache groups with block sizes {sorted({s.block_size for s in specs})}: "
                             f"kvsim's hybrid KV manager needs one block size for prefix caching "
                             f"(vLLM's fine-grained hash hits are not modelled)")
        self.groups = groups
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.debug = False
        self.max_num_batched_tokens = max_num_batched_tokens
        self.long_prefill_token_threshold = long_prefill_token_threshold
        self.pool = BlockPool(num_gpu_blocks, enable_caching=enable_caching,
                              lifo_unhashed=lifo_unhashed)
        in_flight = max_num_batched_tokens if max_in_flight_tokens is None else max_in_flight_tokens
        self.managers = []
        for gid, spec in enumerate(specs):
            if spec.kind == MAMBA and not enable_caching:
                # vLLM: without prefix caching the Mamba block spans max_model_len
                # (one block per request, MambaModelConfig.verify_and_update_config).
                from dataclasses import replace
                spec = replace(spec, block_size=max_model_len, mamba_cache_mode="none")
            self.managers.append(MANAGERS[spec.kind](
                spec, self.pool, gid, enable_caching=enable_caching,
                admission_cap=admission_cap(spec, in_flight, max_model_len)))
        # The hash (and scheduling) block size: the attention groups' one.
        sizes = [m.block_size for m in self.managers if m.kind != MAMBA] or [specs[0].block_size]
        self.block_size = math.gcd(*sizes)
        self.has_mamba_align = any(isinstance(m, MambaManager) and m.align for m in self.managers)
        # The groups that ever drop blocks (full attention never does).
        self._dropping = [m for m in self.managers if m.kind != FULL]
        self._spec_groups = self._make_spec_groups()
        self._junction: dict[str, int] = {}     # vLLM Request.shared_prefix_boundary (Mamba)
        self.blocks_to_copy: list[tuple[int, int]] = []
        self.num_cow_copies = 0

    def _make_spec_groups(self) -> list[tuple[type, list[int]]]:
        """vLLM verify_and_split_kv_cache_groups: groups with one spec are looked up
        together; full attention first (its left-to-right scan bounds the rest)."""
        out: list[tuple[type, list[int]]] = []
        specs: list = []
        for gid, m in enumerate(self.managers):
            for k, (cls, ids) in enumerate(out):
                if specs[k] == m.spec and cls is type(m):
                    ids.append(gid)
                    break
            else:
                out.append((type(m), [gid]))
                specs.append(m.spec)
        order = sorted(range(len(out)), key=lambda k: out[k][0].kind != FULL)
        return [(out[k][0], out[k][1]) for k in order]

    # -------------------------------------------------------------- queries
    # (num_usable_blocks, get_num_free_blocks, usage, free_queue: PoolQueries)

    def get_blocks(self, request_id: str) -> tuple[list[int], ...]:
        """The request's block table in each group (nulls where blocks were dropped)."""
        return tuple(list(m.req_to_blocks.get(request_id, ())) for m in self.managers)

    def num_blocks_for(self, num_tokens: int) -> int:
        """Blocks one request of ``num_tokens`` tokens holds at most, all groups."""
        total = 0
        n = min(num_tokens, self.max_model_len)
        for m in self.managers:
            total += _max_blocks(m.spec, m.block_size, n, m.admission_cap)
        return total

    def get_computed_blocks(self, req) -> tuple[tuple, int]:
        """The longest prefix every group can serve, as (per-group blocks, tokens).

        Read-only, except that it notes where a longer full-attention hit ends
        (vLLM ``shared_prefix_boundary``), where Mamba prefill chunks stop so
        that state gets cached.
        """
        if not self.enable_caching:
            return EMPTY, 0
        blocks, hit, longest = self.find_longest_cache_hit(req.block_hashes, req.num_tokens - 1)
        if self.has_mamba_align:
            self._junction[req.request_id] = longest if longest > hit else 0
        if not any(blocks):
            return EMPTY, 0
        return blocks, hit

    def num_cached_prefix_blocks(self, block_hashes: Sequence[int]) -> int:
        """Leading blocks of ``block_hashes`` every group has cached (read-only)."""
        if not self.enable_caching:
            return 0
        return self.find_longest_cache_hit(block_hashes, len(block_hashes) * self.block_size)[1] // self.block_size

    def find_longest_cache_hit(self, block_hashes: Sequence[int], max_length: int) -> tuple[tuple, int, int]:
        """vLLM HybridKVCacheCoordinator.find_longest_cache_hit: the fixed point.

        Each attention type accepts the candidate length or lowers it; any
        lowering restarts the round. Full attention is looked up once (its hit
        is downward closed) and trimmed. Returns (blocks, hit tokens, the
        longest single-type hit seen).
        """
        pool = self.pool
        n = len(self.managers)
        hit_blocks: list[list[int] | None] = [None] * n
        hit_len_by_group = [0] * n
        hit_length = max_length
        longest = 0
        # One type (vLLM UnitaryKVCacheCoordinator), or full + one other: one round.
        simple = len(self._spec_groups) == 1 or (
            len(self._spec_groups) == 2 and self._spec_groups[0][0].kind == FULL)
        while True:
            curr = hit_length
            for cls, ids in self._spec_groups:
                if cls.kind == FULL and hit_blocks[ids[0]] is not None:
                    curr = min(curr, hit_len_by_group[ids[0]])
                    continue
                found, curr = cls.find_longest_cache_hit(pool, block_hashes, curr, ids,
                                                         self.managers[ids[0]].spec)
                for gid, b in zip(ids, found):
                    hit_blocks[gid] = b
                    hit_len_by_group[gid] = curr
                longest = max(longest, curr)
            if curr >= hit_length:
                break
            hit_length = curr
            if simple:
                break
        for cls, ids in self._spec_groups:
            if cls.kind == FULL:
                for gid in ids:
                    del hit_blocks[gid][cdiv(hit_length, self.managers[gid].block_size):]
        return tuple(b if b is not None else [] for b in hit_blocks), hit_length, longest

    def num_blocks_to_allocate(self, req, num_tokens: int, new_computed_blocks=(),
                               full_sequence: bool = False) -> int:
        """Free blocks an allocation for ``num_tokens`` slots would use up, all groups.

        ``full_sequence``: the whole-prompt gate (``scheduler_reserve_full_isl``),
        where vLLM caps a sliding or chunked group at the blocks it can ever hold
        (``apply_admission_cap``).
        """
        hits = new_computed_blocks or EMPTY
        if not hits and not full_sequence:
            return self._blocks_to_grow(req.request_id, num_tokens)
        computed = req.num_computed_tokens + self._hit_tokens(hits)
        if full_sequence:
            computed = min(computed, self.max_model_len)
        rid = req.request_id
        total = 0
        for g, m in enumerate(self.managers):
            total += m.get_num_blocks_to_allocate(rid, num_tokens, hits[g] if hits else EMPTY,
                                                  computed, full_sequence)
        return total

    def _blocks_to_grow(self, rid: str, num_tokens: int) -> int:
        """``num_blocks_to_allocate`` without a hit: each table grows to ``num_tokens``
        slots (what every manager's rule comes to then; Mamba's own rule kept)."""
        total = 0
        for m in self.managers:
            if m.kind == MAMBA:
                total += m.get_num_blocks_to_allocate(rid, num_tokens, EMPTY, 0)
                continue
            n = -(-num_tokens // m.block_size) - len(m.req_to_blocks.get(rid, ()))
            if n > 0:
                total += n
        return total

    def has_evictable_hits(self, blocks) -> bool:
        ref = self.pool.ref_cnt
        return any(ref[b] == 0 and b != NULL for group in blocks for b in group)

    def align_chunk(self, req, num_new_tokens: int, num_new_computed_tokens: int = 0) -> int:
        """vLLM Scheduler._mamba_block_aligned_split: with Mamba state cached per block
        ("align" mode), a prefill chunk ends on a block boundary, at the last one
        before the prompt's last token, and where a longer hit of another group
        ends, so those states get cached. Decodes and other models: unchanged.
        """
        if not self.has_mamba_align:
            return num_new_tokens
        start = req.num_computed_tokens + num_new_computed_tokens
        num_tokens = req.num_tokens
        prefill_end = max(req.prompt_len, num_tokens - 1)
        if start >= prefill_end:
            return num_new_tokens
        bs = self.block_size
        end = start + num_new_tokens
        last_cache_position = max((num_tokens - 1) // bs * bs, 0)
        if end < prefill_end:
            max_prefill = self.max_num_batched_tokens
            if self.long_prefill_token_threshold > 0:
                max_prefill = min(max_prefill, self.long_prefill_token_threshold)
            aligned = end // bs * bs
            if aligned > start or bs <= max_prefill:
                end = aligned
        junction = self._junction.get(req.request_id, 0)
        stops = ((start // bs + 1) * bs if start % bs else 0,
                 last_cache_position,
                 start + (junction - start) // bs * bs if start < junction < end else 0)
        end = min((s for s in stops if start < s < end), default=end)
        return max(end - start, 0)

    # ------------------------------------------------------------ mutations
    def close(self) -> None:
        """The run is over: nothing here is a reference cycle."""

    def new_step_starts(self) -> None:
        """vLLM KVCacheManager.new_step_starts, at the start of every schedule()."""
        for m in self.managers:
            m.new_step_starts()

    def allocate_slots(self, req, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks=(), num_lookahead_tokens: int = 0, *,
                       num_external_computed_tokens: int = 0,
                       delay_cache_blocks: bool = False) -> list | None:
        """vLLM KVCacheManager.allocate_slots (see the module docstring). Returns None
        when the blocks do not fit (then only out-of-window blocks were freed).

        External KV (a connector's, sched/connector.py) is not modelled for
        several KV-cache groups: a connector's tokens are refused."""
        if num_new_tokens <= 0:
            raise ValueError("num_new_tokens must be > 0")
        if num_external_computed_tokens or delay_cache_blocks:
            raise ValueError("a KV connector with the hybrid KV cache manager is not modelled")
        rid = req.request_id
        hits = new_computed_blocks or EMPTY
        computed = min(req.num_computed_tokens + num_new_computed_tokens, self.max_model_len)
        need = min(computed + num_new_tokens + num_lookahead_tokens, self.max_model_len)
        for m in self._dropping:
            m.remove_skipped_blocks(rid, computed)
        if self.num_blocks_to_allocate(req, need, hits) > self.pool.get_num_free_blocks():
            return None
        if hits and not any(rid in m.num_cached_block for m in self.managers):
            # Touch every group's hit before any group pops a block (vLLM #33775).
            for g, m in enumerate(self.managers):
                m.add_local_computed_blocks(rid, hits[g], computed)
        self._grow(rid, need)
        if self.enable_caching:
            self._cache(req, min(computed + num_new_tokens, req.num_tokens))
        return self.get_blocks(rid) if self.debug else EMPTY_NEW

    def cache_blocks(self, req, num_computed_tokens: int) -> None:
        """vLLM KVCacheManager.cache_blocks (coordinator.cache_blocks: every group's
        manager): the blocks accepted draft tokens filled, cached after the step
        verified them (sched/spec_decode.py). EAGLE's dropped last block is not
        modelled, as in the single-group manager (kv/single_type.py)."""
        if self.enable_caching:
            self._cache(req, min(num_computed_tokens, req.num_tokens))

    def _grow(self, rid: str, num_tokens: int) -> None:
        """Every group's ``allocate_new_blocks`` where its table is short of
        ``num_tokens`` slots (Mamba's always: it notes the request)."""
        for m in self.managers:
            blocks = m.req_to_blocks.get(rid)
            if blocks is None or m.kind == MAMBA or len(blocks) * m.block_size < num_tokens:
                m.allocate_new_blocks(rid, num_tokens)

    def _cache(self, req, num_tokens: int) -> None:
        """Every group's ``cache_blocks`` where a block filled up since the last call."""
        rid = req.request_id
        for m in self.managers:
            if m.num_cached_block.get(rid, 0) < num_tokens // m.block_size:
                m.cache_blocks(req, num_tokens)

    def free(self, req, finished: bool = False) -> None:
        """Return the request's blocks, group by group, each tail first (vLLM coordinator.free).
        (``finished``: as to ``KVCacheManager.free``; no group keeps blocks out of its map.)"""
        rid = req.request_id
        self._junction.pop(rid, None)
        for m in self.managers:
            m.free(rid)

    def fork(self, parent, child) -> None:
        raise ValueError("copy-on-write sharing (parallel sampling, beam search) is not modelled "
                         "with the hybrid KV cache manager")

    # -------------------------------------------------------------- private
    def _hit_tokens(self, hits) -> int:
        if not hits:
            return 0
        return len(hits[0]) * self.managers[0].block_size
