"""The cluster: section: what it accepts, and one-line errors that name the key."""

from __future__ import annotations

import pytest
import yaml

from kvsim.fleet.config import PoolFacts, check_pools, parse_cluster_config
from kvsim.scenario.cluster import load_cluster
from kvsim.scenario.loader import load_scenario
from kvsim.scenario.schema import ScenarioError


def error(data) -> str:
    with pytest.raises(ValueError) as exc:
        parse_cluster_config(data)
    return str(exc.value)


def test_replicas_is_one_mixed_pool_with_round_robin_by_default():
    c = parse_cluster_config({"replicas": 8})
    assert [(p.name, p.replicas, p.role) for p in c.pool_list()] == [("replica", 8, "mixed")]
    assert c.router.policy == "round_robin"
    assert not c.disaggregated


def test_router_may_be_written_as_its_policy_name():
    assert parse_cluster_config({"replicas": 2, "router": "least_loaded"}).router.policy == "least_loaded"


def test_prefix_aware_defaults_are_sglang_router_args():
    r = parse_cluster_config({"replicas": 2, "router": "prefix_aware"}).router
    assert (r.mode, r.cache_threshold, r.balance_abs_threshold, r.balance_rel_threshold,
            r.eviction_interval_s, r.max_tree_size) == ("approximate", 0.3, 64, 1.5, 120.0, 2**26)


def test_disaggregated_pools_take_a_decode_router_and_a_link():
    c = parse_cluster_config({"pools": [{"name": "p", "role": "prefill", "replicas": 2},
                                        {"name": "d", "role": "decode", "replicas": 6}],
                              "router": "prefix_aware", "decode_router": "least_loaded",
                              "link": "rdma"})
    assert c.disaggregated and c.decode_router.policy == "least_loaded" and c.link == "rdma"


@pytest.mark.parametrize("data, message", [
    ({"replicas": 0}, "cluster.replicas: got 0; Input should be greater than or equal to 1"),
    ({"pools": [{"name": "a", "replicas": 0}]},
     "cluster.pools[0].replicas: got 0; Input should be greater than or equal to 1"),
    ({"replicas": 2, "router": "fastest"}, "cluster.router.policy: got 'fastest'; allowed: round_robin, "
                                           "random, least_loaded, kv_utilization, prefix_aware, "
                                           "session_affinity, weighted, kv_router"),
    ({"replicas": 2, "router": {"mode": "precise"}}, "cluster.router.policy: missing; allowed: round_robin"),
    ({"replicas": 2, "router": {"policy": "weighted", "scorers": {"queue": 1, "latency": 1}}},
     "cluster.router.scorers.latency: unknown scorer 'latency'; allowed: queue, kv_cache_utilization, "
     "prefix_cache, precise_prefix_cache, session_affinity"),
    ({"replicas": 2, "router": {"policy": "weighted", "scorers": {"queue": -1}}},
     "cluster.router.scorers.queue: got -1.0; a weight must be >= 0"),
    ({"replicas": 2, "router": {"policy": "prefix_aware", "mode": "exact"}},
     "cluster.router.mode: got 'exact'; Input should be 'approximate' or 'precise'"),
    ({"replicas": 2, "router": {"policy": "prefix_aware", "treshold": 1}},
     "cluster.router.treshold: unknown key; allowed: balance_abs_threshold"),
    ({"replicas": 2, "routers": "x"}, "cluster.routers: unknown key; allowed: decode_router, link, pools, "
                                      "replicas, router"),
    ({}, "cluster.replicas: give either replicas"),
    ({"replicas": 2, "pools": [{"name": "a"}]}, "cluster.replicas: give either replicas (identical copies "
                                               "of the scenario's model/hardware/engine) or pools, not both"),
    ({"pools": [{"name": "a"}, {"name": "a"}]}, "cluster.pools[1].name: 'a' names two pools"),
    ({"pools": [{"name": "p", "role": "prefill"}, {"name": "d", "role": "decode"}]},
     "cluster.link: missing; prefill/decode pools move KV over a link"),
    ({"pools": [{"name": "p", "role": "prefill"}, {"name": "d", "role": "decode"}], "link": "warp"},
     "cluster.link: unknown link 'warp'; catalog: nvlink-h100"),
    ({"pools": [{"name": "p", "role": "prefill"}], "link": "rdma"},
     "cluster.pools: disaggregated serving needs a decode pool"),
    ({"pools": [{"name": "p", "role": "prefill"}, {"name": "d", "role": "decode"},
                {"name": "m"}], "link": "rdma"}, "cluster.pools[2].role: 'mixed' next to prefill/decode"),
    ({"replicas": 2, "link": "rdma"}, "cluster.link: only used with prefill/decode pools"),
    ({"replicas": 2, "decode_router": "random"}, "cluster.decode_router: only used with a decode pool"),
    ({"pools": [{"name": "p", "role": "prefill"}, {"name": "d", "role": "decode"}],
      "link": {"bandwidth_gbps": 0}}, "cluster.link.bandwidth_gbps: got 0; Input should be greater than 0"),
    ({"replicas": "4"}, "cluster.replicas: got '4'; Input should be a valid integer"),
    ([1, 2], "cluster: expected a mapping, got [1, 2]"),
])
def test_bad_cluster_sections_give_one_line_naming_the_key(data, message):
    text = error(data)
    assert "\n" not in text
    assert text.startswith(message)


def facts(index, name, role, model="llama-3.1-8b", block_size=16, dtype="auto", max_len=8192, cap=100000):
    return PoolFacts(index, name, role, model, block_size, dtype, max_len, cap)


def test_pools_of_different_models_in_one_pd_pair_are_refused():
    with pytest.raises(ValueError, match=r"^cluster.pools\[1\].model: 'llama-3.1-70b' differs from pool "
                                         r"'p' \('llama-3.1-8b'\) in one P/D pair; one cluster serves one model$"):
        check_pools([facts(0, "p", "prefill"), facts(1, "d", "decode", model="llama-3.1-70b")])


def test_a_decode_pool_that_can_never_hold_a_request_is_refused():
    with pytest.raises(ValueError, match=r"^cluster.pools\[1\]: decode pool 'd' can never hold a request "
                                         r"of 8192 tokens that prefill pool 'p' accepts \(its max_model_len "
                                         r"is 4096, its KV cache 4096 tokens\)"):
        check_pools([facts(0, "p", "prefill"), facts(1, "d", "decode", max_len=4096, cap=4096)])


def test_a_pd_pair_must_agree_on_block_size_and_kv_dtype():
    with pytest.raises(ValueError, match=r"cluster.pools\[1\].engine.kv_cache_dtype: 'fp8' differs"):
        check_pools([facts(0, "p", "prefill"), facts(1, "d", "decode", dtype="fp8")])
    with pytest.raises(ValueError, match=r"cluster.pools\[1\].engine.block_size: 32 differs"):
        check_pools([facts(0, "p", "prefill"), facts(1, "d", "decode", block_size=32)])


def test_matching_pools_pass():
    check_pools([facts(0, "p", "prefill"), facts(1, "d", "decode", max_len=16384)])


# --- through the scenario loader -----------------------------------------------------------------

BASE = {"model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm", "tp": 1},
        "engine": {"max_model_len": 8192, "num_gpu_blocks_override": 2000},
        "workload": {"num_requests": 5}}


def test_a_scenario_without_cluster_is_unchanged_and_accepts_cluster_overrides():
    sc = load_scenario(BASE)
    assert sc.scenario.cluster is None
    sc2 = load_scenario(BASE, overrides=["cluster.replicas=3", "cluster.router=least_loaded"])
    assert sc2.scenario.cluster == {"replicas": 3, "router": "least_loaded"}
    cluster, plans = load_cluster(sc2)
    assert [(p.name, p.replicas) for p in plans] == [("replica", 3)]
    assert plans[0].sched_config == sc2.sched_config


def test_a_pool_is_the_scenario_with_its_own_keys_merged_over_it():
    data = {**BASE, "cluster": {"pools": [
        {"name": "small", "replicas": 2, "engine": {"max_num_seqs": 8}},
        {"name": "big", "hardware": {"gpu": "h200"}}]}}
    _, plans = load_cluster(load_scenario(data))
    small, big = plans
    assert small.sched_config.max_num_seqs == 8 and small.sched_config.num_gpu_blocks == 2000
    assert big.sched_config.max_num_seqs != 8
    assert big.cost_model is not small.cost_model


def test_a_bad_pool_engine_key_is_named_with_the_pools_path():
    data = {**BASE, "cluster": {"pools": [{"name": "a", "engine": {"max_num_seqs": 0}}]}}
    with pytest.raises(ScenarioError, match=r"^cluster.pools\[0\].engine.max_num_seqs: got 0"):
        load_cluster(load_scenario(data))


def test_a_scenario_file_with_pd_pools_of_two_models_fails_on_load(tmp_path):
    data = {**BASE, "cluster": {"pools": [{"name": "p", "role": "prefill"},
                                          {"name": "d", "role": "decode", "model": "llama-3.1-70b",
                                           "hardware": {"tp": 4}}],
                                "link": "nvlink"}}
    path = tmp_path / "pd.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ScenarioError, match=r"cluster.pools\[1\].model: 'llama-3.1-70b' differs"):
        load_cluster(load_scenario(path))
