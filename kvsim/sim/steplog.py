"""Per-step records of one engine, kept as columns."""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right

import numpy as np


class StepLog:
    """Per-step records, kept as columns (cheap to append, cheap to tabulate).

    A step of the step path is appended as a row. A decode run of the fast
    path is kept as one record (its K steps differ only in their times and
    free blocks) and expanded with numpy when ``columns`` is read.
    """

    COLUMNS = ("step", "start_time_s", "duration_s", "num_prefill_tokens", "num_decode_tokens",
               "num_scheduled_reqs", "num_running", "num_waiting", "num_preempted",
               "num_finished", "num_free_blocks", "kv_cache_usage", "num_generated_tokens")
    FLOAT_COLUMNS = ("start_time_s", "duration_s", "kv_cache_usage")

    def __init__(self, first_step: int = 0) -> None:
        self._rows: dict[str, list] = {c: [] for c in self.COLUMNS}
        # Decode runs: one (first step, K, batch size, waiting, finished in the
        # last step, usable blocks, chunk, last chunk) each; their per-step values in flat arrays.
        self._runs: list[tuple] = []
        self._run_firsts: list[int] = []       # each run's first step (ascending)
        self._run_offsets: list[int] = []      # where each run's steps start in the flat arrays
        self._run_starts = array("d")          # (the cost model's arrays, appended)
        self._run_durations = array("d")
        self._run_free = array("q")
        self._len = 0
        self.first_step = first_step

    def __len__(self) -> int:
        return self._len

    @property
    def next_step(self) -> int:
        return self.first_step + self._len

    def append(self, *values) -> None:
        """One step, values in ``COLUMNS`` order (its step number first)."""
        for col, v in zip(self._rows.values(), values):
            col.append(v)
        self._len += 1

    def add_run(self, starts: array, durations: array, free_after: list[int],
                batch: int, waiting: int, num_finished: int, usable_blocks: int,
                chunk: int = 0, last_chunk: int = 0) -> None:
        """K decode steps of ``batch`` requests; the last one finishes ``num_finished``.
        ``chunk``: a chunk run, whose last request prefills that many tokens a
        step; ``last_chunk``: in the last step, the rest of its prompt, and it samples."""
        k = len(durations)
        self._run_firsts.append(self.next_step)
        self._run_offsets.append(len(self._run_durations))
        self._runs.append((self.next_step, k, batch, waiting, num_finished, usable_blocks, chunk,
                           last_chunk))
        self._run_starts.extend(starts)
        self._run_durations.extend(durations)
        self._run_free.extend(free_after)
        self._len += k

    @property
    def columns(self) -> dict[str, np.ndarray]:
        """Every step in step order, one numpy array per column."""
        return self.columns_between(0, self._len)

    def columns_between(self, lo: int, hi: int) -> dict[str, np.ndarray]:
        """Steps ``lo .. hi - 1`` of the log (0: its first), in step order, one
        numpy array per column: the rows of ``columns[lo:hi]``, made alone (a
        part of steps.csv made during the run: kvsim.metrics.tables.RowsAhead)."""
        lo, hi = max(lo, 0), min(hi, self._len)
        n = max(hi - lo, 0)
        out = {c: np.empty(n, dtype=float if c in self.FLOAT_COLUMNS else np.int64)
               for c in self.COLUMNS}
        if not n:
            return out
        base = self.first_step + lo                 # the step number of row 0 of out
        steps = self._rows["step"]                  # (ascending: appended in step order)
        a, b = bisect_left(steps, base), bisect_left(steps, base + n)
        if b > a:
            at = np.asarray(steps[a:b], dtype=np.int64) - base
            for c, values in self._rows.items():
                out[c][at] = values[a:b]
        runs = self._runs
        # The runs that hold a step of the range: from the one holding its first step.
        i = max(bisect_right(self._run_firsts, base) - 1, 0)
        j = bisect_left(self._run_firsts, base + n)
        if j > i:
            firsts, ks, batch, waiting, fin, usable, chunk, last_chunk = (
                np.asarray(v, dtype=np.int64) for v in zip(*runs[i:j]))
            start = self._run_offsets[i]
            total = int(ks.sum())
            ends = np.cumsum(ks)
            last = ends - 1                              # index of each run's last step
            at = np.repeat(firsts - base, ks) + np.arange(total) - np.repeat(ends - ks, ks)
            b = np.repeat(batch, ks)
            prefill = np.repeat(chunk, ks)
            decodes = b - (prefill > 0)                  # a chunk run's last request prefills
            generated = decodes.copy()
            reached = last[last_chunk > 0]               # chunk runs that reached the last chunk
            prefill[reached] = last_chunk[last_chunk > 0]
            generated[reached] += 1
            free = np.array(memoryview(self._run_free)[start:start + total], dtype=np.int64)
            running = b.copy()
            running[last] -= fin
            finished = np.zeros(total, dtype=np.int64)
            finished[last] = fin
            cols = {
                "step": at + base,
                # Copies (of views of the arrays, let go at once): a view kept would stop them growing.
                "start_time_s": np.array(memoryview(self._run_starts)[start:start + total], dtype=float),
                "duration_s": np.array(memoryview(self._run_durations)[start:start + total], dtype=float),
                "num_prefill_tokens": prefill,
                "num_decode_tokens": decodes,
                "num_scheduled_reqs": b,
                "num_running": running,
                "num_waiting": np.repeat(waiting, ks),
                "num_preempted": 0,
                "num_finished": finished,
                "num_free_blocks": free,
                "kv_cache_usage": 1.0 - free / np.repeat(usable, ks),
                "num_generated_tokens": generated,
            }
            inside = (at >= 0) & (at < n)                # (the first and last runs may reach out)
            if not inside.all():
                at = at[inside]
                cols = {c: v if np.ndim(v) == 0 else v[inside] for c, v in cols.items()}
            for c, values in cols.items():
                out[c][at] = values
        return out
