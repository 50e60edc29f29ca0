"""Run vLLM's own ``CPUOffloadingManager`` (LRU policy) on an operation script.

The vLLM side of tests/test_offload_vllm.py. Run it with an interpreter that
has vLLM (0.33) installed; it needs no GPU (the scheduler-side manager is
plain Python):

    /path/to/vllm-python driver.py < cases.json > out.json

Input: ``{"cases": [{"num_chunks": 4, "ops": [...]}]}``; output: one list of
snapshots per case. Keys are small integers, packed with
``make_offload_key``; positions are set on each request's ``ReqContext`` as
the OffloadingConnector's scheduler does (``update_offload_keys``).
"""

from __future__ import annotations

import json
import sys

from vllm.v1.kv_offload.base import ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager


def key(i: int) -> bytes:
    return make_offload_key(i.to_bytes(8, "big"), 0)


def unkey(k: bytes) -> int:
    return int.from_bytes(k[:8], "big")


class World:
    def __init__(self, case):
        self.m = CPUOffloadingManager(num_chunks=case["num_chunks"], cache_policy="lru")
        self.reqs: dict[str, ReqContext] = {}

    def ctx(self, o):
        rid = o["rid"]
        if rid not in self.reqs:
            self.reqs[rid] = ReqContext(rid)
            self.m.on_new_request(self.reqs[rid])
        c = self.reqs[rid]
        for k, p in zip(o.get("keys", ()), o.get("pos", ())):
            c.set_offload_key_position(key(k), p)
        return c

    def op_store(self, o):
        out = self.m.prepare_store([key(k) for k in o["keys"]], self.ctx(o))
        if out is None:
            return None
        return {"stored": [unkey(k) for k in out.keys_to_store],
                "evicted": [unkey(k) for k in out.evicted_keys]}

    def op_complete(self, o):
        self.m.complete_store([key(k) for k in o["keys"]], self.ctx(o), success=o["ok"])

    def op_load(self, o):
        self.m.prepare_load([key(k) for k in o["keys"]], self.ctx(o))

    def op_complete_load(self, o):
        self.m.complete_load([key(k) for k in o["keys"]], self.ctx(o))

    def op_touch(self, o):
        self.m.touch([key(k) for k in o["keys"]], self.ctx(o))

    def op_finish(self, o):
        self.m.on_request_finished(self.ctx(o))

    def op_lookup(self, o):
        c = self.ctx(o)
        names = {"HIT": "hit", "HIT_PENDING": "pending", "MISS": "miss", "RETRY": "retry"}
        return [names[self.m.lookup(key(k), c).name] for k in o["keys"]]

    def snapshot(self, result):
        policy = self.m._policy
        chunks = {unkey(k): c.ref_cnt for k, c in policy.chunks.items()}
        evictable = sorted(policy._evictable, key=policy._ranks.__getitem__)
        ranks = {unkey(k): list(r) for k, r in policy._ranks.items()}
        return {"r": result, "chunks": {str(k): v for k, v in sorted(chunks.items())},
                "lru": [unkey(k) for k in evictable],
                "ranks": {str(k): v for k, v in sorted(ranks.items())}}


def run_case(case):
    w = World(case)
    return [w.snapshot(getattr(w, "op_" + o["op"])(o)) for o in case["ops"]]


def main():
    if "--lines" in sys.argv:
        for line in sys.stdin:
            print(json.dumps(run_case(json.loads(line))), flush=True)
        return
    json.dump([run_case(c) for c in json.load(sys.stdin)["cases"]], sys.stdout)


if __name__ == "__main__":
    main()
