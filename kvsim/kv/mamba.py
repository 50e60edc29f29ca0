"""The Mamba / linear-attention state group (vLLM ``MambaManager``).

Models such as Qwen3-Next keep, in their Gated DeltaNet layers, a state of
constant size per request instead of per-token KV. vLLM stores it in blocks
of the shared pool, as padded pages of the attention block size
(:mod:`kvsim.specs.kv_groups`), and manages them with ``MambaManager``
(``vllm/v1/core/single_type_kv_cache_manager.py``), in one of two modes:

* ``none`` (prefix caching off): one block per request for good (vLLM makes
  the Mamba block ``max_model_len`` tokens long);
* ``align`` (prefix caching on): block ``j`` of the table holds the state
  after ``(j + 1) x block_size`` tokens once computed; only the running state
  and, for one step, the one before it are kept (the rest are nulls), and
  states at block boundaries are hashed so a later request can resume from
  the rightmost one it shares.

Not modelled: speculative state blocks, prefill checkpoints exported inside a
chunk (``num_prefill_checkpoint_blocks``), fine-grained (sub-block) hits,
sparse retention.
"""

from __future__ import annotations

from kvsim.kv.block_pool import BlockPool
from kvsim.kv.single_type import NULL, SingleTypeManager, cached_blocks, cdiv
from kvsim.specs.kv_groups import MAMBA, LayerKVSpec


class MambaManager(SingleTypeManager):
    """vLLM MambaManager (module docstring). In "align" mode the scheduler cuts
    prefill chunks at block boundaries so that states get cached
    (``HybridKVCacheManager.align_chunk``)."""

    kind = MAMBA

    def __init__(self, spec: LayerKVSpec, pool: BlockPool, group_id: int, **kwargs) -> None:
        super().__init__(spec, pool, group_id, **kwargs)
        self.align = spec.mamba_cache_mode == "align"
        self.cached_this_step: set = set()           # keys cached in this schedule() call
        self.last_state_block_idx: dict[str, int] = {}
        self.num_retired_blocks: dict[str, int] = {}
        self.allocated: set[str] = set()

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return num_computed_tokens - 1           # only the last computed token's state is read

    def get_num_blocks_to_allocate(self, rid, num_tokens, new_computed, total_computed_tokens,
                                   apply_admission_cap=False):
        if new_computed and (self.pool.block_hash[new_computed[-1]] in self.cached_this_step):
            # A state another request writes in this very step is not there yet:
            # more blocks than exist, so the request waits a step (vLLM, same rule).
            return self.pool.num_gpu_blocks + 1
        if not self.align:
            return super().get_num_blocks_to_allocate(rid, num_tokens, new_computed,
                                                      total_computed_tokens, apply_admission_cap)
        num_new = (cdiv(num_tokens, self.block_size) - len(new_computed)
                   - len(self.req_to_blocks.get(rid, ())))
        if num_new > 0:
            num_new = 1                          # one state block per step at most
        ref = self.pool.ref_cnt
        return num_new + sum(1 for b in new_computed if ref[b] == 0 and b != NULL)

    def allocate_new_blocks(self, rid: str, num_tokens: int) -> list[int]:
        if not self.align:
            return super().allocate_new_blocks(rid, num_tokens)
        blocks = self.req_to_blocks.setdefault(rid, [])
        required = cdiv(num_tokens, self.block_size)
        if required <= len(blocks):
            self.allocated.add(rid)
            return []
        prev = len(blocks)
        if rid in self.allocated or prev > 0:
            # The state to copy from into the new slot (a hit's state, or last step's).
            self.last_state_block_idx[rid] = prev - 1
        if prev < required - 1:
            blocks.extend([NULL] * (required - 1 - prev))   # slots whose state is not kept
        new = self.pool.get_new_blocks(max(required - len(blocks), 0))
        blocks.extend(new)
        self.allocated.add(rid)
        return new

    def remove_skipped_blocks(self, rid: str, num_computed_tokens: int) -> None:
        super().remove_skipped_blocks(rid, num_computed_tokens)
        if not self.align:
            return
        # The state two steps back was only the source of last step's copy.
        idx = self.last_state_block_idx.get(rid)
        if idx is not None and idx < cdiv(num_computed_tokens, self.block_size) - 1:
            blocks = self.req_to_blocks[rid]
            if blocks[idx] != NULL:
                self.pool.free_blocks([blocks[idx]])
                blocks[idx] = NULL

    def _remove_blocks_in_range(self, rid: str, first: int, last: int) -> None:
        if not self.align:
            return super()._remove_blocks_in_range(rid, first, last)
        blocks = self.req_to_blocks.get(rid, [])
        first = max(first, self.num_retired_blocks.get(rid, 0))
        last = min(last, len(blocks))
        if first >= last:
            return
        freed = []
        for i in range(last - 1, first - 1, -1):   # prefill leaves null gaps: skip them
            if blocks[i] != NULL:
                freed.append(blocks[i])
                blocks[i] = NULL
        if freed:
            self.pool.free_blocks(freed)
        self.num_retired_blocks[rid] = last

    def cache_blocks(self, req, num_tokens: int) -> None:
        rid = req.request_id
        before = self.num_cached_block.get(rid, 0)
        super().cache_blocks(req, num_tokens)
        after = self.num_cached_block.get(rid, 0)
        if after > before:
            blocks, hashes = self.req_to_blocks[rid], self.pool.block_hash
            for i in range(before, after):
                if blocks[i] != NULL and hashes[blocks[i]] is not None:
                    self.cached_this_step.add(hashes[blocks[i]])

    def pop_blocks(self, rid: str) -> list[int]:
        self.allocated.discard(rid)
        self.last_state_block_idx.pop(rid, None)
        self.num_retired_blocks.pop(rid, None)
        return super().pop_blocks(rid)

    def new_step_starts(self) -> None:
        self.cached_this_step.clear()

    @classmethod
    def find_longest_cache_hit(cls, pool, block_hashes, max_length, group_ids, spec):
        """The rightmost cached state within ``max_length``: nulls, then that block."""
        bs = spec.block_size
        for i in range(max_length // bs - 1, -1, -1):
            hit = cached_blocks(pool, block_hashes[i], group_ids)
            if hit is not None:
                return [[NULL] * i + [b] for b in hit], (i + 1) * bs
        return [[] for _ in group_ids], 0
