"""Summary statistics in bounded memory, for runs too long to keep every row (W4: 10^6 requests).

:class:`StreamingStats` takes requests, inter-token gaps and steps as they happen
(one at a time or in chunks) and returns the same dict as
:func:`kvsim.metrics.summary.summarize` would on the full tables:

* counts, token totals, goodput, preemptions, the prefix-cache hit rate and
  every step figure are exact;
* means and standard deviations are exact up to float rounding (merged per
  chunk with Chan et al.'s parallel update, not a naive sum of squares);
* medians and percentiles come from :class:`LogHistogram`, a fixed histogram
  with geometrically growing bins.

Percentile error bound: bins are ``[lo, lo * g)`` with ``g = 1.01``. An order
statistic is reported as the bin's geometric midpoint ``lo * sqrt(g)`` (clamped
to the exact min and max), which is within a factor ``sqrt(g)`` of any value in
the bin: relative error ``<= sqrt(1.01) - 1 = 0.499 %``. A percentile linearly
interpolates two order statistics with non-negative weights, exactly as
``np.percentile`` does, so it inherits the same ``<= 0.5 %`` bound. This holds
for samples in ``[min_value, max_value)`` = [1 us, ~28 h] in ms; samples below
are reported in ``[sample min, min_value]`` (absolute error < 1 us), above as
the exact max. Memory: about 2,550 int64 bins per metric.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from kvsim.metrics.summary import (
    LATENCY_METRICS,
    NAN,
    STATISTICS,
    build_summary,
    check_slo,
    completed_mask,
    good_mask,
    request_latencies_s,
)

# Buffered scalar calls are flushed into the histograms in chunks of this size,
# so per-request Python overhead stays small and memory stays bounded.
_FLUSH_ROWS = 8192
_FLUSH_SAMPLES = 65536


class LogHistogram:
    """Samples of one latency (ms): exact count/mean/std/min/max, percentiles within 0.5 %."""

    def __init__(self, min_value: float = 1e-3, max_value: float = 1e8, growth: float = 1.01):
        if not (0 < min_value < max_value and growth > 1):
            raise ValueError("LogHistogram needs 0 < min_value < max_value and growth > 1")
        self.min_value = float(min_value)
        self.growth = float(growth)
        self._log_growth = math.log(growth)
        num_bins = int(math.ceil(math.log(max_value / min_value) / self._log_growth))
        self.max_value = self.min_value * growth ** num_bins
        # Bin 0 holds samples below min_value, bin num_bins + 1 those at or above
        # max_value; bin i in between holds [min_value * g**(i-1), min_value * g**i).
        self._counts = np.zeros(num_bins + 2, dtype=np.int64)
        self.count = 0
        self._mean = 0.0
        self._m2 = 0.0  # sum of squared deviations from the mean
        self.min = math.inf
        self.max = -math.inf

    @property
    def relative_error_bound(self) -> float:
        return math.sqrt(self.growth) - 1.0

    def add(self, values) -> None:
        """Add one sample or an array of samples."""
        x = np.atleast_1d(np.asarray(values, dtype=float))
        if len(x) == 0:
            return
        if np.isnan(x).any():
            raise ValueError("LogHistogram.add: NaN sample")
        # Chan et al.: merge this chunk's (n, mean, M2) into the running ones.
        n_b = len(x)
        mean_b = float(x.mean())
        m2_b = float(((x - mean_b) ** 2).sum())
        n = self.count + n_b
        delta = mean_b - self._mean
        self._mean += delta * n_b / n
        self._m2 += m2_b + delta * delta * self.count * n_b / n
        self.count = n
        self.min = min(self.min, float(x.min()))
        self.max = max(self.max, float(x.max()))
        self._counts += np.bincount(self._bin_index(x), minlength=len(self._counts))

    @property
    def mean(self) -> float:
        return self._mean if self.count else NAN

    @property
    def std(self) -> float:
        """Population standard deviation (``ddof=0``, as ``np.std``)."""
        return math.sqrt(max(self._m2, 0.0) / self.count) if self.count else NAN

    def percentile(self, q: float) -> float:
        """``np.percentile(samples, q)`` (linear method), to the documented bound."""
        if not self.count:
            return NAN
        rank = (self.count - 1) * q / 100.0
        below = math.floor(rank)
        above = min(below + 1, self.count - 1)
        lo = self._order_statistic(below)
        hi = self._order_statistic(above)
        return lo + (rank - below) * (hi - lo)

    def stats(self, metric: str) -> dict[str, float]:
        """``mean_/median_/std_/p90_/p99_{metric}_ms``, as ``summary.latency_stats``."""
        values = {
            "mean": self.mean, "median": self.percentile(50), "std": self.std,
            "p90": self.percentile(90), "p99": self.percentile(99),
        }
        return {f"{stat}_{metric}_ms": float(values[stat]) for stat in STATISTICS}

    def _bin_index(self, x: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore"):
            raw = np.floor(np.log(x / self.min_value) / self._log_growth) + 1
        raw = np.where(x < self.min_value, 0, raw)
        return np.clip(raw, 0, len(self._counts) - 1).astype(np.int64)

    def _order_statistic(self, k: int) -> float:
        """The k-th smallest sample (0-based), estimated from its bin."""
        if k == 0:
            return self.min
        if k == self.count - 1:
            return self.max
        index = int(np.searchsorted(np.cumsum(self._counts), k, side="right"))
        if index == 0:
            estimate = self.min_value
        elif index == len(self._counts) - 1:
            estimate = self.max
        else:
            estimate = self.min_value * self.growth ** (index - 1) * math.sqrt(self.growth)
        return min(max(estimate, self.min), self.max)


class StreamingStats:
    """Accumulates a run and returns :func:`summarize`'s keys, in bounded memory.

    Feed it with ``add_request`` / ``add_itl`` / ``add_step`` (scalars, buffered)
    or ``add_requests`` / ``add_steps`` (chunks: DataFrames or mappings of
    column arrays with the :mod:`kvsim.metrics.schema` columns), then call
    :meth:`summary`.
    """

    def __init__(self, *, slo: Mapping | None = None):
        self.slo = check_slo(slo)
        self.hist = {metric: LogHistogram() for metric in LATENCY_METRICS}
        self.completed = 0
        self.failed = 0
        self.first_arrival_s = math.inf
        self.last_finish_s = -math.inf
        self.total_input_tokens = 0
        self.total_output_tokens = 0
        self.num_good = 0
        self.num_preemptions = 0
        self.cached_tokens_scheduled = 0
        self.prompt_tokens_scheduled = 0
        self.num_steps = 0
        self.step_time_s = 0.0
        self.usage_time_s = 0.0    # sum of kv_cache_usage * duration_s
        self.usage_sum = 0.0       # for the plain mean when all steps last 0 s
        self.usage_max = -math.inf
        self.max_running = 0
        self.scheduled_reqs_sum = 0
        self._request_rows: list[tuple] = []
        self._step_rows: list[tuple] = []
        self._itl_chunks: list[np.ndarray] = []
        self._itl_pending = 0

    # --- feeding ---------------------------------------------------------------

    _REQUEST_FIELDS = ("arrival_time_s", "scheduled_time_s", "first_token_time_s",
                       "finish_time_s", "num_prompt_tokens", "num_output_tokens",
                       "num_cached_tokens", "num_preemptions", "status")
    _STEP_FIELDS = ("duration_s", "kv_cache_usage", "num_running", "num_scheduled_reqs")

    def add_request(self, *, arrival_time_s: float, scheduled_time_s: float,
                    first_token_time_s: float, finish_time_s: float, num_prompt_tokens: int,
                    num_output_tokens: int, num_cached_tokens: int, num_preemptions: int,
                    status: str) -> None:
        """One finished (completed or failed) request."""
        self._request_rows.append((arrival_time_s, scheduled_time_s, first_token_time_s,
                                   finish_time_s, num_prompt_tokens, num_output_tokens,
                                   num_cached_tokens, num_preemptions, status))
        if len(self._request_rows) >= _FLUSH_ROWS:
            self._flush_requests()

    def add_itl(self, itl_s) -> None:
        """Inter-token gaps (s) of a completed request: one value or an array."""
        chunk = np.atleast_1d(np.asarray(itl_s, dtype=float))
        self._itl_chunks.append(chunk)
        self._itl_pending += len(chunk)
        if self._itl_pending >= _FLUSH_SAMPLES:
            self._flush_itl()

    def add_step(self, *, duration_s: float, kv_cache_usage: float, num_running: int,
                 num_scheduled_reqs: int) -> None:
        self._step_rows.append((duration_s, kv_cache_usage, num_running, num_scheduled_reqs))
        if len(self._step_rows) >= _FLUSH_ROWS:
            self._flush_steps()

    def add_requests(self, requests) -> None:
        """A chunk of request rows (DataFrame or mapping of arrays)."""
        completed = completed_mask(requests)
        if len(completed) == 0:
            return
        col = {name: np.asarray(requests[name], dtype=float)
               for name in self._REQUEST_FIELDS if name != "status"}
        lat = request_latencies_s(requests, completed)
        self.completed += int(completed.sum())
        self.failed += int((~completed).sum())
        self.first_arrival_s = min(self.first_arrival_s, float(np.nanmin(col["arrival_time_s"])))
        if not np.all(np.isnan(col["finish_time_s"])):
            self.last_finish_s = max(self.last_finish_s, float(np.nanmax(col["finish_time_s"])))
        self.total_input_tokens += int(col["num_prompt_tokens"][completed].sum())
        self.total_output_tokens += int(lat["num_output_tokens"].sum())
        if self.slo:
            self.num_good += int(good_mask(lat, self.slo).sum())
        self.num_preemptions += int(col["num_preemptions"].sum())
        scheduled = ~np.isnan(col["scheduled_time_s"])
        self.cached_tokens_scheduled += int(col["num_cached_tokens"][scheduled].sum())
        self.prompt_tokens_scheduled += int(col["num_prompt_tokens"][scheduled].sum())
        self.hist["ttft"].add(lat["ttft_s"] * 1000.0)
        self.hist["tpot"].add(lat["tpot_s"][lat["num_output_tokens"] > 1] * 1000.0)
        self.hist["e2el"].add(lat["e2el_s"] * 1000.0)

    def add_steps(self, steps) -> None:
        """A chunk of step rows (DataFrame or mapping of arrays)."""
        duration = np.asarray(steps["duration_s"], dtype=float)
        if len(duration) == 0:
            return
        usage = np.asarray(steps["kv_cache_usage"], dtype=float)
        self.num_steps += len(duration)
        self.step_time_s += float(duration.sum())
        self.usage_time_s += float((usage * duration).sum())
        self.usage_sum += float(usage.sum())
        self.usage_max = max(self.usage_max, float(usage.max()))
        self.max_running = max(self.max_running, int(np.asarray(steps["num_running"]).max()))
        self.scheduled_reqs_sum += int(np.asarray(steps["num_scheduled_reqs"]).sum())

    # --- result ------------------------------------------------------------------

    def summary(self, *, num_gpu_blocks: int) -> dict:
        """The same keys as :func:`kvsim.metrics.summary.summarize`."""
        self._flush_requests()
        self._flush_steps()
        self._flush_itl()
        latency: dict[str, float] = {}
        for metric in LATENCY_METRICS:
            latency.update(self.hist[metric].stats(metric))
        if self.completed + self.failed and self.last_finish_s > -math.inf:
            duration_s = self.last_finish_s - self.first_arrival_s
        else:
            duration_s = NAN
        if self.num_steps:
            mean_usage = (self.usage_time_s / self.step_time_s if self.step_time_s > 0
                          else self.usage_sum / self.num_steps)
            steps = {"kv_cache_usage_mean": mean_usage, "kv_cache_usage_max": self.usage_max,
                     "max_concurrent_requests": self.max_running,
                     "mean_batch_size": self.scheduled_reqs_sum / self.num_steps}
        else:
            steps = {"kv_cache_usage_mean": NAN, "kv_cache_usage_max": NAN,
                     "max_concurrent_requests": 0, "mean_batch_size": NAN}
        return build_summary(
            completed=self.completed, failed=self.failed, duration_s=duration_s,
            total_input_tokens=self.total_input_tokens,
            total_output_tokens=self.total_output_tokens,
            num_good=self.num_good if self.slo else None, latency=latency,
            num_preemptions=self.num_preemptions,
            num_cached_tokens_scheduled=self.cached_tokens_scheduled,
            num_prompt_tokens_scheduled=self.prompt_tokens_scheduled,
            num_gpu_blocks=num_gpu_blocks, steps=steps)

    # --- private -------------------------------------------------------------------

    def _flush_requests(self) -> None:
        if not self._request_rows:
            return
        columns = list(zip(*self._request_rows))
        self._request_rows = []
        chunk = {name: np.asarray(values, dtype=object if name == "status" else float)
                 for name, values in zip(self._REQUEST_FIELDS, columns)}
        self.add_requests(chunk)

    def _flush_steps(self) -> None:
        if not self._step_rows:
            return
        columns = list(zip(*self._step_rows))
        self._step_rows = []
        self.add_steps({name: np.asarray(values, dtype=float)
                        for name, values in zip(self._STEP_FIELDS, columns)})

    def _flush_itl(self) -> None:
        if not self._itl_chunks:
            return
        samples = np.concatenate(self._itl_chunks)
        self._itl_chunks = []
        self._itl_pending = 0
        self.hist["itl"].add(samples * 1000.0)
