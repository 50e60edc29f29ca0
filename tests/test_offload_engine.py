"""Offload tiers in a running engine (kv/offload_engine.py): vLLM's OffloadingConnector
behind the KV connector API, hand-worked to exact hits and times.

Every case: 4-token blocks, one chunk per block of 0.25e9 bytes, so a CPU link
of 1 GB/s moves a chunk in 0.25 s; each engine step costs 1 s (the constant
cost model). A request's prompt chunks are stored when its prefill step is
scheduled (write-through, prompt only), the worker submits the store when
that step ends, and a chunk is readable once the store is done; a hit past
the GPU prefix hit loads asynchronously (WAITING_FOR_REMOTE_KVS) and the
request is scheduled at the first step boundary after the load.
"""

from __future__ import annotations

import pytest
from helpers import spec

from kvsim.kv.offload import OffloadTier, TierSpec
from kvsim.kv.offload_engine import OffloadConnector
from kvsim.kv.offload_stack import OffloadTiers
from kvsim.sched.config import SchedulerConfig
from kvsim.sim.run import run_engine

CHUNK = 250_000_000
# 10 usable GPU blocks (and the null block): a second 8-block prompt evicts most of the first.
CONFIG = SchedulerConfig(num_gpu_blocks=11, block_size=4, max_model_len=128, max_num_batched_tokens=64)


def connector(cpu_chunks=16, disk_chunks=None, disk_gbps=0.5):
    tiers = [OffloadTier(TierSpec("cpu", "cpu", cpu_chunks * CHUNK, 1.0), CHUNK)]
    if disk_chunks:
        tiers.append(OffloadTier(TierSpec("disk", "disk", disk_chunks * CHUNK, disk_gbps), CHUNK))
    return OffloadConnector(OffloadTiers(tiers), block_size=4)


def run(specs, c, fast_path=True, config=CONFIG):
    trace = []
    engine = run_engine(specs, config, connector=c, trace=trace.append, fast_path=fast_path)
    return trace, {r.request_id: r for r in engine.done}


A = list(range(1, 33))                   # 8 blocks
C = list(range(100, 132))                # 8 other blocks: evicts A's last 6 from the GPU


def test_a_conversation_evicted_from_the_gpu_comes_back_from_the_cpu_tier():
    c = connector()
    specs = [spec("A", A, max_tokens=1), spec("C", C, max_tokens=1, arrival=2.0),
             spec("B", A + [7, 7, 7, 7], max_tokens=1, arrival=4.0)]
    trace, done = run(specs, c)
    # A's 8 chunks: stored from t=1 (end of its step) to 3.0; C's from 3.0 to 5.0.
    # B at 4.0: the GPU still caches A's first 2 blocks (vLLM frees a request's
    # blocks tail first, so C took A's last 6); the CPU tier has chunks 2-7:
    # 24 tokens load from 4.0 to 5.5 (6 x 0.25 s), then B computes its last 4.
    # (While only transfers are pending the engine sleeps: no empty steps.)
    assert [(s["start_time"], s["scheduled"]) for s in trace] == [
        (0.0, {"A": 32}), (2.0, {"C": 32}), (5.5, {"B": 4})]
    assert trace[2]["prefix_hit_tokens"] == {"B": 32}
    assert done["B"].num_cached_tokens == 32 and done["B"].first_token_time == 6.5
    assert c.external_hits == {"B": (8, 24)}
    s = c.stats()
    assert (s["num_load_jobs"], s["kv_offload_load_bytes"], s["load_wait_s"]) == (1, 6 * CHUNK, 1.5)
    # Stored: A's 8, C's 8, B's new ninth chunk; the tier holds 16, so one LRU eviction.
    assert (s["num_store_jobs"], s["kv_offload_store_bytes"]) == (3, 17 * CHUNK)
    assert (s["cpu_chunks_held"], s["cpu_chunks_evicted"]) == (16, 1)
    # Without the tier B recomputes 28 tokens at 4.0 (first token at 5.0: here a
    # 1 s step is slower than a 1.5 s load plus a step; real steps are not).
    trace, done = run(specs, None)
    assert (trace[-1]["start_time"], trace[-1]["scheduled"]) == (4.0, {"B": 28})


def test_a_chunk_still_being_stored_is_not_a_hit_and_defers_the_request():
    c = connector()
    # C (at 1.0) takes A's last 6 GPU blocks; B arrives at 2.0 while A's store
    # (1.0 to 3.0) is in flight: vLLM's lookup answers "pending" and B is
    # skipped until the store is done, then loads 24 tokens (3.0 to 4.5).
    specs = [spec("A", A, max_tokens=1), spec("C", C, max_tokens=1, arrival=1.0),
             spec("B", A + [7, 7, 7, 7], max_tokens=1, arrival=2.0)]
    trace, done = run(specs, c)
    assert [(s["start_time"], s["scheduled"]) for s in trace] == [
        (0.0, {"A": 32}), (1.0, {"C": 32}), (4.5, {"B": 4})]
    assert c.external_hits == {"B": (8, 24)}
    assert done["B"].first_token_time == 5.5


def test_without_a_cpu_hit_nothing_loads_and_the_gpu_hit_is_unchanged():
    specs = [spec("A", A, max_tokens=1), spec("B", A + [7, 7, 7, 7], max_tokens=1, arrival=4.0)]
    c = connector()
    trace, done = run(specs, c)
    # B hits A's 8 blocks on the GPU; nothing past them is offloaded. (The
    # empty step is the engine's after A's finish, taken once A's store is done.)
    assert [(s["start_time"], s["scheduled"]) for s in trace] == [
        (0.0, {"A": 32}), (3.0, {}), (4.0, {"B": 4})]
    assert done["B"].num_cached_tokens == 32
    assert c.external_hits == {} and c.stats()["num_load_jobs"] == 0


def test_a_chunk_only_on_disk_is_promoted_into_the_cpu_tier_then_loaded():
    c = connector(cpu_chunks=8, disk_chunks=64)
    specs = [spec("A", A, max_tokens=1), spec("C", C, max_tokens=1, arrival=6.0),
             spec("B", A + [7, 7, 7, 7], max_tokens=1, arrival=12.0)]
    trace, done = run(specs, c)
    # A's store (submitted at 1.0) writes the CPU (2.0 s) and the disk (8 x 0.5 s):
    # done at 5.0. C's (7.0) evicts A's chunks from the CPU; its disk write ends
    # at 11.0. B at 12.0: chunks 2-7 are on disk only: promoted (disk read, 3.0 s,
    # 12.0 to 15.0), B skipped meanwhile; then loaded from the CPU (15.0 to 16.5).
    # The empty steps are the engine's after a finish (sched/connector.py: kvsim
    # sleeps to the transfer, then takes that step).
    assert [(s["start_time"], s["scheduled"]) for s in trace] == [
        (0.0, {"A": 32}), (5.0, {}), (6.0, {"C": 32}), (11.0, {}), (16.5, {"B": 4})]
    assert done["B"].first_token_time == 17.5
    s = c.stats()
    assert (s["num_promote_jobs"], s["kv_offload_promote_bytes"], s["kv_offload_promote_time_s"]) == (
        1, 6 * CHUNK, 3.0)
    assert (s["num_load_jobs"], s["kv_offload_load_bytes"]) == (1, 6 * CHUNK)
    # A, C and B's ninth chunk, each to the CPU and the disk.
    assert s["kv_offload_store_bytes"] == 2 * 17 * CHUNK
    assert (s["disk_chunks_held"], s["cpu_chunks_held"]) == (17, 8)
    assert c.external_hits == {"B": (8, 24)}


def test_the_links_queue_transfers_in_order():
    # Two prompts stored by one step share the GPU->CPU link: 8 chunks each,
    # the second store starts when the first ends (1.0-3.0, 3.0-5.0): the link is
    # busy 4 s, not 2.
    c = connector(cpu_chunks=32)
    specs = [spec("A", A, max_tokens=1), spec("D", range(200, 232), max_tokens=1),
             spec("B", A + [7, 7, 7, 7], max_tokens=1, arrival=1.5),
             spec("E", list(range(200, 232)) + [9, 9, 9, 9], max_tokens=1, arrival=1.5)]
    config = SchedulerConfig(num_gpu_blocks=41, block_size=4, max_model_len=128, max_num_batched_tokens=64)
    trace, done = run(specs, c, config=config)
    assert trace[0]["scheduled"] == {"A": 32, "D": 32}
    # Then B and E hit on the GPU and store their ninth chunks (0.25 s each).
    assert c.stats()["kv_offload_store_time_s"] == 4.5
    assert c.stats()["num_store_jobs"] == 4


@pytest.mark.parametrize("cpu_chunks", [40, 12])
def test_the_fast_path_is_the_step_path_with_offloading(cpu_chunks):
    # 12 CPU chunks: stores fail for room (retried at the next step), chunks are
    # promoted from disk, one found pending on disk waits.
    def sc(fast):
        c = connector(cpu_chunks=cpu_chunks, disk_chunks=200)
        # Sessions that come back after their GPU blocks were taken, with decode
        # runs between arrivals that loads and stores must cut.
        specs = []
        for i in range(36):
            base = 1000 * (i % 6)
            turn = i // 6
            specs.append(spec(f"r{i}", range(base, base + 12 + 6 * turn), max_tokens=4 + (i * 5) % 23,
                              arrival=turn * 9.0 + (i % 6) * 0.75))
        trace, done = run(specs, c, fast_path=fast)
        return trace, sorted((r.request_id, r.finish_time, tuple(r.token_times), r.num_cached_tokens)
                             for r in done.values()), c.stats()
    fast, slow = sc(True), sc(False)
    assert fast[0] == slow[0]
    assert fast[1] == slow[1]
    assert fast[2] == slow[2]
    assert fast[2]["num_load_jobs"] > 0 and fast[2]["num_store_jobs"] > 0
    if cpu_chunks == 12:
        assert fast[2]["kv_offload_allocation_failure"] > 0 and fast[2]["num_promote_jobs"] > 0


# --- a store shared by a fleet's replicas (LMCache remote backend, Mooncake store) ---

def test_one_replicas_prefill_is_another_replicas_hit_through_a_shared_store():
    from kvsim.cost.base import ConstantCostModel
    from kvsim.fleet.config import parse_cluster_config
    from kvsim.fleet.replica import PoolPlan
    from kvsim.fleet.runner import Fleet

    remote = OffloadTier(TierSpec("remote", "remote", 64 * CHUNK, 0.5, shared=True), CHUNK)
    made = []

    def factory(shared):
        links = shared.setdefault("links", {})
        c = OffloadConnector(OffloadTiers([OffloadTier(TierSpec("cpu", "cpu", 16 * CHUNK, 1.0), CHUNK),
                                           remote]), block_size=4, shared_links=links)
        made.append(c)
        return c

    pool = PoolPlan("p", "mixed", 2, "chunked", CONFIG, ConstantCostModel(1.0), connector_factory=factory)
    fleet = Fleet([pool], parse_cluster_config({"replicas": 2, "router": "round_robin"}), seed=0)
    run = fleet.run([spec("A", A, max_tokens=1), spec("B", A + [7, 7, 7, 7], max_tokens=1, arrival=6.0)])
    done = {r.request_id: r for e in run.replicas for r in e.done}
    # A on replica 0: its store (from 1.0) writes replica 0's CPU (2 s) and the
    # store over the network (8 x 0.5 s): done at 5.0. B on replica 1 at 6.0: its
    # GPU and CPU miss, the store has all 8 chunks: promoted into replica 1's CPU
    # (network, 6.0 to 10.0; B skipped), loaded over PCIe (10.0 to 12.0), then B
    # computes its last 4 tokens: first token at 13.0 (alone it would compute 36 at 6.0).
    assert run.num_routed == [1, 1]
    assert done["B"].first_token_time == 13.0 and done["B"].num_cached_tokens == 32
    r0, r1 = made
    assert r1.external_hits == {"B": (0, 32)} and r0.external_hits == {}
    assert (r1.stats()["num_promote_jobs"], r1.stats()["kv_offload_promote_bytes"]) == (1, 8 * CHUNK)
    assert len(remote) == 9                  # A's 8 chunks and B's ninth, once
