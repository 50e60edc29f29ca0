"""The OffloadingConnector's scheduler side on kvsim's tiers (kv/offload_connector.py).

Vectors follow vLLM 0.33's ``OffloadingConnectorScheduler`` for one
full-attention group: write-through stores of full prompt chunks, pending
chunks defer a lookup, a hit loads asynchronously and pins its chunks,
chunks only on disk are promoted into the CPU tier first.
"""

from __future__ import annotations

import pytest

from kvsim.kv.offload import OffloadTier, TierSpec
from kvsim.kv.offload_connector import OffloadingConnectorScheduler
from kvsim.kv.offload_stack import OffloadTiers

CHUNK = 1000          # bytes per chunk (one 4-token block)


class Req:
    def __init__(self, rid, hashes, num_tokens, prompt_len=None):
        self.request_id = rid
        self.block_hashes = list(hashes)
        self.num_tokens = num_tokens
        self.prompt_len = num_tokens if prompt_len is None else prompt_len


def connector(cpu_chunks=8, disk_chunks=None):
    tiers = [OffloadTier(TierSpec("cpu", "cpu", cpu_chunks * CHUNK, 25.0), CHUNK)]
    if disk_chunks:
        tiers.append(OffloadTier(TierSpec("disk", "disk", disk_chunks * CHUNK, 5.0), CHUNK))
    return OffloadingConnectorScheduler(OffloadTiers(tiers), block_size=4)


def test_full_prompt_chunks_are_stored_write_through_and_pending_until_done():
    c = connector()
    a = Req("A", [11, 12, 13], 13)
    assert c.get_num_new_matched_tokens(a, 0) == (0, False)
    (job,) = c.build_store_jobs([(a, 13)])
    assert (job.kind, job.keys, job.bytes_per_tier) == ("store", (11, 12, 13), {"cpu": 3 * CHUNK})
    b = Req("B", [11, 12, 99], 14)
    assert c.get_num_new_matched_tokens(b, 0) == (None, False)       # HIT_PENDING: retry
    c.complete(job.job_id)
    assert c.get_num_new_matched_tokens(b, 0) == (8, True)           # 2 chunks, async


def test_a_hit_pins_its_chunks_and_skips_storing_them():
    c = connector()
    a = Req("A", [11, 12, 13], 13)
    c.get_num_new_matched_tokens(a, 0)
    c.complete(c.build_store_jobs([(a, 13)])[0].job_id)
    c.request_finished(a)
    b = Req("B", [11, 12, 13, 14], 17)
    assert c.get_num_new_matched_tokens(b, 4) == (8, True)           # GPU hit 4, chunks 1-2 offloaded
    load = c.update_state_after_alloc(b, 8)
    assert (load.kind, load.keys, load.reads) == ("load", (12, 13), {"cpu": (12, 13)})
    cpu = c.tiers.first
    assert [cpu.state(k) for k in (11, 12, 13)] == [0, 1, 1]
    assert c.get_num_new_matched_tokens(b, 4) == (None, False)       # its load is in flight
    c.complete(load.job_id)
    assert cpu.state(12) == 0
    (store,) = c.build_store_jobs([(b, 17)])
    assert store.keys == (14,)                                       # 11-13 were hits: skipped


def test_decode_tokens_are_not_offloaded_by_default():
    c = connector()
    a = Req("A", [11, 12, 13, 14], 16, prompt_len=6)
    c.get_num_new_matched_tokens(a, 0)
    (job,) = c.build_store_jobs([(a, 16)])
    assert job.keys == (11,)                                          # 6 prompt tokens: 1 full chunk
    assert c.build_store_jobs([(a, 16)]) == []


def test_a_full_tier_of_pinned_chunks_fails_the_store_and_offers_it_again():
    c = connector(cpu_chunks=2)
    a = Req("A", [1, 2], 8)
    c.get_num_new_matched_tokens(a, 0)
    c.complete(c.build_store_jobs([(a, 8)])[0].job_id)
    b = Req("B", [1, 2], 9)
    assert c.get_num_new_matched_tokens(b, 0) == (8, True)
    c.update_state_after_alloc(b, 8)                                  # 1 and 2 pinned
    d = Req("D", [7], 4)
    c.get_num_new_matched_tokens(d, 0)
    assert c.build_store_jobs([(d, 4)]) == [] and c.num_store_failures == 1
    for job in c.jobs_in_flight:
        c.complete(job.job_id)
    (job,) = c.build_store_jobs([(d, 4)])                             # offered again
    assert job.keys == (7,) and 2 not in c.tiers.first and 1 in c.tiers.first   # tail first


def test_a_chunk_only_on_disk_is_promoted_into_the_cpu_tier_first():
    c = connector(cpu_chunks=2, disk_chunks=8)
    a = Req("A", [1, 2], 8)
    c.get_num_new_matched_tokens(a, 0)
    c.complete(c.build_store_jobs([(a, 8)])[0].job_id)
    c.request_finished(a)
    e = Req("E", [5, 6], 8)                                           # pushes 1, 2 out of the CPU
    c.get_num_new_matched_tokens(e, 0)
    c.complete(c.build_store_jobs([(e, 8)])[0].job_id)
    c.request_finished(e)
    cpu, disk = c.tiers.first, c.tiers.by_name["disk"]
    assert 1 not in cpu and 1 in disk
    b = Req("B", [1, 2, 3], 13)
    assert c.get_num_new_matched_tokens(b, 0) == (None, False)        # RETRY
    (promo,) = c.jobs_in_flight
    assert (promo.kind, promo.reads, promo.writes) == ("promote", {"disk": (1, 2)}, {"cpu": (1, 2)})
    assert promo.bytes_per_tier == {"disk": 2 * CHUNK, "cpu": 2 * CHUNK}
    c.complete(promo.job_id)
    assert c.get_num_new_matched_tokens(b, 0) == (8, True)
    assert c.update_state_after_alloc(b, 8).reads == {"cpu": (1, 2)}


def test_lmcache_tiers_are_refused():
    tiers = OffloadTiers([OffloadTier(TierSpec("cpu", "cpu", CHUNK, 25.0), CHUNK)], semantics="lmcache")
    with pytest.raises(ValueError, match="semantics: vllm"):
        OffloadingConnectorScheduler(tiers, block_size=4)


def test_a_chunk_still_being_stored_on_disk_is_not_promoted():
    c = connector(cpu_chunks=2, disk_chunks=8)
    a = Req("A", [11, 12], 8)
    c.get_num_new_matched_tokens(a, 0)
    (job,) = c.build_store_jobs([(a, 8)])
    c.tiers.complete_store([11, 12], tier="cpu")          # the CPU copy is done, the disk's is not
    c.tiers.by_name["cpu"].prepare_store([21, 22], "X")   # ... and then evicted for other chunks
    c.tiers.complete_store([21, 22], tier="cpu")
    b = Req("B", [11, 12, 13], 12)
    assert c.get_num_new_matched_tokens(b, 0) == (None, False)   # pending on disk: retry
    assert [j.kind for j in c.jobs_in_flight] == ["store"]        # no promotion of a pending chunk
