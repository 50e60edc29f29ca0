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

Every chunk is read on its own and its results kept, so many chunks (a
fleet's) are read on several threads, numpy's loops letting go of the GIL:
the figures do not depend on which thread read which chunk (W7's fleet
summary, two cores: ``mean_std_ranks`` 0.35 -> 0.29 s; the views of a
client's order are made in Python, holding the GIL, so little more).

A fleet's gaps are held replica by replica, and its client pools them
request by request in arrival order: with a ``Segments`` order, each chunk is
read in that order (one C-level concatenation of the requests' runs), so the
sums are those of the client's list; the order statistics do not depend on it.
"""

from __future__ import annotations

import math
import os
import threading
from bisect import bisect_right
from concurrent.futures import ThreadPoolExecutor
from itertools import accumulate

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


class Segments:
    """An order of an array's values: the runs ``values[start:start + count]``, one
    after the other. A fleet holds its gaps replica by replica; its client lists
    them request by request in arrival order, and numpy's sums depend on the
    order (kvsim/scenario/cluster.py makes the runs, one per request)."""

    def __init__(self, starts: np.ndarray, counts: np.ndarray) -> None:
        starts = np.asarray(starts, dtype=np.int64)
        counts = np.asarray(counts, dtype=np.int64)
        runs = counts > 0                                # (a request with no gap adds no run)
        starts, counts = starts[runs], counts[runs]
        # A run that goes on where the one before it ended is one run with it.
        new = np.ones(len(starts), dtype=bool)
        new[1:] = starts[1:] != starts[:-1] + counts[:-1]
        firsts = np.flatnonzero(new)
        self.starts = starts[firsts].tolist()
        self.counts = np.add.reduceat(counts, firsts).tolist() if len(firsts) else []
        self.begins = [0, *accumulate(self.counts)]      # where each run begins in the order
        self.size = self.begins.pop()

    def take(self, values: np.ndarray) -> np.ndarray:
        """The values in this order, a new array."""
        return self.read(values, 0, self.size, np.empty(self.size, dtype=values.dtype))

    def read(self, values: np.ndarray, lo: int, m: int, out: np.ndarray) -> np.ndarray:
        """Values ``lo .. lo + m - 1`` of this order, written into ``out[:m]`` (returned)."""
        if m <= 0:
            return out[:0]
        begins = self.begins
        i = bisect_right(begins, lo) - 1                 # the runs i .. j - 1 hold them
        j = bisect_right(begins, lo + m - 1)
        parts = [values[a:a + c] for a, c in zip(self.starts[i:j], self.counts[i:j])]
        parts[-1] = parts[-1][:lo + m - begins[j - 1]]   # (the last one first: i may be j - 1)
        parts[0] = parts[0][lo - begins[i]:]
        # One C-level copy of the views (a slice assignment per run cost 1.7x as much).
        return np.concatenate(parts, out=out[:m])


def mean_std_ranks(values: np.ndarray, ranks: list[int], order: Segments | None = None
                   ) -> tuple[float, float, dict[int, float] | None]:
    """``np.mean(values)``, ``np.std(values)`` and the ``r``-th smallest value for
    each of ``ranks`` (None when a value is NaN, as ``median_p90_p99`` then
    returns NaN), for a 1-d contiguous float64 ``values``; with ``order``, the
    mean and std of the values in that order (``np.mean(order.take(values))``),
    read a chunk at a time (the ranks do not depend on the order).

    Each chunk is read on its own (its sum, its counts below the brackets, its
    values inside them), so from ``THREADED_CHUNKS`` chunks on (a fleet's gaps)
    they are read on ``_threads()`` threads: numpy's loops let go of the GIL,
    and the sums are then added in the tree's order, the same floats.
    """
    n = len(values)
    if order is not None and order.size != n:
        raise ValueError(f"an order of {order.size} values for {n} values")
    leaves = _leaves(n)
    scratch = _Scratch(min(n, CHUNK))

    def read(lo: int, m: int, out: np.ndarray | None) -> np.ndarray:
        if order is None:
            return values[lo:lo + m]
        return order.read(values, lo, m, out)

    brackets = _brackets(values, ranks)

    def first_pass(leaf: tuple[int, int]):
        chunk = read(*leaf, None if order is None else scratch.get("ordered"))
        nan = bool(np.isnan(chunk).any())
        below = [int(np.count_nonzero(chunk < low)) for low, _, _ in brackets]
        inside = [chunk[(chunk >= low) & (chunk <= high)] for low, high, _ in brackets]
        return np.add.reduce(chunk), nan, below, inside

    firsts = dict(zip(leaves, _map(first_pass, leaves)))
    total = tree_sum(n, lambda lo, m: firsts[lo, m][0])
    count = np.intp(n)
    mean = np.true_divide(np.array([total]), count)       # np.mean's sum over count (shape (1,))

    def squared_deviations(leaf: tuple[int, int]) -> float:
        out = scratch.get("deviations")
        chunk = np.subtract(read(*leaf, out), mean, out=out[:leaf[1]])
        np.square(chunk, out=chunk)
        return np.add.reduce(chunk)

    squares = dict(zip(leaves, _map(squared_deviations, leaves)))
    var = np.float64(tree_sum(n, lambda lo, m: squares[lo, m]))
    var = var.dtype.type(var / np.maximum(count, 0))
    std = float(var.dtype.type(np.sqrt(var)))
    if any(nan for _, nan, _, _ in firsts.values()):
        return float(mean[0]), std, None
    found: dict[int, float] = {}
    for k, (_, _, wanted) in enumerate(brackets):
        below = sum(first[2][k] for first in firsts.values())
        inside = [first[3][k] for first in firsts.values()]
        candidates = np.concatenate(inside) if inside else np.zeros(0)
        for r in wanted:
            local = r - below
            if not 0 <= local < len(candidates):
                return float(mean[0]), std, _ranks_by_copy(values, ranks)
            found[r] = float(np.partition(candidates, local)[local])
    return float(mean[0]), std, found


# From this many chunks on (W7's 35 M gaps: 34) they are read on several threads;
# below it (a W1-sized run's 2.2 M gaps: 3) the threads would cost more than they save.
THREADED_CHUNKS = 8


def _leaves(n: int) -> list[tuple[int, int]]:
    """The (start, count) of ``tree_sum(n, ...)``'s leaves, in its order."""
    leaves: list[tuple[int, int]] = []
    tree_sum(n, lambda lo, m: leaves.append((lo, m)) or 0.0)
    return leaves


def _threads() -> int:
    """Threads for the chunks: the cores this process may use, at most 4."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:                      # (not on every platform)
        cores = os.cpu_count() or 1
    return max(1, min(cores, 4))


def _map(fn, leaves: list[tuple[int, int]]) -> list:
    """``fn`` of each leaf, in order; on threads when there are many."""
    threads = _threads() if len(leaves) >= THREADED_CHUNKS else 1
    if threads == 1:
        return list(map(fn, leaves))
    with ThreadPoolExecutor(threads, thread_name_prefix="kvsim-stats") as pool:
        return list(pool.map(fn, leaves))


class _Scratch:
    """Each thread's own scratch arrays of ``size`` values, one per use (the
    deviations, an order's reads), reused chunk after chunk: fresh memory is dear."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.local = threading.local()

    def get(self, use: str) -> np.ndarray:
        out = getattr(self.local, use, None)
        if out is None:
            out = np.empty(self.size)
            setattr(self.local, use, out)
        return out


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
