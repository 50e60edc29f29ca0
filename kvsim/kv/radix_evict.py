"""Eviction from the radix tree: SGLang 0.4.6's LRU loop and 0.5.x's strategies.

``evict_lru`` is ``RadixCache.evict`` of SGLang 0.4.6.post5
(``mem_cache/radix_cache.py`` lines 263-286), line for line: a heap of
leaves ordered by ``TreeNode.__lt__`` (last access). ``evict_by_priority``
is 0.5.x's ``evict`` with an ``EvictionStrategy`` (``mem_cache/evict_policy.py``):
a heap of ``(priority, node)`` over the unlocked leaves, one sort key per
policy, smallest evicted first. Both free whole leaves until at least
``num_tokens`` are freed (kv-semantics G5) and push a parent that becomes a
childless, unlocked leaf.

Heap order: leaves are collected depth-first, last child first
(``collect_leaves``, 0.4.6's ``_collect_leaves``), then heapified;
with equal keys the heap's positions decide, as in SGLang 0.4.6. (0.5.x
collects from a ``set``, whose order kvsim cannot reproduce; with kvsim's
default clock no two leaves share a stamp.)
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvsim.kv.radix import RadixCache, TreeNode

#: SGLang 0.5.x ``--radix-eviction-policy`` values kvsim honours; 0.4.6 has LRU only.
EVICTION_POLICIES = ("lru", "lfu", "fifo", "mru", "filo")

# evict_policy.py: LFUStrategy, FIFOStrategy, MRUStrategy, FILOStrategy.
PRIORITY: dict[str, Callable[[TreeNode], object]] = {
    "lfu": lambda n: (n.hit_count, n.last_access_time),
    "fifo": lambda n: n.creation_time,
    "mru": lambda n: -n.last_access_time,
    "filo": lambda n: -n.creation_time,
}


def collect_leaves(tree: RadixCache) -> list[TreeNode]:
    """Depth-first, last child first (rc:450): the heap's initial order."""
    leaves = []
    stack = [tree.root_node]
    while stack:
        node = stack.pop()
        if len(node.children) == 0:
            leaves.append(node)
        else:
            stack.extend(node.children.values())
    return leaves


def delete_leaf(tree: RadixCache, node: TreeNode) -> None:
    """rc:431: unlink an evicted leaf (its slots are already freed)."""
    del node.parent.children[tree.child_key(node.key)]
    tree.evictable_size_ -= len(node.key)


def evict_lru(tree: RadixCache, num_tokens: int) -> int:
    """0.4.6 ``evict``: returns the tokens freed."""
    leaves = collect_leaves(tree)
    heapq.heapify(leaves)
    num_evicted = 0
    while num_evicted < num_tokens and len(leaves):
        x = heapq.heappop(leaves)
        if x is tree.root_node:
            break
        if x.lock_ref > 0:
            continue
        tree.allocator.free(x.value)
        num_evicted += len(x.value)
        delete_leaf(tree, x)
        if len(x.parent.children) == 0:
            heapq.heappush(leaves, x.parent)
    return num_evicted


def evict_by_priority(tree: RadixCache, num_tokens: int) -> int:
    """0.5.x ``evict`` under ``tree.eviction_policy``: returns the tokens freed."""
    key = PRIORITY[tree.eviction_policy]
    heap = [(key(n), n) for n in collect_leaves(tree)
            if n is not tree.root_node and n.lock_ref == 0]
    heapq.heapify(heap)
    num_evicted = 0
    while num_evicted < num_tokens and heap:
        _, x = heapq.heappop(heap)
        tree.allocator.free(x.value)
        num_evicted += len(x.value)
        delete_leaf(tree, x)
        parent = x.parent
        if len(parent.children) == 0 and parent.lock_ref == 0 and parent is not tree.root_node:
            heapq.heappush(heap, (key(parent), parent))
    return num_evicted
