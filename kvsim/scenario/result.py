"""What a run produced: ``Result`` and the tables built from an engine's records.

Moved here from kvsim/scenario/simulate.py unchanged, so that a fleet
(kvsim/scenario/cluster.py, which ``simulate`` runs for a scenario with
``cluster:``) builds the same tables without importing ``simulate``.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvsim.metrics.schema import REQUEST_COLUMNS, STEP_COLUMNS
from kvsim.metrics.tables import RowsAhead, write_csv
from kvsim.scenario.loader import LoadedScenario
from kvsim.scenario.outputs import check_output_dir, summary_json, write_files
from kvsim.sched.request import Request, RequestStatus
from kvsim.sim.engine import Engine, EngineStats

RUN_FILES = ("summary.json", "requests.csv", "steps.csv")
# Values ``itl_seconds`` compresses at a time: a 512 kB copy, not one of them all.
_COMPRESS_BLOCK = 1 << 16


@dataclass
class Result:
    """What a run produced: the summary, per-request and per-step tables.

    ``stats`` says how the run was simulated (steps, decode runs, the
    scheduler's own counters): what benchmarks and reports read instead of
    reaching into the engine.
    """

    summary: dict[str, Any]
    requests: pd.DataFrame
    steps: pd.DataFrame
    itl_s: np.ndarray = field(repr=False)
    scenario: LoadedScenario | None = field(default=None, repr=False)
    stats: EngineStats | None = field(default=None, repr=False)

    def write(self, out_dir: str | Path, *, steps_ahead=None) -> Path:
        """Write summary.json (strict JSON), requests.csv, steps.csv atomically (scenario/outputs.py).
        ``steps_ahead``: steps.csv's rows made text during the run (``kvsim.metrics.tables.RowsAhead``)."""
        out = check_output_dir(out_dir, files=RUN_FILES)
        summary = summary_json(self.summary)
        # The same bytes as DataFrame.to_csv(index=False), several times faster.
        write_files({out / "summary.json": lambda path: path.write_text(summary, encoding="utf-8"),
                     out / "requests.csv": lambda path: write_csv(self.requests, path),
                     out / "steps.csv": lambda path: write_csv(self.steps, path, ahead=steps_ahead)})
        return out


# The Request field behind each of REQUEST_COLUMNS (num_cached_tokens: -1 before the
# first admission, shown as 0; status: "failed" or "completed").
_REQUEST_FIELDS = {
    "request_id": "request_id", "arrival_time_s": "arrival_time", "queued_time_s": "queued_time",
    "scheduled_time_s": "scheduled_time", "first_token_time_s": "first_token_time",
    "finish_time_s": "finish_time", "num_prompt_tokens": "prompt_len",
    "num_output_tokens": "num_output_tokens", "num_cached_tokens": "num_cached_tokens",
    "num_preemptions": "num_preemptions", "priority": "priority", "status": "status",
    "fail_reason": "fail_reason"}
_read_request = attrgetter(*(_REQUEST_FIELDS[c] for c in REQUEST_COLUMNS))


_arrival_then_input = attrgetter("arrival_time", "index")
_index = attrgetter("index")


def in_arrival_order(done: list[Request]) -> list[Request]:
    """The requests by arrival time, then in the workload's order (``Request.index``):
    the order of requests.csv and of the gaps ``itl_seconds`` pools, which is the
    order ``vllm bench serve`` lists its outputs in (it sends them in that order,
    and its ``np.mean(ttfts)`` sums them in it: with simultaneous arrivals, the
    order the requests finished in would change the last bits)."""
    return sorted(done, key=_arrival_then_input)


def arrival_indices(done: list[Request]) -> np.ndarray:
    """The ``Request.index`` of each row of ``requests_frame(done)``: with the arrival
    times, what puts several engines' rows in one client's order (a fleet's)."""
    return np.fromiter(map(_index, in_arrival_order(done)), dtype=np.int64, count=len(done))


def requests_frame(done: list[Request]) -> pd.DataFrame:
    """One row per request, in ``in_arrival_order``."""
    # One C-level pass reads every request's fields; zip turns the rows into columns.
    columns = list(zip(*map(_read_request, in_arrival_order(done)))) or [()] * len(REQUEST_COLUMNS)
    rows = dict(zip(REQUEST_COLUMNS, columns))
    rows["num_cached_tokens"] = [c if c > 0 else 0 for c in rows["num_cached_tokens"]]
    failed = RequestStatus.FAILED
    rows["status"] = ["failed" if st is failed else "completed" for st in rows["status"]]
    return pd.DataFrame({c: _column(v) for c, v in rows.items()}, columns=REQUEST_COLUMNS)


def _column(values) -> np.ndarray | list:
    """A column of plain floats or ints as the numpy array pandas would infer from
    it (float64, int64), made without pandas' inference pass over the objects;
    anything else as a list, for pandas to infer."""
    kinds = set(map(type, values))
    if kinds == {float}:
        return np.array(values, dtype=np.float64)
    if kinds == {int}:
        try:
            return np.array(values, dtype=np.int64)
        except OverflowError:
            pass                                    # past int64: pandas decides
    return list(values)


def steps_frame(engine: Engine) -> pd.DataFrame:
    return pd.DataFrame(engine.steps.columns, columns=STEP_COLUMNS)


def steps_csv_ahead(sc: LoadedScenario) -> RowsAhead | None:
    """For ``kvsim run --out``: steps.csv's rows made text while the run goes
    (``simulate(sc, watch_steps=ahead.watch)``, then ``Result.write(out,
    steps_ahead=ahead)``; ``close()`` it in any case), or None where there is
    no such table to watch (a fleet, streaming metrics)."""
    if sc.scenario.cluster is not None or sc.scenario.metrics.streaming:
        return None
    return RowsAhead(STEP_COLUMNS)


def itl_seconds(done: list[Request]) -> np.ndarray:
    """Every gap between consecutive streamed messages of each completed request, request
    by request in ``in_arrival_order`` (requests.csv's rows), as vLLM's ``itls += output.itl``.

    Tokens that reach the client at the same time are one message and add no
    gap (several tokens per step, ``stream_interval``: ``kvsim.sim.client``),
    as ``vllm bench serve`` counts one ITL per message after the first.
    """
    return _gaps(done, with_counts=False)[0]


def itl_seconds_and_counts(done: list[Request]) -> tuple[np.ndarray, np.ndarray]:
    """``itl_seconds(done)``, and how many of them each request has, in the order of
    requests.csv's rows (0 for a failed one): where each request's gaps are, for an
    order of several engines' gaps (a fleet's client pools them in its own)."""
    return _gaps(done, with_counts=True)


def _gaps(done: list[Request], *, with_counts: bool) -> tuple[np.ndarray, np.ndarray | None]:
    ordered = in_arrival_order(done)
    failed = RequestStatus.FAILED
    has_gaps = [r.status is not failed and len(r.token_times) > 1 for r in ordered]
    times = [r.token_times for r, g in zip(ordered, has_gaps) if g]
    counts = np.zeros(len(ordered), dtype=np.int64) if with_counts else None
    if not times:
        return np.zeros(0), counts
    # One diff over all requests' token times, less the gaps between requests
    # (a np.diff per request costs more than its arithmetic). The times are
    # arrays of doubles (Request.token_times), joined in one writable copy (a
    # list, from a caller's own requests, is converted first) that the gaps
    # then overwrite: fresh memory is dear (a W7 replica's 2.2 M gaps: a diff and
    # a compressed copy of 17 MB each took ~60 ms of fresh pages).
    lengths = np.fromiter(map(len, times), dtype=np.int64, count=len(times))
    flat = np.frombuffer(bytearray().join([t if type(t) is array else array("d", t) for t in times]),
                         dtype=float)
    # (Overlapping operands give what separate ones would: np.diff's floats.)
    gaps = np.subtract(flat[1:], flat[:-1], out=flat[:-1])
    # Steps take positive time, so a zero gap is two tokens of one message; the
    # gaps from a request's last token to the next request's first are not gaps.
    keep = gaps != 0.0
    ends = np.cumsum(lengths)
    keep[ends[:-1] - 1] = False
    if with_counts:
        # A request's diffs start where its times do; the boundary after them is kept out.
        counts[np.array(has_gaps, dtype=bool)] = np.add.reduceat(keep, ends - lengths, dtype=np.int64)
    return _compress_in_place(gaps, keep), counts


def _compress_in_place(values: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """``values[keep]``, made inside ``values`` (a view of its start is returned): a
    block at a time, each block's kept values copied out, then written down to
    where the kept ones before them end (never past the block's own start).
    When most go (one message of several tokens, ``stream_interval``), a copy of
    the kept ones, so that the whole array is not held for them."""
    end = 0
    for lo in range(0, len(values), _COMPRESS_BLOCK):
        kept = values[lo:lo + _COMPRESS_BLOCK][keep[lo:lo + _COMPRESS_BLOCK]]
        values[end:end + len(kept)] = kept
        end += len(kept)
    return values[:end] if 2 * end >= len(values) else values[:end].copy()
