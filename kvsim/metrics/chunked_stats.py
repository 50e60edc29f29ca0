"""``latency_stats`` of millions of values without a temporary of their size.

``summary.scaled_latency_stats`` takes the mean, the standard deviation, the
median, p90 and p99 of a run's gaps (in seconds; each figure is then scaled
to ms, as vLLM does). A fleet's gaps are tens of millions (W7: 35 M values):
numpy's ``std`` makes a temporary as large as them, and the order statistics
a partition of a copy of all of them (a 280 MB temporary in fresh memory,
and its partition, made W7's ``collect_fleet`` 0.9-1.1 s, 0.47-0.53 s
without them; the driver's peak RSS 1,045 -> 933 MiB). Here the values are
read a chunk at a time, the squared deviations made in one scratch of
``CHUNK`` values, and every figure is numpy's, bit for bit
(tests/test_chunked_stats.py checks it against numpy):

* **sums.** numpy adds a contiguous float64 array pairwise
  (``pairwise_sum``, numpy/_core/src/umath/loops_utils.h.src): it halves the
  array, each half cut at a multiple of 8, down to blocks of at most 128.
  The sum of a half depends only on its values and length, so a chunk that
  is one of the halves sums alone to the float it contributes; the halves
  above the chunks are added here in numpy's order (``tree_sum``).
* **order statistics.** A sorted sample of the values brackets each rank
  needed; one pass counts the values below each bracket and collects the
  ones inside it, and the rank is selected among those. A bracket that
  turns out not to hold its rank (a sample that misleads) costs one full
  copy instead, partitioned as ``summary.median_p90_p99`` does.

The mean and the standard deviation are numpy's ``mean`` and ``std`` (the
operations of ``summary.std_overwriting``); the order statistics feed
``summary``'s own interpolation (``QuantileRanks.quantiles``).
"""

from __future__ import annotations

import math

import numpy as np

# Values whose squared deviations are made at a time: 8 MB of scratch.
CHUNK = 1 << 20
# From this many values on the chunks are quicker than a copy and its partition
# (measured, the same floats either way: 2.2 M gaps, a W1-sized run's or a W7
# replica's, 45 -> 17 ms; 600 k 11.7 -> 10.6 ms; 300 k 5.5 -> 8.0 ms, so below).
MIN_VALUES = 1 << 19
# The sorted sample that brackets the ranks, and the bracket's half width in
# standard deviations of a sample rank (plus a few values for ties and small samples).
_SAMPLE = 1 << 17
_SIGMAS = 6.0
_SLACK = 32


def tree_sum(n: int, leaf_sum, start: int = 0) -> float:
    """numpy's pairwise sum of ``n`` values from ``start``, its halves above
    ``CHUNK`` values added here: ``leaf_sum(start, count)`` sums one half."""
    if n <= CHUNK:
        return leaf_sum(start, n)
    half = n // 2
    half -= half % 8
    return tree_sum(half, leaf_sum, start) + tree_sum(n - half, leaf_sum, start + half)


def mean_std_ranks(values: np.ndarray, ranks: list[int]) -> tuple[float, float, dict[int, float] | None]:
    """``np.mean(values)``, ``np.std(values)`` and the ``r``-th smallest value for
    each of ``ranks`` (None when a value is NaN, as ``median_p90_p99`` then
    returns NaN), for a 1-d contiguous float64 ``values``."""
    n = len(values)
    scratch = np.empty(min(n, CHUNK))
    brackets = _brackets(values, ranks)
    below = [0] * len(brackets)
    inside: list[list[np.ndarray]] = [[] for _ in brackets]
    nan = False

    def first_pass(lo: int, m: int) -> float:
        nonlocal nan
        chunk = values[lo:lo + m]
        nan = nan or bool(np.isnan(chunk).any())
        for k, (low, high, _) in enumerate(brackets):
            below[k] += int(np.count_nonzero(chunk < low))
            inside[k].append(chunk[(chunk >= low) & (chunk <= high)])
        return np.add.reduce(chunk)

    total = tree_sum(n, first_pass)
    count = np.intp(n)
    mean = np.true_divide(np.array([total]), count)       # np.mean's sum over count (shape (1,))

    def squared_deviations(lo: int, m: int) -> float:
        chunk = np.subtract(values[lo:lo + m], mean, out=scratch[:m])
        np.square(chunk, out=chunk)
        return np.add.reduce(chunk)

    var = np.float64(tree_sum(n, squared_deviations))
    var = var.dtype.type(var / np.maximum(count, 0))
    std = float(var.dtype.type(np.sqrt(var)))
    if nan:
        return float(mean[0]), std, None
    found: dict[int, float] = {}
    for k, (_, _, wanted) in enumerate(brackets):
        candidates = np.concatenate(inside[k]) if inside[k] else np.zeros(0)
        for r in wanted:
            local = r - below[k]
            if not 0 <= local < len(candidates):
                return float(mean[0]), std, _ranks_by_copy(values, ranks)
            found[r] = float(np.partition(candidates, local)[local])
    return float(mean[0]), std, found


def _brackets(values: np.ndarray, ranks: list[int]) -> list[tuple[float, float, list[int]]]:
    """(low, high, ranks) per bracket of values: a sorted strided sample
    puts each rank's value, with high probability, between low and high;
    brackets that overlap are merged (the median's two middle ranks, p90's two)."""
    n = len(values)
    step = max(1, n // _SAMPLE)
    sample = np.sort(values[::step])
    last = len(sample) - 1
    out: list[list] = []
    for r in sorted(set(ranks)):
        q = r / (n - 1) if n > 1 else 0.0
        at = q * last
        margin = _SIGMAS * math.sqrt(len(sample) * q * (1.0 - q)) + _SLACK
        i, j = math.floor(at - margin), math.ceil(at + margin)
        low = float(sample[i]) if i >= 0 else -math.inf
        high = float(sample[j]) if j <= last else math.inf
        if out and low <= out[-1][1]:
            out[-1][1] = max(out[-1][1], high)
            out[-1][2].append(r)
        else:
            out.append([low, high, [r]])
    return [(low, high, wanted) for low, high, wanted in out]


def _ranks_by_copy(values: np.ndarray, ranks: list[int]) -> dict[int, float]:
    """The ranks' values from one copy, partitioned at each (the fallback)."""
    part = values.copy()
    part.partition(sorted(set(ranks)))
    return {r: float(part[r]) for r in ranks}
