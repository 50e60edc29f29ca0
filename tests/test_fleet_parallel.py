"""A fleet whose replicas run apart, simulated in worker processes (cluster.workers,
kvsim/scenario/cluster_parallel.py), gives the one-process run's tables, summaries
and files, byte for byte."""

from __future__ import annotations

import json
import multiprocessing

import numpy as np
import pandas as pd
import pytest

from kvsim.fleet.config import parse_cluster_config
from kvsim.fleet.runner import Fleet
from kvsim.scenario import cluster as cluster_module
from kvsim.scenario import cluster_parallel
from kvsim.scenario.cluster import fleet_workers, load_cluster, simulate_cluster
from kvsim.scenario.loader import load_scenario
from kvsim.vllm_outputs import write_vllm_outputs
from tests.test_fleet_separate import scenario as separate_scenario


def scenario(cluster=None, engine=None, **workload):
    """test_fleet_separate's fleet, on 5 replicas and 120 requests."""
    return separate_scenario({"replicas": 5, **(cluster or {})}, engine,
                             **{"num_requests": 120, "arrival": {"type": "poisson", "rate": 40.0},
                                **workload})


def nan_free(obj):
    """JSON text of a summary (NaN == NaN there, unlike in the dicts)."""
    return json.dumps(obj, default=str)


def assert_same(a, b):
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.steps, b.steps)
    assert np.array_equal(a.itl_s, b.itl_s)
    assert [list(x) for x in a.replica_itls] == [list(x) for x in b.replica_itls]
    assert nan_free(a.summary) == nan_free(b.summary)
    assert nan_free(a.per_replica) == nan_free(b.per_replica)
    assert nan_free(a.per_pool) == nan_free(b.per_pool)
    assert a.stats == b.stats
    assert a.run.num_routed == b.run.num_routed


def counting_apart(monkeypatch):
    """Calls of simulate_apart (the worker processes), counted."""
    calls = []
    real = cluster_parallel.simulate_apart

    def counted(*args, **kwargs):
        calls.append(args[2])                     # workers
        return real(*args, **kwargs)

    monkeypatch.setattr(cluster_parallel, "simulate_apart", counted)
    return calls


@pytest.mark.parametrize("workers", [2, 3])
def test_workers_give_the_one_process_tables(workers, monkeypatch):
    calls = counting_apart(monkeypatch)
    one = simulate_cluster(scenario())
    many = simulate_cluster(scenario({"workers": workers}))
    assert calls == [workers]                    # the second ran in worker processes
    assert one.run.replicas and not many.run.replicas
    assert_same(one, many)
    assert many.stats.num_runs > 0 and sum(many.run.num_routed) == 120


@pytest.mark.parametrize("workers", [1, 2])
def test_the_replicas_gaps_are_held_once(workers):
    """Each replica's gaps are a view of the fleet's (W7: 0.3 GB held once, not
    twice), in the replicas' order, whichever process built them."""
    result = simulate_cluster(scenario({"workers": workers}))
    whole = result.itl_s
    assert sum(map(len, result.replica_itls)) == len(whole) > 0
    start = 0
    for part in result.replica_itls:
        assert part.base is whole or len(part) == 0
        assert np.array_equal(part, whole[start:start + len(part)])
        start += len(part)


@pytest.mark.parametrize("variant", [
    {"router": "random"},
    {"arrival": {"type": "poisson", "rate": 4000.0}},         # bursts: many arrivals in a window
    {"arrival": {"type": "all_at_once"}},
    {"n": 2},
    {"fast_path": False},
    {"replicas": 7, "num_requests": 4},                       # replicas that get no request
])
def test_variants_match(variant, monkeypatch):
    variant = dict(variant)
    fast_path = variant.pop("fast_path", True)
    cluster = {k: variant.pop(k) for k in ("router", "replicas") if k in variant}
    calls = counting_apart(monkeypatch)
    one = simulate_cluster(scenario(cluster, **variant), fast_path=fast_path)
    many = simulate_cluster(scenario({**cluster, "workers": 2}, **variant), fast_path=fast_path)
    assert calls == [2]
    assert_same(one, many)


def test_written_files_are_the_same_bytes(tmp_path):
    one = simulate_cluster(scenario())
    many = simulate_cluster(scenario({"workers": 2}))
    for name, result in (("one", one), ("many", many)):
        result.write(tmp_path / name)
        write_vllm_outputs(result, tmp_path / name, detailed=True)
    files = sorted(p.name for p in (tmp_path / "one").iterdir())
    assert "bench_serve.json" in files and "metrics.csv" in files and "steps.csv" in files
    assert files == sorted(p.name for p in (tmp_path / "many").iterdir())
    for name in files:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "many" / name).read_bytes(), name


def test_a_fleet_that_shares_a_queue_ignores_workers(monkeypatch):
    """A router that reads replica state: one process, whatever cluster.workers says."""
    calls = counting_apart(monkeypatch)
    one = simulate_cluster(scenario({"router": "least_loaded"}))
    many = simulate_cluster(scenario({"router": "least_loaded", "workers": 4}))
    assert calls == []
    assert_same(one, many)


@pytest.mark.parametrize("workload", [
    {"sessions": {"turns": 2, "think_time_s": 0.1}, "num_requests": 20},
    {"arrival": {"type": "closed_loop", "concurrency": 4}},
], ids=["sessions", "closed-loop"])
def test_requests_that_wait_share_a_queue_whatever_workers_says(workload, monkeypatch):
    calls = counting_apart(monkeypatch)
    result = simulate_cluster(scenario({"workers": 2}, **workload))
    assert calls == [] and result.run.replicas


def test_how_many_workers():
    cfg = parse_cluster_config
    assert fleet_workers(cfg({"replicas": 4}), 4) == 1                       # the default
    assert fleet_workers(cfg({"replicas": 4, "workers": 3}), 4) == 3
    assert fleet_workers(cfg({"replicas": 2, "workers": 8}), 2) == 2         # one replica each at most
    auto = fleet_workers(cfg({"replicas": 64, "workers": "auto"}), 64)
    assert auto == min(64, len(__import__("os").sched_getaffinity(0)))


def _workers_in_a_daemon(queue):
    queue.put(fleet_workers(parse_cluster_config({"replicas": 4, "workers": 4}), 4))


def test_a_daemonic_process_runs_its_fleet_itself():
    """A sweep's worker is daemonic and may not start processes: its fleet runs in it."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_workers_in_a_daemon, args=(queue,), daemon=True)
    proc.start()
    assert queue.get(timeout=60) == 1
    proc.join()


def test_a_failing_worker_is_one_error_naming_its_replicas(monkeypatch):
    def broken(*_args, **_kwargs):
        raise RuntimeError("boom in the worker")

    monkeypatch.setattr(cluster_module, "replica_tables", broken)   # the forked workers inherit it
    with pytest.raises(RuntimeError) as info:
        simulate_cluster(scenario({"workers": 2}))
    message = str(info.value)
    assert message in ("a fleet worker simulating replicas [0, 2, 4] failed: RuntimeError: boom in the worker",
                       "a fleet worker simulating replicas [1, 3] failed: RuntimeError: boom in the worker")
    assert "in broken" in info.value.__notes__[0]              # the worker's traceback, as a note


def test_only_needs_replicas_that_run_apart():
    sc = load_scenario(scenario({"router": "least_loaded"}))
    cluster, plans = load_cluster(sc)
    with pytest.raises(ValueError, match="only replicas that run apart"):
        Fleet(plans, cluster, seed=0, independent=True, only=[0])


@pytest.mark.parametrize("bad", [0, -1, "two", True, 1.5])
def test_bad_workers_is_one_line(bad):
    with pytest.raises(ValueError) as info:
        parse_cluster_config({"replicas": 2, "workers": bad})
    assert str(info.value) == (f"cluster.workers: got {bad!r}; allowed: an integer >= 1 (processes) or "
                               f"'auto' (every core this process may use)")


def test_a_worker_that_dies_is_one_line(monkeypatch):
    """A worker killed (out of memory, SIGKILL) fails the run with one line naming the key."""
    import os
    import signal

    def killed(*_args, **_kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    monkeypatch.setattr(cluster_module, "replica_tables", killed)
    with pytest.raises(ChildProcessError) as info:
        simulate_cluster(scenario({"workers": 2}))
    assert str(info.value).startswith("cluster.workers: a worker simulating replicas [")
    assert "failed: worker process died (killed by SIGKILL); fewer workers" in str(info.value)



def _replica_tables(seed: int, rows: int, gaps: int, mixed: bool = False):
    rng = np.random.default_rng(seed)
    steps = pd.DataFrame({"step": np.arange(rows), "start_time_s": rng.random(rows),
                          "num_decode_tokens": rng.integers(0, 9, rows),
                          "kv_cache_usage": rng.random(rows).astype(np.float32)})
    if mixed:
        steps["note"] = pd.array(rng.choice(["a", None], rows), dtype="string")
    return cluster_module.ReplicaTables(requests=pd.DataFrame(), steps=steps, itl=rng.random(gaps),
                                        summary={}, stats=None, order=np.zeros(0, dtype=np.int64),
                                        gap_counts=np.zeros(0, dtype=np.int64))


@pytest.mark.parametrize("mixed", [False, True])
def test_the_fleets_tables_are_the_replicas_concatenated_each_let_go_of(mixed):
    # Each replica's steps and gaps copied into the fleet's, in order, as
    # pd.concat and np.concatenate make them (names, dtypes, values, index),
    # and each replica's own table dropped once copied in (the driver's peak),
    # an empty replica included; a column that is not plain numpy goes
    # through pd.concat.
    sizes = [(50, 70), (0, 0), (13, 5), (200, 1)]
    tables = [_replica_tables(k, rows, gaps, mixed) for k, (rows, gaps) in enumerate(sizes)]
    want_steps = pd.concat([t.steps for t in tables], ignore_index=True)
    want_itl = np.concatenate([t.itl for t in tables])
    steps, itl = cluster_module._fleet_steps_and_gaps(tables)
    pd.testing.assert_frame_equal(steps, want_steps)
    assert list(steps.dtypes) == list(want_steps.dtypes)
    assert itl.dtype == want_itl.dtype and itl.tobytes() == want_itl.tobytes()
    if not mixed:
        assert all(t.steps is None and t.itl is None for t in tables)
