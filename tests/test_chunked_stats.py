"""kvsim.metrics.chunked_stats: a fleet's latency statistics a chunk at a time, bit for bit
the whole array's (``summary.latency_stats`` of the values, which is numpy's, each times the
scale, as vLLM's ``np.mean(itls) * 1000``)."""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from kvsim.metrics import chunked_stats
from kvsim.metrics.summary import latency_stats, scaled_latency_stats, summarize


def whole(values, scale):
    stats = latency_stats("itl", np.asarray(values, dtype=float))
    return {key: value * scale for key, value in stats.items()}


def same(a: dict, b: dict) -> bool:
    """Equal floats, NaN equal to NaN, -0.0 apart from 0.0: the same bits."""
    return a.keys() == b.keys() and all(
        (math.isnan(a[k]) and math.isnan(b[k])) or (a[k] == b[k] and math.copysign(1, a[k]) == math.copysign(1, b[k]))
        for k in a)


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of a few hundred values and a small sample, for any number of values:
    every branch at test sizes."""
    monkeypatch.setattr(chunked_stats, "MIN_VALUES", 0)
    monkeypatch.setattr(chunked_stats, "CHUNK", 200)
    monkeypatch.setattr(chunked_stats, "_SAMPLE", 64)


values_strategy = st.one_of(
    hnp.arrays(np.float64, st.integers(1, 3000),
               elements=st.floats(0.0, 1.0, allow_nan=False, width=64)),
    # Few distinct values: a rank's bracket is all ties.
    hnp.arrays(np.float64, st.integers(1, 3000), elements=st.sampled_from([0.004, 0.008, 0.0081, 0.5])),
    # Sorted either way: a strided sample of a trend.
    hnp.arrays(np.float64, st.integers(1, 3000), elements=st.floats(0.0, 10.0, width=64)).map(np.sort),
    hnp.arrays(np.float64, st.integers(1, 3000), elements=st.floats(0.0, 10.0, width=64))
    .map(lambda a: np.sort(a)[::-1].copy()),
    # Any float at all: infinities, NaN, negative zero, huge and tiny.
    hnp.arrays(np.float64, st.integers(1, 600), elements=st.floats(width=64)),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=values_strategy, scale=st.sampled_from([1000.0, 1.0, 0.1]))
def test_chunked_is_the_whole_arrays_statistics_bit_for_bit(small_chunks, values, scale):
    with np.errstate(all="ignore"):         # (infinities overflow both ways alike)
        assert same(scaled_latency_stats("itl", values, scale), whole(values, scale))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=values_strategy, cuts=st.lists(st.integers(0, 3000), max_size=40), seed=st.integers(0, 2**32 - 1),
       chunked=st.booleans())
def test_in_an_order_the_statistics_of_the_values_so_ordered(small_chunks, monkeypatch, values, cuts, seed,
                                                              chunked):
    """``order``: the values cut into runs (some empty) and the runs shuffled, as a
    fleet's client pools its replicas' gaps; each statistic is the one of the values
    in that order, bit for bit, a chunk at a time or not."""
    if not chunked:
        monkeypatch.setattr(chunked_stats, "MIN_VALUES", 1 << 40)
    bounds = sorted({0, len(values), *(c % (len(values) + 1) for c in cuts)})
    starts, counts = np.array(bounds[:-1]), np.diff(bounds)
    starts, counts = np.append(starts, len(values)), np.append(counts, 0)     # a run of nothing
    shuffle = np.random.default_rng(seed).permutation(len(starts))
    order = chunked_stats.Segments(starts[shuffle], counts[shuffle])
    ordered = np.concatenate([values[a:a + c] for a, c in zip(starts[shuffle], counts[shuffle])])
    np.testing.assert_array_equal(order.take(values), ordered)
    with np.errstate(all="ignore"):
        assert same(scaled_latency_stats("itl", values, 1000.0, order), whole(ordered, 1000.0))


@pytest.mark.parametrize("chunked", [True, False])
@pytest.mark.parametrize("seed", [12, 135])
def test_gaps_pooled_in_another_order_are_that_orders_floats(small_chunks, monkeypatch, chunked, seed):
    # Gaps of 300 requests held in one order and pooled in another: the mean and
    # the std of the two orders differ in their last bits; the ordered ones are given.
    if not chunked:
        monkeypatch.setattr(chunked_stats, "MIN_VALUES", 1 << 40)
    rng = np.random.default_rng(seed)                    # (ones whose std differs too)
    values = rng.gamma(2.0, 0.01, 6000)
    bounds = np.unique(np.r_[0, rng.integers(0, 6000, 299), 6000])
    starts, counts = bounds[:-1], np.diff(bounds)
    shuffle = rng.permutation(len(starts))
    order = chunked_stats.Segments(starts[shuffle], counts[shuffle])
    ordered = order.take(values)
    assert np.mean(ordered) != np.mean(values) and np.std(ordered) != np.std(values)
    assert same(scaled_latency_stats("itl", values, 1000.0, order), whole(ordered, 1000.0))


@pytest.mark.parametrize("ordered", [False, True])
def test_many_chunks_are_read_on_threads_with_the_same_floats(small_chunks, monkeypatch, ordered):
    # 60 chunks of 200 values: read on three threads (each with its own scratch),
    # the sums added in the tree's order; the floats of numpy on the whole array.
    rng = np.random.default_rng(21)
    values = rng.gamma(2.0, 0.01, 12_000)
    values[rng.integers(0, len(values), 2000)] = 0.0081           # ties across chunks
    order = None
    if ordered:
        bounds = np.unique(np.r_[0, rng.integers(0, len(values), 400), len(values)])
        shuffle = rng.permutation(len(bounds) - 1)
        order = chunked_stats.Segments(bounds[:-1][shuffle], np.diff(bounds)[shuffle])
    threads = []
    real = chunked_stats.ThreadPoolExecutor
    monkeypatch.setattr(chunked_stats, "_threads", lambda: 3)
    monkeypatch.setattr(chunked_stats, "ThreadPoolExecutor",
                        lambda n, **kw: threads.append(n) or real(n, **kw))
    got = scaled_latency_stats("itl", values, 1000.0, order)
    assert threads == [3, 3]                                      # both passes
    expected = whole(values if order is None else order.take(values), 1000.0)
    assert same(got, expected)


def test_an_order_must_hold_every_value():
    three = chunked_stats.Segments(np.array([0]), np.array([3]))
    with pytest.raises(ValueError, match="an order of 3 values for 4 values"):
        chunked_stats.mean_std_ranks(np.ones(4), [1], three)
    with pytest.raises(ValueError, match="an order of 3 values for 4 values"):
        scaled_latency_stats("itl", np.ones(4), 1000.0, three)


def test_a_sample_that_misleads_falls_back_to_a_copy_with_the_same_result(small_chunks, monkeypatch):
    # The values the sample sees spread over [0, 1], every other one is 2.0: the
    # median's bracket lies below 1 and misses its ranks, which the full copy selects.
    calls = []
    by_copy = chunked_stats._ranks_by_copy
    monkeypatch.setattr(chunked_stats, "_ranks_by_copy", lambda *a: calls.append(1) or by_copy(*a))
    monkeypatch.setattr(chunked_stats, "_SAMPLE", 640)
    values = np.full(30_000, 2.0)
    seen = values[::30_000 // 640]
    seen[:] = np.linspace(0.0, 1.0, len(seen))
    assert same(scaled_latency_stats("itl", values, 1000.0), whole(values, 1000.0))
    assert calls == [1]


def test_the_brackets_hold_the_ranks_of_ordinary_gaps(small_chunks, monkeypatch):
    monkeypatch.setattr(chunked_stats, "_ranks_by_copy", lambda *a: pytest.fail("fell back"))
    rng = np.random.default_rng(7)
    values = rng.gamma(2.0, 0.005, 20_000)
    assert same(scaled_latency_stats("itl", values, 1000.0), whole(values, 1000.0))


def test_tree_sum_is_numpys_pairwise_sum(small_chunks):
    rng = np.random.default_rng(3)
    for n in (1, 7, 8, 129, 200, 201, 1000, 4099, 12_345):
        x = rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)
        got = chunked_stats.tree_sum(n, lambda lo, m: np.add.reduce(x[lo:lo + m]))
        assert got == np.add.reduce(x), n


def test_at_full_size_with_the_real_chunks():
    # 5 M values: the tree above the real 1 M-value chunks, against numpy on the whole array.
    rng = np.random.default_rng(11)
    values = rng.gamma(2.0, 0.005, 4 * chunked_stats.CHUNK + 1_000_003)
    values[rng.integers(0, len(values), len(values) // 10)] = 0.0081
    assert same(scaled_latency_stats("itl", values, 1000.0), whole(values, 1000.0))


def test_summarize_takes_the_chunked_path_for_many_gaps_and_the_same_summary(monkeypatch):
    requests = {"arrival_time_s": np.array([0.0, 1.0]), "first_token_time_s": np.array([0.5, 1.2]),
                "finish_time_s": np.array([2.0, 3.0]), "num_output_tokens": np.array([4, 5]),
                "num_prompt_tokens": np.array([10, 20]), "num_preemptions": np.array([0, 0]),
                "num_cached_tokens": np.array([0, 0]), "scheduled_time_s": np.array([0.1, 1.1]),
                "status": np.array(["completed", "completed"], dtype=object)}
    steps = {"kv_cache_usage": np.array([0.5]), "duration_s": np.array([1.0]),
             "num_running": np.array([2]), "num_scheduled_reqs": np.array([2])}
    itl = np.random.default_rng(5).gamma(2.0, 0.005, 5000)
    before = summarize(requests, steps, itl, num_gpu_blocks=10)
    calls = []
    real = chunked_stats.mean_std_ranks
    monkeypatch.setattr(chunked_stats, "mean_std_ranks", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(chunked_stats, "MIN_VALUES", 1000)
    monkeypatch.setattr(chunked_stats, "CHUNK", 300)
    after = summarize(requests, steps, itl, num_gpu_blocks=10)
    assert calls == [1]
    assert same(after, before)
