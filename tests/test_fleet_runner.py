"""Fleets end to end: one replica is kvsim.simulate exactly; routers place requests as they say."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest

import kvsim
from kvsim.scenario.cluster import simulate_cluster
from kvsim.scenario.schema import ScenarioError
from kvsim.workload import build_workload

BASE = {
    "name": "fleet-test", "seed": 3, "model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm", "tp": 1},
    "engine": {"max_model_len": 4096, "max_num_batched_tokens": 1024, "max_num_seqs": 64,
               "num_gpu_blocks_override": 600},
    "cost_model": {"type": "roofline"},
    "workload": {"num_requests": 60, "arrival": {"type": "poisson", "rate": 20.0},
                 "prompt_len": {"type": "lognormal", "median": 300, "sigma": 0.6, "min": 16, "max": 2000},
                 "output_len": {"type": "lognormal", "median": 60, "sigma": 0.5, "min": 4, "max": 400},
                 "prefix": {"shared_prompt_tokens": 256, "num_groups": 4}},
    "slo": {"ttft_ms": 2000, "tpot_ms": 100},
}


def scenario(cluster=None, **workload):
    data = copy.deepcopy(BASE)
    data["workload"].update(workload)
    if cluster is not None:
        data["cluster"] = cluster
    return data


def same_run(single, fleet):
    pd.testing.assert_frame_equal(single.requests, fleet.requests.drop(columns=["replica"]))
    pd.testing.assert_frame_equal(single.steps, fleet.steps.drop(columns=["replica"]))
    for key, value in single.summary.items():
        other = fleet.summary[key]
        assert value == other or (value != value and other != other), key


@pytest.mark.parametrize("workload", [
    {},
    {"sessions": {"turns": 3, "think_time_s": 0.5}, "num_requests": 20},
    {"arrival": {"type": "closed_loop", "concurrency": 6}},
    {"n": 2, "num_requests": 20},
    {"arrival": {"type": "all_at_once"}, "num_requests": 40},
], ids=["poisson", "sessions", "closed-loop", "parallel-samples", "all-at-once"])
def test_one_replica_fleet_reproduces_simulate_exactly(workload):
    single = kvsim.simulate(scenario(**workload))
    fleet = simulate_cluster(scenario({"replicas": 1}, **workload))
    same_run(single, fleet)
    assert set(fleet.requests["replica"]) == {"replica-0"}


def test_round_robin_places_the_kth_arrival_on_replica_k_mod_n():
    r = simulate_cluster(scenario({"replicas": 3}))
    assert list(r.requests["replica"]) == [f"replica-{k % 3}" for k in range(60)]
    assert [s["routed"] for s in r.per_replica.values()] == [20, 20, 20]
    assert sum(s["completed"] for s in r.per_replica.values()) == r.summary["completed"] == 60
    assert r.summary["num_replicas"] == 3 and r.summary["router"] == "round_robin"


def test_a_later_turn_under_session_affinity_runs_where_its_session_began():
    r = simulate_cluster(scenario({"replicas": 4, "router": "session_affinity"},
                                  sessions={"turns": 3, "think_time_s": 0.2}, num_requests=24))
    spec = kvsim.load_scenario(scenario(sessions={"turns": 3, "think_time_s": 0.2}, num_requests=24))
    specs = list(build_workload(spec.workload, rng=np.random.default_rng(spec.seed)).requests())
    where = dict(zip(r.requests["request_id"], r.requests["replica"]))
    for s in specs:
        if s.after_request_id is not None:
            assert where[s.request_id] == where[s.after_request_id]


def test_same_seed_same_bytes_with_a_random_router():
    a = simulate_cluster(scenario({"replicas": 3, "router": "random"}))
    b = simulate_cluster(scenario({"replicas": 3, "router": "random"}))
    pd.testing.assert_frame_equal(a.requests, b.requests)
    c = simulate_cluster(scenario({"replicas": 3, "router": "random"}) | {"seed": 4})
    assert list(c.requests["replica"]) != list(a.requests["replica"])


def test_prefix_aware_routing_recovers_the_hit_rate_round_robin_loses():
    # 24 system prompts of 1024 tokens; each replica's cache holds only a few of them.
    work = {"num_requests": 240, "arrival": {"type": "poisson", "rate": 30.0},
            "prefix": {"shared_prompt_tokens": 1024, "num_groups": 24}}
    rates = {}
    for policy in ("round_robin", "prefix_aware", {"policy": "prefix_aware", "mode": "precise"},
                   {"policy": "weighted", "scorers": {"queue": 1, "precise_prefix_cache": 2}}):
        r = simulate_cluster(scenario({"replicas": 6, "router": policy}, **work))
        rates[str(policy)] = r.summary["prefix_cache_hit_rate"]
    rr = rates.pop("round_robin")
    for name, rate in rates.items():
        assert rate > rr + 0.2, (name, rate, rr)


def test_disaggregated_pools_run_every_request_on_a_decode_replica():
    # The P/D flow itself: tests/test_fleet_pd.py.
    cluster = {"pools": [{"name": "p", "role": "prefill"}, {"name": "d", "role": "decode", "replicas": 2}],
               "link": "rdma"}
    r = simulate_cluster(scenario(cluster))
    assert r.summary["completed"] == 60 and set(r.requests["replica"]) == {"d-0", "d-1"}
    assert [s["routed"] for s in r.per_replica.values()] == [60, 30, 30]


def test_a_scenario_without_cluster_is_refused_by_simulate_cluster():
    with pytest.raises(ScenarioError, match="cluster: missing"):
        simulate_cluster(scenario())


@pytest.mark.parametrize("router", ["least_loaded", "prefix_aware"])
def test_a_fleets_skip_ahead_gives_the_step_paths_tables(router):
    # Decode runs are not bounded by other replicas' events; submissions cut them.
    cluster = {"replicas": 3, "router": router}
    fast = simulate_cluster(scenario(cluster, sessions={"turns": 2, "think_time_s": 0.0}, num_requests=40))
    slow = simulate_cluster(scenario(cluster, sessions={"turns": 2, "think_time_s": 0.0}, num_requests=40),
                            fast_path=False)
    pd.testing.assert_frame_equal(fast.requests, slow.requests)
    pd.testing.assert_frame_equal(fast.steps, slow.steps)
    assert sum(e.stats().num_runs for e in fast.run.replicas) > 0
