"""metrics.csv with KV offload tiers: vLLM 0.33's prefix-cache counters split between
the GPU cache and the KV connector, hand-worked to exact values.

vLLM (``Scheduler.schedule``, ``PrefixCacheStats.record``, ``PrometheusStatLogger.record``)
counts, when a request is first admitted: ``prefix_cache_queries`` += its tokens,
``prefix_cache_hits`` += its GPU hit, ``external_prefix_cache_queries`` += tokens
past the GPU hit, ``external_prefix_cache_hits`` += the tokens the connector
supplies; a request that loads asynchronously is admitted (and counted) in the
step that starts its load.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from helpers import spec
from test_kv_offload_scenarios import base
from test_offload_engine import A, C, CONFIG, connector

import kvsim
from kvsim.metrics.prometheus import prometheus_series
from kvsim.metrics.schema import CONNECTOR_REQUEST_COLUMNS, REQUEST_COLUMNS
from kvsim.scenario.kv_offload import with_connector_columns
from kvsim.scenario.result import requests_frame, steps_frame
from kvsim.sim.run import run_engine
from kvsim.vllm_outputs import write_vllm_outputs

PREFIX = ["vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
          "vllm:external_prefix_cache_queries_total", "vllm:external_prefix_cache_hits_total"]


def series(c):
    # test_offload_engine's first case: A (32 tokens) at 0, C (32 others) at 2.0
    # evicts A's last 6 GPU blocks, B (A + 4 tokens) at 4.0 hits A's first 2
    # blocks on the GPU (8 tokens) and loads 24 from the CPU tier 4.0 -> 5.5.
    specs = [spec("A", A, max_tokens=1), spec("C", C, max_tokens=1, arrival=2.0),
             spec("B", A + [7, 7, 7, 7], max_tokens=1, arrival=4.0)]
    engine = run_engine(specs, CONFIG, connector=c)
    requests, steps = requests_frame(engine.done), steps_frame(engine)
    if c is not None:
        requests = with_connector_columns(requests, c)
    return requests, prometheus_series(requests, steps, max_model_len=128)


def test_the_requests_table_carries_the_gpu_and_connector_split():
    requests, _ = series(connector())
    assert list(requests.columns) == REQUEST_COLUMNS + CONNECTOR_REQUEST_COLUMNS
    rows = requests.set_index("request_id")
    assert rows.loc["B", "num_cached_tokens"] == 32
    assert (rows.loc["B", "num_local_cached_tokens"], rows.loc["B", "num_external_cached_tokens"]) == (8, 24)
    assert rows.loc["B", "kv_load_start_time_s"] == 4.0 and rows.loc["B", "scheduled_time_s"] == 5.5
    assert list(rows["num_local_cached_tokens"]) == [0, 0, 8]
    assert math.isnan(rows.loc["A", "kv_load_start_time_s"])


def test_gpu_hits_and_connector_hits_are_counted_apart_when_the_load_starts():
    _, m = series(connector())
    # Steps: A 0.0-1.0, C 2.0-3.0, B 5.5-6.5; scrapes every second, 0 to 7.
    # A counts at 1.0, C at 3.0 (32 queries, no hit, all 32 past the GPU hit each);
    # B when its load starts (4.0: that step runs nothing else, kvsim records no
    # step for it), not when it is scheduled (5.5): 36 queries, GPU hit 8, 28
    # external queries of which 24 hit.
    assert list(m["time_s"]) == [0, 1, 2, 3, 4, 5, 6, 7]
    assert m[PREFIX].values.tolist() == [
        [0, 0, 0, 0], [32, 0, 32, 0], [32, 0, 32, 0], [64, 0, 64, 0],
        [100, 8, 92, 24], [100, 8, 92, 24], [100, 8, 92, 24], [100, 8, 92, 24]]
    # prompt_tokens_cached counts both sources (request.num_cached_tokens) at B's
    # first token (6.5): 32 tokens (its last 4 computed).
    assert list(m["vllm:prompt_tokens_cached_total"]) == [0] * 7 + [32]


def test_without_a_connector_there_is_no_external_series_and_hits_are_the_gpus():
    requests, m = series(None)
    assert list(requests.columns) == REQUEST_COLUMNS
    assert not any("external" in col for col in m.columns)
    # B recomputes 28 tokens at 4.0 - 5.0: counted at 5.0 with its GPU hit of 8.
    assert list(m["vllm:prefix_cache_hits_total"]) == [0, 0, 0, 0, 0, 8]
    assert list(m["vllm:prefix_cache_queries_total"]) == [0, 32, 32, 64, 64, 100]


def test_a_scenario_run_writes_the_split_and_it_agrees_with_the_summary(tmp_path: Path):
    res = kvsim.simulate(base())
    k = res.summary["kv_offload"]
    write_vllm_outputs(res, tmp_path)
    m = pd.read_csv(tmp_path / "metrics.csv")
    last = m.iloc[-1]
    assert (last["vllm:prefix_cache_queries_total"], last["vllm:prefix_cache_hits_total"],
            last["vllm:external_prefix_cache_queries_total"], last["vllm:external_prefix_cache_hits_total"]) == (
        k["prefix_cache_queries"], k["prefix_cache_hits"], k["external_prefix_cache_queries"],
        k["external_prefix_cache_hits"])
    assert k["external_prefix_cache_hits"] > 0
    # The counters never decrease, and the external queries are the tokens past the GPU hit.
    for col in PREFIX:
        assert (m[col].diff().dropna() >= 0).all()
    assert (m[PREFIX[2]] == m[PREFIX[0]] - m[PREFIX[1]]).all()


def test_a_fleet_with_tiers_writes_the_split_per_replica(tmp_path: Path):
    sc = {**base(), "cluster": {"pools": [{"name": "r", "replicas": 2}], "router": {"policy": "round_robin"}}}
    res = kvsim.simulate(sc)
    k = res.summary["kv_offload"]
    assert set(CONNECTOR_REQUEST_COLUMNS) <= set(res.requests.columns)
    write_vllm_outputs(res, tmp_path)
    m = pd.read_csv(tmp_path / "metrics.csv")
    last = m.groupby("replica").tail(1)
    assert int(last["vllm:prefix_cache_hits_total"].sum()) == k["prefix_cache_hits"]
    assert int(last["vllm:external_prefix_cache_hits_total"].sum()) == k["external_prefix_cache_hits"]
