"""Writing the run's tables as CSV, byte for byte as ``DataFrame.to_csv(index=False)``.

``steps.csv`` of a long run has hundreds of thousands of rows; pandas spends
most of ``to_csv`` formatting numbers one cell at a time. Here each column is
turned into text once, and a value that repeats (a batch size, a free-block
count, the KV usage that follows from it) is formatted only the first time.

The text is what pandas writes: numbers as Python's shortest round-trip
``repr`` (``0.009611544548093896``, ``1e-05``), missing values (NaN, None) as
an empty field, strings quoted only when they hold a comma, a quote or a line
break (``csv.QUOTE_MINIMAL``), ``\\n`` line ends.
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np

# Format each distinct float once when at most this share of the values are
# distinct (finding them, pandas.factorize, costs ~0.03 µs a value; repr ~0.5-1 µs).
_MAX_DISTINCT_SHARE = 0.9

# Rows turned into text and written at a time: a fleet's steps.csv has millions
# of rows, whose cells as strings all at once took ~0.25 GB per million rows
# (W7: 3.1 million) on top of the tables, for no gain in speed. A cell's text
# does not depend on the other rows, so the chunks join to the same bytes.
# At most _CELLS_PER_CHUNK cells a chunk, so a wide table is cut finer:
# metrics.csv has a column per histogram bucket (W2: 283 columns x 16,691
# scrapes, whose 4.7 M cells at once took 170 MB).
_ROWS_PER_CHUNK = 65536
_CELLS_PER_CHUNK = 1 << 20

# Rows a process makes text at the least when several share a table (a
# fork of a large process costs ~10 ms; 50,000 rows ~0.1 s).
_MIN_ROWS_PER_WORKER = 50_000
# Rows a child of RowsAhead makes text: few forks (each copies pages the run then
# writes) and few rows left for the end (W1: three parts, 36 k rows left of 186 k).
ROWS_AHEAD = 50_000


def write_csv(table, path: str | Path, *, workers: int | None = None,
              ahead: RowsAhead | None = None) -> None:
    """Write ``table`` (a DataFrame, or a mapping of column name to values) to ``path``.

    ``workers``: processes that make the rows text (None: every core this
    process may use, for a table of at least ``_MIN_ROWS_PER_WORKER`` rows a
    process; 1 in a daemonic process, a sweep's worker). The bytes are the
    same for any number (``_write_rows_apart``). ``ahead``: the table's first
    rows already made text while it grew (``RowsAhead``); the same bytes again.
    """
    names = list(table.keys())
    if not names:
        raise ValueError(f"write_csv: no columns to write to {path}")
    arrays = [np.asarray(table[name]) for name in names]
    num_rows = len(arrays[0])
    if any(len(a) != num_rows for a in arrays):
        raise ValueError(f"write_csv: columns of different lengths in {path}")
    header = [_quote(str(name)) for name in names]
    if len(arrays) == 1:
        # csv writes a row of one empty field as "" (an empty line would be no row)
        header = [h or '""' for h in header]
        body = "".join(t + "\n" for t in [t or '""' for t in column_text(arrays[0])])
    elif num_rows == 0:
        body = ""
    else:
        body = None
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(",".join(header) + "\n")
        if body is not None:
            f.write(body)
            return
        start = ahead.write_parts(f, names, arrays) if ahead is not None else 0
        if start:
            _write_rows(f, arrays, start, num_rows)      # (fewer than a part's rows)
            return
        workers = _row_workers(num_rows) if workers is None else min(workers, num_rows)
        if workers > 1:
            _write_rows_apart(f, Path(path), arrays, num_rows, workers)
        else:
            _write_rows(f, arrays, 0, num_rows)


class RowsAhead:
    """A table's rows made text while it grows, by forked children: ``kvsim run``'s
    steps.csv during the simulation.

    W1's steps.csv is 186 k rows; making them text took 0.3 s of its 2.8 s
    process after the simulation, on both cores, while the simulation itself
    runs on one. So each time ``rows`` more rows are recorded (``watch``, an
    ``Engine.watch_steps``), a forked child makes them text into a part file
    and this process simulates on; ``write_csv(..., ahead=self)`` then waits
    for the parts, appends them in order and makes only the last rows. A
    row's text does not depend on the other rows (``_rows_text``), so the file
    is the same bytes. A child that failed costs only time: its rows are made
    there instead. The children see the table as it is at the fork (copy on
    write), read nothing else and leave by ``os._exit``; where forking is not
    safe (no ``fork``, other threads, a daemonic process) none is started.
    ``close()`` ends any child still running and removes the parts.
    """

    def __init__(self, names, rows: int | None = None) -> None:
        self.names = list(names)
        self.rows = rows or ROWS_AHEAD
        self.covered = 0                                  # rows given to children so far
        self.parts: list[tuple[int, Path, int, int]] = []  # (pid, part file, first row, end)
        self._dir: Path | None = None
        self._forks = _row_workers(2 * _MIN_ROWS_PER_WORKER) > 1

    def watch(self, steps) -> float:
        """``Engine.watch_steps``: a child for each ``rows`` new rows of ``steps``
        (a ``StepLog``: the child makes only its rows, ``columns_between``); the
        step count at which to be called next."""
        while self._forks and len(steps) - self.covered >= self.rows:
            if threading.active_count() > 1:
                self._forks = False                       # (a thread started since: no fork now)
                break
            self._fork(steps, self.covered, self.covered + self.rows)
        return self.covered + self.rows if self._forks else math.inf

    def _fork(self, steps, lo: int, hi: int) -> None:
        try:
            if self._dir is None:
                _remove_orphaned_parts()
                self._dir = Path(tempfile.mkdtemp(prefix=f"kvsim-rows-{os.getpid()}-"))
            part = self._dir / f"part{len(self.parts)}"
            pid = os.fork()
        except OSError:
            self._forks = False           # no folder or no process to be had: all made at the end
            return
        if pid == 0:                                      # the child
            code = 1
            try:
                with contextlib.suppress(OSError):
                    os.nice(10)                           # a core shared with the run: the run first
                columns = steps.columns_between(lo, hi)
                arrays = [np.asarray(columns[name]) for name in self.names]
                with open(part, "w", encoding="utf-8", newline="") as g:
                    _write_rows(g, arrays, 0, hi - lo)
                code = 0
            finally:
                os._exit(code)
        self.parts.append((pid, part, lo, hi))
        self.covered = hi

    def write_parts(self, f, names: list[str], arrays: list[np.ndarray]) -> int:
        """The rows the children made, in order, to ``f`` (a part whose child failed
        made here); the first row not written. 0, with nothing written, when the
        table is not the one watched (other columns or fewer rows)."""
        if not self.parts or names != self.names or len(arrays[0]) < self.covered:
            self.close()
            return 0
        f.flush()
        while self.parts:
            pid, part, lo, hi = self.parts.pop(0)
            text = _read_part(part) if _wait(pid) == 0 else None
            if text is not None:
                f.buffer.write(text)                      # (a few MB: read whole, so a failed
                f.buffer.flush()                          # read leaves nothing half written)
            else:
                _write_rows(f, arrays, lo, hi)
                f.flush()
        self.close()
        return self.covered

    def close(self) -> None:
        """End the children still running and remove the parts (also after an error)."""
        for pid, _, _, _ in self.parts:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            _wait(pid)
        self.parts = []
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        self._forks = False


def _remove_orphaned_parts() -> None:
    """The part folders of runs whose process is gone (killed by SIGKILL, which
    ``close`` cannot see): ``kvsim-rows-<pid>-*`` in the temporary folder, for a
    pid that no longer runs. Another user's, or a live process's, are left."""
    for folder in Path(tempfile.gettempdir()).glob("kvsim-rows-*-*"):
        pid = folder.name.split("-")[2]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except (OSError, OverflowError):
            pass                                          # (alive, another user's; no pid)


def _read_part(part: Path) -> bytes | None:
    try:
        return part.read_bytes()
    except OSError:
        return None                                       # (gone, unreadable: made again)


def _wait(pid: int) -> int:
    """The child's exit status (0: it succeeded)."""
    try:
        return os.waitpid(pid, 0)[1]
    except ChildProcessError:
        return -1


def _write_rows(f, arrays: list[np.ndarray], start: int, stop: int) -> None:
    """Rows ``start..stop-1``, ``_ROWS_PER_CHUNK`` (or ``_CELLS_PER_CHUNK`` cells) at a time."""
    step = max(1, min(_ROWS_PER_CHUNK, _CELLS_PER_CHUNK // len(arrays)))
    for lo in range(start, stop, step):
        hi = min(lo + step, stop)
        f.write(_rows_text([a[lo:hi] for a in arrays]))


def fork_is_safe() -> bool:
    """Whether this process may fork a child that runs a part of its work: Linux
    (``fork``, and the cores this process may use are known), no other thread
    running (it could hold a lock the child would need), not a daemonic process
    (a sweep's worker, which may not have children)."""
    if not hasattr(os, "fork") or sys.platform != "linux":
        return False
    import multiprocessing
    return threading.active_count() == 1 and not multiprocessing.current_process().daemon


def _row_workers(num_rows: int) -> int:
    """Processes for ``num_rows`` rows: one per ``_MIN_ROWS_PER_WORKER``, at most
    one per core this process may use; 1 where forking is not safe
    (``fork_is_safe``)."""
    if num_rows < 2 * _MIN_ROWS_PER_WORKER or not fork_is_safe():
        return 1
    # The cores this process may use (Linux here; scenario/executor.py's
    # default_workers says the same a layer above, for every platform).
    return max(1, min(len(os.sched_getaffinity(0)), num_rows // _MIN_ROWS_PER_WORKER))


def _write_rows_apart(f, path: Path, arrays: list[np.ndarray], num_rows: int, workers: int) -> None:
    """The rows in ``workers`` equal parts: the first made text here, each other
    one in a forked child that writes it to ``PATH.partK`` next to ``path``;
    then the parts are appended in order. A row's text does not depend on the
    other rows, so the file is the one-process file, byte for byte. A child
    that fails (killed, a full disk) costs only time: its part is made here
    instead. The children see the tables as they are at the fork (copy on
    write) and leave by ``os._exit``, running nothing of this process's."""
    bounds = [num_rows * k // workers for k in range(workers + 1)]
    f.flush()                                   # (nothing buffered for a child to write again)
    children: list[tuple[int, Path, int, int]] = []
    unreaped: set[int] = set()
    try:
        for k in range(1, workers):
            part = path.with_name(f"{path.name}.part{k}")
            try:
                pid = os.fork()
            except OSError:
                break                             # no process to be had: this one does the rest
            if pid == 0:                          # the child
                code = 1
                try:
                    with open(part, "w", encoding="utf-8", newline="") as g:
                        _write_rows(g, arrays, bounds[k], bounds[k + 1])
                    code = 0
                finally:
                    os._exit(code)
            unreaped.add(pid)
            children.append((pid, part, bounds[k], bounds[k + 1]))
        _write_rows(f, arrays, 0, bounds[1])
        for pid, part, lo, hi in children:
            _, status = os.waitpid(pid, 0)
            unreaped.discard(pid)
            if status == 0:
                f.flush()
                with open(part, "rb") as g:
                    shutil.copyfileobj(g, f.buffer, 1 << 20)
            else:
                _write_rows(f, arrays, lo, hi)
        covered = children[-1][3] if children else bounds[1]
        _write_rows(f, arrays, covered, num_rows)      # (parts whose fork failed)
    finally:
        for pid in unreaped:                      # an error here: the children are not needed
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        for _, part, _, _ in children:
            try:
                part.unlink(missing_ok=True)
            except OSError:
                pass                              # (a folder in the way: the child failed, made here)


def _rows_text(arrays: list[np.ndarray]) -> str:
    """Every row of two or more columns, each ended by a line break.

    Two ways, the same text: most columns integers that rarely repeat (a wide
    table of counters, metrics.csv) go to one ``%`` format per row, ``%d``
    for them, which beats turning each into a string first; otherwise
    (steps.csv: repeating integers and clocks) every column is made text and
    each row joined.
    """
    direct = [a.dtype.kind in "iu" and not _few_distinct(a) for a in arrays]
    if 2 * sum(direct) >= len(arrays):
        columns = [a.tolist() if d else column_text(a) for a, d in zip(arrays, direct)]
        line = ",".join("%d" if d else "%s" for d in direct) + "\n"
        return "".join([line % row for row in zip(*columns)])
    texts = [column_text(a) for a in arrays]
    return "\n".join(map(",".join, zip(*texts))) + "\n"


def column_text(values) -> list[str]:
    """The CSV field of every value of one column."""
    array = np.asarray(values)
    if array.dtype.kind in "iu":
        return _integers_text(array)
    if array.dtype.kind == "f":
        texts = _floats_text(array)
        for i in np.flatnonzero(np.isnan(array)).tolist():
            texts[i] = ""
        return texts
    values = array.tolist()
    if len({v for v in values[:1024] if type(v) is str}) > 64:
        return [_object_text(v) for v in values]          # (ids: nearly every one distinct)
    # Each distinct string quoted once (a fleet's replica column: 16 names in
    # 3.1 M rows); only strings are keyed, so 1, 1.0 and True stay apart.
    texts = {v: _quote(v) for v in {v for v in values if type(v) is str}}
    get = texts.get
    return [get(v) if type(v) is str else _object_text(v) for v in values]


def _few_distinct(array: np.ndarray) -> bool:
    """Integers within a range under half their number (a batch size, a flag): text by table."""
    return bool(len(array)) and int(array.max()) - int(array.min()) < len(array) // 2


def _integers_text(array: np.ndarray) -> list[str]:
    if _few_distinct(array):
        low = int(array.min())
        table = np.array([str(v) for v in range(low, int(array.max()) + 1)], dtype=object)
        return table[array - low].tolist()
    return list(map(str, array.tolist()))


def _floats_text(array: np.ndarray) -> list[str]:
    # Skip the search for repeats in a column that never repeats (a clock);
    # the search would merge -0.0 into 0.0, whose text differs.
    if len(array) > 16 and not (array[1:] > array[:-1]).all() \
            and not np.signbit(array[array == 0]).any():
        import pandas as pd      # (a hash table: several times faster than np.unique's sort)
        codes, distinct = pd.factorize(array, use_na_sentinel=False)    # (NaN: one value)
        if len(distinct) <= _MAX_DISTINCT_SHARE * len(array):
            table = np.array(list(map(repr, distinct.tolist())), dtype=object)
            return table[codes].tolist()
    return list(map(repr, array.tolist()))


def _object_text(value) -> str:
    if isinstance(value, str):
        return _quote(value)
    if value is None or (isinstance(value, float) and value != value) \
            or type(value).__name__ == "NAType":       # pandas.NA, without importing pandas
        return ""
    return _quote(str(value))


def _quote(text: str) -> str:
    if "," in text or '"' in text or "\n" in text or "\r" in text:
        # Rare (ids are plain): let the csv module that pandas uses decide, so
        # the quoting is csv.QUOTE_MINIMAL exactly as this Python implements it.
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator="\n").writerow([text])
        return buffer.getvalue()[:-1]
    return text
