"""Operation scripts for the radix-cache differential test, and kvsim's replay of them.

A script is what ``driver.py`` runs on SGLang's code: the memory side of
requests arriving, being admitted (whole or in chunks), decoding, finishing,
being retracted, plus bare evictions. ``make_script`` builds a random but
valid script by running it on kvsim while it chooses (so SGLang must agree
with kvsim on every outcome, admission failures included); ``replay`` runs a
script on kvsim and returns the same snapshots as the driver.
"""

from __future__ import annotations

import copy

from kvsim.kv.radix import RadixCache
from kvsim.kv.radix_pool import RadixKVPool, RadixRequest

# A few shared stems so that prompts match, split nodes and duplicate each other.
STEMS = ([1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 9, 9, 9], [20, 21, 22, 23], [1, 2], [])


class Kvsim:
    """kvsim's side of the operations (the names of driver.py's ``op_*``)."""

    def __init__(self, case: dict) -> None:
        self.now = 0.0
        self.mode = case.get("clock", "counter")
        self.page_size = case.get("page_size", 1)
        self.pool = RadixKVPool(case["size"], self.page_size, clock=self._clock)
        self.reqs: dict[str, RadixRequest] = {}

    def _clock(self) -> float:
        if self.mode == "counter":
            self.now += 1
        return self.now

    def apply(self, o: dict):
        return getattr(self, "op_" + o["op"])(o)

    def op_new(self, o):
        self.reqs[o["rid"]] = RadixRequest(o["rid"], list(o["prompt"]))

    def op_match(self, o):
        return self.pool.match(self.reqs[o["rid"]])

    def op_admit(self, o):
        return self.pool.admit([self.reqs[r] for r in o["rids"]], o.get("chunks"))

    def op_output(self, o):
        self.reqs[o["rid"]].output_ids.append(o["token"])

    def op_cache(self, o):
        self.pool.cache_prefill(self.reqs[o["rid"]])

    def op_check_decode_mem(self, o):
        return self.pool.check_decode_mem([self.reqs[r] for r in o["rids"]])

    def op_decode(self, o):
        reqs = [self.reqs[r] for r in o["rids"]]
        out = self.pool.alloc_decode(reqs)
        if out is not None:
            for r, t in zip(reqs, o["tokens"]):
                r.output_ids.append(t)
        return out

    def op_finish(self, o):
        self.pool.finish(self.reqs[o["rid"]])

    def op_retract(self, o):
        self.pool.retract(self.reqs[o["rid"]])

    def op_evict(self, o):
        before = self.pool.available_size()
        self.pool.tree.evict(o["n"])
        return self.pool.available_size() - before

    def op_tick(self, o):
        self.now += 1

    def op_free_group_begin(self, o):
        self.pool.free_group_begin()

    def op_free_group_end(self, o):
        self.pool.free_group_end()

    def snapshot(self, result) -> dict:
        tree = self.pool.tree

        def node(n):
            return [list(n.key), list(n.value), n.lock_ref, float(n.last_access_time),
                    [node(c) for c in n.children.values()]]
        alloc = self.pool.allocator
        free = alloc.free_slots() if self.page_size == 1 else alloc.free_pages()
        return {"r": result, "tree": node(tree.root_node), "ev": tree.evictable_size(),
                "pr": tree.protected_size(), "free": list(free)}


def replay(case: dict) -> list[dict]:
    world = Kvsim(case)
    return [world.snapshot(world.apply(o)) for o in case["ops"]]


def make_script(choose, *, size: int, page_size: int = 1, clock: str = "counter",
                num_ops: int = 40) -> dict:
    """A valid script of about ``num_ops`` operations; ``choose(n)`` returns an int in [0, n)."""
    case = {"size": size, "page_size": page_size, "clock": clock, "ops": []}
    world = Kvsim(case)
    ops = case["ops"]
    waiting: list[str] = []
    chunked: list[str] = []        # mid-prefill: cache, then the next chunk
    running: list[str] = []
    token = [100]
    count = [0]

    def do(o):
        ops.append(o)
        return world.apply(o)

    def would_fail(o) -> bool:
        # A paged allocation that does not fit makes SGLang's Triton kernel read
        # past the free pages (SGLang's scheduler never lets it happen): leave it out.
        return page_size > 1 and copy.deepcopy(world).apply(o) is None

    def fresh():
        token[0] += 1
        return token[0]

    def prefill_done(rid):
        do({"op": "output", "rid": rid, "token": fresh()})
        if choose(4) == 0:
            do({"op": "finish", "rid": rid})
        else:
            do({"op": "cache", "rid": rid})
            running.append(rid)

    while len(ops) < num_ops:
        kind = choose(10)
        if kind <= 1 or not (waiting or chunked or running):
            count[0] += 1
            rid = f"r{count[0]}"
            stem = STEMS[choose(len(STEMS))]
            prompt = stem[:choose(len(stem) + 1)] + [30 + choose(6) for _ in range(1 + choose(6))]
            do({"op": "new", "rid": rid, "prompt": prompt})
            waiting.append(rid)
        elif kind <= 4 and (waiting or chunked):
            batch = []
            if chunked and choose(2):
                batch.append(chunked.pop(0))
                do({"op": "cache", "rid": batch[0]})
            for rid in list(waiting)[:1 + choose(2)]:
                do({"op": "match", "rid": rid})
                batch.append(rid)
            if not batch:
                continue
            req = world.reqs
            rest = {r: len(req[r].origin_input_ids) + len(req[r].output_ids)
                    - len(req[r].prefix_indices) for r in batch}
            chunks = [None] * len(batch)
            if choose(3) == 0 and rest[batch[-1]] > 1:
                chunks[-1] = 1 + choose(rest[batch[-1]] - 1)       # a chunk short of the end
            if batch[0] in world.reqs and world.reqs[batch[0]].holds_lock and rest[batch[0]] > 1 and choose(2):
                chunks[0] = 1 + choose(rest[batch[0]] - 1)
            o = {"op": "admit", "rids": batch, "chunks": chunks}
            out = None if would_fail(o) else do(o)
            if out is None:
                for rid in batch:
                    if world.reqs[rid].holds_lock:
                        chunked.insert(0, rid)          # a chunked request keeps its lock
                    elif rid not in waiting:
                        waiting.insert(0, rid)
                continue
            for rid, chunk in zip(batch, chunks):
                if rid in waiting:
                    waiting.remove(rid)
                r = world.reqs[rid]
                if chunk is not None and len(r.fill_ids) < r.seqlen:
                    chunked.append(rid)
                else:
                    prefill_done(rid)
        elif kind <= 7 and running:
            batch = running[:1 + choose(len(running))]
            if do({"op": "check_decode_mem", "rids": batch}):
                group = page_size > 1 and choose(2)
                if group:
                    do({"op": "free_group_begin"})
                o = {"op": "decode", "rids": batch, "tokens": [fresh() for _ in batch]}
                out = None if would_fail(o) else do(o)
                if out is not None:
                    for rid in batch:
                        if choose(3) == 0:
                            do({"op": "finish", "rid": rid})
                            running.remove(rid)
                if group:
                    do({"op": "free_group_end"})
            else:
                rid = batch[choose(len(batch))]
                do({"op": "retract", "rid": rid})
                running.remove(rid)
                waiting.append(rid)
        elif kind == 8:
            do({"op": "evict", "n": choose(2 * page_size + 8)})
        elif clock == "step":
            do({"op": "tick"})
    return case


# ------------------------------------------------ tree-level scripts (SGLang 0.5.x)


class KvsimTree:
    """kvsim's ``RadixCache`` on the tree-level operations of driver.py's ``TreeWorld``."""

    def __init__(self, case: dict) -> None:
        self.now = 0
        self.freed: list[int] = []
        world = self

        class Allocator:
            def free(self, slots):
                world.freed += list(slots)
        self.tree = RadixCache(Allocator(), case.get("page_size", 1), clock=self._clock,
                               eviction_policy=case.get("policy", "lru"))
        self.handles: dict = {}

    def _clock(self) -> int:
        self.now += 1
        return self.now

    def apply(self, o: dict):
        return getattr(self, "op_" + o["op"])(o)

    def op_insert(self, o):
        return self.tree.insert(o["key"], o["value"], o.get("inserted_len", 0))

    def op_match(self, o):
        value, node = self.tree.match_prefix(o["key"])
        if "h" in o:
            self.handles[o["h"]] = node
        return len(value)

    def op_lock(self, o):
        self.tree.inc_lock_ref(self.handles[o["h"]])

    def op_unlock(self, o):
        self.tree.dec_lock_ref(self.handles[o["h"]])

    def op_evict(self, o):
        return self.tree.evict(o["n"])

    def snapshot(self, result) -> dict:
        def node(n):
            return [list(n.key), list(n.value), n.lock_ref, n.hit_count,
                    [node(c) for c in n.children.values()]]
        t = self.tree
        return {"r": result, "tree": node(t.root_node), "ev": t.evictable_size(),
                "pr": t.protected_size(), "freed": list(self.freed)}


def replay_tree(case: dict) -> list[dict]:
    world = KvsimTree(case)
    return [world.snapshot(world.apply(o)) for o in case["ops"]]


def make_tree_script(choose, *, page_size: int = 1, policy: str = "lru", num_ops: int = 40) -> dict:
    """Inserts (with fresh slots), matches that lock and later unlock, evictions."""
    case = {"page_size": page_size, "policy": policy, "ops": []}
    world = KvsimTree(case)
    slot = [1]
    locked: list[str] = []
    count = 0
    while len(case["ops"]) < num_ops:
        kind = choose(8)
        stem = STEMS[choose(len(STEMS))]
        key = stem[:choose(len(stem) + 1)] + [30 + choose(5) for _ in range(choose(6))]
        if kind <= 2 and key:
            value = list(range(slot[0], slot[0] + len(key)))
            slot[0] += len(key)
            o = {"op": "insert", "key": key, "value": value, "inserted_len": choose(3) * choose(len(key) + 1)}
        elif kind <= 4 and key:
            count += 1
            h = f"h{count}"
            case["ops"].append({"op": "match", "key": key, "h": h})
            world.apply(case["ops"][-1])
            o = {"op": "lock", "h": h}
            locked.append(h)
        elif kind == 5 and locked:
            o = {"op": "unlock", "h": locked.pop(choose(len(locked)))}
        elif kind == 6:
            o = {"op": "match", "key": key}
        else:
            o = {"op": "evict", "n": choose(12)}
        case["ops"].append(o)
        world.apply(o)
    return case
