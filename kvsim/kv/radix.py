"""SGLang's radix prefix cache (RadixAttention), rule for rule.

A transcription of SGLang 0.4.6.post5 ``python/sglang/srt/mem_cache/radix_cache.py``
(``rc:N`` below is a line of that file), with the 0.5.x eviction strategies
(``mem_cache/evict_policy.py``) and the 0.5.x prompt-boundary split as options.
kv-semantics.md section 9 (G1-G5) states the rules; TV15 is its test vector.

The tree maps token runs to KV slot indices (``value``), token-granular when
``page_size`` is 1 (G1)::

    root  (key [], lock_ref 1: never evicted)
     '-- [1,2,3]        value [1,2,3]    lock_ref 1  <- B holds it (inc_lock_ref)
          |-- [4,5,6,60] value [4,5,6,7]  lock_ref 0  <- an evictable leaf
          '-- [9,9]      value [8,9]      lock_ref 0

* Children are keyed by their first token (first page when paged); the dict
  keeps insertion order, and a split puts the new node in its child's place.
  That order decides which of two leaves with the same ``last_access_time``
  is evicted first (see ``evict``).
* ``match_prefix`` splits the node where the match ends inside it (G2), so
  the matched part is always a path of whole nodes; ``last_access_time`` is
  refreshed along the path.
* ``evictable_size`` counts tokens in nodes no running request locks,
  ``protected_size`` the locked ones (G4). Eviction frees *whole* unlocked
  leaves, oldest first, and may free more than asked (G5).

Time: SGLang stamps nodes with ``time.monotonic()``. kvsim injects ``clock``
and calls it at exactly the places SGLang calls ``time.monotonic()``; the
default is a counter (each call a new, larger value), which orders accesses
as the real clock does without reading the wall clock.

The eviction loops (LRU and 0.5.x's strategies) are in ``radix_evict.py``.
Slot allocation (the free-slot list, G1) and the request lifecycle around
the tree (admission, decode slots, retraction) are in ``radix_pool.py``; this
module only needs an ``allocator`` with ``free(slots)``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

from kvsim.kv.radix_evict import EVICTION_POLICIES, evict_by_priority, evict_lru



class TreeNode:
    """One node: a token run (``key``) and the KV slots that hold it (``value``)."""

    __slots__ = ("children", "parent", "key", "value", "lock_ref",
                 "last_access_time", "creation_time", "hit_count")

    def __init__(self, now: float) -> None:
        self.children: dict = {}
        self.parent: TreeNode | None = None
        self.key: list[int] = []
        self.value: list[int] = []
        self.lock_ref = 0
        self.last_access_time = now            # rc:54
        self.creation_time = now               # 0.5.x FIFO/FILO strategies
        self.hit_count = 0                     # 0.5.x LFU strategy

    def __lt__(self, other: TreeNode) -> bool:
        # rc:73: the heap of leaves compares nodes by last access only.
        return self.last_access_time < other.last_access_time

    def __repr__(self) -> str:
        return f"TreeNode(key={self.key[:8]}{'...' if len(self.key) > 8 else ''}, lock_ref={self.lock_ref})"


def _match_len(key0: Sequence[int], key1: Sequence[int]) -> int:
    """Common prefix length, token by token (rc:77 ``_key_match_page_size1``).

    Compares whole slices first: the result is the same as SGLang's
    token loop, without a Python step per matching token.
    """
    n = min(len(key0), len(key1))
    if key0[:n] == key1[:n]:
        return n
    lo, hi = 0, n                     # key0[:lo] == key1[:lo], key0[:hi] != key1[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if key0[lo:mid] == key1[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _match_len_paged(key0: Sequence[int], key1: Sequence[int], page_size: int) -> int:
    """Common prefix length in whole pages (rc:86 ``_key_match_paged``)."""
    return _match_len(key0, key1) // page_size * page_size if min(len(key0), len(key1)) else 0


class RadixCache:
    """SGLang's ``RadixCache``: match, insert, lock, evict (G2-G5).

    ``allocator`` receives ``free(slots)`` for every slot the tree gives back
    (evicted leaves, duplicate slots of an insertion). ``split_prompt``
    reproduces SGLang 0.5.x's extra insertion of the prompt at a request's
    finish, which puts a node boundary between prompt and output so that the
    output is evicted first (``mem_cache/radix_cache.py`` ``_insert_cache``).
    """

    def __init__(self, allocator, page_size: int = 1, *, clock: Callable[[], float] | None = None,
                 disable: bool = False, eviction_policy: str = "lru",
                 split_prompt: bool = False) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if eviction_policy not in EVICTION_POLICIES:
            raise ValueError(f"eviction_policy: {eviction_policy!r} is not one of "
                             f"{', '.join(EVICTION_POLICIES)}")
        self.allocator = allocator
        self.page_size = page_size
        self.disable = disable
        self.eviction_policy = eviction_policy
        self.split_prompt = split_prompt
        self.clock = clock if clock is not None else itertools.count(1).__next__
        self.reset()

    # ------------------------------------------------------------ public API

    def reset(self) -> None:
        """An empty tree (rc:129)."""
        self.root_node = TreeNode(self.clock())
        self.root_node.lock_ref = 1            # the root is never evicted (G4)
        self.evictable_size_ = 0
        self.protected_size_ = 0

    def close(self) -> None:
        """The run is over: unlink every node from its parent. Parent and child
        links make the tree one big reference cycle, which only the collector
        could free; without the parent links it goes with its last reference.
        Lookups from the root still work; nothing may be inserted or evicted."""
        stack = [self.root_node]
        while stack:
            node = stack.pop()
            node.parent = None
            stack.extend(node.children.values())

    def child_key(self, key: Sequence[int]):
        """The dict key of a child: first token, or first page as a tuple (rc:119-124)."""
        return key[0] if self.page_size == 1 else tuple(key[:self.page_size])

    def match_prefix(self, key: Sequence[int]) -> tuple[list[int], TreeNode]:
        """Slots of the longest cached prefix of ``key``, and its last node (rc:138, G2).

        Not read-only: a match that ends inside a node splits it, and every
        node on the path gets a new ``last_access_time``. Paged: ``key`` is
        first cut to whole pages.
        """
        if self.disable or len(key) == 0:
            return [], self.root_node
        if self.page_size != 1:
            key = key[:len(key) // self.page_size * self.page_size]
        values, last_node = self._match_prefix_helper(self.root_node, key)
        return [slot for v in values for slot in v], last_node

    def peek_prefix(self, key: Sequence[int]) -> tuple[int, int]:
        """(tokens ``match_prefix(key)`` would return, how many of them no lock holds).

        Read-only: no split, no new ``last_access_time`` (kvsim's addition, for
        a lookup that must not count as an access; see kv/radix_manager.py).
        """
        if self.disable or len(key) == 0:
            return 0, 0
        if self.page_size != 1:
            key = key[:len(key) // self.page_size * self.page_size]
        node = self.root_node
        matched = unlocked = 0
        while len(key) > 0:
            child = node.children.get(self.child_key(key))
            if child is None:
                break
            prefix_len = self._key_match(child.key, key)
            matched += prefix_len
            if child.lock_ref == 0:
                unlocked += prefix_len
            if prefix_len < len(child.key):
                break
            node = child
            key = key[prefix_len:]
        return matched, unlocked

    def insert(self, key: Sequence[int], value: Sequence[int] | None = None,
               inserted_len: int = 0) -> int:
        """Insert ``key`` -> ``value``; return how many leading tokens were already there (rc:170).

        The tree keeps ``value[prefix_len:]`` for the new tokens; the caller
        frees its own slots for the first ``prefix_len`` tokens beyond what it
        matched (the dedup of G3). ``inserted_len`` is SGLang 0.5.x's
        ``cache_inserted_len`` (tokens this request inserted before): only
        nodes past it count a hit for LFU.
        """
        if self.disable:
            return 0
        if value is None:
            value = list(key)
        if self.page_size != 1:
            # Whole pages only (0.5.x insert: key.page_aligned; 0.4.6's callers cut first).
            aligned = len(key) // self.page_size * self.page_size
            key, value = key[:aligned], value[:aligned]
        return self._insert_helper(self.root_node, list(key), list(value), inserted_len)

    def cache_finished_req(self, req) -> None:
        """Insert a finished request's KV, free its duplicates, unlock (rc:178, G3).

        The key is ``(prompt + output)[:-1]``: the last sampled token never
        had its KV computed. Paged: the partial last page is freed, not cached.
        """
        if self.disable:
            self.allocator.free(req.kv_indices[:len(req.origin_input_ids) + len(req.output_ids) - 1])
            req.kv_indices = []
            return
        token_ids = (req.origin_input_ids + req.output_ids)[:-1]
        kv_indices = req.kv_indices[:len(token_ids)]
        aligned = len(kv_indices) // self.page_size * self.page_size
        if self.page_size != 1:
            self.allocator.free(kv_indices[aligned:])
        new_prefix_len = self.insert(token_ids[:aligned], kv_indices[:aligned],
                                     req.cache_inserted_len)
        self.allocator.free(kv_indices[len(req.prefix_indices):new_prefix_len])
        self._maybe_split_prompt(req, token_ids, kv_indices, aligned)
        req.cache_inserted_len = max(req.cache_inserted_len, aligned)
        req.kv_indices = []                     # rc:210: the request's row is released
        self.dec_lock_ref(req.last_node)

    def cache_unfinished_req(self, req) -> None:
        """Insert a running request's ``fill_ids`` and re-point it at the tree (rc:213, G3).

        Runs after a prefill chunk or a whole prefill. The request's slots for
        tokens the tree already had are freed and replaced by the tree's;
        the lock moves from the old last node to the new one.
        """
        if self.disable:
            return
        token_ids = req.fill_ids
        kv_indices = req.kv_indices[:len(token_ids)]
        aligned = len(kv_indices) // self.page_size * self.page_size
        aligned_tokens = token_ids[:aligned]
        new_prefix_len = self.insert(aligned_tokens, kv_indices[:aligned], req.cache_inserted_len)
        self.allocator.free(kv_indices[len(req.prefix_indices):new_prefix_len])
        self._maybe_split_prompt(req, token_ids, kv_indices, aligned)
        req.cache_inserted_len = max(req.cache_inserted_len, aligned)

        new_indices, new_last_node = self.match_prefix(aligned_tokens)
        # rc:239 rewrites the row from len(prefix_indices); paged, that leaves
        # the tokens of the request's own partial page pointing at a page the
        # free above just returned (when another request inserted them
        # meanwhile). 0.5.x (checkpoint) rewrites from the tree-owned,
        # page-aligned length: the same pages are freed, no stale slot is kept.
        start = len(req.prefix_indices) // self.page_size * self.page_size
        req.kv_indices[start:len(new_indices)] = new_indices[start:]
        self.dec_lock_ref(req.last_node)
        self.inc_lock_ref(new_last_node)
        if self.page_size != 1:
            # rc:249: the partial page stays the request's own, after the tree's pages.
            req.prefix_indices = new_indices + kv_indices[len(new_indices):]
        else:
            req.prefix_indices = new_indices
        req.last_node = new_last_node

    def evict(self, num_tokens: int) -> int:
        """Free whole unlocked leaves, least recently used first, until ``num_tokens`` (rc:263, G5).

        Leaves are collected depth-first (``collect_leaves``) and heapified;
        a parent left childless joins the heap. Ties in ``last_access_time``
        are broken by the heap's positions, i.e. by that collection order,
        exactly as ``heapq`` does in SGLang. May free more than asked: a leaf
        goes whole. Returns the tokens freed.
        """
        if self.disable:
            return 0
        if self.eviction_policy == "lru":
            return evict_lru(self, num_tokens)
        return evict_by_priority(self, num_tokens)

    def inc_lock_ref(self, node: TreeNode) -> int:
        """Lock the path from ``node`` to the root: protected from eviction (rc:288, G4)."""
        if self.disable:
            return 0
        delta = 0
        while node is not self.root_node:
            if node.lock_ref == 0:
                self.evictable_size_ -= len(node.value)
                self.protected_size_ += len(node.value)
                delta -= len(node.value)
            node.lock_ref += 1
            node = node.parent
        return delta

    def dec_lock_ref(self, node: TreeNode) -> int:
        """Undo one ``inc_lock_ref`` on the path from ``node`` (rc:302, G4)."""
        if self.disable:
            return 0
        delta = 0
        while node is not self.root_node:
            if node.lock_ref == 1:
                self.evictable_size_ += len(node.value)
                self.protected_size_ -= len(node.value)
                delta += len(node.value)
            node.lock_ref -= 1
            node = node.parent
        return delta

    def evictable_size(self) -> int:
        return self.evictable_size_

    def protected_size(self) -> int:
        """Tokens locked by running requests (rc:319)."""
        return self.protected_size_

    def total_size(self) -> int:
        """Tokens in the tree (rc:438)."""
        total = 0
        stack = [self.root_node]
        while stack:
            node = stack.pop()
            total += len(node.value)
            stack.extend(node.children.values())
        return total

    def snapshot(self, node: TreeNode | None = None) -> list:
        """The tree as nested lists ``[key, value, lock_ref, [children in dict order]]``."""
        node = self.root_node if node is None else node
        return [list(node.key), list(node.value), node.lock_ref,
                [self.snapshot(c) for c in node.children.values()]]

    # ------------------------------------------------------------- private

    def _match_prefix_helper(self, node: TreeNode, key: Sequence[int]):
        """rc:336."""
        node.last_access_time = self.clock()
        values: list[list[int]] = []
        if len(key) == 0:
            return values, node
        child_key = self.child_key(key)
        while len(key) > 0 and child_key in node.children:
            child = node.children[child_key]
            child.last_access_time = self.clock()
            prefix_len = self._key_match(child.key, key)
            if prefix_len < len(child.key):
                new_node = self._split_node(child, prefix_len)
                values.append(new_node.value)
                node = new_node
                break
            values.append(child.value)
            node = child
            key = key[prefix_len:]
            if len(key):
                child_key = self.child_key(key)
        return values, node

    def _split_node(self, child: TreeNode, split_len: int) -> TreeNode:
        """Cut ``child`` after ``split_len`` tokens: parent -> new_node -> child (rc:361)."""
        new_node = TreeNode(self.clock())
        new_node.children = {self.child_key(child.key[split_len:]): child}
        new_node.parent = child.parent
        new_node.lock_ref = child.lock_ref
        new_node.hit_count = child.hit_count    # 0.5.x
        new_node.key = child.key[:split_len]
        new_node.value = child.value[:split_len]
        child.parent = new_node
        child.key = child.key[split_len:]
        child.value = child.value[split_len:]
        # The new node takes the child's place in the parent's dict (same key).
        new_node.parent.children[self.child_key(new_node.key)] = new_node
        return new_node

    def _insert_helper(self, node: TreeNode, key: list[int], value: list[int],
                       inserted_len: int) -> int:
        """rc:380; the hit counting is 0.5.x's (``radix_cache.py`` ``_insert_helper``)."""
        node.last_access_time = self.clock()
        if len(key) == 0:
            return 0
        child_key = self.child_key(key)
        total_prefix_length = 0
        while len(key) > 0 and child_key in node.children:
            node = node.children[child_key]
            node.last_access_time = self.clock()
            prefix_len = self._key_match(node.key, key)
            total_prefix_length += prefix_len
            key = key[prefix_len:]
            value = value[prefix_len:]
            if prefix_len < len(node.key):
                node = self._split_node(node, prefix_len)
            if total_prefix_length > inserted_len:
                node.hit_count += 1
            if len(key):
                child_key = self.child_key(key)
        if len(key):
            new_node = TreeNode(self.clock())
            new_node.parent = node
            new_node.key = key
            new_node.value = value
            if total_prefix_length + len(key) > inserted_len:
                new_node.hit_count += 1
            node.children[child_key] = new_node
            self.evictable_size_ += len(value)
        return total_prefix_length

    def _key_match(self, key0: Sequence[int], key1: Sequence[int]) -> int:
        if self.page_size == 1:
            return _match_len(key0, key1)
        return _match_len_paged(key0, key1, self.page_size)

    def _maybe_split_prompt(self, req, token_ids, kv_indices, aligned: int) -> None:
        """0.5.x: insert the prompt alone too, so a node ends at the prompt boundary."""
        if not self.split_prompt:
            return
        prompt_len = len(req.origin_input_ids) // self.page_size * self.page_size
        if 0 < prompt_len < aligned:
            self.insert(token_ids[:prompt_len], kv_indices[:prompt_len], prompt_len)
