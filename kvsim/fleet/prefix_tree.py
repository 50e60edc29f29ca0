"""SGLang router's approximate prefix tree, over KV blocks instead of characters.

sgl-router (``sgl-router/src/tree.rs``) keeps one radix tree shared by all
workers ("tenants"): every request's text is inserted under the worker it was
sent to, each node remembers when each tenant last used it, and a background
thread evicts least-recently-used leaves of a tenant until the tenant's size
is at most ``max_tree_size``. The router never asks a worker what it has
cached: the tree is what it *routed*, an approximation of the workers' caches.

kvsim keeps the same tree with one change of unit: a key is a KV block (the
chained hash of the prompt up to that block, ``kvsim.kv.hashing``) instead of
a character, so sizes and matches count blocks. A node holds a run of keys
(radix compression, as SGLang's node text)::

    root ── [h0 h1 h2] {A: t5, B: t9} ──┬── [h3 h4] {A: t5}
                                        └── [g3]    {B: t9}

``prefix_match`` walks from the root as far as the request's keys match and
returns the matched length and a tenant of the deepest node reached (SGLang
takes the first key of a hash map there, an order it does not define; kvsim
takes the lowest index), refreshing that tenant's times on the path.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


class _Node:
    __slots__ = ("keys", "parent", "children", "tenants", "seq")

    def __init__(self, keys: list[int], parent: _Node | None, seq: int) -> None:
        self.keys = keys                          # a run of block keys (SGLang: node text)
        self.parent = parent
        self.children: dict[int, _Node] = {}      # by the child's first key
        self.tenants: dict[int, float] = {}       # tenant -> last access time
        self.seq = seq                            # creation order (eviction tie-break)


def _shared(keys: list[int], hashes: Sequence[int], start: int) -> int:
    """How many of ``keys`` equal ``hashes[start:]`` from the front."""
    n = min(len(keys), len(hashes) - start)
    k = 0
    while k < n and keys[k] == hashes[start + k]:
        k += 1
    return k


class ApproxPrefixTree:
    """The multi-tenant radix tree of ``sgl-router/src/tree.rs`` (tenants are replica indices)."""

    def __init__(self, num_tenants: int) -> None:
        self.root = _Node([], None, 0)
        self._seq = 1
        self.size = [0] * num_tenants             # blocks per tenant (SGLang: tenant_char_count)
        for t in range(num_tenants):              # CacheAwarePolicy::init_workers inserts "" per worker
            self.root.tenants[t] = 0.0

    def _new(self, keys: list[int], parent: _Node) -> _Node:
        node = _Node(keys, parent, self._seq)
        self._seq += 1
        return node

    # ------------------------------------------------------------------ public

    def insert(self, hashes: Sequence[int], tenant: int, now: float) -> None:
        """Record that ``tenant`` now holds the prefix ``hashes`` (Tree::insert)."""
        node = self.root
        node.tenants[tenant] = now
        i, n = 0, len(hashes)
        while i < n:
            child = node.children.get(hashes[i])
            if child is None:
                new = self._new(list(hashes[i:]), node)
                new.tenants[tenant] = now
                node.children[hashes[i]] = new
                self.size[tenant] += n - i
                return
            k = _shared(child.keys, hashes, i)
            if k < len(child.keys):
                # Split: [curr] -> [child] becomes [curr] -> [mid] -> [child's rest];
                # mid keeps every tenant of child (their sizes do not change).
                mid = self._new(child.keys[:k], node)
                mid.tenants = dict(child.tenants)
                node.children[hashes[i]] = mid
                child.keys = child.keys[k:]
                child.parent = mid
                mid.children[child.keys[0]] = child
                child = mid
            if tenant not in child.tenants:
                self.size[tenant] += len(child.keys)
            child.tenants[tenant] = now
            node = child
            i += k

    def prefix_match(self, hashes: Sequence[int], now: float) -> tuple[int, int | None]:
        """(matched blocks, tenant of the deepest node reached) (Tree::prefix_match)."""
        node, i, n = self.root, 0, len(hashes)
        while i < n:
            child = node.children.get(hashes[i])
            if child is None:
                break
            k = _shared(child.keys, hashes, i)
            i += k
            node = child
            if k < len(child.keys):
                break                             # a partial match ends in this node
        if node is self.root:
            return 0, None
        tenant = min(node.tenants)
        while node is not None:                   # refresh the tenant's path to the root
            node.tenants[tenant] = now
            node = node.parent
        return i, tenant

    def smallest_tenant(self) -> int:
        """The tenant holding the fewest blocks, lowest index first (Tree::get_smallest_tenant)."""
        return min(range(len(self.size)), key=lambda t: (self.size[t], t))

    def evict(self, max_size: int) -> None:
        """Drop least-recently-used leaves of every tenant above ``max_size`` blocks.

        Tree::evict_tenant_by_size: a heap of (last access, tenant, node) over
        the nodes that are a leaf *for that tenant*; pop the oldest, remove the
        tenant from it, and push its parent when that becomes the tenant's
        leaf. Ties in time go to the lower tenant, then the older node.
        """
        heap = []
        stack = [self.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if node is not self.root:
                for t in self._leaf_tenants(node):
                    heap.append((node.tenants[t], t, node.seq, node))
        heapq.heapify(heap)
        while heap:
            _, t, _, node = heapq.heappop(heap)
            if self.size[t] <= max_size or t not in node.tenants:
                continue
            del node.tenants[t]
            self.size[t] -= len(node.keys)
            parent = node.parent
            if not node.tenants and not node.children:
                del parent.children[node.keys[0]]
            if parent is not self.root and t in parent.tenants and t in self._leaf_tenants(parent):
                heapq.heappush(heap, (parent.tenants[t], t, parent.seq, parent))

    def num_nodes(self) -> int:
        count, stack = 0, [self.root]
        while stack:
            node = stack.pop()
            count += 1
            stack.extend(node.children.values())
        return count - 1

    # ----------------------------------------------------------------- private

    @staticmethod
    def _leaf_tenants(node: _Node) -> list[int]:
        """Tenants of ``node`` that no child of it holds (Tree::leaf_of)."""
        below: set[int] = set()
        for child in node.children.values():
            below.update(child.tenants)
        return [t for t in node.tenants if t not in below]
