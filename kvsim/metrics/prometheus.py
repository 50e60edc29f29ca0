"""What a Prometheus server scraping vLLM's ``/metrics`` would have recorded during a run.

One row per scrape (every ``interval_s`` simulated seconds from t = 0, the
last at or after the run's end), one column per series under vLLM 0.33's
names as Prometheus exposes them (``vllm/v1/metrics/loggers.py``
``PrometheusStatLogger``; counters get ``_total``, histograms
``_bucket{le="..."}``, ``_sum`` and ``_count``; the ``model_name`` and
``engine`` labels every vLLM series carries are left out). So the columns
read like the PromQL a dashboard uses: ``rate(vllm:prefix_cache_hits_total[1m])
/ rate(vllm:prefix_cache_queries_total[1m])`` is the hit rate.

A sample at scrape time ``t`` holds what vLLM's stat logger had recorded by
then, which it does after each engine step (``record`` with the step's
SchedulerStats and IterationStats):

* gauges are the state after the last step that ended at or before ``t``;
* counters and histograms count what happened in the steps that ended by ``t``:
  a request's prefix-cache lookup when it was first scheduled (vLLM
  ``record_prefix_cache_stats``, preempted re-admissions not counted), its
  prompt and first token when its prefill finished, its latencies when it finished.

With a KV connector (offload tiers: the requests table then has
``kvsim.metrics.schema.CONNECTOR_REQUEST_COLUMNS``) the prefix-cache counters
split as vLLM 0.33's do (``Scheduler.schedule``, ``PrefixCacheStats.record``,
``PrometheusStatLogger.record``): ``vllm:prefix_cache_hits`` counts the GPU
hit only, ``vllm:external_prefix_cache_queries`` the tokens past it and
``vllm:external_prefix_cache_hits`` those the connector supplied, all in the
step that admitted the request, for a loaded one the step that started its
load. (vLLM exposes the two external counters at 0 without a connector; kvsim
writes them only with one, so runs without keep their columns.)

Derived from ``Result.requests`` and ``Result.steps``; exact except where the
tables do not say it (docs/metrics.md): ``generation_tokens`` and the
inter-token-latency histogram count, per step, its decode tokens (each
observed as the step's duration) and the first tokens it produced, so the
token a preempted request makes when its recompute ends is missing, and under
the ``continuous`` scheduler a decode that waited out a prefill-only step is
observed as one step, not two.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

# vllm/v1/metrics/buckets.py
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                           50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TIME_TO_FIRST_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                               2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
INTER_TOKEN_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
                               2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
REQUEST_NUM_PREEMPTIONS_BUCKETS = (1, 2, 3, 4, 5, 10, 20)

GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
COUNTERS = ("vllm:num_preemptions_total", "vllm:prompt_tokens_total", "vllm:prompt_tokens_cached_total",
            "vllm:generation_tokens_total", "vllm:prefix_cache_queries_total",
            "vllm:prefix_cache_hits_total", 'vllm:request_success_total{finished_reason="length"}')


def request_tokens_buckets(max_model_len: int) -> tuple[int, ...]:
    """vLLM ``build_1_2_5_buckets(max_model_len)``: 1, 2, 5, 10, 20, 50, ... up to max_model_len."""
    out, exponent = [], 0
    while True:
        for m in (1, 2, 5):
            value = m * 10**exponent
            if value > max_model_len:
                return tuple(out)
            out.append(value)
        exponent += 1


def prometheus_series(requests: pd.DataFrame, steps: pd.DataFrame, *, max_model_len: int,
                      enable_prefix_caching: bool = True, interval_s: float = 1.0) -> pd.DataFrame:
    """The scrape table: ``time_s`` then one column per series (see the module docstring)."""
    if not interval_s > 0:
        raise ValueError(f"interval_s = {interval_s!r}: must be > 0")
    start = steps["start_time_s"].to_numpy(dtype=float)
    end = start + steps["duration_s"].to_numpy(dtype=float)
    finish = requests["finish_time_s"].to_numpy(dtype=float)
    finish = finish[np.isfinite(finish)]
    last = max(float(end.max()) if len(end) else 0.0, float(finish.max()) if len(finish) else 0.0)
    scrapes = interval_s * np.arange(int(math.ceil(last / interval_s - 1e-9)) + 1)
    out: dict[str, np.ndarray] = {"time_s": scrapes}
    _gauges(out, steps, end, scrapes)
    ev = _RequestEvents(requests, steps, start, end)
    _counters(out, steps, end, scrapes, ev, enable_prefix_caching)
    _histograms(out, steps, end, scrapes, ev, max_model_len)
    return pd.DataFrame(out)


class _RequestEvents:
    """When each request reached the milestones vLLM records, and its phase times."""

    def __init__(self, requests: pd.DataFrame, steps: pd.DataFrame, start: np.ndarray,
                 end: np.ndarray) -> None:
        col = lambda name: requests[name].to_numpy(dtype=float)           # noqa: E731
        self.arrival, self.scheduled = col("arrival_time_s"), col("scheduled_time_s")
        self.first, self.finish = col("first_token_time_s"), col("finish_time_s")
        self.prompt, self.cached = col("num_prompt_tokens"), col("num_cached_tokens")
        self.output, self.preemptions = col("num_output_tokens"), col("num_preemptions")
        self.completed = (requests["status"] == "completed").to_numpy()
        self.has_first = np.isfinite(self.first)
        # The prefix-cache lookup is recorded with the stats of the step that first
        # scheduled the request: that step starts at scheduled_time_s.
        self.admitted = np.isfinite(self.scheduled)
        at = np.searchsorted(start, self.scheduled[self.admitted], side="left")
        self.admit_end = end[np.minimum(at, max(len(end) - 1, 0))] if len(end) else self.scheduled[self.admitted]
        self.connector = "num_external_cached_tokens" in requests
        if self.connector:
            self._connector_split(col, start, end)

    def _connector_split(self, col, start: np.ndarray, end: np.ndarray) -> None:
        """With a KV connector (the requests table's CONNECTOR_REQUEST_COLUMNS): a
        request's GPU and external hits, and when vLLM counts them.

        vLLM ``Scheduler.schedule`` records both lookups when the request is
        admitted, before an asynchronous load sends it to WAITING_FOR_REMOTE_KVS,
        so a loaded request counts in the stats of the step that started its load
        (``kv_load_start_time_s``), not of the one that schedules it once the KV is
        there. kvsim records no step that only starts a load (sim/engine.py: it
        sleeps to the transfer); vLLM's would take next to no time, so the count
        lands at the load's start then.
        """
        self.local, self.external = col("num_local_cached_tokens"), col("num_external_cached_tokens")
        load = col("kv_load_start_time_s")
        loaded = np.isfinite(load)
        self.admitted = np.isfinite(self.scheduled) | loaded
        when = np.where(loaded, load, self.scheduled)[self.admitted]
        if not len(end):
            self.admit_end = when
            return
        at = np.minimum(np.searchsorted(start, when, side="left"), len(start) - 1)
        self.admit_end = np.where(start[at] == when, end[at], when)


def _gauges(out: dict, steps: pd.DataFrame, end: np.ndarray, scrapes: np.ndarray) -> None:
    # Index of the last step that ended at or before each scrape (-1: none yet).
    last = np.searchsorted(end, scrapes, side="right") - 1
    for name, column in zip(GAUGES, ("num_running", "num_waiting", "kv_cache_usage")):
        values = steps[column].to_numpy()
        sampled = np.where(last >= 0, values[np.maximum(last, 0)] if len(values) else 0, 0)
        out[name] = sampled.astype(float if column == "kv_cache_usage" else np.int64)


def _scrape_index(times: np.ndarray, scrapes: np.ndarray) -> np.ndarray:
    """The first scrape at or after each event: the one whose sample counts it first."""
    return np.searchsorted(scrapes, times, side="left")


def _cumulative(times: np.ndarray, weights, scrapes: np.ndarray) -> np.ndarray:
    """Sum of ``weights`` of the events at or before each scrape time."""
    at = _scrape_index(np.asarray(times, dtype=float), scrapes)
    weights = np.broadcast_to(np.asarray(weights, dtype=float), at.shape)
    keep = at < len(scrapes)
    return np.cumsum(np.bincount(at[keep], weights=weights[keep], minlength=len(scrapes)))


def _histogram(times: np.ndarray, values: np.ndarray, weights: np.ndarray, buckets,
               scrapes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cumulative counts per (scrape, ``le`` bucket incl. +Inf), and the cumulative sum, per scrape."""
    at = _scrape_index(times, scrapes)
    keep = at < len(scrapes)
    at, values, weights = at[keep], values[keep], weights[keep]
    bucket = np.searchsorted(np.asarray(buckets, dtype=float), values, side="left")   # le: value <= bound
    width = len(buckets) + 1
    counts = np.bincount(at * width + bucket, weights=weights, minlength=len(scrapes) * width)
    counts = counts.reshape(len(scrapes), width).cumsum(axis=0).cumsum(axis=1)
    sums = np.cumsum(np.bincount(at, weights=weights * values, minlength=len(scrapes)))
    return counts, sums


def _first_tokens_per_step(end: np.ndarray, ev: _RequestEvents) -> np.ndarray:
    """How many requests got their first token at the end of each step."""
    at = np.searchsorted(end, ev.first[ev.has_first], side="left")
    return np.bincount(at[at < len(end)], minlength=len(end))


def _counters(out: dict, steps: pd.DataFrame, end: np.ndarray, scrapes: np.ndarray,
              ev: _RequestEvents, caching: bool) -> None:
    decode = steps["num_decode_tokens"].to_numpy(dtype=np.int64)
    generated = decode + _first_tokens_per_step(end, ev)
    first, ok = ev.first[ev.has_first], ev.has_first
    queries = ev.prompt[ev.admitted] if caching else np.zeros(int(ev.admitted.sum()))
    # With a KV connector vLLM's prefix_cache_hits counts the GPU hit only.
    hits = (ev.local if ev.connector else ev.cached)[ev.admitted] if caching \
        else np.zeros(int(ev.admitted.sum()))
    done = ev.finish[ev.completed]
    series = {
        "vllm:num_preemptions_total": (end, steps["num_preempted"].to_numpy()),
        "vllm:prompt_tokens_total": (first, ev.prompt[ok]),
        "vllm:prompt_tokens_cached_total": (first, ev.cached[ok]),
        "vllm:generation_tokens_total": (end, generated),
        "vllm:prefix_cache_queries_total": (ev.admit_end, queries),
        "vllm:prefix_cache_hits_total": (ev.admit_end, hits),
    }
    if ev.connector:
        # vLLM Scheduler.schedule: connector_prefix_cache_queries = num_tokens - the
        # GPU hit, connector_prefix_cache_hits = the tokens the connector supplies
        # (recorded when queries != 0: a zero adds nothing); PrometheusStatLogger.record
        # adds scheduler_stats.connector_prefix_cache_stats to these two counters.
        series["vllm:external_prefix_cache_queries_total"] = (
            ev.admit_end, (ev.prompt - ev.local)[ev.admitted])
        series["vllm:external_prefix_cache_hits_total"] = (ev.admit_end, ev.external[ev.admitted])
    series['vllm:request_success_total{finished_reason="length"}'] = (done, np.ones(len(done)))
    for name, (times, weights) in series.items():
        out[name] = np.rint(_cumulative(times, weights, scrapes)).astype(np.int64)


def _histograms(out: dict, steps: pd.DataFrame, end: np.ndarray, scrapes: np.ndarray,
                ev: _RequestEvents, max_model_len: int) -> None:
    c, ok = ev.completed, ev.has_first
    decode_time = ev.finish[c] - ev.first[c]
    tpot = np.where(ev.output[c] > 1, decode_time / np.maximum(ev.output[c] - 1, 1), 0.0)
    decode = steps["num_decode_tokens"].to_numpy(dtype=float)
    duration = steps["duration_s"].to_numpy(dtype=float)
    computed_first = np.zeros(len(end))
    at = np.searchsorted(end, ev.first[ok], side="left")
    np.add.at(computed_first, at[at < len(end)], (ev.prompt[ok] - ev.cached[ok])[at < len(end)])
    generated = decode + _first_tokens_per_step(end, ev)
    tokens = request_tokens_buckets(max_model_len)
    done = ev.finish[c]
    histograms = [
        ("vllm:time_to_first_token_seconds", TIME_TO_FIRST_TOKEN_BUCKETS,
         ev.first[ok], ev.first[ok] - ev.arrival[ok], None),
        ("vllm:inter_token_latency_seconds", INTER_TOKEN_LATENCY_BUCKETS, end, duration, decode),
        ("vllm:request_time_per_output_token_seconds", INTER_TOKEN_LATENCY_BUCKETS, done, tpot, None),
        ("vllm:e2e_request_latency_seconds", REQUEST_LATENCY_BUCKETS, done, done - ev.arrival[c], None),
        ("vllm:request_queue_time_seconds", REQUEST_LATENCY_BUCKETS, done,
         ev.scheduled[c] - ev.arrival[c], None),
        ("vllm:request_inference_time_seconds", REQUEST_LATENCY_BUCKETS, done, done - ev.scheduled[c], None),
        ("vllm:request_prefill_time_seconds", REQUEST_LATENCY_BUCKETS, done,
         ev.first[c] - ev.scheduled[c], None),
        ("vllm:request_decode_time_seconds", REQUEST_LATENCY_BUCKETS, done, decode_time, None),
        ("vllm:request_prompt_tokens", tokens, done, ev.prompt[c], None),
        ("vllm:request_generation_tokens", tokens, done, ev.output[c], None),
        ("vllm:request_prefill_kv_computed_tokens", tokens, done, ev.prompt[c] - ev.cached[c], None),
        ("vllm:request_num_preemptions", REQUEST_NUM_PREEMPTIONS_BUCKETS, done, ev.preemptions[c], None),
        # One observation per step that ran something (an empty step outputs nothing).
        ("vllm:iteration_tokens_total", ITERATION_TOKENS_BUCKETS, end, computed_first + generated,
         (steps["num_scheduled_reqs"].to_numpy() > 0).astype(float)),
    ]
    for name, buckets, times, values, weights in histograms:
        times, values = np.asarray(times, dtype=float), np.asarray(values, dtype=float)
        w = np.ones(len(values)) if weights is None else np.asarray(weights, dtype=float)
        counts, sums = _histogram(times, values, w, buckets, scrapes)
        counts = np.rint(counts).astype(np.int64)
        for j, bound in enumerate(buckets):
            out[f'{name}_bucket{{le="{_le(bound)}"}}'] = counts[:, j]
        out[f'{name}_bucket{{le="+Inf"}}'] = counts[:, -1]
        out[f"{name}_sum"] = sums
        out[f"{name}_count"] = counts[:, -1]


def _le(bound) -> str:
    """The ``le`` label as prometheus_client writes it (``utils.floatToGoString``).

    Python's repr, except that Go switches to an exponent from 10^6 up:
    0.001, 1.0, 16.0, 100000.0, 1e+06.
    """
    text = repr(float(bound))
    dot = text.find(".")
    if bound > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return text
