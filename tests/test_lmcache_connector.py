"""``kv_offloading_backend: lmcache``: vLLM 0.33's LMCacheMPConnector (kv/lmcache_connector.py)
against LMCache's L1 store (kv/lmcache_server.py), hand-worked to exact hits and times.

Every engine case: 4-token blocks, LMCache chunks of 8 tokens (2 blocks) of
0.25e9 bytes, so a 1 GB/s link moves a chunk in 0.25 s and a block in 0.125 s;
each engine step costs 1 s (the constant cost model); 10 usable GPU blocks.
A lookup is an RPC answered by the next scheduler pass (an idle engine takes
that pass at once, a busy one a step later); stores are submitted at the end
of the step that filled their chunks; a finished request keeps its blocks
until the step after its finish, and until its stores are done.
"""

from __future__ import annotations

import pytest
from helpers import spec

import kvsim
from kvsim.kv.lmcache_connector import LMCacheMPConnector
from kvsim.kv.lmcache_server import LMCacheServer
from kvsim.kv.offload import OffloadTier, TierSpec
from kvsim.kv.offload_engine import OffloadConnector
from kvsim.kv.offload_stack import OffloadTiers
from kvsim.sched.config import SchedulerConfig
from kvsim.sched.request import Request, RequestStatus
from kvsim.scenario.loader import load_scenario
from kvsim.scenario.schema import ScenarioError
from kvsim.sim.run import run_engine

CHUNK = 250_000_000
CONFIG = SchedulerConfig(num_gpu_blocks=11, block_size=4, max_model_len=128, max_num_batched_tokens=64)
A = list(range(1, 33))                   # 4 chunks
C = list(range(100, 132))                # 4 other chunks: evicts A's last 6 blocks from the GPU


def chunk_keys_of(tokens):
    """The chunk keys of ``tokens`` (8-token chunks: the hash of every second block)."""
    return Request(spec("x", tokens), 0, block_size=4, max_model_len=128).block_hashes[1:len(tokens) // 4:2]


A_KEYS, C_KEYS = chunk_keys_of(A), chunk_keys_of(C)


def lmcache(l1_chunks=16, **kw):
    l1 = OffloadTier(TierSpec("cpu", "cpu", l1_chunks * CHUNK, 1.0), CHUNK)
    return LMCacheMPConnector(LMCacheServer(l1, **kw), block_size=4, chunk_size=8)


def recording(c):
    """The connector, recording each store it submits: (request, chunks written, time)."""
    submitted, submit = [], c._submit_store

    def record(rid, keys, now):
        before = c.bytes_moved["store"]
        submit(rid, keys, now)
        submitted.append((rid, (c.bytes_moved["store"] - before) // CHUNK, now))
    c._submit_store = record
    return c, submitted


def run(specs, c, fast_path=True):
    trace = []
    engine = run_engine(specs, CONFIG, connector=c, trace=trace.append, fast_path=fast_path)
    return trace, {r.request_id: r for r in engine.done}


def steps(trace):
    return [(s["start_time"], s["scheduled"]) for s in trace]


@pytest.mark.parametrize("fast_path", [True, False])
def test_a_returning_conversation_gets_a_whole_chunk_hit_loaded_asynchronously(fast_path):
    c = lmcache()
    specs = [spec("A", A, max_tokens=1), spec("C", C, max_tokens=1, arrival=2.0),
             spec("B", A + [7, 7, 7, 7], max_tokens=1, arrival=4.0)]
    trace, done = run(specs, c, fast_path)
    # A: looked up at 0.0 (skipped), answered at the next pass (0.0, the engine is
    # idle), computed 0-1; its 4 chunks stored 1.0-2.0; its blocks held until then.
    # C the same, 2.0-3.0, stored 3.0-4.0; it took A's last 6 GPU blocks.
    # B at 4.0: lookup of its 4 whole chunks -> 32 tokens; the GPU holds A's
    # first 2 blocks (8 tokens): 24 tokens (6 blocks) load 4.0-4.75; then B
    # computes its last 4 tokens.
    assert steps(trace) == [(0.0, {"A": 32}), (2.0, {"C": 32}), (4.75, {"B": 4})]
    assert trace[2]["prefix_hit_tokens"] == {"B": 32}
    assert done["B"].first_token_time == 5.75 and done["B"].num_cached_tokens == 32
    assert c.external_hits == {"B": (8, 24)} and c.load_start_s == {"B": 4.0}
    s = c.stats()
    assert (s["num_lookups"], s["num_lookup_skips"], s["lookup_hit_tokens"]) == (3, 3, 32)
    assert (s["num_load_jobs"], s["kv_offload_load_bytes"], s["load_wait_s"]) == (1, 6 * CHUNK // 2, 0.75)
    # B's 36 tokens fill no fifth chunk: two stores of 4 chunks.
    assert (s["num_store_jobs"], s["kv_offload_store_bytes"], s["cpu_chunks_held"]) == (2, 8 * CHUNK, 8)
    assert s["held_after_finish_s"] == 2.0             # A 1.0-2.0, C 3.0-4.0


def test_a_hit_stops_at_the_last_whole_chunk():
    # B shares A's first 7 blocks (28 tokens): the native connector would load
    # blocks 2-6; LMCache's 4th chunk (blocks 6-7) differs, so the hit is 3
    # chunks (24 tokens): 16 tokens load 4.0-4.5, B computes the other 12.
    c = lmcache()
    specs = [spec("A", A, max_tokens=1), spec("C", C, max_tokens=1, arrival=2.0),
             spec("B", A[:28] + [7] * 8, max_tokens=1, arrival=4.0)]
    trace, done = run(specs, c)
    assert steps(trace)[-1] == (4.5, {"B": 12})
    assert c.external_hits == {"B": (8, 16)}
    native = OffloadConnector(OffloadTiers([OffloadTier(TierSpec("cpu", "cpu", 16 * CHUNK, 1.0), CHUNK)]),
                              block_size=4)
    run(specs, native)
    assert native.external_hits == {"B": (8, 20)}


def test_a_lookup_costs_a_busy_engine_one_step():
    specs = [spec("L", list(range(1, 9)), max_tokens=4), spec("R", list(range(50, 58)), max_tokens=1,
                                                                arrival=0.5)]
    trace, _ = run(specs, lmcache())
    # R arrives during L's prefill; at the 1.0 pass its lookup is submitted and it
    # is skipped; the reply is there at the 2.0 pass.
    assert steps(trace)[:3] == [(0.0, {"L": 8}), (1.0, {"L": 1}), (2.0, {"L": 1, "R": 8})]
    trace, _ = run(specs, None)
    assert steps(trace)[:2] == [(0.0, {"L": 8}), (1.0, {"L": 1, "R": 8})]


@pytest.mark.parametrize("fast_path", [True, False])
def test_stores_take_decode_tokens_at_the_end_of_the_step_that_fills_the_chunk(fast_path):
    out = [50, 51, 52, 53, 54, 55]
    c, submitted = recording(lmcache())
    specs = [spec("A", A[:12], max_tokens=6, output_token_ids=out),
             spec("C", C, max_tokens=1, arrival=8.0),
             spec("B", A[:12] + out[:4] + [9, 9], max_tokens=1, arrival=10.0)]
    trace, done = run(specs, c, fast_path)
    # A's prompt fills chunk 0 (stored at 1.0); chunk 1 (tokens 8-15) is full
    # once token 15, A's 4th output, is computed: the step 4.0-5.0 (on the fast
    # path a decode run 2.0-6.0, whose stores are built when it ends). C at 9.0.
    assert submitted == [("A", 1, 1.0), ("A", 1, 5.0), ("C", 4, 9.0)]
    # B (16 tokens of A's prompt and output): 2 chunks; the GPU holds 2 blocks;
    # the decode chunk loads 10.0-10.25.
    assert steps(trace)[-1] == (10.25, {"B": 2})
    assert c.external_hits == {"B": (8, 8)} and done["B"].first_token_time == 11.25


def test_a_finished_request_keeps_its_blocks_until_its_store_is_done():
    specs = [spec("A", A, max_tokens=1), spec("C", C, max_tokens=1, arrival=1.0)]
    # A finishes at 1.0 and holds its 8 blocks until its store ends (2.0): C,
    # needing 8 of the 10, waits. The native connector frees them at once.
    trace, _ = run(specs, lmcache())
    assert steps(trace) == [(0.0, {"A": 32}), (2.0, {"C": 32})]
    native = OffloadConnector(OffloadTiers([OffloadTier(TierSpec("cpu", "cpu", 16 * CHUNK, 1.0), CHUNK)]),
                              block_size=4)
    trace, _ = run(specs, native)
    assert steps(trace) == [(0.0, {"A": 32}), (1.0, {"C": 32})]


def test_a_full_store_drops_its_chunks_and_the_eviction_loop_frees_the_least_recent():
    c = lmcache(l1_chunks=6)
    D = list(range(200, 216))                            # 2 chunks
    specs = [spec("A", A, max_tokens=1), spec("D", D, max_tokens=1, arrival=2.0),
             spec("C", C, max_tokens=1, arrival=4.0), spec("B", A + [7, 7, 7, 7], max_tokens=1, arrival=6.0)]
    trace, done = run(specs, c)
    # A's 4 chunks in L1 at 2.0 (4/6 < the 0.8 watermark); D's 2 at 3.5. The
    # loop's tick at 4.0 sees 6/6: it evicts int(6 * 0.2) = 1, the least recent:
    # A3 (A's chunks were created head most recent); tick 5.0, 5/6: A2. C's
    # store at 5.5 needs 4 chunks, 2 are free: all 4 are dropped (allocated
    # together). B at 6.5 hits A0-A1 (16 tokens, none on the GPU: D and C took
    # A's blocks), loads them 6.5-7.0, computes 20 and stores A2, A3 at 8.0.
    # (3.5 and 5.5: the engine's empty steps after D's and C's finishes, taken
    # once their stores are done; sched/connector.py. B and C arrive during them.)
    assert steps(trace) == [(0.0, {"A": 32}), (2.0, {"D": 16}), (3.5, {}), (4.5, {"C": 32}),
                            (5.5, {}), (7.0, {"B": 20})]
    assert c.external_hits == {"B": (0, 16)} and done["B"].first_token_time == 8.0
    s = c.stats()
    assert (s["kv_offload_allocation_failure"], s["num_eviction_rounds"]) == (4, 2)
    assert (s["cpu_chunks_evicted"], s["cpu_chunks_held"], s["cpu_capacity_chunks"]) == (2, 6, 6)
    d = Request(spec("d", D), 0, block_size=4, max_model_len=128).block_hashes[1:4:2]
    # B's lookup touched A0, A1 (head most recent); A2, A3 written last.
    assert c.server.l1.lru_order() == [d[1], d[0], A_KEYS[1], A_KEYS[0], A_KEYS[3], A_KEYS[2]]


@pytest.mark.parametrize("fast_path", [True, False])
def test_a_chunk_evicted_from_l1_comes_back_from_the_l2_disk_before_the_reply(fast_path):
    l1 = OffloadTier(TierSpec("cpu", "cpu", 4 * CHUNK, 1.0), CHUNK)
    l2 = OffloadTier(TierSpec("disk", "disk", 1 << 60, 0.5), CHUNK)      # 0.5 s a chunk
    c = LMCacheMPConnector(LMCacheServer(l1, l2=l2), block_size=4, chunk_size=8)
    specs = [spec("A", A, max_tokens=1), spec("C", C, max_tokens=1, arrival=2.0),
             spec("B", A + [7, 7, 7, 7], max_tokens=1, arrival=6.0)]
    trace, done = run(specs, c, fast_path)
    # A's 4 chunks: L1 1.0-2.0, then copied to L2 2.0-4.0. Tick 2.0: 4/4 -> A3
    # evicted from L1. C's store (3.0) needs 4, 1 is free: dropped. B at 6.0:
    # A0-A2 in L1, A3 in L2: read into an L1 buffer 6.0-6.5, the reply waits
    # for it. At 6.5: 32 tokens, 8 on the GPU: 24 retrieved 6.5-7.25; B
    # computes its last 4. (3.0: the engine's empty step after C's finish.)
    assert steps(trace) == [(0.0, {"A": 32}), (2.0, {"C": 32}), (3.0, {}), (7.25, {"B": 4})]
    assert c.external_hits == {"B": (8, 24)} and done["B"].first_token_time == 8.25
    s = c.stats()
    assert (s["lmcache_l2_store_bytes"], s["lmcache_l2_prefetch_bytes"]) == (4 * CHUNK, CHUNK)
    assert (s["lmcache_l2_prefetch_time_s"], s["disk_chunks_held"]) == (0.5, 4)
    # Tick 7.0 (4/4: A3's buffer counts) evicts A0, the only unlocked chunk (the
    # GPU covers it); A3's buffer is temporary, deleted once retrieved.
    assert (s["kv_offload_allocation_failure"], s["num_eviction_rounds"], s["cpu_chunks_evicted"]) == (
        4, 2, 2)
    assert c.server.l1.lru_order() == [A_KEYS[2], A_KEYS[1]]


def test_an_l2_hit_needs_l1_buffers_for_all_its_chunks():
    l1 = OffloadTier(TierSpec("cpu", "cpu", 4 * CHUNK, 1.0), CHUNK)
    l2 = OffloadTier(TierSpec("disk", "disk", 8 * CHUNK, 0.5), CHUNK)
    server = LMCacheServer(l1, l2=l2)
    server.finish_write(server.reserve_write([1, 2, 3, 4]), done=0.0)
    server.advance(0.0)                           # L1 1-4; copied to L2 0.0-2.0
    server.advance(2.0)                           # tick 1.0: 4/4 -> 4 evicted; tick 2.0: 3/4
    assert [k in l1 for k in (1, 2, 3, 4)] == [True, True, True, False] and len(l2) == 4
    server.finish_write(server.reserve_write([9]), done=2.0)
    server.advance(2.0)                           # L1 full again: 1, 2, 3, 9
    assert server.lookup([1, 2, 3, 4]) == ([1, 2, 3], 2.0)     # no buffer for 4: L1 part only
    server.unlock([1, 2, 3])
    # Tick 3.0: 4/4 -> 9 evicted (1-3 were touched by the lookup after 9 was written).
    server.advance(3.0)
    assert 9 not in l1 and 9 in l2               # copied to L2 2.0-2.5
    # Now a buffer is free: 4 is read 3.0-3.5 (the disk is idle), the reply then.
    assert server.lookup([1, 2, 3, 4]) == ([1, 2, 3, 4], 3.5)
    server.advance(3.5)
    server.unlock([1, 2, 3, 4])
    assert 4 not in l1 and len(l1) == 3           # the buffer is temporary


def test_the_server_store_drops_what_does_not_fit_and_evicts_lru_above_the_watermark():
    tier = OffloadTier(TierSpec("cpu", "cpu", 10 * CHUNK, 1.0), CHUNK)
    server = LMCacheServer(tier)
    assert server.reserve_write(range(1, 11)) == list(range(1, 11))
    assert server.reserve_write([11, 12]) == []        # allocated together: both OUT_OF_MEMORY
    assert server.num_out_of_memory == 2 and server.reserve_write([1, 2]) == []   # held: not rewritten
    server.finish_write(list(range(1, 11)), done=0.5)
    # Created head most recent: 10 is the least recently used.
    server.advance(0.5)
    assert tier.lru_order() == list(range(10, 0, -1))
    hit, ready = server.lookup([3, 4, 99, 5])          # leading written chunks, locked and touched
    assert (hit, ready) == ([3, 4], 0.5)               # no L2: the reply needs no read
    # Tick 1.0: 10/10 >= 0.8 -> 2 evicted (10, 9); tick 2.0: 8/10 -> 1 (8); tick 3.0: 7/10 stops.
    server.advance(3.5)
    assert (server.num_eviction_rounds, tier.num_evicted) == (2, 3)
    assert tier.lru_order() == [7, 6, 5, 2, 1]         # 3 and 4 locked, most recent
    server.unlock(hit)
    assert tier.lru_order() == [7, 6, 5, 2, 1, 4, 3]
    # A locked chunk is never evicted: lock all 7, fill up, tick. Tick 4.0: 10/10
    # -> 2 of the unlocked (22, 21: created head most recent); 5.0: 8/10 -> 1 (20).
    server.lookup([7, 6, 5, 2, 1, 4, 3])
    server.finish_write(server.reserve_write([20, 21, 22]), done=3.6)
    server.advance(10.0)
    assert [k in tier for k in (20, 21, 22)] == [False] * 3 and len(tier) == 7
    assert (server.num_eviction_rounds, tier.num_evicted, tier.lru_order()) == (4, 6, [])


def test_a_preempted_request_gets_no_hit_and_a_fresh_tracker():
    c = lmcache()
    req = Request(spec("P", A, max_tokens=4), 0, block_size=4, max_model_len=128)
    keys = req.block_hashes[1:8:2]                # its 4 chunks, in the server
    c.server.finish_write(c.server.reserve_write(keys), done=0.0)
    assert c.get_num_new_matched_tokens(req, 0) == (None, True)     # lookup submitted
    c._pass += 1                                  # the next scheduler pass
    assert c.get_num_new_matched_tokens(req, 8) == (24, True)       # 32 hit, 8 on the GPU
    old = c._trackers["P"]
    assert (old.num_vllm_hit_blocks, old.num_lmcache_hit_blocks, old.num_stored_blocks) == (2, 8, 8)
    c._after_alloc(old, True)                     # admitted (and loaded), then preempted
    req.status = RequestStatus.PREEMPTED
    assert c.get_num_new_matched_tokens(req, 0) == (0, False)
    assert c.num_lookups == 1                     # no second lookup
    assert c._trackers["P"] is not old and c._trackers["P"].num_stored_blocks == 0


# ------------------------------------------------------------------ scenarios

def base(**engine) -> dict:
    return {"name": "lmcache", "seed": 3, "model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm"},
            "engine": {"num_gpu_blocks_override": 200, "block_size": 16, "max_model_len": 1024,
                       "max_num_batched_tokens": 1024, "kv_offloading_size": 1.0,
                       "kv_offloading_backend": "lmcache", **engine},
            "cost_model": {"type": "roofline"},
            "workload": {"num_requests": 60, "arrival": {"type": "poisson", "rate": 4.0},
                         "sessions": {"turns": 4, "think_time_s": 3.0},
                         "prompt_len": {"type": "uniform", "low": 200, "high": 600},
                         "output_len": {"type": "uniform", "low": 5, "high": 300}}}


def test_the_store_is_sized_by_the_lmcache_config_not_kv_offloading_size():
    # Llama-3.1-8B: a 16-token block is 2 MiB; a 256-token chunk 32 MiB; 5 GiB: 160 chunks.
    sc = load_scenario(base())
    assert (sc.kv_offload.chunk_size, sc.kv_offload.chunk_bytes, sc.kv_offload.l1_chunks) == (
        256, 32 << 20, 160)
    note = next(n for n in sc.notes if n.startswith("KV offloading: LMCache"))
    assert "kv_offloading_size (1 GiB) only switches it on" in note
    sc = load_scenario(base(kv_offloading_size=64.0, lmcache={"l1_size_gb": 1.0, "chunk_size": 64}))
    assert (sc.kv_offload.chunk_bytes, sc.kv_offload.l1_chunks) == (8 << 20, 128)
    # TP 2: each rank's share, 4 KiB-aligned, times 2.
    sc = load_scenario({**base(), "hardware": {"gpu": "h100-sxm", "tp": 2}})
    assert sc.kv_offload.chunk_bytes == 32 << 20 and sc.kv_offload.tp == 2
    sc = load_scenario(base(lmcache={"l2_adapter": {"type": "fs", "capacity_gib": 1.0,
                                                    "bandwidth_gbps": 6.0}}))
    assert (sc.kv_offload.l2.capacity_bytes, sc.kv_offload.l2.bandwidth_gbps) == (1 << 30, 6.0)
    assert "L2 disk 32 chunks at 6 GB/s" in sc.notes[-1]
    # vLLM: no kv_offloading_size, no connector.
    assert load_scenario(base(kv_offloading_size=None)).kv_offload is None


@pytest.mark.parametrize("l2", [None, {"bandwidth_gbps": 3.0, "latency_us": 100.0}])
def test_a_scenario_run_hits_lmcache_and_the_fast_path_is_the_step_path(l2):
    data = base(lmcache={"chunk_size": 64, "l1_size_gb": 0.25, "l2_adapter": l2})
    fast, slow = kvsim.simulate(data), kvsim.simulate(data, fast_path=False)
    assert fast.requests.equals(slow.requests) and fast.steps.equals(slow.steps)
    assert fast.summary == slow.summary
    k = fast.summary["kv_offload"]
    assert k["external_prefix_cache_hits"] > 0 and k["num_load_jobs"] > 0
    assert k["num_lookups"] > 0 and k["num_lookup_skips"] >= k["num_lookups"]
    assert k["cpu_chunks_held"] <= k["cpu_capacity_chunks"] == 32
    if l2 is not None:
        assert k["lmcache_l2_prefetch_bytes"] > 0 and k["disk_chunks_held"] > k["cpu_chunks_held"]
    hits = fast.requests["num_external_cached_tokens"]
    local = fast.requests["num_local_cached_tokens"]
    assert ((hits + local)[hits > 0] % 64 == 0).all()          # the LMCache hit: whole chunks


def test_the_example_scenario_runs():
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    sc = load_scenario(root / "scenarios" / "kv_offload_lmcache.yaml",
                       overrides=["workload.num_requests=100"])
    result = kvsim.simulate(sc)
    assert result.summary["kv_offload"]["external_prefix_cache_hits"] > 0


@pytest.mark.parametrize("engine, message", [
    ({"lmcache": {"chunk_size": 100}}, "engine.lmcache.chunk_size: got 100; it must be a multiple "
                                       "of engine.block_size (16)"),
    ({"lmcache": {"l1_size_gb": 0.01}}, "engine.lmcache.l1_size_gb: got 0.01; it holds no chunk"),
    ({"lmcache": {"l1_size_gb": 0}}, "engine.lmcache.l1_size_gb: got 0; Input should be greater than 0"),
    ({"lmcache": {"eviction_ratio": 1.5}}, "engine.lmcache.eviction_ratio: got 1.5"),
    ({"lmcache": {"eviction_policy": "ARC"}}, "engine.lmcache.eviction_policy: got 'ARC'"),
    ({"lmcache": {"max_local_disk_size": 5}}, "engine.lmcache.max_local_disk_size"),
    ({"lmcache": {"l2_adapter": {"capacity_gib": 1}}}, "engine.lmcache.l2_adapter.bandwidth_gbps: "
                                                       "got a mapping; Field required"),
    ({"lmcache": {"l2_adapter": {"capacity_gib": 0.01, "bandwidth_gbps": 1}}},
     "engine.lmcache.l2_adapter.capacity_gib: got 0.01; it holds no chunk"),
    ({"lmcache": {"l2_adapter": {"type": "s3", "bandwidth_gbps": 1}}}, "engine.lmcache.l2_adapter.type"),
    ({"kv_offloading_backend": "native", "lmcache": {}}, "engine.lmcache: set with "
                                                         "kv_offloading_backend 'native'"),
    ({"kv_offloading": {"blocks_per_chunk": 2}}, "engine.kv_offloading: the native connector's details"),
    ({"kv_offloading_size": None, "lmcache": {}}, "engine.lmcache: set, but vLLM turns KV offloading "
                                                  "on only with engine.kv_offloading_size"),
    ({"scheduler": "continuous"}, "engine.scheduler: 'continuous' with KV offloading; vLLM's "
                                  "LMCacheMPConnector"),
    ({"enable_prefix_caching": False}, "engine.enable_prefix_caching: false with KV offloading"),
])
def test_bad_lmcache_input_is_one_line_naming_the_key(engine, message):
    with pytest.raises(ScenarioError) as exc:
        load_scenario(base(**engine))
    assert str(exc.value).startswith(message), str(exc.value)
    assert "\n" not in str(exc.value)


def test_a_fleet_runs_one_lmcache_server_per_replica():
    data = {**base(lmcache={"chunk_size": 64, "l1_size_gb": 0.25}),
            "cluster": {"replicas": 2, "router": "round_robin"}}
    fast, slow = kvsim.simulate(data), kvsim.simulate(data, fast_path=False)
    assert fast.requests.equals(slow.requests) and fast.summary == slow.summary
    servers = [e.scheduler.transfers.connector.server for e in fast.run.replicas]
    assert servers[0] is not servers[1]
    assert fast.summary["kv_offload"]["cpu_capacity_chunks"] == 2 * 32
