"""A run's summary, with the metric names of ``vllm bench serve``.

The definitions follow vLLM's ``vllm/benchmarks/serve.py`` (``calculate_metrics``)
so a simulated number can be put next to a measured one:

* only **completed** requests enter token counts and latency statistics; failed
  ones are only counted (``failed``);
* TTFT = first token - arrival; E2EL = finish - arrival;
* TPOT of a request = (E2EL - TTFT) / (output tokens - 1), for requests with more
  than one output token; for goodput a request with one output token has TPOT 0
  (vLLM's ``all_tpots``);
* ITL statistics are over every inter-token gap of every completed request;
* ``mean`` / ``std`` (population, ``ddof=0``) / ``median`` / ``pNN`` are numpy's
  ``mean``, ``std``, ``median`` and ``percentile`` (linear interpolation), in ms;
* a request is *good* when it meets every SLO given, with ``<=`` (vLLM: ``s >= r``).

What a simulation must define differently from a client-side benchmark:

* ``duration`` runs from the first arrival to the last finish (completed or
  failed) of any request: the span over which the engine had work.
* Where vLLM returns 0 for a statistic of an empty list, kvsim returns NaN
  (e.g. latency statistics when nothing completed), so that a missing value is
  not mistaken for a fast one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd

from kvsim.metrics import chunked_stats

LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
STATISTICS = ("mean", "median", "std", "p90", "p99")
SLO_KEYS = ("ttft_ms", "tpot_ms", "e2el_ms")
# vLLM's ``--goodput ttft:300`` spells the keys without the unit; accept both.
_SLO_ALIASES = {"ttft": "ttft_ms", "tpot": "tpot_ms", "e2el": "e2el_ms"}

LATENCY_KEYS = [f"{stat}_{metric}_ms" for metric in LATENCY_METRICS for stat in STATISTICS]

SUMMARY_KEYS = [
    "completed",
    "failed",
    "duration",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
    *LATENCY_KEYS,
    "num_preemptions",
    "prefix_cache_hit_rate",
    "num_gpu_blocks",
    "kv_cache_usage_mean",
    "kv_cache_usage_max",
    "max_concurrent_requests",
    "mean_batch_size",
]

NAN = float("nan")


# --- public API -------------------------------------------------------------


def summarize(requests, steps, itl_s, *, num_gpu_blocks: int, slo: dict | None = None,
              itl_order: chunked_stats.Segments | None = None) -> dict:
    """The summary of one run: a dict with :data:`SUMMARY_KEYS`, plain floats and ints.

    ``requests`` and ``steps`` are the tables of :mod:`kvsim.metrics.schema`
    (DataFrames, or any mapping of column name to array); ``itl_s`` holds every
    inter-token gap of every completed request, in seconds, in the requests'
    order, or in any order that ``itl_order`` puts in theirs. ``slo`` maps
    ``ttft_ms`` / ``tpot_ms`` / ``e2el_ms`` to a limit in ms; without it
    ``request_goodput`` is NaN.
    """
    slo = check_slo(slo)
    completed = completed_mask(requests)
    lat = request_latencies_s(requests, completed)
    itl_s = np.asarray(itl_s, dtype=float)

    latency = {}
    for metric, values_s in (("ttft", lat["ttft_s"]),
                             ("tpot", lat["tpot_s"][lat["num_output_tokens"] > 1]),
                             ("itl", itl_s),
                             ("e2el", lat["e2el_s"])):
        order = itl_order if metric == "itl" else None
        latency.update(scaled_latency_stats(metric, values_s, 1000.0, order))

    arrival = _column(requests, "arrival_time_s")
    finish = _column(requests, "finish_time_s")
    duration_s = (float(np.nanmax(finish) - np.nanmin(arrival))
                  if len(arrival) and not np.all(np.isnan(finish)) else NAN)

    scheduled = ~np.isnan(_column(requests, "scheduled_time_s"))
    return build_summary(
        completed=int(completed.sum()),
        failed=int((~completed).sum()),
        duration_s=duration_s,
        total_input_tokens=int(_column(requests, "num_prompt_tokens")[completed].sum()),
        total_output_tokens=int(lat["num_output_tokens"].sum()),
        num_good=count_good(lat, slo) if slo else None,
        latency=latency,
        num_preemptions=int(_column(requests, "num_preemptions").sum()),
        num_cached_tokens_scheduled=int(_column(requests, "num_cached_tokens")[scheduled].sum()),
        num_prompt_tokens_scheduled=int(_column(requests, "num_prompt_tokens")[scheduled].sum()),
        num_gpu_blocks=num_gpu_blocks,
        steps=step_stats(steps),
    )


def format_summary(summary: Mapping) -> str:
    """The block ``kvsim run`` prints, laid out like ``vllm bench serve``'s."""
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="=")]

    def row(label: str, key: str, fmt: str = ".2f", scale: float = 1.0) -> None:
        value = summary.get(key)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            text = "n/a"
        elif fmt == "d":
            text = str(int(value))
        else:
            text = format(value * scale, fmt)
        lines.append("{:<40} {}".format(label, text))

    row("Successful requests:", "completed", "d")
    row("Failed requests:", "failed", "d")
    row("Benchmark duration (s):", "duration")
    row("Total input tokens:", "total_input_tokens", "d")
    row("Total generated tokens:", "total_output_tokens", "d")
    row("Request throughput (req/s):", "request_throughput")
    goodput = summary.get("request_goodput")
    if goodput is not None and not math.isnan(goodput):
        row("Request goodput (req/s):", "request_goodput")
    row("Output token throughput (tok/s):", "output_throughput")
    row("Total Token throughput (tok/s):", "total_token_throughput")
    headers = {
        "ttft": ("TTFT", "Time to First Token"),
        "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
        "itl": ("ITL", "Inter-token Latency"),
        "e2el": ("E2EL", "End-to-end Latency"),
    }
    for metric, (short, header) in headers.items():
        lines.append("{s:{c}^{n}}".format(s=header, n=50, c="-"))
        row(f"Mean {short} (ms):", f"mean_{metric}_ms")
        row(f"Median {short} (ms):", f"median_{metric}_ms")
        row(f"P90 {short} (ms):", f"p90_{metric}_ms")
        row(f"P99 {short} (ms):", f"p99_{metric}_ms")
    lines.append("{s:{c}^{n}}".format(s="KV cache and batching", n=50, c="-"))
    row("Preemptions:", "num_preemptions", "d")
    row("Prefix cache hit rate (%):", "prefix_cache_hit_rate", scale=100.0)
    row("GPU KV cache blocks:", "num_gpu_blocks", "d")
    row("KV cache usage, time mean (%):", "kv_cache_usage_mean", scale=100.0)
    row("KV cache usage, max (%):", "kv_cache_usage_max", scale=100.0)
    row("Max concurrent requests:", "max_concurrent_requests", "d")
    row("Mean batch size (requests/step):", "mean_batch_size")
    lines.append("=" * 50)
    return "\n".join(lines)


# --- pieces shared with kvsim.metrics.streaming -------------------------------


def check_slo(slo: Mapping | None) -> dict[str, float]:
    """The SLO with canonical keys (``ttft_ms`` ...); ValueError names a bad entry."""
    if not slo:
        return {}
    out: dict[str, float] = {}
    for key, value in slo.items():
        name = _SLO_ALIASES.get(key, key)
        if name not in SLO_KEYS:
            raise ValueError(
                f"slo.{key}: unknown SLO; allowed: {', '.join(SLO_KEYS)} (milliseconds)")
        try:
            limit = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"slo.{key}: {value!r} is not a number of milliseconds") from None
        if not limit >= 0:  # also rejects NaN
            raise ValueError(f"slo.{key}: {value!r} must be a non-negative number of milliseconds")
        out[name] = limit
    return out


def request_latencies_s(requests, completed: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Per completed request: ``ttft_s``, ``tpot_s`` (0 with one output token), ``e2el_s``
    and ``num_output_tokens``."""
    if completed is None:
        completed = completed_mask(requests)
    arrival = _column(requests, "arrival_time_s")[completed]
    first = _column(requests, "first_token_time_s")[completed]
    finish = _column(requests, "finish_time_s")[completed]
    n_out = _column(requests, "num_output_tokens")[completed].astype(np.int64)
    if np.isnan(first).any() or np.isnan(finish).any():
        raise ValueError("requests: a completed request has no first_token_time_s or "
                         "finish_time_s (NaN); the engine must record both")
    ttft = first - arrival
    e2el = finish - arrival
    # vLLM: tpot = (latency - ttft) / (output_len - 1) when output_len > 1, else 0.
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(n_out > 1, (e2el - ttft) / np.maximum(n_out - 1, 1), 0.0)
    return {"ttft_s": ttft, "tpot_s": tpot, "e2el_s": e2el, "num_output_tokens": n_out}


def good_mask(latencies_s: Mapping[str, np.ndarray], slo: Mapping[str, float]) -> np.ndarray:
    """Which requests meet every SLO (vLLM goodput: ``slo >= value``, all must hold)."""
    good = np.ones(len(latencies_s["ttft_s"]), dtype=bool)
    for key, limit_ms in slo.items():
        # As vLLM compares: the limit in seconds (``slo / 1000 >= value``), not the value in ms.
        good &= latencies_s[key.replace("_ms", "_s")] <= limit_ms / 1000
    return good


def count_good(latencies_s: Mapping[str, np.ndarray], slo: Mapping[str, float]) -> int:
    return int(good_mask(latencies_s, slo).sum())


def latency_stats(metric: str, values_ms: np.ndarray, *, reorder: bool = False,
                  remake=None) -> dict[str, float]:
    """``mean_/median_/std_/p90_/p99_{metric}_ms`` of the samples; NaN when there are none.

    ``reorder``: ``values_ms`` is the caller's scratch array, which the order
    statistics may reorder in place instead of copying it (a fleet's gaps are
    tens of millions of values). The mean and the standard deviation are taken
    first, from the values in their order, as numpy sums them. ``remake``
    (with ``reorder``): a function that writes the values again into the
    array it is given; the standard deviation then uses ``values_ms`` itself
    for its deviations instead of a temporary of its own (``std_overwriting``).
    """
    values_ms = np.asarray(values_ms, dtype=float)
    if len(values_ms) == 0:
        return {f"{stat}_{metric}_ms": NAN for stat in STATISTICS}
    mean = float(np.mean(values_ms))
    if reorder and remake is not None:
        std = std_overwriting(values_ms)
        remake(values_ms)
    else:
        std = float(np.std(values_ms))
    median, p90, p99 = median_p90_p99(values_ms, in_place=reorder)
    return _latency_dict(metric, mean, std, median, p90, p99)


def scaled_latency_stats(metric: str, values: np.ndarray, scale: float,
                         order: chunked_stats.Segments | None = None) -> dict[str, float]:
    """Each statistic of ``values`` (a 1-d float array, in seconds for a scale of
    1000), times ``scale``: vLLM's ``calculate_metrics`` arithmetic
    (``np.mean(ttfts) * 1000``, ``np.percentile(itls, 99) * 1000``, ...; in
    vllm/benchmarks/serve.py), the same floats, not the statistics of the
    values in ms (which differ in the last bits). One copy of the values is
    the scratch (the standard deviation's deviations overwrite it, then the
    order statistics partition it); from ``chunked_stats.MIN_VALUES`` values
    on (a long run's gaps; a fleet's, tens of millions) a chunk at a time instead
    (kvsim/metrics/chunked_stats.py), the same floats. ``order``: the statistics
    of the values in that order (a fleet's gaps as its client pools them)."""
    values = np.ascontiguousarray(values, dtype=float)
    if len(values) == 0:
        return {f"{stat}_{metric}_ms": NAN for stat in STATISTICS}
    if order is not None and order.size != len(values):
        raise ValueError(f"an order of {order.size} values for {len(values)} values")
    if order is not None and len(values) < chunked_stats.MIN_VALUES:
        values, order = order.take(values), None
    if len(values) < chunked_stats.MIN_VALUES:
        stats = latency_stats(metric, np.array(values), reorder=True,
                              remake=lambda out: np.copyto(out, values))
        return {key: value * scale for key, value in stats.items()}
    plan = QuantileRanks(len(values))
    mean, std, found = chunked_stats.mean_std_ranks(values, plan.ranks, order)
    if found is None:                                # a NaN among the values
        return _latency_dict(metric, mean * scale, std * scale, NAN, NAN, NAN)
    n = len(values)

    def value_at(rank):
        if np.ndim(rank):
            return np.array([found[r % n] for r in rank.tolist()], dtype=float)
        return found[rank]

    return _latency_dict(metric, *(x * scale for x in (mean, std, *plan.quantiles(value_at))))


def _latency_dict(metric: str, mean: float, std: float, median: float, p90: float,
                  p99: float) -> dict[str, float]:
    return {
        f"mean_{metric}_ms": mean,
        f"median_{metric}_ms": median,
        f"std_{metric}_ms": std,
        f"p90_{metric}_ms": p90,
        f"p99_{metric}_ms": p99,
    }


def std_overwriting(values: np.ndarray) -> float:
    """``np.std(values)``, bit for bit, with ``values`` itself as the scratch for
    the squared deviations (it is overwritten): numpy's ``_var`` and ``_std``
    (numpy/_core/_methods.py) for a non-empty 1-d float64 array, the same
    ufuncs in the same order, whose temporary ``x`` is a copy of the whole
    array (W7's fleet: 256 MB). tests/test_metrics_summary.py checks it against numpy."""
    count = np.intp(len(values))
    mean = np.add.reduce(values, None, None, keepdims=True)
    mean = np.true_divide(mean, count, out=mean, casting="unsafe", subok=False)
    x = np.subtract(values, mean, out=values)
    x = np.square(x, out=x)
    var = np.add.reduce(x, None, None, None)
    var = var.dtype.type(var / np.maximum(count, 0))
    return float(var.dtype.type(np.sqrt(var)))


_P90_P99 = np.true_divide([90, 99], 100)           # the quantiles, as np.percentile makes them


def median_p90_p99(values: np.ndarray, *, in_place: bool = False) -> tuple[float, float, float]:
    """``np.median(values)`` and ``np.percentile(values, [90, 99])``, bit for bit.

    numpy's own arithmetic (the linear method's virtual indexes ``(n - 1) * q``
    and its interpolation ``_lerp``; the median as the mean of the middle one
    or two values; NaN if any value is NaN), but the order statistics it needs
    come from one copy, partitioned once and then only above the last one
    found: a run's inter-token gaps are hundreds of thousands of values, and
    numpy's three partitions of two copies (one a partition at several ranks,
    which costs several times one) were most of ``summarize``. ``values``: a
    non-empty 1-d float array; tests/test_metrics_summary.py checks it against
    numpy. ``in_place``: partition ``values`` itself (a writable float64 array
    the caller no longer needs in its order), not a copy.
    """
    n = len(values)
    if np.isnan(values).any():
        return NAN, NAN, NAN
    plan = QuantileRanks(n)
    part = values if in_place else np.array(values, dtype=float)
    _place_ranks(part, plan.ranks)
    return plan.quantiles(part.__getitem__)


class QuantileRanks:
    """The order statistics the median, p90 and p99 of ``n`` values read
    (``ranks``), and numpy's arithmetic on them (``quantiles``)."""

    def __init__(self, n: int) -> None:
        virtual = (n - 1) * _P90_P99
        prev = np.floor(virtual)
        nxt = prev + 1
        above = virtual >= n - 1                         # past the last index: the last value
        prev[above] = nxt[above] = -1
        self.n, self.virtual = n, virtual
        self.prev, self.nxt = prev.astype(np.intp), nxt.astype(np.intp)
        half = n // 2
        self.middle = (half - 1, half) if n % 2 == 0 else (half,)
        self.ranks = sorted({*self.middle, *(self.prev % n).tolist(), *(self.nxt % n).tolist()})

    def quantiles(self, value_at) -> tuple[float, float, float]:
        """(median, p90, p99) from ``value_at(rank)``, the rank-th smallest value
        (a rank array for p90 and p99; -1 is the last)."""
        middle = self.middle
        # np.mean of the middle values: their sum (one addition at most), over their count.
        median = (float(value_at(middle[0]) + value_at(middle[1])) / 2.0 if len(middle) == 2
                  else float(value_at(middle[0])))
        a, b = value_at(self.prev), value_at(self.nxt)
        gamma = self.virtual - self.prev
        diff = b - a
        lerp = a + diff * gamma
        np.subtract(b, diff * (1 - gamma), out=lerp, where=gamma >= 0.5)
        return median, float(lerp[0]), float(lerp[1])


def _place_ranks(part: np.ndarray, ranks: list[int]) -> None:
    """Put the ``r``-th smallest value at ``part[r]`` for each of the ascending
    ``ranks``, in place: each is selected among the values above the last one
    placed (a rank right after it is their minimum)."""
    lo = 0
    for r in ranks:
        rest = part[lo:]
        if r == lo:
            i = int(rest.argmin())
            rest[0], rest[i] = rest[i], rest[0]
        else:
            rest.partition(r - lo)
        lo = r + 1


def step_stats(steps) -> dict:
    """KV and batching figures over the step table.

    ``kv_cache_usage_mean`` is weighted by step duration, so a long prefill step
    counts more than a short decode step; if every step lasted 0 s it falls back
    to the plain mean. Gaps between steps (an idle engine) carry no weight.
    """
    usage = _column(steps, "kv_cache_usage")
    if len(usage) == 0:
        return {"kv_cache_usage_mean": NAN, "kv_cache_usage_max": NAN,
                "max_concurrent_requests": 0, "mean_batch_size": NAN}
    duration = _column(steps, "duration_s")
    total = float(duration.sum())
    mean_usage = float((usage * duration).sum() / total) if total > 0 else float(usage.mean())
    return {
        "kv_cache_usage_mean": mean_usage,
        "kv_cache_usage_max": float(usage.max()),
        "max_concurrent_requests": int(_column(steps, "num_running").max()),
        "mean_batch_size": float(_column(steps, "num_scheduled_reqs").mean()),
    }


def build_summary(*, completed: int, failed: int, duration_s: float, total_input_tokens: int,
                  total_output_tokens: int, num_good: int | None, latency: Mapping[str, float],
                  num_preemptions: int, num_cached_tokens_scheduled: int,
                  num_prompt_tokens_scheduled: int, num_gpu_blocks: int,
                  steps: Mapping) -> dict:
    """Assemble the summary dict in :data:`SUMMARY_KEYS` order from the totals."""
    def rate(count: float) -> float:
        # Undefined (NaN) when the run has no duration, as for an empty run.
        return float(count / duration_s) if duration_s > 0 else NAN

    summary = {
        "completed": int(completed),
        "failed": int(failed),
        "duration": float(duration_s),
        "total_input_tokens": int(total_input_tokens),
        "total_output_tokens": int(total_output_tokens),
        "request_throughput": rate(completed),
        "request_goodput": rate(num_good) if num_good is not None else NAN,
        "output_throughput": rate(total_output_tokens),
        "total_token_throughput": rate(total_input_tokens + total_output_tokens),
    }
    summary.update({key: float(latency[key]) for key in LATENCY_KEYS})
    summary.update({
        "num_preemptions": int(num_preemptions),
        # Over requests the scheduler looked up at least once: vLLM counts prefix
        # cache queries at admission, so a request that never got in has none.
        "prefix_cache_hit_rate": (float(num_cached_tokens_scheduled / num_prompt_tokens_scheduled)
                                  if num_prompt_tokens_scheduled > 0 else NAN),
        "num_gpu_blocks": int(num_gpu_blocks),
        "kv_cache_usage_mean": float(steps["kv_cache_usage_mean"]),
        "kv_cache_usage_max": float(steps["kv_cache_usage_max"]),
        "max_concurrent_requests": int(steps["max_concurrent_requests"]),
        "mean_batch_size": float(steps["mean_batch_size"]),
    })
    return summary


# --- private helpers ------------------------------------------------------------


def _column(table, name: str) -> np.ndarray:
    try:
        values = table[name]
    except KeyError:
        raise ValueError(f"metrics: table lacks column {name!r} (see kvsim/metrics/schema.py)") \
            from None
    return np.asarray(values, dtype=float)


def completed_mask(requests) -> np.ndarray:
    try:
        status = requests["status"]
    except KeyError:
        raise ValueError("metrics: requests table lacks column 'status'") from None
    if isinstance(status, pd.Series):  # pandas string dtype: a missing status is not completed
        return status.eq("completed").fillna(False).to_numpy(dtype=bool)
    return np.asarray(status, dtype=object) == "completed"
