"""metrics.csv (vLLM's Prometheus series) and bench_serve.json (vllm bench serve --save-result)."""

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import yaml

from kvsim.metrics.bench_json import bench_serve_result, per_request_itls
from kvsim.metrics.prometheus import _le, prometheus_series, request_tokens_buckets
from kvsim.scenario.simulate import simulate

# Two requests, 0.1 s per step: r0 (t=0) and r1 (t=0.25) share a 16-token system prompt.
#   step 0 [0.0, 0.1]: r0 prefill 32     step 3 [0.3, 0.4]: r0 decode (done), r1 prefill 16 (16 hit)
#   steps 1-2: r0 decodes                steps 4-6: r1 decodes, done at 0.7
TWO = {"model": "llama-3.1-8b", "engine": {"max_model_len": 1024, "block_size": 16},
       "cost_model": {"type": "constant", "step_time_s": 0.1},
       "workload": {"num_requests": 2, "arrival": {"type": "constant", "interval_s": 0.25},
                    "prompt_len": {"type": "fixed", "value": 16}, "output_len": {"type": "fixed", "value": 4},
                    "prefix": {"shared_prompt_tokens": 16}}}
SUCCESS = 'vllm:request_success_total{finished_reason="length"}'


@pytest.fixture(scope="module")
def two():
    result = simulate(TWO)
    return result, prometheus_series(result.requests, result.steps, max_model_len=1024, interval_s=0.25)


def test_one_row_per_scrape_from_zero_to_past_the_end(two):
    _, series = two
    assert series["time_s"].tolist() == [0.0, 0.25, 0.5, 0.75]


def test_gauges_are_the_state_after_the_last_step_before_the_scrape(two):
    _, series = two
    assert series["vllm:num_requests_running"].tolist() == [0, 1, 1, 0]
    assert series["vllm:num_requests_waiting"].tolist() == [0, 0, 0, 0]


def test_prefix_cache_counters_count_tokens_at_first_admission(two):
    _, series = two
    assert series["vllm:prefix_cache_queries_total"].tolist() == [0, 32, 64, 64]
    assert series["vllm:prefix_cache_hits_total"].tolist() == [0, 0, 16, 16]


def test_token_counters(two):
    _, series = two
    assert series["vllm:prompt_tokens_total"].tolist() == [0, 32, 64, 64]
    assert series["vllm:prompt_tokens_cached_total"].tolist() == [0, 0, 16, 16]
    # Steps ending by 0.5: first token, 2 decodes, decode + r1's first token, decode.
    assert series["vllm:generation_tokens_total"].tolist() == [0, 2, 6, 8]
    assert series[SUCCESS].tolist() == [0, 0, 1, 2]


def test_histograms_have_vllms_buckets_and_cumulative_counts(two):
    _, series = two
    ttft = [c for c in series.columns if c.startswith("vllm:time_to_first_token_seconds_bucket")]
    assert ttft[0] == 'vllm:time_to_first_token_seconds_bucket{le="0.001"}'
    assert ttft[-2:] == ['vllm:time_to_first_token_seconds_bucket{le="2560.0"}',
                         'vllm:time_to_first_token_seconds_bucket{le="+Inf"}']
    assert series['vllm:time_to_first_token_seconds_bucket{le="0.1"}'].tolist() == [0, 1, 1, 1]
    assert series["vllm:time_to_first_token_seconds_count"].tolist() == [0, 1, 2, 2]
    assert series["vllm:time_to_first_token_seconds_sum"].iloc[-1] == pytest.approx(0.1 + 0.15)
    assert series["vllm:inter_token_latency_seconds_count"].tolist() == [0, 1, 4, 6]
    assert series["vllm:e2e_request_latency_seconds_sum"].iloc[-1] == pytest.approx(0.4 + 0.45)
    assert series["vllm:request_queue_time_seconds_sum"].iloc[-1] == pytest.approx(0.05)
    # Per step: prompt tokens computed for the prefills it finished + tokens it generated.
    assert series["vllm:iteration_tokens_total_sum"].tolist() == [0, 34, 54, 56]


def test_le_labels_are_written_as_prometheus_client_writes_them():
    assert [_le(b) for b in (0.001, 1, 16, 131072, 10**6, 2 * 10**6)] == \
        ["0.001", "1.0", "16.0", "131072.0", "1e+06", "2e+06"]
    assert request_tokens_buckets(1000) == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)


@pytest.fixture(scope="module")
def chat():
    result = simulate({**TWO, "cost_model": {"type": "roofline"},
                       "workload": {"num_requests": 150, "arrival": {"type": "poisson", "rate": 20.0},
                                    "prompt_len": {"type": "uniform", "low": 20, "high": 400},
                                    "output_len": {"type": "uniform", "low": 1, "high": 60},
                                    "prefix": {"shared_prompt_tokens": 64, "num_groups": 3}}})
    return result, prometheus_series(result.requests, result.steps, max_model_len=1024)


def test_the_last_scrape_agrees_with_the_summary(chat):
    result, series = chat
    last, s = series.iloc[-1], result.summary
    assert last["vllm:prompt_tokens_total"] == s["total_input_tokens"]
    assert last["vllm:generation_tokens_total"] == s["total_output_tokens"]
    assert last[SUCCESS] == s["completed"] == 150
    assert last["vllm:prefix_cache_hits_total"] / last["vllm:prefix_cache_queries_total"] == \
        pytest.approx(s["prefix_cache_hit_rate"])
    assert last["vllm:inter_token_latency_seconds_count"] == len(result.itl_s)
    assert last["vllm:inter_token_latency_seconds_sum"] == pytest.approx(result.itl_s.sum())
    assert last['vllm:inter_token_latency_seconds_bucket{le="0.01"}'] == (result.itl_s <= 0.01).sum()


def test_counters_never_fall_and_buckets_grow_with_le(chat):
    _, series = chat
    cumulative = [c for c in series.columns if c.endswith(("_total", "_count", "}"))]
    assert (series[cumulative].diff().iloc[1:] >= 0).all().all()
    buckets = [c for c in series.columns if c.startswith("vllm:e2e_request_latency_seconds_bucket")]
    assert (series[buckets].diff(axis=1).iloc[:, 1:] >= 0).all().all()


def test_no_prefix_caching_means_no_lookups():
    result = simulate({**TWO, "engine": {**TWO["engine"], "enable_prefix_caching": False}})
    series = prometheus_series(result.requests, result.steps, max_model_len=1024,
                               enable_prefix_caching=False)
    assert series["vllm:prefix_cache_queries_total"].iloc[-1] == 0


# --- bench_serve.json ------------------------------------------------------------------------

# serve.py main_async + benchmark (vLLM 0.33): the keys --save-result --save-detailed writes
# for a text run, before the per-metric statistics.
VLLM_KEYS = ["endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts",
             "request_rate", "burstiness", "max_concurrency", "duration", "completed", "failed",
             "total_input_tokens", "total_output_tokens", "request_throughput", "request_goodput",
             "output_throughput", "total_token_throughput", "input_lens", "output_lens", "ttfts",
             "itls", "start_times", "generated_texts", "errors", "latencies", "queue_times",
             "max_output_tokens_per_s", "max_concurrent_requests", "rtfx"]
SETUP = {"endpoint_type": "kvsim", "backend": "kvsim", "label": "t", "model_id": "m",
         "tokenizer_id": None, "num_prompts": 2, "request_rate": 4.0, "burstiness": 1.0,
         "max_concurrency": None}


def test_bench_json_has_vllms_keys_and_values(two):
    result, _ = two
    data, notes = bench_serve_result(result.summary, result.requests, result.steps, result.itl_s,
                                     setup=SETUP, slo={"ttft_ms": 120}, detailed=True)
    assert list(data)[:len(VLLM_KEYS)] == VLLM_KEYS and not notes
    assert data["duration"] == pytest.approx(0.7)            # from t = 0 to the last answer
    assert (data["completed"], data["total_input_tokens"], data["total_output_tokens"]) == (2, 64, 8)
    assert data["request_goodput"] == pytest.approx(1 / 0.7)  # r0's TTFT 100 ms, r1's 150 ms
    assert data["ttfts"] == pytest.approx([0.1, 0.15]) and data["latencies"] == pytest.approx([0.4, 0.45])
    assert data["itls"] == [pytest.approx([0.1] * 3)] * 2
    assert data["max_concurrent_requests"] == 2 and data["max_output_tokens_per_s"] == 8
    assert data["p99_ttft_ms"] == result.summary["p99_ttft_ms"]


def test_per_request_itls_are_the_runs_own_gaps(chat):
    result, _ = chat
    itls = per_request_itls(result.requests, result.steps, result.itl_s)
    assert sorted(g for gaps in itls for g in gaps) == sorted(result.itl_s.tolist())
    ok = result.requests["num_output_tokens"].to_numpy()
    assert [len(g) for g in itls] == [max(n - 1, 0) for n in ok]


def test_itls_are_left_out_when_the_tables_cannot_say_them():
    # Eight blocks for three long requests: preemptions.
    result = simulate({**TWO, "engine": {"max_model_len": 64, "block_size": 16, "num_gpu_blocks_override": 9},
                       "workload": {"num_requests": 3, "arrival": {"type": "all_at_once"},
                                    "prompt_len": {"type": "fixed", "value": 30},
                                    "output_len": {"type": "fixed", "value": 30}}})
    assert result.summary["num_preemptions"] > 0
    data, notes = bench_serve_result(result.summary, result.requests, result.steps, result.itl_s,
                                     setup=SETUP, detailed=True)
    assert "itls" not in data and notes[0].startswith("itls left out")


def test_kvsim_run_out_writes_both_files_and_keeps_the_others(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(TWO))
    done = subprocess.run([sys.executable, "-m", "kvsim", "run", str(path), "--out", str(tmp_path / "o"),
                           "--scrape-interval", "0.25"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    series = pd.read_csv(tmp_path / "o" / "metrics.csv")
    assert series["vllm:generation_tokens_total"].tolist() == [0, 2, 6, 8]
    data = json.loads((tmp_path / "o" / "bench_serve.json").read_text())
    assert data["completed"] == 2 and "itls" not in data          # --save-detailed not given
    assert done.stderr.splitlines()[-2].startswith("simulated time 0.70 s (2 requests, 7 steps); wall time ")
    assert done.stderr.splitlines()[-1] == (f"wrote {tmp_path / 'o'}/: summary.json, requests.csv, "
                                            f"steps.csv, metrics.csv, bench_serve.json")
    assert np.array_equal(pd.read_csv(tmp_path / "o" / "steps.csv")["step"], np.arange(7))
