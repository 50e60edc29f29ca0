"""SGLang's radix cache behind vLLM's KV manager facade (``engine.prefix_cache: radix``).

``RadixKVManager`` answers the calls ``kvsim/kv/manager.py`` answers, so vLLM's
``chunked`` scheduler runs unchanged on top of SGLang's ``RadixCache``
(``kv/radix.py``, ``kv/radix_pool.py``, SGLang 0.4.6.post5). Which part of the
combination is whose (docs/kv_tiers.md, section 1):

* **vLLM's**: the scheduler (who runs, chunk sizes, the token budget, the
  admission gates N1/N2, recompute preemption of the last running request,
  decode-first), and the facade's contract: ``get_computed_blocks`` is a
  read-only lookup (H3), ``allocate_slots`` either succeeds whole or changes
  nothing (A2), and "free" counts what an allocation may take, cached blocks
  no request holds included (vLLM's free queue; SGLang's
  ``available_and_evictable``, G6).
* **SGLang's**: the tree and everything it does — token-granular matching
  (``page_size`` 1) or whole pages, node splits, lock references held by
  running requests (``inc_lock_ref`` at admission, moved by each insertion,
  dropped at finish or preemption), insertion *after* the step
  (``cache_unfinished_req`` after a prefill or chunk, ``cache_finished_req``
  at finish: decode tokens enter the tree only then, G3), the dedup of slots
  already in the tree, LRU eviction of whole unlocked leaves (G5), and the
  slot allocators (G1).

Where the two meet, kvsim decides, and says so:

* **The lookup is read-only.** vLLM's scheduler looks the waiting head up
  on every step it tries to admit it; vLLM's lookup changes nothing, so
  kvsim's radix lookup (``RadixCache.peek_prefix``) neither splits nor
  stamps. SGLang's ``match_prefix`` (split + new access times) runs when the
  request is admitted (``allocate_slots``), where vLLM touches its hit blocks.
* **Eviction happens inside** ``allocate_slots``, as SGLang's allocation
  does: an admission or chunk evicts as ``alloc_token_slots`` /
  ``alloc_paged_token_slots_extend`` do for a batch of one; a decode token
  that needs a slot (page) when none is free evicts one page's worth, as
  ``check_decode_mem`` / ``alloc_paged_token_slots_decode`` do for one
  request (SGLang's batch-level decode evicts for the whole batch at once,
  even for requests that need no new page; vLLM allocates per request).
* **Finish or preemption**: vLLM frees both alike (``free``); SGLang inserts
  at a finish and only unlocks at a retraction (``retract_decode``), so
  ``free`` tells them apart by the request's length (a finished request has
  all its tokens).
* **Units**: the facade counts *pages* (``block_size`` here is the radix
  page, ``page_size``): tokens when ``page_size`` is 1, the engine's blocks
  when it equals ``engine.block_size``. The memory is the hash cache's:
  ``(num_gpu_blocks - 1) * block_size`` token slots (vLLM's null block is
  SGLang's padding slot 0).

The decode-run methods let the engine skip ahead over decode-only steps:
nothing enters the tree during them (G3), and their slots are taken by the
same function the step path uses, in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvsim.kv.decode_runs import allocate_decode_step_by_run
from kvsim.kv.manager import KVCacheManager
from kvsim.kv.radix_pool import RadixKVPool, RadixRequest


class RadixHit:
    """A lookup's result, handed back to ``allocate_slots`` (vLLM: the hit blocks).

    ``len()`` is the hit in pages; ``num_unlocked_pages`` of them lie in nodes
    no running request locks (taking them uses up free pages, as reviving a
    cached block from vLLM's free queue uses up a free block).
    """

    __slots__ = ("num_tokens", "num_pages", "num_unlocked_pages")

    def __init__(self, num_tokens: int, num_pages: int, num_unlocked_pages: int) -> None:
        self.num_tokens = num_tokens
        self.num_pages = num_pages
        self.num_unlocked_pages = num_unlocked_pages

    def __len__(self) -> int:
        return self.num_pages

    def __repr__(self) -> str:
        return f"RadixHit({self.num_tokens} tokens, {self.num_unlocked_pages}/{self.num_pages} pages unlocked)"


NO_HIT = RadixHit(0, 0, 0)


class _Held:
    """A request that holds slots: its SGLang ``Req`` fields and its token ids."""

    __slots__ = ("rr", "tokens", "fill_target")

    def __init__(self, rr: RadixRequest, tokens: list[int], fill_target: int) -> None:
        self.rr = rr
        self.tokens = tokens
        # Tokens the request had when admitted: until they are computed, a
        # step is a prefill (or chunk) of it, and the tree takes it in after.
        self.fill_target = fill_target


class RadixKVManager:
    """The radix strategy of the KV manager (see the module docstring)."""

    # vLLM hashes full blocks when they are scheduled (A4); the radix tree
    # takes tokens in after the step (G3), through ``cache_after_step``.
    caches_at_schedule_time = False
    aligns_chunks = False                   # align_chunk is the identity (one group)
    enable_caching = True

    def __init__(self, num_gpu_blocks: int, block_size: int, *, max_model_len: int,
                 page_size: int = 1, eviction_policy: str = "lru", split_prompt: bool = False,
                 debug: bool = False) -> None:
        if page_size not in (1, block_size):
            raise ValueError(f"radix page_size must be 1 or the block size ({block_size}), got {page_size}")
        self.engine_block_size = block_size
        self.page_size = self.block_size = page_size
        self.max_model_len = max_model_len
        self.debug = debug
        size = (num_gpu_blocks - 1) * block_size
        self.pool = RadixKVPool(size, page_size, eviction_policy=eviction_policy,
                                split_prompt=split_prompt)
        self.tree, self.allocator = self.pool.tree, self.pool.allocator
        self._num_pages = size // page_size
        self._held: dict[str, _Held] = {}
        self._looked_up: tuple[str, list[int]] | None = None   # the last waiting request's ids

    # -------------------------------------------------------------- queries

    @property
    def num_usable_blocks(self) -> int:
        return self._num_pages

    def get_num_free_blocks(self) -> int:
        """Free pages plus the pages of unlocked tree nodes (SGLang ``available_and_evictable``)."""
        return (self.allocator.available_size() + self.tree.evictable_size()) // self.page_size

    @property
    def usage(self) -> float:
        return 1.0 - self.get_num_free_blocks() / self._num_pages

    def get_blocks(self, request_id: str) -> list[int]:
        """The request's row of slots, one per token with KV (tests, debugging)."""
        held = self._held.get(request_id)
        return list(held.rr.kv_indices) if held else []

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-min(num_tokens, self.max_model_len) // self.page_size)

    def get_computed_blocks(self, req) -> tuple[RadixHit, int]:
        """Longest cached prefix of ``req``'s first ``num_tokens - 1`` tokens (G2); read-only."""
        key = self._token_ids(req)[:req.num_tokens - 1]
        num_tokens, unlocked = self.tree.peek_prefix(key)
        if not num_tokens:
            return NO_HIT, 0
        ps = self.page_size
        return RadixHit(num_tokens, num_tokens // ps, unlocked // ps), num_tokens

    def num_cached_prefix_blocks(self, block_hashes: Sequence[int]) -> int:
        raise ValueError("engine.prefix_cache: radix keys its tree by token ids, not by block "
                         "hashes: prefix-aware routing over radix replicas is not supported yet")

    def num_blocks_to_allocate(self, req, num_tokens: int, new_computed_blocks=(),
                               full_sequence: bool = False) -> int:
        """Pages an allocation for ``num_tokens`` slots would take from the free ones (A2)."""
        required = self.num_blocks_for(num_tokens)
        held = self._held.get(req.request_id)
        if held is not None:
            # A request that holds slots gets no new hits (as in vLLM).
            return max(required - -(-len(held.rr.kv_indices) // self.page_size), 0)
        hit = new_computed_blocks or NO_HIT
        return max(required - hit.num_pages, 0) + hit.num_unlocked_pages

    def has_evictable_hits(self, hits) -> bool:
        return bool(hits) and hits.num_unlocked_pages > 0

    def first_step_caching(self, reqs, num_computed, block_hash, max_steps) -> None:
        """Nothing enters the tree during decode steps (G3)."""
        return None

    # One full-attention group: the hybrid manager's hooks (kv/hybrid.py) are no-ops.
    def close(self) -> None:
        self.tree.close()

    def new_step_starts(self) -> None:
        pass

    def align_chunk(self, req, num_new_tokens: int, num_new_computed_tokens: int = 0) -> int:
        return num_new_tokens

    def decode_run_head_limit(self, head, reqs, max_steps: int) -> None:
        return None

    # ------------------------------------------------------------ mutations

    def allocate_slots(self, req, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks=(), num_lookahead_tokens: int = 0,
                       num_external_computed_tokens: int = 0,
                       delay_cache_blocks: bool = False) -> list[int] | None:
        """Slots for ``num_new_tokens`` more tokens of ``req``, or None (nothing changed).

        Returns the slots of the new tokens. KV from a connector
        (``num_external_computed_tokens``, sched/connector.py) is not supported
        yet: the tree would have to take in tokens whose KV arrives later.
        """
        if num_external_computed_tokens or delay_cache_blocks:
            raise ValueError("engine.prefix_cache: radix does not take KV from a KV connector yet")
        held = self._held.get(req.request_id)
        if (held is not None and num_new_tokens == 1 and not num_lookahead_tokens
                and req.num_computed_tokens >= held.fill_target):
            return self._decode_one(held.rr.kv_indices)
        if num_new_tokens <= 0:
            raise ValueError("num_new_tokens must be > 0")
        if num_lookahead_tokens:
            raise ValueError("the radix cache has no lookahead slots (speculative decoding)")
        need = req.num_computed_tokens + num_new_computed_tokens + num_new_tokens
        if self.num_blocks_to_allocate(req, need, new_computed_blocks) > self.get_num_free_blocks():
            return None
        if held is None:
            out = self._admit(req, num_new_tokens, num_new_computed_tokens)
        elif req.num_computed_tokens < held.fill_target:
            # The next chunk of a chunked prefill: the lock moved with the last insertion.
            out = self.pool.admit([held.rr], [num_new_tokens])
        else:
            out = self._decode(held, num_new_tokens)
        if out is None:
            raise AssertionError("radix allocation failed after its feasibility check")
        if self.debug:
            self.check()
        return out

    def cache_blocks(self, req, num_computed_tokens: int) -> None:
        raise ValueError("engine.prefix_cache: radix does not take KV from a KV connector yet")

    def cache_after_step(self, scheduled) -> None:
        """After the forward pass: insert what each prefill or chunk computed (G3).

        ``scheduled`` holds the step's (request, tokens, computed before). A
        request still in its prefill that did not finish in this step gets
        SGLang's ``cache_unfinished_req``: ``fill_ids`` (its tokens up to the
        chunk's end) go into the tree, its own slots for tokens already there
        are freed, and its lock moves to the new last node. Finished requests
        are inserted by ``free``; decode steps insert nothing.
        """
        held_of = self._held
        for req, _, before in scheduled:
            held = held_of.get(req.request_id)
            if held is None or before >= held.fill_target or req.num_tokens >= req.final_num_tokens:
                continue
            self.pool.cache_prefill(held.rr)
        if self.debug:
            self.check()

    def free(self, req, finished: bool = False) -> None:
        """A finished request is inserted, deduplicated and unlocked (``cache_finished_req``);
        a preempted one frees the slots the tree does not own and unlocks (``retract_decode``).
        (``finished``: the scheduler's word, as to ``KVCacheManager.free``; the tree reads
        the request's own state.)"""
        held = self._held.pop(req.request_id, None)
        if held is None:
            return
        rr = held.rr
        if req.num_tokens >= req.final_num_tokens:
            rr.output_ids = held.tokens[req.prompt_len:req.num_tokens]
            self.pool.finish(rr)
        else:
            self.pool.retract(rr)
        if self.debug:
            self.check()

    # ------------------------------------------------------- decode runs

    def decode_run_first_allocations(self, reqs: Sequence, num_computed: Sequence[int]) -> list[int] | None:
        """Step s of a run writes token c + s - 1: a new page when it starts one."""
        ps = self.page_size
        out = []
        for r, c in zip(reqs, num_computed):
            held = self._held[r.request_id]
            if c < held.fill_target or len(held.rr.kv_indices) != c:
                return None
            out.append((-c) % ps + 1)
        return out

    # The same arithmetic as the hash strategy's, in pages (it reads only ``block_size``).
    nth_decode_run_allocation = KVCacheManager.nth_decode_run_allocation
    allocate_decode_step = allocate_decode_step_by_run

    def allocate_decode_steps(self, reqs: Sequence, num_computed: Sequence[int],
                              first_allocations: Sequence[int], first_step: int,
                              last_step: int) -> list[int]:
        """Steps ``first_step..last_step`` of a decode run: what ``allocate_slots(req, 1)``
        does for each request in each step, in that order; returns the free pages after
        each step. Pages are taken in pop order by ``_take_pages``, the step path's function."""
        ps = self.page_size
        num_seqs = len(reqs)
        keys = []
        for i, s0 in enumerate(first_allocations):
            s = s0 if s0 >= first_step else s0 + -(-(first_step - s0) // ps) * ps
            keys.extend(range(s * num_seqs + i, last_step * num_seqs + num_seqs, ps * num_seqs))
        keys.sort()
        free = self.get_num_free_blocks()
        bases = self._take_pages(len(keys))
        new_pages: list[list[int]] = [[] for _ in reqs]
        taken = [0] * (last_step - first_step + 1)
        for key, base in zip(keys, bases):
            new_pages[key % num_seqs].append(base)
            taken[key // num_seqs - first_step] += 1
        for i, r in enumerate(reqs):
            self._append_slots(self._held[r.request_id].rr.kv_indices,
                               num_computed[i] + first_step - 1, num_computed[i] + last_step,
                               iter(new_pages[i]))
        if self.debug:
            self.check()
        out = []
        for k in taken:
            free -= k
            out.append(free)
        return out

    # -------------------------------------------------------------- checks

    def check(self) -> None:
        """Slots are conserved (free + tree + requests' own = all) and the sizes add up."""
        self.pool.check([held.rr.kv_indices for held in self._held.values()], self._num_pages)

    # -------------------------------------------------------------- private

    def _token_ids(self, req) -> list[int]:
        held = self._held.get(req.request_id)
        if held is not None:
            return held.tokens
        looked = self._looked_up
        if looked is not None and looked[0] == req.request_id:
            return looked[1]
        ids = req.all_token_ids
        if ids is None:
            raise ValueError(f"request {req.request_id}: the radix cache needs its token ids "
                             f"(build the Request with keep_tokens=True)")
        tokens = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        self._looked_up = (req.request_id, tokens)
        return tokens

    def _admit(self, req, num_new_tokens: int, num_hit: int) -> list[int] | None:
        """SGLang's admission of one request: match (split, stamps), lock, allocate."""
        tokens = self._token_ids(req)
        rr = RadixRequest(req.request_id, tokens[:req.prompt_len],
                          tokens[req.prompt_len:req.num_tokens])
        if num_hit:
            if self.pool.match(rr) != num_hit:
                raise AssertionError(f"request {req.request_id}: the tree changed between its "
                                     f"lookup ({num_hit} tokens) and its allocation")
        else:
            # No hit offered: nothing is matched (vLLM allocates without one).
            rr.fill_ids = tokens[:req.num_tokens]
            rr.last_node = self.tree.root_node
        out = self.pool.admit([rr], [num_new_tokens])
        if out is not None:
            self._held[req.request_id] = _Held(rr, tokens, req.num_tokens)
            if self._looked_up is not None and self._looked_up[0] == req.request_id:
                self._looked_up = None
        return out

    def _decode_one(self, kv: list[int]) -> list[int] | None:
        """One decode token: the slot after the last one, or a new page (``_take_pages``)."""
        ps = self.page_size
        if ps != 1 and len(kv) % ps:
            slot = kv[-1] + 1                # the request's own, partly used last page
        elif self.allocator.available_size() or self.tree.evictable_size():
            slot = self._take_pages(1)[0]
        else:
            return None
        kv.append(slot)
        if self.debug:
            self.check()
        return [slot]

    def _decode(self, held: _Held, num_new_tokens: int) -> list[int]:
        kv = held.rr.kv_indices
        start = len(kv)
        ps = self.page_size
        num_pages = -(-(start + num_new_tokens) // ps) - -(-start // ps)
        bases = self._take_pages(num_pages)
        self._append_slots(kv, start, start + num_new_tokens, iter(bases))
        return kv[start:]

    def _take_pages(self, count: int) -> list[int]:
        """``count`` pages for decode tokens, as one decode allocation at a time
        takes them: when no page is free, evict one page's worth of tokens first
        (``check_decode_mem``; ``alloc_paged_token_slots_decode``). Returns each
        page's first slot."""
        alloc, ps = self.allocator, self.page_size
        out: list[int] = []
        while count:
            free = alloc.available_size() // ps
            if not free:
                self.tree.evict(ps)
                free = alloc.available_size() // ps
                if not free:
                    raise AssertionError("radix decode allocation: nothing free, nothing evictable")
            take = min(count, free)
            slots = alloc.alloc(take * ps)
            out += slots if ps == 1 else slots[::ps]
            count -= take
        return out

    def _append_slots(self, kv: list[int], start: int, end: int, new_pages) -> None:
        """Slots of tokens ``start..end-1`` into the row ``kv``: a token that starts
        a page gets the next new page, the others the slot after their predecessor."""
        if len(kv) != start:
            raise AssertionError(f"radix row holds {len(kv)} slots, expected {start}")
        ps = self.page_size
        if ps == 1:
            kv.extend(new_pages)
            return
        t = start
        while t < end:
            offset = t % ps
            base = next(new_pages) if offset == 0 else kv[-1] + 1
            k = min(ps - offset, end - t)
            kv.extend(range(base, base + k))
            t += k
