"""``engine.kv_offloading_size`` in scenario files: the tiers are sized as vLLM sizes them,
a run gets hits from the CPU tier with the same results on the fast and step paths,
the summary counts them under vLLM's metric names, and bad input is one line.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import kvsim
from kvsim.scenario.loader import load_scenario
from kvsim.scenario.schema import ScenarioError
from kvsim.scenario.vllm_args import VllmArgsError, map_serve_args

ROOT = Path(__file__).resolve().parent.parent
MIB2 = 2 << 20                 # Llama-3.1-8B: one 16-token block, bf16, all 32 layers = 2 MiB


def base(**engine) -> dict:
    return {"name": "offload", "seed": 3, "model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm"},
            "engine": {"num_gpu_blocks_override": 120, "block_size": 16, "max_model_len": 1024,
                       "max_num_batched_tokens": 512, "kv_offloading_size": 1.0, **engine},
            "cost_model": {"type": "roofline"},
            "workload": {"num_requests": 60, "arrival": {"type": "poisson", "rate": 4.0},
                         "sessions": {"turns": 4, "think_time_s": 3.0},
                         "prompt_len": {"type": "uniform", "low": 40, "high": 200},
                         "output_len": {"type": "uniform", "low": 5, "high": 60}}}


def test_the_cpu_tier_is_sized_as_vllm_sizes_it():
    # cpu_bytes_to_use = 1 GiB; a chunk = one 2 MiB block (page-aligned already): 512 chunks.
    sc = load_scenario(base())
    assert (sc.kv_offload.chunk_bytes, sc.kv_offload.cpu_chunks) == (MIB2, 512)
    assert sc.kv_offload.cpu.bandwidth_gbps == sc.gpu.pcie_bandwidth_gbps
    assert any(n.startswith("KV offloading: CPU tier 512 chunks") for n in sc.notes)
    # TP 2: the size is the sum over ranks; a chunk holds every rank's share.
    sc = load_scenario({**base(), "hardware": {"gpu": "h100-sxm", "tp": 2}})
    assert (sc.kv_offload.chunk_bytes, sc.kv_offload.cpu_chunks) == (MIB2, 512)
    sc = load_scenario(base(kv_offloading_size=None, kv_offloading={
        "num_cpu_blocks": 300, "blocks_per_chunk": 2, "bandwidth_gbps": 25.0, "latency_us": 5.0,
        "disk": {"capacity_gib": 2.0, "bandwidth_gbps": 3.0}}))
    assert (sc.kv_offload.chunk_bytes, sc.kv_offload.cpu_chunks) == (2 * MIB2, 150)
    assert (sc.kv_offload.cpu.bandwidth_gbps, sc.kv_offload.cpu.latency_us) == (25.0, 5.0)
    assert sc.kv_offload.disk.capacity_bytes == 2 << 30
    assert load_scenario(base(kv_offloading_size=None)).kv_offload is None


def test_a_run_with_a_cpu_tier_hits_it_and_the_fast_path_is_the_step_path():
    fast, slow = kvsim.simulate(base()), kvsim.simulate(base(), fast_path=False)
    assert fast.requests.equals(slow.requests) and fast.steps.equals(slow.steps)
    assert fast.summary == slow.summary
    k = fast.summary["kv_offload"]
    assert k["external_prefix_cache_hits"] > 0 and k["num_load_jobs"] > 0
    # vLLM's split: the GPU hit and the tiers' tokens add up to what was cached
    # at admission (a whole-prompt hit is cut by one token when the load ends).
    cached = int(fast.requests["num_cached_tokens"].sum())
    full = k["prefix_cache_hits"] + k["external_prefix_cache_hits"]
    assert cached <= full <= cached + k["num_external_hit_requests"]
    assert k["prompt_tokens_cached_by_source"] == {"device": k["prefix_cache_hits"],
                                                   "host": k["external_prefix_cache_hits"]}
    assert k["external_prefix_cache_queries"] == k["prefix_cache_queries"] - k["prefix_cache_hits"]
    # Every load moved whole 2 MiB chunks.
    assert k["kv_offload_load_bytes"] % MIB2 == 0 and k["kv_offload_load_bytes"] > 0
    without = kvsim.simulate(base(kv_offloading_size=None))
    assert "kv_offload" not in without.summary
    assert fast.summary["prefix_cache_hit_rate"] > without.summary["prefix_cache_hit_rate"]


def test_the_example_scenario_runs_with_a_disk_tier_too():
    sc = load_scenario(ROOT / "scenarios" / "kv_offload.yaml",
                       overrides=["workload.num_requests=40", "engine.kv_offloading_size=0.25",
                                  "engine.kv_offloading.disk={capacity_gib: 8, bandwidth_gbps: 6}"])
    r = kvsim.simulate(sc)
    assert r.summary["completed"] == 40
    assert r.summary["kv_offload"]["disk_chunks_held"] > 0


@pytest.mark.parametrize("engine, message", [
    ({"kv_offloading_size": 0}, "engine.kv_offloading_size: got 0; Input should be greater than 0"),
    ({"kv_offloading_size": 0.001}, "engine.kv_offloading_size: got 0.001 GiB; it holds no chunk of 1 "
                                    "block(s) (2097152 bytes): raise it"),
    ({"kv_offloading": {"num_cpu_blocks": 8}}, "engine.kv_offloading.num_cpu_blocks: set with "
                                               "engine.kv_offloading_size; give the CPU tier's size once"),
    ({"kv_offloading_size": None, "kv_offloading": {"blocks_per_chunk": 2}},
     "engine.kv_offloading: set, but the CPU tier has no size"),
    # kv_offloading_backend: lmcache runs (tests/test_lmcache_connector.py); its own
    # knobs' errors are there.
    ({"scheduler": "continuous", "max_num_batched_tokens": 1024}, "engine.scheduler: 'continuous' with KV offloading"),
    ({"enable_prefix_caching": False}, "engine.enable_prefix_caching: false with KV offloading"),
    ({"prefix_cache": "radix"}, "engine.prefix_cache: radix with KV offloading"),
    ({"kv_offloading": {"disk": {"capacity_gib": 10}}},
     "engine.kv_offloading.disk.bandwidth_gbps: got a mapping; Field required"),
    ({"kv_offloading": {"disk": {"capacity_gib": -1, "bandwidth_gbps": 3}}},
     "engine.kv_offloading.disk.capacity_gib: got -1; Input should be greater than 0"),
    ({"kv_offloading": {"bandwidth_gbps": 0}}, "engine.kv_offloading.bandwidth_gbps: got 0; Input "
                                               "should be greater than 0"),
])
def test_bad_offloading_input_is_one_line_naming_the_key(engine, message):
    with pytest.raises(ScenarioError) as exc:
        load_scenario(base(**engine))
    assert str(exc.value).startswith(message)
    assert "\n" not in str(exc.value)


def test_a_fleet_shares_one_remote_store_and_sums_the_counters():
    remote = {"capacity_gib": 4.0, "bandwidth_gbps": 12.5, "latency_us": 20.0}
    data = {**base(kv_offloading_size=0.125, kv_offloading={"remote": remote}),
            "cluster": {"replicas": 2, "router": "round_robin"}}
    fast, slow = kvsim.simulate(data), kvsim.simulate(data, fast_path=False)
    assert fast.requests.equals(slow.requests) and fast.summary == slow.summary
    k = fast.summary["kv_offload"]
    # Two CPU tiers of 64 chunks, one store of 2048 (counted once).
    assert (k["cpu_capacity_chunks"], k["remote_capacity_chunks"]) == (128, 2048)
    assert k["num_promote_jobs"] > 0 and k["external_prefix_cache_hits"] > 0
    stores = [c.tiers.by_name["remote"] for c in
              (e.scheduler.transfers.connector for e in fast.run.replicas)]
    assert stores[0] is stores[1]
    alone = kvsim.simulate({**data, "engine": {**data["engine"], "kv_offloading": None}})
    assert fast.summary["prefix_cache_hit_rate"] > alone.summary["prefix_cache_hit_rate"]


def test_the_vllm_offloading_flags_map_to_the_scenario_keys():
    mapped = dict(map_serve_args("--kv-offloading-size 64 --kv-offloading-backend native").overrides)
    assert mapped == {"engine.kv_offloading_size": 64.0, "engine.kv_offloading_backend": "native"}
    mapped = dict(map_serve_args("--kv-offloading-size 1 --kv-offloading-backend lmcache").overrides)
    assert mapped == {"engine.kv_offloading_size": 1.0, "engine.kv_offloading_backend": "lmcache"}
    with pytest.raises(VllmArgsError, match="--kv-offloading-backend"):
        map_serve_args("--kv-offloading-backend mooncake")
