"""Bounded-memory statistics agree with the full-table summary."""

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from kvsim.metrics.schema import REQUEST_COLUMNS, STEP_COLUMNS
from kvsim.metrics.streaming import LogHistogram, StreamingStats
from kvsim.metrics.summary import LATENCY_KEYS, SUMMARY_KEYS, summarize

BOUND = 0.005  # the documented relative error of percentiles


def random_run(seed: int, n: int = 3000):
    rng = np.random.default_rng(seed)
    arrival = np.sort(rng.uniform(0, 600, n))
    failed = rng.random(n) < 0.05
    ttft = rng.lognormal(-1.5, 1.2, n)
    n_out = rng.integers(1, 300, n)
    gaps = [rng.lognormal(-3.5, 0.4, k - 1) for k in n_out]
    finish = arrival + ttft + np.array([g.sum() for g in gaps])
    scheduled = np.where(rng.random(n) < 0.03, np.nan, arrival + ttft / 2)
    requests = pd.DataFrame({
        "request_id": [f"r{i}" for i in range(n)],
        "arrival_time_s": arrival,
        "scheduled_time_s": np.where(failed, scheduled, arrival + ttft / 2),
        "first_token_time_s": np.where(failed, np.nan, arrival + ttft),
        "finish_time_s": finish,
        "num_prompt_tokens": rng.integers(1, 4000, n),
        "num_output_tokens": np.where(failed, 0, n_out),
        "num_cached_tokens": rng.integers(0, 500, n),
        "num_preemptions": rng.poisson(0.2, n),
        "priority": 0,
        "status": np.where(failed, "failed", "completed"),
        "fail_reason": np.where(failed, "too long", ""),
    }, columns=REQUEST_COLUMNS)
    itl_s = np.concatenate([g for g, bad in zip(gaps, failed) if not bad])
    m = 5000
    steps = pd.DataFrame({
        "step": np.arange(m), "start_time_s": np.cumsum(rng.uniform(0.01, 0.2, m)),
        "duration_s": rng.uniform(0.01, 0.2, m), "num_prefill_tokens": 0,
        "num_decode_tokens": 0, "num_scheduled_reqs": rng.integers(1, 256, m),
        "num_running": rng.integers(1, 256, m), "num_waiting": 0, "num_preempted": 0,
        "num_finished": 0, "num_free_blocks": 0, "kv_cache_usage": rng.uniform(0, 1, m),
    }, columns=STEP_COLUMNS)
    return requests, steps, itl_s, gaps, failed


SLO = {"ttft_ms": 400, "tpot_ms": 40, "e2el_ms": 8000}


def assert_matches_exact(streamed: dict, exact: dict):
    assert list(streamed) == SUMMARY_KEYS
    for key in SUMMARY_KEYS:
        if key in LATENCY_KEYS and not key.startswith(("mean_", "std_")):
            assert streamed[key] == pytest.approx(exact[key], rel=BOUND), key
        elif isinstance(exact[key], int):
            assert streamed[key] == exact[key], key
        else:
            assert streamed[key] == pytest.approx(exact[key], rel=1e-9), key


def test_streaming_chunks_match_summarize_on_random_run():
    requests, steps, itl_s, _, _ = random_run(seed=1)
    exact = summarize(requests, steps, itl_s, num_gpu_blocks=4096, slo=SLO)
    stats = StreamingStats(slo=SLO)
    for start in range(0, len(requests), 700):
        stats.add_requests(requests.iloc[start:start + 700])
    for start in range(0, len(steps), 1000):
        stats.add_steps(steps.iloc[start:start + 1000])
    stats.add_itl(itl_s)
    assert_matches_exact(stats.summary(num_gpu_blocks=4096), exact)


def test_streaming_scalar_calls_match_summarize():
    requests, steps, itl_s, gaps, failed = random_run(seed=2, n=1500)
    exact = summarize(requests, steps, itl_s, num_gpu_blocks=100, slo=SLO)
    stats = StreamingStats(slo=SLO)
    for row, g, bad in zip(requests.itertuples(index=False), gaps, failed):
        stats.add_request(
            arrival_time_s=row.arrival_time_s, scheduled_time_s=row.scheduled_time_s,
            first_token_time_s=row.first_token_time_s, finish_time_s=row.finish_time_s,
            num_prompt_tokens=row.num_prompt_tokens, num_output_tokens=row.num_output_tokens,
            num_cached_tokens=row.num_cached_tokens, num_preemptions=row.num_preemptions,
            status=row.status)
        if not bad:
            stats.add_itl(g)
    for row in steps.itertuples(index=False):
        stats.add_step(duration_s=row.duration_s, kv_cache_usage=row.kv_cache_usage,
                       num_running=row.num_running, num_scheduled_reqs=row.num_scheduled_reqs)
    assert_matches_exact(stats.summary(num_gpu_blocks=100), exact)


def test_empty_streaming_stats_match_empty_summary():
    requests, steps, _, _, _ = random_run(seed=3, n=10)
    exact = summarize(requests.iloc[:0], steps.iloc[:0], np.array([]), num_gpu_blocks=1)
    streamed = StreamingStats().summary(num_gpu_blocks=1)
    for key in SUMMARY_KEYS:
        assert (streamed[key] == exact[key]
                or (math.isnan(streamed[key]) and math.isnan(exact[key]))), key


def test_histogram_percentiles_stay_within_half_a_percent_over_many_magnitudes():
    rng = np.random.default_rng(4)
    samples = np.exp(rng.uniform(math.log(0.01), math.log(1e6), 20000))
    hist = LogHistogram()
    hist.add(samples)
    assert hist.relative_error_bound <= BOUND
    for q in (0.1, 1, 10, 25, 50, 75, 90, 99, 99.9):
        exact = np.percentile(samples, q)
        assert abs(hist.percentile(q) - exact) <= BOUND * exact, q


def test_histogram_extremes_are_exact():
    hist = LogHistogram()
    hist.add([3.7, 120.25, 0.0, 9e9])  # 0 below range, 9e9 above it
    assert hist.percentile(0) == 0.0
    assert hist.percentile(100) == 9e9


def test_histogram_mean_and_std_are_exact_across_chunks():
    rng = np.random.default_rng(5)
    samples = rng.lognormal(3, 2, 10000)
    hist = LogHistogram()
    for chunk in np.array_split(samples, 37):
        hist.add(chunk)
    assert hist.count == 10000
    assert hist.mean == pytest.approx(samples.mean(), rel=1e-12)
    assert hist.std == pytest.approx(samples.std(), rel=1e-10)


def test_histogram_memory_does_not_grow_with_samples():
    hist = LogHistogram()
    bins = len(hist._counts)
    hist.add(np.ones(100000))
    assert len(hist._counts) == bins < 3000


def test_histogram_rejects_nan_samples():
    with pytest.raises(ValueError, match="NaN"):
        LogHistogram().add([1.0, float("nan")])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=1e-3, max_value=1e7), min_size=1, max_size=300),
       st.floats(min_value=0, max_value=100))
def test_any_percentile_of_in_range_samples_is_within_the_bound(samples, q):
    hist = LogHistogram()
    hist.add(samples)
    exact = np.percentile(samples, q)
    assert abs(hist.percentile(q) - exact) <= BOUND * exact
