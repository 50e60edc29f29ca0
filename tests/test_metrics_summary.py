"""The run summary: vLLM ``bench serve`` definitions on hand-computed tiny runs."""

import json
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.metrics.schema import REQUEST_COLUMNS, STEP_COLUMNS
from kvsim.metrics.summary import (
    LATENCY_KEYS,
    SUMMARY_KEYS,
    check_slo,
    format_summary,
    latency_stats,
    median_p90_p99,
    std_overwriting,
    summarize,
)

NAN = float("nan")


def make_requests(rows):
    """rows: (arrival, scheduled, first, finish, prompt, output, cached, preempt, status)."""
    records = []
    for i, (arr, sch, first, fin, n_in, n_out, cached, pre, status) in enumerate(rows):
        records.append({
            "request_id": f"r{i}", "arrival_time_s": arr, "scheduled_time_s": sch,
            "first_token_time_s": first, "finish_time_s": fin, "num_prompt_tokens": n_in,
            "num_output_tokens": n_out, "num_cached_tokens": cached, "num_preemptions": pre,
            "priority": 0, "status": status,
            "fail_reason": "" if status == "completed" else "prompt too long",
        })
    return pd.DataFrame(records, columns=REQUEST_COLUMNS)


def make_steps(rows):
    """rows: (start, duration, kv_usage, num_running, num_scheduled_reqs)."""
    records = []
    for i, (start, dur, usage, running, sched) in enumerate(rows):
        records.append({
            "step": i, "start_time_s": start, "duration_s": dur, "num_prefill_tokens": 0,
            "num_decode_tokens": sched, "num_scheduled_reqs": sched, "num_running": running,
            "num_waiting": 0, "num_preempted": 0, "num_finished": 0, "num_free_blocks": 0,
            "kv_cache_usage": usage,
        })
    return pd.DataFrame(records, columns=STEP_COLUMNS)


# Times are binary fractions so every expected value below is exact.
# r0: TTFT 250 ms, E2EL 1000 ms, 4 tokens -> TPOT 750/3 = 250 ms, ITL 3 x 250 ms
# r1: TTFT 500 ms, E2EL 500 ms, 1 token -> no TPOT sample (TPOT 0 for goodput)
# r2: failed at 2.0 s, never scheduled
REQUESTS = make_requests([
    (0.0, 0.0, 0.25, 1.0, 12, 4, 0, 0, "completed"),
    (0.5, 0.5, 1.0, 1.0, 20, 1, 16, 1, "completed"),
    (0.75, NAN, NAN, 2.0, 30, 0, 0, 0, "failed"),
])
ITL_S = np.array([0.25, 0.25, 0.25])
STEPS = make_steps([
    (0.0, 0.25, 0.5, 1, 1),
    (0.25, 0.75, 0.25, 2, 2),
])


def tiny_summary(slo=None):
    return summarize(REQUESTS, STEPS, ITL_S, num_gpu_blocks=64, slo=slo)


def test_summary_has_every_key_in_order():
    assert list(tiny_summary()) == SUMMARY_KEYS


def test_counts_completed_and_failed_separately():
    s = tiny_summary()
    assert (s["completed"], s["failed"]) == (2, 1)


def test_duration_runs_from_first_arrival_to_last_finish_including_failed():
    assert tiny_summary()["duration"] == 2.0


def test_token_totals_count_completed_requests_only():
    s = tiny_summary()
    assert (s["total_input_tokens"], s["total_output_tokens"]) == (32, 5)


def test_throughputs_divide_by_duration():
    s = tiny_summary()
    assert s["request_throughput"] == 1.0
    assert s["output_throughput"] == 2.5
    assert s["total_token_throughput"] == 18.5


def test_ttft_statistics():
    s = tiny_summary()
    assert s["mean_ttft_ms"] == 375.0
    assert s["median_ttft_ms"] == 375.0
    assert s["std_ttft_ms"] == 125.0          # population std, as numpy's default
    assert s["p90_ttft_ms"] == 475.0          # linear interpolation: 250 + 0.9 * 250
    assert s["p99_ttft_ms"] == 497.5


def test_tpot_excludes_requests_with_a_single_output_token():
    s = tiny_summary()
    assert s["mean_tpot_ms"] == 250.0
    assert s["std_tpot_ms"] == 0.0
    assert s["p99_tpot_ms"] == 250.0


def test_itl_statistics_come_from_the_gap_array():
    s = tiny_summary()
    assert s["mean_itl_ms"] == 250.0
    assert s["p99_itl_ms"] == 250.0


def test_e2el_statistics():
    s = tiny_summary()
    assert s["mean_e2el_ms"] == 750.0
    assert s["median_e2el_ms"] == 750.0
    assert s["std_e2el_ms"] == 250.0
    assert s["p90_e2el_ms"] == 950.0
    assert s["p99_e2el_ms"] == 995.0


def test_failed_requests_do_not_enter_latency_statistics():
    with_failure = tiny_summary()
    only_completed = summarize(REQUESTS.iloc[:2], STEPS, ITL_S, num_gpu_blocks=64)
    for key in LATENCY_KEYS:
        assert with_failure[key] == only_completed[key], key


def test_preemptions_sum_over_requests():
    assert tiny_summary()["num_preemptions"] == 1


def test_prefix_cache_hit_rate_is_cached_over_prompt_tokens_of_scheduled_requests():
    # r2 never reached the scheduler, so its 30 prompt tokens were never looked up.
    assert tiny_summary()["prefix_cache_hit_rate"] == 16 / 32


def test_kv_cache_usage_mean_is_weighted_by_step_duration():
    # (0.5 * 0.25 + 0.25 * 0.75) / 1.0; the plain mean would be 0.375
    assert tiny_summary()["kv_cache_usage_mean"] == 0.3125


def test_kv_cache_usage_mean_falls_back_to_plain_mean_for_zero_length_steps():
    steps = make_steps([(0.0, 0.0, 0.5, 1, 1), (0.0, 0.0, 0.25, 1, 1)])
    s = summarize(REQUESTS, steps, ITL_S, num_gpu_blocks=64)
    assert s["kv_cache_usage_mean"] == 0.375


def test_step_figures():
    s = tiny_summary()
    assert s["kv_cache_usage_max"] == 0.5
    assert s["max_concurrent_requests"] == 2
    assert s["mean_batch_size"] == 1.5
    assert s["num_gpu_blocks"] == 64


def test_goodput_is_nan_without_slo():
    assert math.isnan(tiny_summary()["request_goodput"])


@pytest.mark.parametrize("slo, good", [
    ({"ttft_ms": 300}, 1),                     # r0 (250) meets it, r1 (500) does not
    ({"tpot_ms": 200}, 1),                     # r0 (250) misses; r1 has TPOT 0 (one token)
    ({"e2el_ms": 500}, 1),                     # the limit is inclusive: r1 at exactly 500
    ({"ttft_ms": 500, "e2el_ms": 1000}, 2),
    ({"ttft_ms": 300, "e2el_ms": 500}, 0),     # a request must meet every SLO
])
def test_goodput_counts_requests_meeting_every_slo(slo, good):
    assert tiny_summary(slo)["request_goodput"] == good / 2.0


def test_slo_accepts_vllm_cli_key_names():
    assert check_slo({"ttft": 300, "tpot": 50}) == {"ttft_ms": 300.0, "tpot_ms": 50.0}


def test_unknown_slo_key_is_rejected_with_the_allowed_ones():
    with pytest.raises(ValueError, match=r"slo\.itl_ms: unknown SLO; allowed: ttft_ms, tpot_ms"):
        check_slo({"itl_ms": 10})


def test_negative_slo_is_rejected():
    with pytest.raises(ValueError, match=r"slo\.ttft_ms: -1"):
        check_slo({"ttft_ms": -1})


def test_no_completed_request_gives_nan_latencies_and_zero_throughput():
    failed = REQUESTS.iloc[2:]
    s = summarize(failed, STEPS, np.array([]), num_gpu_blocks=64, slo={"ttft_ms": 100})
    assert (s["completed"], s["failed"]) == (0, 1)
    assert all(math.isnan(s[key]) for key in LATENCY_KEYS)
    assert s["request_throughput"] == 0.0
    assert s["request_goodput"] == 0.0
    assert math.isnan(s["prefix_cache_hit_rate"])


def test_empty_run_has_nan_duration_and_rates():
    s = summarize(REQUESTS.iloc[:0], STEPS.iloc[:0], np.array([]), num_gpu_blocks=8)
    assert s["completed"] == 0
    assert math.isnan(s["duration"])
    assert math.isnan(s["request_throughput"])
    assert math.isnan(s["kv_cache_usage_mean"])
    assert s["max_concurrent_requests"] == 0


def test_summary_values_are_plain_python_numbers_and_json_serialisable():
    s = tiny_summary({"ttft_ms": 300})
    assert all(type(v) in (int, float) for v in s.values())
    assert json.loads(json.dumps(s)) == s


def test_percentiles_match_numpy_on_random_runs():
    rng = np.random.default_rng(7)
    n = 500
    arrival = np.sort(rng.uniform(0, 100, n))
    ttft = rng.lognormal(-2, 1, n)
    n_out = rng.integers(1, 200, n)
    tpot = rng.lognormal(-4, 0.3, n)
    finish = arrival + ttft + (n_out - 1) * tpot
    requests = make_requests([
        (a, a, a + t, f, 100, int(k), 0, 0, "completed")
        for a, t, f, k in zip(arrival, ttft, finish, n_out)])
    itl = rng.lognormal(-4, 0.5, 3000)
    s = summarize(requests, STEPS, itl, num_gpu_blocks=1)
    multi = n_out > 1
    expected_tpot = ((finish - arrival - ttft) / np.maximum(n_out - 1, 1))[multi] * 1000
    for metric, values in (("ttft", ttft * 1000), ("itl", itl * 1000),
                           ("e2el", (finish - arrival) * 1000), ("tpot", expected_tpot)):
        assert s[f"median_{metric}_ms"] == pytest.approx(np.median(values), rel=1e-12)
        assert s[f"p90_{metric}_ms"] == pytest.approx(np.percentile(values, 90), rel=1e-12)
        assert s[f"p99_{metric}_ms"] == pytest.approx(np.percentile(values, 99), rel=1e-12)
        assert s[f"std_{metric}_ms"] == pytest.approx(np.std(values), rel=1e-9)


def test_completed_request_without_first_token_time_is_an_error():
    bad = make_requests([(0.0, 0.0, NAN, 1.0, 4, 2, 0, 0, "completed")])
    with pytest.raises(ValueError, match="first_token_time_s"):
        summarize(bad, STEPS, np.array([0.5]), num_gpu_blocks=1)


def test_format_summary_prints_the_vllm_style_block():
    text = format_summary(tiny_summary({"ttft_ms": 300}))
    lines = text.splitlines()
    assert lines[0] == "============ Serving Benchmark Result ============"
    assert lines[-1] == "=" * 50
    assert "Successful requests:                     2" in text
    assert "Request goodput (req/s):                 0.50" in text
    assert "P99 TTFT (ms):                           497.50" in text
    assert "Prefix cache hit rate (%):               50.00" in text


def test_format_summary_shows_nan_as_not_available_and_omits_goodput_without_slo():
    text = format_summary(summarize(REQUESTS.iloc[2:], STEPS, np.array([]), num_gpu_blocks=1))
    assert "Mean TTFT (ms):                          n/a" in text
    assert "goodput" not in text


_SAMPLES = st.lists(st.one_of(st.floats(min_value=0.0, max_value=1e6, allow_subnormal=True),
                              st.sampled_from([0.0, 0.1, 0.2, 5e-324, 1e300]),
                              st.just(float("nan"))),
                    min_size=1, max_size=60)


@settings(max_examples=400, deadline=None)
@given(_SAMPLES)
def test_median_p90_p99_are_numpys_bit_for_bit(values):
    # The summary's one-copy order statistics against np.median and
    # np.percentile(.., [90, 99]) themselves: the same bits (NaN included), and
    # the input left as it was.
    v = np.array(values, dtype=float)
    before = v.tobytes()
    got = np.array(median_p90_p99(v))
    want = np.array([np.median(v), *np.percentile(v, [90, 99])])
    assert got.tobytes() == want.tobytes()
    assert v.tobytes() == before
    # In place (a caller's scratch array): the same bits, the same values reordered.
    scratch = v.copy()
    assert np.array(median_p90_p99(scratch, in_place=True)).tobytes() == want.tobytes()
    assert np.sort(scratch).tobytes() == np.sort(v).tobytes()


@settings(max_examples=200, deadline=None)
@given(_SAMPLES)
def test_latency_stats_on_a_scratch_array_are_the_same_bits(values):
    # reorder=True (summarize's temporaries) partitions the array itself: the mean
    # and standard deviation still come from the values in their order.
    v = np.array(values, dtype=float)
    with np.errstate(over="ignore"):                # the std of 1e300s overflows (inf) either way
        want = latency_stats("itl", v)
        got = latency_stats("itl", v.copy(), reorder=True)
    assert np.array(list(got.values())).tobytes() == np.array(list(want.values())).tobytes()
    assert list(got) == list(want)


@settings(max_examples=300, deadline=None)
@given(_SAMPLES)
def test_std_overwriting_is_numpys_std_bit_for_bit(values):
    # Its own array as the scratch of the deviations: the same bits as np.std
    # (NaN, overflow to inf included); a remade array gives the same statistics.
    v = np.array(values, dtype=float)
    with np.errstate(over="ignore", invalid="ignore"):
        want = np.std(v)
        scratch = v.copy()
        assert np.float64(std_overwriting(scratch)).tobytes() == want.tobytes()
        if not np.isnan(v).any() and not np.isinf(want):
            assert not np.array_equal(scratch, v) or np.all(v == v[0])   # it was overwritten
        stats = latency_stats("itl", v.copy(), reorder=True,
                              remake=lambda out: np.copyto(out, v))
        plain = latency_stats("itl", v)
    assert np.array(list(stats.values())).tobytes() == np.array(list(plain.values())).tobytes()


@pytest.mark.parametrize("n", [8, 9, 1000, 65_537, 1_000_003])
def test_std_overwriting_on_large_arrays(n):
    # numpy sums pairwise in blocks: long arrays take other paths than short ones.
    rng = np.random.default_rng(n)
    for v in (rng.gamma(2.0, 10.0, n), rng.random(n) * 1e-3, np.full(n, 7.5)):
        assert np.float64(std_overwriting(v.copy())).tobytes() == np.std(v).tobytes()


@pytest.mark.parametrize("n", [1, 2, 3, 10, 11, 100, 101, 1000, 100_001])
def test_median_p90_p99_on_large_and_tied_samples(n):
    rng = np.random.default_rng(n)
    for v in (rng.gamma(2.0, 10.0, n), np.round(rng.gamma(2.0, 10.0, n), 1), np.full(n, 7.5)):
        got = np.array(median_p90_p99(v))
        assert got.tobytes() == np.array([np.median(v), *np.percentile(v, [90, 99])]).tobytes()


def _vllm_calculate_metrics(ttfts, tpots, itls, e2els):
    """The statistics of vLLM's ``calculate_metrics`` (vllm/benchmarks/serve.py), as
    written there: each of the lists of seconds, times 1000."""
    out = {}
    for metric, xs in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        out[f"mean_{metric}_ms"] = np.mean(xs or 0) * 1000
        out[f"median_{metric}_ms"] = np.median(xs or 0) * 1000
        out[f"std_{metric}_ms"] = np.std(xs or 0) * 1000
        out[f"p90_{metric}_ms"] = np.percentile(xs or 0, 90) * 1000
        out[f"p99_{metric}_ms"] = np.percentile(xs or 0, 99) * 1000
    return out


def test_statistics_are_vllms_arithmetic_bit_for_bit():
    """Each statistic of the seconds, times 1000, as vLLM computes it: not the
    statistic of the values in ms, which differs in the last bits (it does here)."""
    rng = np.random.default_rng(11)
    n = 400
    arrival = np.sort(rng.uniform(0, 100, n))
    ttft = rng.lognormal(-2, 1, n)
    n_out = rng.integers(1, 50, n)
    finish = arrival + ttft + (n_out - 1) * rng.lognormal(-4, 0.3, n)
    requests = make_requests([(a, a, a + t, f, 100, int(k), 0, 0, "completed")
                              for a, t, f, k in zip(arrival, ttft, finish, n_out)])
    itl = rng.lognormal(-4, 0.5, 3001)
    s = summarize(requests, STEPS, itl, num_gpu_blocks=1)
    ttfts = list(requests["first_token_time_s"] - requests["arrival_time_s"])
    e2els = list(requests["finish_time_s"] - requests["arrival_time_s"])
    tpots = [(e - t) / (k - 1) for e, t, k in zip(e2els, ttfts, n_out) if k > 1]
    expected = _vllm_calculate_metrics(ttfts, tpots, list(itl), e2els)
    assert {k: s[k] for k in expected} == expected
    # (The old arithmetic, statistics of the values in ms, is not these floats.)
    in_ms = latency_stats("itl", itl * 1000)
    assert any(in_ms[k] != expected[k] for k in in_ms)


def test_goodput_compares_the_limit_in_seconds_as_vllm():
    """vLLM counts a request good when ``slo_ms / 1000 >= value_s``: at 394.3 ms a TTFT
    of 0.39430000000000004 s is over the limit, though its value in ms (394.3) is not."""
    ttft = 0.39430000000000004
    assert ttft * 1000.0 <= 394.3 and not 394.3 / 1000 >= ttft
    requests = make_requests([(0.0, 0.0, ttft, 1.0, 12, 4, 0, 0, "completed"),
                              (0.0, 0.0, 0.25, 1.0, 12, 4, 0, 0, "completed")])
    s = summarize(requests, STEPS, np.array([0.25]), num_gpu_blocks=1, slo={"ttft_ms": 394.3})
    assert s["request_goodput"] == 1 / s["duration"]
