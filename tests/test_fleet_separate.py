"""Replicas simulated one at a time (kvsim/fleet/separate.py) give the shared queue's results exactly."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest

from kvsim.fleet import runner, separate
from kvsim.fleet.runner import Fleet
from kvsim.scenario.cluster import load_cluster, simulate_cluster
from kvsim.scenario.loader import load_scenario
from kvsim.workload import build_workload
from kvsim.workload.request import RequestSpec

BASE = {
    "name": "separate-test", "seed": 5, "model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm", "tp": 1},
    "engine": {"max_model_len": 4096, "max_num_batched_tokens": 1024, "max_num_seqs": 64,
               "num_gpu_blocks_override": 600},
    "cost_model": {"type": "roofline"},
    "workload": {"num_requests": 90, "arrival": {"type": "poisson", "rate": 30.0},
                 "prompt_len": {"type": "lognormal", "median": 300, "sigma": 0.6, "min": 16, "max": 2000},
                 "output_len": {"type": "lognormal", "median": 60, "sigma": 0.5, "min": 4, "max": 400},
                 "prefix": {"shared_prompt_tokens": 256, "num_groups": 4}},
    "cluster": {"replicas": 3},
}


def scenario(cluster=None, engine=None, **workload):
    data = copy.deepcopy(BASE)
    data["workload"].update(workload)
    data["cluster"].update(cluster or {})
    data["engine"].update(engine or {})
    return data


def both(data, monkeypatch, *, window=None, fast_path=True):
    """(separate run, shared-queue run) of ``data``."""
    if window is not None:
        monkeypatch.setattr(separate, "WINDOW", window)
    apart = simulate_cluster(data, fast_path=fast_path)
    with monkeypatch.context() as m:
        m.setattr(runner, "STATELESS_POLICIES", ())      # no router counts as stateless: shared queue
        shared = simulate_cluster(data, fast_path=fast_path)
    return apart, shared


def assert_same(a, b):
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.steps, b.steps)
    assert np.array_equal(a.itl_s, b.itl_s)
    assert a.summary == b.summary
    assert a.per_replica == b.per_replica
    assert [e.stats().num_steps for e in a.run.replicas] == [e.stats().num_steps for e in b.run.replicas]


def envs(result):
    return {id(e.env) for e in result.run.replicas}


CASES = {
    "poisson": scenario(),
    "random-router": scenario({"router": "random", "replicas": 4}),
    "all-at-once": scenario(arrival={"type": "all_at_once"}, num_requests=70),
    "parallel-samples": scenario(n=2, num_requests=40),
    "refused-on-arrival": scenario(prompt_len={"type": "lognormal", "median": 2500, "sigma": 0.6,
                                               "min": 16, "max": 6000}, num_requests=60),
    "queue-limit": scenario(engine={"max_num_queued_reqs": 3}, arrival={"type": "poisson", "rate": 200.0}),
    "async-scheduling": scenario(engine={"async_scheduling": True}),
    "continuous": scenario(engine={"scheduler": "continuous", "max_num_batched_tokens": 4096}),
    "one-replica": scenario({"replicas": 1}),
}


@pytest.mark.parametrize("window", [1, 7, 1024])
@pytest.mark.parametrize("case", list(CASES))
def test_separate_replicas_give_the_shared_queues_results(case, window, monkeypatch):
    apart, shared = both(CASES[case], monkeypatch, window=window)
    n = len(apart.run.replicas)
    assert len(envs(apart)) == n and len(envs(shared)) == 1
    assert_same(apart, shared)
    assert (apart.requests["status"] == "completed").any()


@pytest.mark.parametrize("case", ["poisson", "all-at-once", "parallel-samples", "refused-on-arrival"])
def test_windows_cut_by_their_prompt_tokens_give_the_same_results(case, monkeypatch):
    # A window ends at WINDOW requests or WINDOW_TOKENS prompt tokens: cut by
    # tokens (a few requests each, a refused prompt alone), the same tables.
    monkeypatch.setattr(separate, "WINDOW_TOKENS", 700)
    windows = []
    next_window = separate._next_window
    monkeypatch.setattr(separate, "_next_window",
                        lambda it: windows.append(next_window(it)) or windows[-1])
    apart, shared = both(CASES[case], monkeypatch)
    assert_same(apart, shared)
    # The windows read each request once, in order, and each full one stopped
    # at the request that took it to 700 tokens.
    sizes = [len(w) for w, _ in windows]
    assert sum(sizes) == CASES[case]["workload"]["num_requests"] and len(sizes) > 3
    assert all(sum(s.num_prompt_tokens for s in w[:-1]) < 700 <= sum(s.num_prompt_tokens for s in w)
               for w, done in windows if not done)
    assert windows[-1][1] and not any(done for _, done in windows[:-1])


def test_the_cases_reach_what_they_name(monkeypatch):
    """The cases are not vacuous: refusals, queue-limit 503s and fan-out happen."""
    refused = simulate_cluster(CASES["refused-on-arrival"]).requests
    assert (refused["status"] == "failed").any() and (refused["status"] == "completed").any()
    limited = simulate_cluster(CASES["queue-limit"]).requests
    assert (limited["status"] == "failed").any()
    fanned = simulate_cluster(CASES["parallel-samples"]).requests
    assert len(fanned) == 80


def test_separate_step_path_matches_the_shared_step_path(monkeypatch):
    apart, shared = both(scenario(num_requests=40), monkeypatch, window=5, fast_path=False)
    assert_same(apart, shared)


@pytest.mark.parametrize("change", [
    {"cluster": {"router": "least_loaded"}},                  # reads replica state
    {"workload": {"sessions": {"turns": 2, "think_time_s": 0.1}, "num_requests": 20}},
    {"workload": {"arrival": {"type": "closed_loop", "concurrency": 4}}},
], ids=["state-reading-router", "sessions", "closed-loop"])
def test_replicas_that_may_affect_one_another_share_one_queue(change):
    data = scenario(change.get("cluster"), **change.get("workload", {}))
    assert len(envs(simulate_cluster(data))) == 1


def test_a_traced_fleet_shares_one_queue():
    rows = []
    result = simulate_cluster(scenario(num_requests=20), trace=rows.append)
    assert len(envs(result)) == 1 and rows


def test_workload_independence_flags():
    rng = np.random.default_rng(0)
    assert build_workload(BASE["workload"], rng=rng).independent
    sessions = {**BASE["workload"], "sessions": {"turns": 2}}
    assert not build_workload(sessions, rng=rng).independent


def test_a_request_that_waits_on_another_is_refused_by_a_separate_run():
    sc = load_scenario(scenario())
    cluster, plans = load_cluster(sc)
    fleet = Fleet(plans, cluster, seed=0, independent=True)
    assert fleet.separate
    specs = [RequestSpec("a", 0.0, np.arange(32), 4),
             RequestSpec("b", 0.0, np.arange(32, 64), 4, after_request_id="a")]
    with pytest.raises(ValueError, match="'b' waits on 'a'"):
        fleet.run(specs)


@pytest.mark.parametrize("window", [1, 3, 7])
def test_bursts_of_same_instant_arrivals_split_across_windows(window, monkeypatch):
    """Five requests arrive at each instant (after t=0, the engines are started): a
    window may end inside a burst, and the burst's rest must still come before
    what the first part caused."""
    from kvsim.scenario.cluster import collect_fleet
    monkeypatch.setattr(separate, "WINDOW", window)
    sc = load_scenario(scenario())
    cluster, plans = load_cluster(sc)
    rng = np.random.default_rng(1)
    specs, start = [], 0
    for i in range(60):
        n = int(rng.integers(20, 600))
        specs.append(RequestSpec(f"r{i}", 0.05 * (i // 5 + 1), np.arange(start, start + n), int(rng.integers(2, 80)),
                                 fresh_prompt_start=start, may_be_followed=False))
        start += n
    results = []
    for independent in (True, False):
        fleet = Fleet(plans, cluster, seed=0, independent=independent)
        assert fleet.separate is independent
        results.append(collect_fleet(fleet.run(specs), sc, cluster))
    assert_same(*results)


def test_progress_of_a_separate_run_never_goes_back_and_counts_every_request(monkeypatch):
    monkeypatch.setattr(separate, "WINDOW", 16)
    calls = []
    result = simulate_cluster(scenario(num_requests=1200, arrival={"type": "poisson", "rate": 60.0}),
                              progress=lambda t, n, total: calls.append((t, n, total)))
    assert len(envs(result)) == 3 and len(calls) > 3
    times = [t for t, _, _ in calls]
    assert times == sorted(times)
    assert all(total == 1200 for _, _, total in calls)
    assert max(n for _, n, _ in calls) <= 1200
