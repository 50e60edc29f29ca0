"""Run SGLang's own radix cache and slot allocators on an operation script.

This is the SGLang side of the differential test (tests/test_radix_sglang.py).
It needs an interpreter with torch (and triton, for the paged allocator's
kernels, run in interpreter mode) and SGLang's source, which is *not* part of
kvsim: point ``--src`` at the wheel (``pip download sglang==0.4.6.post5
--no-deps``) or at a folder holding ``sglang/``. SGLang's own modules are
loaded from there; every other ``sglang.*`` import they make is stubbed.

    python driver.py --src sglang-0.4.6.post5-py3-none-any.whl < cases.json > out.json

Input: ``{"cases": [{"size": 16, "page_size": 1, "clock": "counter", "ops": [...]}]}``.
Output: one list per case, one snapshot per operation (see ``snapshot``).
The operations mirror ``kvsim.kv.radix_pool.RadixKVPool``'s methods; the
glue around the tree is ``ScheduleBatch``'s memory steps, written again here
(ScheduleBatch itself needs a GPU model runner), so the code under test is
SGLang's ``RadixCache``, ``TokenToKVPoolAllocator`` and
``PagedTokenToKVPoolAllocator`` themselves.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.util
import json
import os
import sys
import types
import zipfile
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")       # the paged kernels, on CPU

REAL_046 = ("sglang.srt.mem_cache.base_prefix_cache", "sglang.srt.mem_cache.radix_cache",
            "sglang.srt.mem_cache.memory_pool", "sglang.srt.mem_cache.paged_allocator")
# 0.5.x: the tree, its parameter types and eviction strategies; the rest is stubbed.
REAL_05 = ("sglang.srt.mem_cache.base_prefix_cache", "sglang.srt.mem_cache.radix_cache",
           "sglang.srt.mem_cache.evict_policy", "sglang.srt.mem_cache.cache_init_params")
REAL = REAL_046


class _Anything:
    """A stand-in for any name SGLang imports but the radix cache never uses."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return self

    def __getattr__(self, name):
        return _Anything()

    def __bool__(self):
        return False


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (_Anything,), {})


def _utils_stub() -> types.ModuleType:
    m = types.ModuleType("sglang.srt.utils")
    m.debug_timing = lambda f: f
    m.get_compiler_backend = lambda: "inductor"
    m.is_cuda = lambda: False
    m.next_power_of_2 = lambda n: 1 if n == 0 else 1 << (n - 1).bit_length()
    m.get_bool_env_var = lambda name, default="false": os.environ.get(name, default).lower() in ("true", "1")
    return m


def _mem_cache_utils_stub() -> types.ModuleType:
    """0.5.x ``mem_cache/utils.py`` imports CUDA kernels; the tree needs two of its functions."""
    m = types.ModuleType("sglang.srt.mem_cache.utils")

    def get_eviction_strategy(policy, config=None):
        ep = importlib.import_module("sglang.srt.mem_cache.evict_policy")
        return {"lru": ep.LRUStrategy, "lfu": ep.LFUStrategy, "fifo": ep.FIFOStrategy,
                "mru": ep.MRUStrategy, "filo": ep.FILOStrategy}[policy]()
    m.get_eviction_strategy = get_eviction_strategy
    m.split_node_hash_value = lambda hash_value, split_len, page_size: (None, None)
    return m


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, src: Path):
        self.src = src
        self.zip = zipfile.ZipFile(src) if src.is_file() else None

    def has(self, name: str) -> bool:
        rel = name.replace(".", "/") + ".py"
        if self.zip is not None:
            return rel in self.zip.namelist()
        return (self.src / rel).exists()

    def _source(self, name: str) -> str:
        rel = name.replace(".", "/") + ".py"
        if self.zip is not None:
            return self.zip.read(rel).decode()
        return (self.src / rel).read_text()

    def find_spec(self, name, path=None, target=None):
        if name == "sglang" or name.startswith("sglang."):
            return importlib.util.spec_from_loader(name, self, is_package=name not in REAL)
        return None

    def create_module(self, spec):
        if spec.name == "sglang.srt.utils" and REAL is REAL_046:
            return _utils_stub()
        if spec.name == "sglang.srt.mem_cache.utils":
            return _mem_cache_utils_stub()
        if spec.name in REAL:
            return None
        m = _StubModule(spec.name)
        m.__path__ = []
        if spec.name == "sglang.srt.utils.common":
            m.ceil_align = lambda x, a: -(-x // a) * a
        return m

    def exec_module(self, module):
        if module.__name__ in REAL:
            code = compile(self._source(module.__name__), module.__name__ + ".py", "exec")
            exec(code, module.__dict__)


class Clock:
    """``time.monotonic`` for SGLang's radix_cache: a counter, or a step number."""

    def __init__(self, mode: str):
        self.mode, self.now = mode, 0

    def monotonic(self):
        if self.mode == "counter":
            self.now += 1
        return float(self.now)

    def perf_counter(self):
        return 0.0                      # 0.5.x times its evictions for metrics only


class ReqToTokenPool:
    """The fields of SGLang's ``ReqToTokenPool`` the radix cache uses (int32 rows, as there)."""

    def __init__(self, torch, size: int, max_len: int):
        self.req_to_token = torch.zeros((size, max_len), dtype=torch.int32)
        self.free_slots = list(range(size))

    def write(self, indices, values):
        self.req_to_token[indices] = values

    def alloc(self, n):
        out, self.free_slots = self.free_slots[:n], self.free_slots[n:]
        return out

    def free(self, idx):
        self.free_slots.append(idx)


class World:
    def __init__(self, modules, torch, case):
        rc, mp, pa = modules
        self.torch = torch
        self.clock = Clock(case.get("clock", "counter"))
        rc.time = self.clock
        size, ps = case["size"], case.get("page_size", 1)
        self.page_size = ps
        if ps == 1:
            self.alloc = mp.TokenToKVPoolAllocator(size, torch.int64, "cpu", None)
        else:
            self.alloc = pa.PagedTokenToKVPoolAllocator(size, ps, torch.int64, "cpu", None)
        self.pool = ReqToTokenPool(torch, 64, 4096)
        self.tree = rc.RadixCache(self.pool, self.alloc, page_size=ps)
        self.reqs = {}

    # ---------------------------------------------------------- operations
    def op_new(self, o):
        self.reqs[o["rid"]] = types.SimpleNamespace(
            rid=o["rid"], origin_input_ids=list(o["prompt"]), output_ids=[], fill_ids=[],
            prefix_indices=self.torch.empty((0,), dtype=self.torch.int64), last_node=None,
            req_pool_idx=None, holds_lock=False)

    def op_match(self, o):
        req = self.reqs[o["rid"]]
        req.fill_ids = req.origin_input_ids + req.output_ids          # init_next_round_input
        max_prefix_len = max(len(req.fill_ids) - 1, 0)              # adjust_max_prefix_ids
        req.prefix_indices, req.last_node = self.tree.match_prefix(
            rid=req.rid, key=req.fill_ids[:max_prefix_len])
        return len(req.prefix_indices)

    def op_admit(self, o):
        torch = self.torch
        reqs = [self.reqs[r] for r in o["rids"]]
        chunks = o.get("chunks") or [None] * len(reqs)
        newly = []
        old_fill = [req.fill_ids for req in reqs]
        for req, chunk in zip(reqs, chunks):
            if req.holds_lock:
                req.fill_ids = req.origin_input_ids + req.output_ids
            else:
                self.tree.inc_lock_ref(req.last_node)                 # PrefillAdder.add_one_req
                req.holds_lock = True
                newly.append(req)
            if chunk is not None:
                req.fill_ids = req.fill_ids[:len(req.prefix_indices) + chunk]
        pre = [len(r.prefix_indices) for r in reqs]
        seq = [len(r.fill_ids) for r in reqs]
        ext = sum(seq) - sum(pre)
        if self.page_size == 1:                                        # alloc_token_slots
            if self.alloc.available_size() < ext:
                self.tree.evict(ext)
            out = self.alloc.alloc(ext)
        else:                                                          # alloc_paged_token_slots_extend
            want = ext + len(reqs) * self.page_size
            if self.alloc.available_size() < want:
                self.tree.evict(want)
            last = [int(r.prefix_indices[-1]) if len(r.prefix_indices) else -1 for r in reqs]
            out = self.alloc.alloc_extend(torch.tensor(pre, dtype=torch.int64),
                                          torch.tensor(seq, dtype=torch.int64),
                                          torch.tensor(last, dtype=torch.int64), ext)
        if out is None:
            for req in newly:
                self.tree.dec_lock_ref(req.last_node)
                req.holds_lock = False
            for req, fill in zip(reqs, old_fill):
                req.fill_ids = fill
            return None
        pos = 0
        for req, p, s in zip(reqs, pre, seq):                          # prepare_for_extend
            if req.req_pool_idx is not None:
                self.pool.free(req.req_pool_idx)
            req.req_pool_idx = self.pool.alloc(1)[0]
            self.pool.write((req.req_pool_idx, slice(0, p)), req.prefix_indices)
            self.pool.write((req.req_pool_idx, slice(p, s)), out[pos:pos + s - p])
            pos += s - p
        return [int(x) for x in out]

    def op_output(self, o):
        self.reqs[o["rid"]].output_ids.append(o["token"])

    def op_cache(self, o):
        self.tree.cache_unfinished_req(self.reqs[o["rid"]])

    def op_check_decode_mem(self, o):
        reqs = [self.reqs[r] for r in o["rids"]]
        ps = self.page_size
        needed = len(reqs) if ps == 1 else sum(1 for r in reqs if (len(r.origin_input_ids) + len(r.output_ids)) % ps == 0) * ps
        if self.alloc.available_size() >= needed:
            return True
        self.tree.evict(needed)
        return self.alloc.available_size() >= needed

    def op_decode(self, o):
        torch = self.torch
        reqs = [self.reqs[r] for r in o["rids"]]
        seqlens = [len(r.origin_input_ids) + len(r.output_ids) for r in reqs]   # after seq_lens + 1
        if self.page_size == 1:
            if self.alloc.available_size() < len(reqs):
                self.tree.evict(len(reqs))
            out = self.alloc.alloc(len(reqs))
        else:
            if self.alloc.available_size() < len(reqs) * self.page_size:
                self.tree.evict(len(reqs) * self.page_size)
            last = [int(self.pool.req_to_token[r.req_pool_idx, s - 2]) for r, s in zip(reqs, seqlens)]
            out = self.alloc.alloc_decode(torch.tensor(seqlens, dtype=torch.int64),
                                          torch.tensor(last, dtype=torch.int64))
        if out is None:
            return None
        for r, s, slot in zip(reqs, seqlens, out):
            self.pool.write((r.req_pool_idx, s - 1), slot)
        for r, t in zip(reqs, o["tokens"]):
            r.output_ids.append(t)
        return [int(x) for x in out]

    def op_finish(self, o):
        req = self.reqs[o["rid"]]
        self.tree.cache_finished_req(req)
        req.holds_lock = False
        req.req_pool_idx = None

    def op_retract(self, o):                                           # retract_decode
        req = self.reqs[o["rid"]]
        seq_len = len(req.origin_input_ids) + len(req.output_ids) - 1
        start = len(req.prefix_indices) // self.page_size * self.page_size
        self.alloc.free(self.pool.req_to_token[req.req_pool_idx, start:seq_len].to(self.torch.int64))
        self.pool.free(req.req_pool_idx)
        self.tree.dec_lock_ref(req.last_node)
        req.prefix_indices = self.torch.empty((0,), dtype=self.torch.int64)
        req.last_node = None
        req.req_pool_idx = None
        req.holds_lock = False

    def op_evict(self, o):
        before = self.alloc.available_size()
        self.tree.evict(o["n"])
        return self.alloc.available_size() - before

    def op_tick(self, o):
        self.clock.now += 1

    def op_free_group_begin(self, o):
        self.alloc.free_group_begin()

    def op_free_group_end(self, o):
        self.alloc.free_group_end()

    # ------------------------------------------------------------ snapshot
    def snapshot(self, result):
        def node(n):
            return [[int(t) for t in n.key], [int(v) for v in n.value], n.lock_ref,
                    n.last_access_time, [node(c) for c in n.children.values()]]
        free = self.alloc.free_slots if self.page_size == 1 else self.alloc.free_pages
        return {"r": result, "tree": node(self.tree.root_node),
                "ev": int(self.tree.evictable_size()), "pr": int(self.tree.protected_size()),
                "free": [int(x) for x in free]}


class TreeWorld:
    """SGLang 0.5.x ``RadixCache.create_simulated``: tree-level operations only."""

    def __init__(self, rc, bp, torch, case):
        self.rc, self.bp, self.torch = rc, bp, torch
        self.clock = Clock("counter")
        rc.time = self.clock
        self.freed: list[int] = []
        world = self

        class Allocator:
            device = "cpu"

            def free_segment(self, idx, start_pos=0):
                world.freed += [int(x) for x in idx]

            free = free_segment
        self.tree = rc.RadixCache.create_simulated(mock_allocator=Allocator(),
                                                    page_size=case.get("page_size", 1))
        self.tree.eviction_policy = case.get("policy", "lru")
        self.tree.eviction_strategy = sys.modules["sglang.srt.mem_cache.utils"].get_eviction_strategy(
            self.tree.eviction_policy)
        self.handles = {}

    def key(self, tokens):
        from array import array
        return self.rc.RadixKey(array("q", tokens))

    def op_insert(self, o):
        r = self.tree.insert(self.bp.InsertParams(
            key=self.key(o["key"]), value=self.torch.tensor(o["value"], dtype=self.torch.int64),
            inserted_len=o.get("inserted_len", 0)))
        return r.prefix_len

    def op_match(self, o):
        r = self.tree.match_prefix(self.bp.MatchPrefixParams(key=self.key(o["key"])))
        if "h" in o:
            self.handles[o["h"]] = r.last_device_node
        return r.device_prefix_len

    def op_lock(self, o):
        self.tree.inc_lock_ref(self.handles[o["h"]])

    def op_unlock(self, o):
        self.tree.dec_lock_ref(self.handles[o["h"]])

    def op_evict(self, o):
        return self.tree.evict(self.bp.EvictParams(num_tokens=o["n"])).num_tokens_evicted

    def snapshot(self, result):
        def node(n):
            return [[int(t) for t in n.key.token_ids], [int(v) for v in n.value], n.lock_ref,
                    n.hit_count, [node(c) for c in n.children.values()]]
        return {"r": result, "tree": node(self.tree.root_node), "ev": int(self.tree.evictable_size()),
                "pr": int(self.tree.protected_size()), "freed": list(self.freed)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", required=True, type=Path)
    ap.add_argument("--lines", action="store_true",
                    help="one case per input line, one result per output line (a long-lived driver)")
    args = ap.parse_args()
    global REAL
    finder = _Finder(args.src)
    if finder.has("sglang.srt.mem_cache.evict_policy"):
        REAL = REAL_05
    sys.meta_path.insert(0, finder)
    import torch
    if REAL is REAL_05:
        rc = importlib.import_module("sglang.srt.mem_cache.radix_cache")
        bp = importlib.import_module("sglang.srt.mem_cache.base_prefix_cache")

        def run(case):
            world = TreeWorld(rc, bp, torch, case)
            return [world.snapshot(getattr(world, "op_" + o["op"])(o)) for o in case["ops"]]
        if args.lines:
            for line in sys.stdin:
                print(json.dumps(run(json.loads(line))), flush=True)
        else:
            json.dump([run(c) for c in json.load(sys.stdin)["cases"]], sys.stdout)
        return
    rc = importlib.import_module("sglang.srt.mem_cache.radix_cache")
    mp = importlib.import_module("sglang.srt.mem_cache.memory_pool")
    pa = importlib.import_module("sglang.srt.mem_cache.paged_allocator")
    modules = (rc, mp, pa)
    if args.lines:
        for line in sys.stdin:
            print(json.dumps(run_case(modules, torch, json.loads(line))), flush=True)
        return
    cases = json.load(sys.stdin)["cases"]
    json.dump([run_case(modules, torch, case) for case in cases], sys.stdout)


def run_case(modules, torch, case) -> list[dict]:
    world = World(modules, torch, case)
    return [world.snapshot(getattr(world, "op_" + o["op"])(o)) for o in case["ops"]]


if __name__ == "__main__":
    main()
