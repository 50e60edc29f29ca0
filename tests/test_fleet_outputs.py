"""A fleet's results: kvsim.simulate and kvsim run dispatch to it; its summaries and files."""

from __future__ import annotations

import copy
import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvsim
from kvsim.cli import main
from kvsim.metrics.fleet import imbalance, max_concurrent, slo_attainment
from kvsim.metrics.prometheus import prometheus_series
from kvsim.scenario.cluster import simulate_cluster
from kvsim.scenario.cluster_outputs import fleet_itls
from kvsim.scenario.schema import ScenarioError
from kvsim.view import render_view

BASE = {
    "name": "fleet-out", "seed": 1, "model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm", "tp": 1},
    "engine": {"max_model_len": 4096, "max_num_batched_tokens": 1024, "max_num_seqs": 64,
               "num_gpu_blocks_override": 800},
    "cost_model": {"type": "roofline"},
    "workload": {"num_requests": 48, "arrival": {"type": "poisson", "rate": 16.0},
                 "prompt_len": {"type": "lognormal", "median": 200, "sigma": 0.5, "min": 16, "max": 1000},
                 "output_len": {"type": "lognormal", "median": 40, "sigma": 0.5, "min": 4, "max": 200},
                 "prefix": {"shared_prompt_tokens": 256, "num_groups": 3}},
    "slo": {"ttft_ms": 200, "tpot_ms": 30},
    "cluster": {"replicas": 3, "router": "least_loaded"},
}


def scenario(**changes):
    data = copy.deepcopy(BASE)
    for key, value in changes.items():
        data[key] = value
    return data


def test_simulate_runs_a_scenario_with_cluster_as_a_fleet():
    a = kvsim.simulate(scenario())
    b = simulate_cluster(scenario())
    assert set(a.per_replica) == {"replica-0", "replica-1", "replica-2"}
    pd.testing.assert_frame_equal(a.requests, b.requests)
    assert a.summary == b.summary or json.dumps(a.summary) == json.dumps(b.summary)


def test_per_replica_and_per_pool_summaries_add_up_to_the_fleet():
    r = kvsim.simulate(scenario())
    reps = r.per_replica.values()
    assert sum(s["completed"] for s in reps) == r.summary["completed"] == 48
    assert sum(s["routed"] for s in reps) == 48
    assert sum(s["num_gpu_blocks"] for s in reps) == r.summary["num_gpu_blocks"] == 3 * 800
    assert sum(s["num_preemptions"] for s in reps) == r.summary["num_preemptions"]
    assert sum(s["computed_tokens"] for s in reps) == int(r.steps["num_prefill_tokens"].sum()
                                                          + r.steps["num_decode_tokens"].sum())
    cached = sum(s["prefix_cache_hit_rate"] * s["total_input_tokens"] for s in reps)
    assert cached / r.summary["total_input_tokens"] == pytest.approx(r.summary["prefix_cache_hit_rate"])
    pool = r.per_pool["replica"]
    assert pool["replicas"] == 3 and pool["role"] == "mixed" and pool["completed"] == 48
    assert pool["imbalance_routed"] == r.summary["imbalance_routed"] == imbalance(
        [s["routed"] for s in reps])
    for name, s in r.per_replica.items():
        assert s["completed"] == int((r.requests["replica"] == name).sum())


@pytest.mark.parametrize("workers", [1, 2])
def test_simultaneous_arrivals_are_the_clients_order_across_replicas(workers):
    """Every request arrives at t = 0 and round robin spreads them: requests.csv lists
    them in the workload's order, not replica by replica, and the per-request
    statistics are vLLM's ``calculate_metrics`` over the lists in that order
    (``np.mean(ttfts) * 1000``, ...), the ITL gaps pooled request by request in that
    order too; the same with the replicas in two processes."""
    r = kvsim.simulate(scenario(
        workload={**BASE["workload"], "num_requests": 60, "arrival": {"type": "all_at_once"}},
        cluster={"replicas": 3, "router": "round_robin", "workers": workers}))
    req = r.requests
    assert list(req["request_id"]) == [f"r{i}" for i in range(60)]
    assert list(req["replica"][:3]) == ["replica-0", "replica-1", "replica-2"]
    ttfts = (req["first_token_time_s"] - req["arrival_time_s"]).tolist()
    e2els = (req["finish_time_s"] - req["arrival_time_s"]).tolist()
    tpots = [(e - t) / (k - 1) for e, t, k in zip(e2els, ttfts, req["num_output_tokens"]) if k > 1]
    itls = [g for gaps in fleet_itls(r) for g in gaps]      # each request's, in the rows' order
    for metric, xs in (("ttft", ttfts), ("tpot", tpots), ("e2el", e2els), ("itl", itls)):
        assert r.summary[f"mean_{metric}_ms"] == np.mean(xs) * 1000, metric
        assert r.summary[f"std_{metric}_ms"] == np.std(xs) * 1000, metric
        assert r.summary[f"p99_{metric}_ms"] == np.percentile(xs, 99) * 1000, metric
    # (The order shows in the last bits: replica by replica, the means are other floats.)
    by_replica = [t for name in ("replica-0", "replica-1", "replica-2")
                  for t in (req["first_token_time_s"] - req["arrival_time_s"])[req["replica"] == name]]
    assert np.mean(by_replica) != np.mean(ttfts)
    assert np.mean(r.itl_s) != np.mean(itls)               # (the fleet's gaps are held by replica)


def test_fleet_keys_mean_what_they_say():
    r = kvsim.simulate(scenario())
    good = ((r.requests["first_token_time_s"] - r.requests["arrival_time_s"]) * 1000 <= 200)
    n_out = r.requests["num_output_tokens"]
    tpot = np.where(n_out > 1, (r.requests["finish_time_s"] - r.requests["first_token_time_s"])
                    / np.maximum(n_out - 1, 1), 0.0) * 1000
    good &= tpot <= 30
    assert r.summary["slo_attainment"] == pytest.approx(good.mean())
    assert r.summary["request_goodput"] == pytest.approx(good.sum() / r.summary["duration"])
    assert r.summary["max_concurrent_requests"] >= max(s["max_concurrent_requests"]
                                                       for s in r.per_replica.values())


def test_max_concurrent_adds_the_replicas_running_counts_along_time():
    a = pd.DataFrame({"start_time_s": [0.0, 1.0, 2.0], "duration_s": [1.0, 1.0, 1.0],
                      "num_running": [2, 3, 1]})
    b = pd.DataFrame({"start_time_s": [0.5, 2.5], "duration_s": [1.0, 1.0], "num_running": [4, 0]})
    # ends: a 1:2, a 2:3, a 3:1; b 1.5:4, b 3.5:0 -> levels 2, 6, 7, 5, 1
    assert max_concurrent([a, b]) == 7
    # a finish on one replica and an admission on another at one instant do not overlap
    c = pd.DataFrame({"start_time_s": [0.0, 1.0], "duration_s": [1.0, 1.0], "num_running": [5, 0]})
    d = pd.DataFrame({"start_time_s": [1.0], "duration_s": [1.0], "num_running": [5]})
    assert max_concurrent([c, d]) == 5
    assert max_concurrent([a]) == 3


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 6), st.integers(1, 3), st.integers(0, 4)),
                         max_size=12), min_size=2, max_size=4))
def test_max_concurrent_is_the_largest_sum_at_any_instant(engines):
    # Each engine's steps: (start, duration, running), in time order; its count
    # holds from a step's end to its next end. Steps that change no count
    # (skipped by max_concurrent) must not change the answer.
    tables, ends = [], set()
    for raw in engines:
        t, rows = 0, []
        for gap, duration, running in raw:
            t += gap
            rows.append((float(t), float(duration), running))
            t += duration
        tables.append(pd.DataFrame(rows, columns=["start_time_s", "duration_s", "num_running"]))
        ends.update(a + b for a, b, _ in rows)

    def level(at):          # every engine's count after its last step ending by ``at``
        total = 0
        for table in tables:
            done = table[table.start_time_s + table.duration_s <= at]
            total += int(done.num_running.iloc[-1]) if len(done) else 0
        return total

    assert max_concurrent(tables) == max([0, *(level(at) for at in ends)])


def test_imbalance_is_max_over_mean():
    assert imbalance([10, 10, 10]) == 1.0
    assert imbalance([30, 0, 0]) == 3.0
    assert imbalance([0, 0]) == 1.0


def test_slo_attainment_counts_failed_requests_as_misses():
    requests = pd.DataFrame({"status": ["completed", "completed", "failed", "completed"],
                             "arrival_time_s": [0.0, 0.0, 0.0, 0.0],
                             "first_token_time_s": [0.1, 0.3, np.nan, 0.2],
                             "finish_time_s": [0.5, 0.9, 0.0, 0.2],
                             "num_output_tokens": [5, 5, 0, 1]})
    assert slo_attainment(requests, {"ttft_ms": 250}) == 0.5
    assert slo_attainment(requests, {"ttft_ms": 250, "tpot_ms": 50}) == 0.25
    assert np.isnan(slo_attainment(requests, None))


def test_kvsim_run_writes_the_fleets_files(tmp_path, capsys):
    path = tmp_path / "fleet.yaml"
    path.write_text(json.dumps(scenario(slo={})))
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--save-detailed"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_replicas"] == 3 and summary["router"] == "least_loaded"
    assert summary["slo_attainment"] is None
    assert summary["null_reasons"]["slo_attainment"].startswith("no SLO given")
    assert set(summary["pools"]) == {"replica"}
    assert set(summary["replicas"]) == {"replica-0", "replica-1", "replica-2"}
    assert summary["replicas"]["replica-0"]["request_goodput"] is None      # strict JSON inside too
    requests = pd.read_csv(out / "requests.csv")
    steps = pd.read_csv(out / "steps.csv")
    assert requests.columns[-1] == "replica" and steps.columns[-1] == "replica"
    assert list(dict.fromkeys(steps["replica"])) == ["replica-0", "replica-1", "replica-2"]
    metrics = pd.read_csv(out / "metrics.csv")
    assert metrics.columns[0] == "replica"
    per = {name: part for name, part in metrics.groupby("replica")}
    assert len({len(p) for p in per.values()}) == 1                          # one set of scrape times
    last = metrics.groupby("replica")["vllm:prefix_cache_queries_total"].max().sum()
    assert last == requests["num_prompt_tokens"].sum()
    bench = json.loads((out / "bench_serve.json").read_text())
    assert bench["completed"] == 48 and len(bench["itls"]) == 48
    gaps = np.sort(np.concatenate([g for g in bench["itls"] if g]))
    r = kvsim.simulate(scenario(slo={}))
    np.testing.assert_array_equal(gaps, np.sort(r.itl_s))


def test_a_replicas_metrics_are_its_own_prometheus_series():
    from kvsim.scenario.cluster_outputs import fleet_prometheus
    r = kvsim.simulate(scenario())
    table = fleet_prometheus(r)
    name = "replica-1"
    own = prometheus_series(r.requests[r.requests["replica"] == name].drop(columns=["replica"]),
                            r.steps[r.steps["replica"] == name].drop(columns=["replica"]),
                            max_model_len=4096)
    mine = table[table["replica"] == name].drop(columns=["replica"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(mine.iloc[:len(own)], own, check_dtype=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "c", None]), max_size=40),
       st.lists(st.sampled_from(["a", "b", "c"]), max_size=40))
def test_a_replicas_rows_are_those_its_name_selects(request_replicas, step_replicas):
    # _by_replica codes each replica column once: the same frames, index and
    # order included, as selecting each name's rows by comparison.
    from types import SimpleNamespace

    from kvsim.scenario.cluster_outputs import _by_replica
    requests = pd.DataFrame({"replica": pd.array(request_replicas, dtype="str"),
                             "x": np.arange(len(request_replicas), dtype=float)})
    steps = pd.DataFrame({"replica": pd.array(step_replicas, dtype="str"),
                          "y": np.arange(len(step_replicas))})
    result = SimpleNamespace(requests=requests, steps=steps, per_replica={"c": 0, "a": 0, "b": 0})
    for name, part, own in _by_replica(result):
        pd.testing.assert_frame_equal(part, requests[requests["replica"] == name].drop(columns=["replica"]))
        pd.testing.assert_frame_equal(
            own, steps[steps["replica"] == name].drop(columns=["replica"]).reset_index(drop=True))


def test_the_trace_names_each_records_replica():
    records = []
    kvsim.simulate(scenario(), trace=records.append)
    assert {r["replica"] for r in records} == {"replica-0", "replica-1", "replica-2"}
    assert len(records) == len(kvsim.simulate(scenario()).steps)


def test_streaming_metrics_with_a_cluster_is_one_line_error():
    with pytest.raises(ScenarioError, match=r"^metrics.streaming: true is not supported with cluster:"):
        kvsim.simulate(scenario(metrics={"streaming": True}))


def test_view_shows_the_replica_table_and_figure(tmp_path):
    kvsim.simulate(scenario()).write(tmp_path)
    page = render_view(tmp_path)
    assert "<h2>Replicas</h2>" in page and "<h2>Pools</h2>" in page
    assert "Load and prefix-cache hit rate per replica" in page
    assert "KV cache and queues over time" not in page          # one engine's figure: not for a fleet
    for name in ("replica-0", "replica-1", "replica-2"):
        assert f"<td>{name}</td>" in page


def test_a_sweep_over_cluster_keys_runs_each_fleet(tmp_path):
    from kvsim.scenario.sweep import run_sweep
    sc = scenario()
    sc["workload"]["num_requests"] = 24
    sc["sweep"] = {"grid": {"cluster.replicas": [1, 2], "cluster.router": ["round_robin", "prefix_aware"]}}
    outcome = run_sweep(sc, tmp_path, workers=1, progress=False)
    assert outcome.num_done == 4
    rows = pd.read_csv(outcome.results_csv)
    assert rows["num_replicas"].tolist() == rows["cluster.replicas"].tolist() == [1, 1, 2, 2]
    assert rows["router"].tolist() == ["round_robin", "prefix_aware"] * 2
    assert (rows["completed"] == 24).all() and rows["slo_attainment"].notna().all()


@pytest.mark.parametrize("values, message", [
    ({"cluster.router": ["round_robin", "fastest"]}, r"cluster.router='fastest'.*cluster.router.policy: got 'fastest'"),
    ({"cluster.replicas": [2, 0]}, r"cluster.replicas=0.*cluster.replicas: got 0"),
])
def test_a_bad_cluster_value_in_a_sweep_stops_it_before_anything_runs(values, message):
    from kvsim.scenario.sweep_points import SweepError, validate_sweep
    sc = scenario() | {"sweep": {"grid": values}}
    with pytest.raises(SweepError, match=message):
        validate_sweep(sc)
