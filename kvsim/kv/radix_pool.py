"""SGLang's KV slot allocators and the request lifecycle around the radix tree.

Sources (SGLang 0.4.6.post5):

* ``mem_cache/memory_pool.py`` ``TokenToKVPoolAllocator`` (page size 1, G1):
  slots ``1..size`` (slot 0 is the padding slot); ``alloc(n)`` takes the
  first n free slots, ``free`` appends;
* ``mem_cache/paged_allocator.py`` ``PagedTokenToKVPoolAllocator``: pages
  ``1..size//page_size``; ``free`` puts the freed pages, sorted and
  de-duplicated (``torch.unique``), in *front* of the free pages, so they are
  reused first; ``alloc_extend`` / ``alloc_decode`` (Triton kernels there)
  first fill a request's partly used last page, then take new pages;
* ``managers/schedule_batch.py``: ``Req.init_next_round_input`` /
  ``adjust_max_prefix_ids`` (the lookup of ``fill_ids[:-1]``),
  ``alloc_token_slots`` and ``alloc_paged_token_slots_*`` (evict first when
  short), ``check_decode_mem``, ``retract_decode``'s freeing;
  ``managers/schedule_policy.py`` ``PrefillAdder.add_one_req`` (the lock taken
  at admission, the chunk cut ``fill_ids[:prefix + chunk]``).

Scheduling policy (budgets, which request is retracted) is not here: a
scheduler decides, ``RadixKVPool`` does the memory side, as
``ScheduleBatch`` does for SGLang's ``Scheduler``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from kvsim.kv.radix import RadixCache, TreeNode


class TokenSlotAllocator:
    """``TokenToKVPoolAllocator``: one slot per token, FIFO reuse (G1)."""

    page_size = 1

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1 token slot, got {size}")
        self.size = size
        self.clear()

    def clear(self) -> None:
        # memory_pool.py:231: slot 0 is kept for padded tokens' dummy writes.
        self._slots = list(range(1, self.size + 1))
        self._head = 0                  # _slots[:_head] already handed out
        self._group: list[int] | None = None

    def available_size(self) -> int:
        return len(self._slots) - self._head

    def free_slots(self) -> list[int]:
        return self._slots[self._head:]

    def alloc(self, need_size: int) -> list[int] | None:
        """The first ``need_size`` free slots, or None (nothing changes)."""
        if need_size > self.available_size():
            return None
        out = self._slots[self._head:self._head + need_size]
        self._head += need_size
        if self._head > 4096 and self._head * 2 > len(self._slots):
            del self._slots[:self._head]           # keep the list from growing forever
            self._head = 0
        return out

    def free(self, slots) -> None:
        """Append to the free list (or hold until ``free_group_end``)."""
        if not len(slots):
            return
        if self._group is not None:
            self._group.extend(slots)
        else:
            self._slots.extend(slots)

    def free_group_begin(self) -> None:
        self._group = []

    def free_group_end(self) -> None:
        group, self._group = self._group, None
        if group:
            self.free(group)


class PagedSlotAllocator:
    """``PagedTokenToKVPoolAllocator``: whole pages, freed pages reused first."""

    def __init__(self, size: int, page_size: int) -> None:
        if page_size < 2:
            raise ValueError(f"page_size must be >= 2 (use TokenSlotAllocator for 1), got {page_size}")
        if size < page_size:
            raise ValueError(f"size must hold at least one page of {page_size} tokens, got {size}")
        self.size = size
        self.page_size = page_size
        self.num_pages = size // page_size
        self.clear()

    def clear(self) -> None:
        self._pages: deque[int] = deque(range(1, self.num_pages + 1))   # page 0: padding
        self._group: list[int] | None = None

    def available_size(self) -> int:
        return len(self._pages) * self.page_size

    def free_pages(self) -> list[int]:
        return list(self._pages)

    def alloc(self, need_size: int) -> list[int] | None:
        """``need_size // page_size`` whole pages, as token slots (paged_allocator.py:196)."""
        num_pages = need_size // self.page_size
        if num_pages > len(self._pages):
            return None
        ps = self.page_size
        return [p * ps + i for p in self._take(num_pages) for i in range(ps)]

    def alloc_extend(self, prefix_lens, seq_lens, last_locs) -> list[int] | None:
        """Slots for tokens ``prefix_len..seq_len`` of each request, in batch order.

        ``alloc_extend_kernel``: a request first fills its partly used last
        page (after ``last_loc``), then takes its new pages from the free
        pages in order (requests earlier in the batch first).
        """
        ps = self.page_size
        need = sum(-(-s // ps) - -(-p // ps) for p, s in zip(prefix_lens, seq_lens))
        if need > len(self._pages):
            return None
        pages = iter(self._take(need))
        out: list[int] = []
        for pre, seq, last in zip(prefix_lens, seq_lens, last_locs):
            part1 = min(seq, -(-pre // ps) * ps) - pre
            out.extend(range(last + 1, last + 1 + part1))
            pos = pre + part1
            while pos < seq:
                page = next(pages)
                n = min(ps, seq - pos)
                out.extend(range(page * ps, page * ps + n))
                pos += n
        return out

    def alloc_decode(self, seq_lens, last_locs) -> list[int] | None:
        """One slot per request for token ``seq_len - 1`` (``alloc_decode_kernel``)."""
        ps = self.page_size
        need = sum(1 for s in seq_lens if (s - 1) % ps == 0)
        if need > len(self._pages):
            return None
        pages = iter(self._take(need))
        return [next(pages) * ps if (s - 1) % ps == 0 else last + 1
                for s, last in zip(seq_lens, last_locs)]

    def free(self, slots) -> None:
        """Prepend the pages of ``slots``, sorted, each once (paged_allocator.py:288)."""
        if not len(slots):
            return
        if self._group is not None:
            self._group.extend(slots)
            return
        pages = sorted({s // self.page_size for s in slots})
        self._pages.extendleft(reversed(pages))

    def free_group_begin(self) -> None:
        self._group = []

    def free_group_end(self) -> None:
        group, self._group = self._group, None
        if group:
            self.free(group)

    def _take(self, n: int) -> list[int]:
        pages = self._pages
        return [pages.popleft() for _ in range(n)]


@dataclass(eq=False)
class RadixRequest:
    """The fields of SGLang's ``Req`` that the radix cache reads and writes.

    ``kv_indices`` is the request's row of ``req_to_token``: the slot of each
    token position that has KV. ``prefix_indices`` are the slots the tree
    gave it (the matched prefix, then what it inserted); ``last_node`` the
    node its lock hangs on.
    """

    rid: str
    origin_input_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    fill_ids: list[int] = field(default_factory=list)
    kv_indices: list[int] = field(default_factory=list)
    prefix_indices: list[int] = field(default_factory=list)
    last_node: TreeNode | None = None
    holds_lock: bool = False             # a lock on last_node's path is this request's
    cache_inserted_len: int = 0          # 0.5.x, for LFU hit counting

    @property
    def seqlen(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    @property
    def extend_input_len(self) -> int:
        return len(self.fill_ids) - len(self.prefix_indices)


class RadixKVPool:
    """Tree + slot allocator + the memory steps of SGLang's ``ScheduleBatch``.

    One ``RadixKVPool`` per engine. The methods are the memory side of one
    request's life: ``match`` (on every scheduling round while it waits),
    ``admit`` (lock + slots for its prefill or chunk), ``cache_prefill``
    after the forward pass, ``alloc_decode`` per decode step, then
    ``finish`` or ``retract``.
    """

    def __init__(self, size: int, page_size: int = 1, *, clock=None, disable: bool = False,
                 eviction_policy: str = "lru", split_prompt: bool = False) -> None:
        self.allocator = TokenSlotAllocator(size) if page_size == 1 else PagedSlotAllocator(size, page_size)
        self.page_size = page_size
        self.tree = RadixCache(self.allocator, page_size, clock=clock, disable=disable,
                               eviction_policy=eviction_policy, split_prompt=split_prompt)

    # ------------------------------------------------------------ queries

    def available_size(self) -> int:
        """Free slots (not counting what eviction could free)."""
        return self.allocator.available_size()

    def available_and_evictable(self) -> int:
        """What SGLang's admission checks compare against (G6): free + evictable."""
        return self.allocator.available_size() + self.tree.evictable_size()

    # ---------------------------------------------------------- lifecycle

    def match(self, req: RadixRequest) -> int:
        """Look up ``fill_ids[:-1]`` (``init_next_round_input``); return the hit in tokens.

        At least one token is always computed, so a hit is at most
        ``len - 1`` (G2). Splits and access times change; nothing is locked.
        """
        req.fill_ids = req.origin_input_ids + req.output_ids
        max_prefix_len = max(len(req.fill_ids) - 1, 0)          # adjust_max_prefix_ids
        req.prefix_indices, req.last_node = self.tree.match_prefix(req.fill_ids[:max_prefix_len])
        return len(req.prefix_indices)

    def admit(self, reqs: list[RadixRequest], chunk_sizes: list[int | None] | None = None) -> list[int] | None:
        """Lock each request's prefix and allocate the slots of one prefill batch.

        ``chunk_sizes[i]`` cuts request i to ``fill_ids[:prefix + chunk]``
        (``PrefillAdder``, chunked prefill). A request not yet holding a lock
        locks its matched prefix first (the scheduler's admission took it; a
        chunked request's next chunk already holds one), then ``alloc_token_slots`` evicts when
        the free slots are short and allocates for the whole batch at once
        (``prepare_for_extend``). Returns the new slots in batch order, or
        None when they do not fit even after eviction; then the requests
        are as before (locks and ``fill_ids``), though what eviction freed stays freed (as in SGLang, where
        the scheduler checked ``available_and_evictable`` beforehand).
        """
        chunk_sizes = chunk_sizes or [None] * len(reqs)
        newly_locked = []
        old_fill = [req.fill_ids for req in reqs]
        for req, chunk in zip(reqs, chunk_sizes):
            if req.holds_lock:
                # The chunked request's next chunk: its lock moved with its last
                # insertion; fill_ids is rebuilt (init_next_round_input, no lookup).
                req.fill_ids = req.origin_input_ids + req.output_ids
            else:
                self.tree.inc_lock_ref(req.last_node)
                req.holds_lock = True
                newly_locked.append(req)
            if chunk is not None:
                req.fill_ids = req.fill_ids[:len(req.prefix_indices) + chunk]
        prefix_lens = [len(r.prefix_indices) for r in reqs]
        seq_lens = [len(r.fill_ids) for r in reqs]
        if self.page_size == 1:
            out = self._alloc_token_slots(sum(seq_lens) - sum(prefix_lens))
        else:
            last_locs = [r.prefix_indices[-1] if r.prefix_indices else -1 for r in reqs]
            out = self._alloc_paged_extend(prefix_lens, seq_lens, last_locs)
        if out is None:
            for req in newly_locked:
                self.tree.dec_lock_ref(req.last_node)
                req.holds_lock = False
            for req, fill in zip(reqs, old_fill):
                req.fill_ids = fill
            return None
        pos = 0
        for req, pre, seq in zip(reqs, prefix_lens, seq_lens):
            req.kv_indices = list(req.prefix_indices) + out[pos:pos + seq - pre]
            pos += seq - pre
        return out

    def cache_prefill(self, req: RadixRequest) -> None:
        """After a prefill chunk or a whole prefill that did not finish the request (G3)."""
        self.tree.cache_unfinished_req(req)

    def check_decode_mem(self, reqs: list[RadixRequest]) -> bool:
        """Room for one decode step of ``reqs``, evicting if needed (``check_decode_mem``)."""
        ps = self.page_size
        needed = len(reqs) if ps == 1 else sum(1 for r in reqs if r.seqlen % ps == 0) * ps
        if self.allocator.available_size() >= needed:
            return True
        self.tree.evict(needed)
        return self.allocator.available_size() >= needed

    def alloc_decode(self, reqs: list[RadixRequest]) -> list[int] | None:
        """One slot per request for its last token (``prepare_for_decode``)."""
        if self.page_size == 1:
            out = self._alloc_token_slots(len(reqs))
        else:
            seq_lens = [r.seqlen for r in reqs]
            ps = self.page_size
            if self.allocator.available_size() < len(reqs) * ps:
                self.tree.evict(len(reqs) * ps)
            out = self.allocator.alloc_decode(seq_lens, [r.kv_indices[-1] for r in reqs])
        if out is None:
            return None
        for req, slot in zip(reqs, out):
            req.kv_indices.append(slot)
        return out

    def finish(self, req: RadixRequest) -> None:
        """``cache_finished_req``: insert ``(prompt + output)[:-1]``, free duplicates, unlock."""
        self.tree.cache_finished_req(req)
        req.holds_lock = False

    def free_group_begin(self) -> None:
        """Hold frees until ``free_group_end`` (SGLang does so around a decode step's outputs)."""
        self.allocator.free_group_begin()

    def free_group_end(self) -> None:
        self.allocator.free_group_end()

    def retract(self, req: RadixRequest) -> None:
        """Free the slots the tree does not own and drop the lock (``retract_decode``).

        The request keeps its outputs and goes back to waiting; its next
        ``match`` finds what the tree kept of it.
        """
        start = len(req.prefix_indices) // self.page_size * self.page_size
        self.allocator.free(req.kv_indices[start:])
        self.tree.dec_lock_ref(req.last_node)
        req.holds_lock = False
        req.kv_indices = []
        req.prefix_indices = []
        req.last_node = None

    def check(self, rows, num_pages: int) -> None:
        """Slots are conserved given the requests' ``rows``: free + tree + the
        requests' own = all ``num_pages`` pages; the tree's sizes add up."""
        tree, ps = self.tree, self.page_size
        in_tree = []
        stack = [tree.root_node]
        while stack:
            node = stack.pop()
            in_tree += node.value
            stack.extend(node.children.values())
        tree_set = set(in_tree)
        own = {s for row in rows for s in row if s not in tree_set}
        free = self.allocator.available_size()
        used = (len(in_tree) + len(own) if ps == 1 else
                (len({s // ps for s in tree_set}) + len({s // ps for s in own})) * ps)
        if len(tree_set) != len(in_tree) or free + used != num_pages * ps:
            raise AssertionError(f"radix slots not conserved: free {free} + used {used} "
                                 f"!= {num_pages * ps}")
        if tree.evictable_size() + tree.protected_size() != len(in_tree):
            raise AssertionError("radix evictable + protected != tokens in the tree")

    # ------------------------------------------------------------ private

    def _alloc_token_slots(self, num_tokens: int) -> list[int] | None:
        """``alloc_token_slots``: evict ``num_tokens`` (not the shortfall) when short."""
        if self.allocator.available_size() < num_tokens:
            self.tree.evict(num_tokens)
        return self.allocator.alloc(num_tokens)

    def _alloc_paged_extend(self, prefix_lens, seq_lens, last_locs) -> list[int] | None:
        """``alloc_paged_token_slots_extend``: evict extend + one page per request when short."""
        extend = sum(seq_lens) - sum(prefix_lens)
        want = extend + len(seq_lens) * self.page_size
        if self.allocator.available_size() < want:
            self.tree.evict(want)
        return self.allocator.alloc_extend(prefix_lens, seq_lens, last_locs)
