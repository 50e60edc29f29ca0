"""Operation scripts for the offload-tier differential test, and kvsim's replay of them.

``make_script`` builds a random valid script on kvsim's ``OffloadTier`` while
choosing (so vLLM must agree with kvsim on every outcome); ``replay`` runs a
script on kvsim and returns the driver's snapshots.
"""

from __future__ import annotations

from kvsim.kv.offload import HIT, OffloadTier, TierSpec

CHUNK_BYTES = 1000
STEMS = ([1, 2, 3, 4, 5, 6], [1, 2, 7, 8], [9, 10, 11])


class Kvsim:
    def __init__(self, case):
        self.t = OffloadTier(TierSpec("cpu", "cpu", case["num_chunks"] * CHUNK_BYTES, 25.0),
                             CHUNK_BYTES)

    def apply(self, o):
        return getattr(self, "op_" + o["op"])(o)

    def op_store(self, o):
        out = self.t.prepare_store(o["keys"], o["rid"], o["pos"])
        return None if out is None else {"stored": list(out.stored), "evicted": list(out.evicted)}

    def op_complete(self, o):
        self.t.complete_store(o["keys"], o["ok"])

    def op_load(self, o):
        self.t.prepare_load(o["keys"], o["rid"], o["pos"])

    def op_complete_load(self, o):
        self.t.complete_load(o["keys"])

    def op_touch(self, o):
        self.t.touch(o["keys"])

    def op_finish(self, o):
        self.t.request_finished(o["rid"])

    def op_lookup(self, o):
        return [self.t.lookup(k) for k in o["keys"]]

    def snapshot(self, result):
        t = self.t
        return {"r": result, "chunks": {str(k): t.state(k) for k in sorted(t._ref)},
                "lru": t.lru_order(),
                "ranks": {str(k): list(t.rank(k)) for k in sorted(t._rank)}}


def replay(case):
    w = Kvsim(case)
    return [w.snapshot(w.apply(o)) for o in case["ops"]]


def make_script(choose, *, num_chunks: int, num_ops: int = 50) -> dict:
    case = {"num_chunks": num_chunks, "ops": []}
    world = Kvsim(case)
    live: dict[str, list[int]] = {}
    pending: list[list[int]] = []
    loading: list[list[int]] = []
    count = 0

    def do(o):
        case["ops"].append(o)
        return world.apply(o)

    while len(case["ops"]) < num_ops:
        kind = choose(9)
        if kind == 0 or not live:
            count += 1
            stem = STEMS[choose(len(STEMS))]
            live[f"r{count}"] = stem[:choose(len(stem) + 1)] + [100 * count + j for j in range(1 + choose(4))]
            continue
        rid = sorted(live)[choose(len(live))]
        keys = live[rid]
        pos = [16 * (i + 1) for i in range(len(keys))]
        if kind <= 2:
            a = choose(len(keys))
            b = a + 1 + choose(len(keys) - a)
            out = do({"op": "store", "rid": rid, "keys": keys[a:b], "pos": pos[a:b]})
            if out and out["stored"]:
                pending.append(out["stored"])
        elif kind == 3 and pending:
            do({"op": "complete", "rid": rid, "keys": pending.pop(choose(len(pending))),
                "ok": choose(5) > 0})
        elif kind == 4:
            states = do({"op": "lookup", "rid": rid, "keys": keys})
            n = 0
            while n < len(states) and states[n] == HIT:
                n += 1
            if n:
                do({"op": "load", "rid": rid, "keys": keys[:n], "pos": pos[:n]})
                loading.append(keys[:n])
        elif kind == 5 and loading:
            do({"op": "complete_load", "rid": rid, "keys": loading.pop(choose(len(loading)))})
        elif kind == 6:
            a = choose(len(keys))
            do({"op": "touch", "rid": rid, "keys": keys[a:]})
        elif kind == 7:
            do({"op": "finish", "rid": rid})
            del live[rid]
    return case
