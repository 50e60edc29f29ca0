"""Where a run's files go: checked before the simulation, written atomically.

A run's outputs must not be found broken only after minutes of simulation,
and an interrupted or failed write must not leave a truncated file under a
final name. So:

* ``check_output_dir`` / ``check_output_file`` run before the simulation
  starts: a path that is a file where a folder is wanted (or the reverse), a
  folder that cannot be created or written, are one-line ``OutputError``s
  that name the option and the path;
* every file is first written under a temporary name in its own folder
  (``.summary.json.<pid>.tmp``) and then renamed over the final name
  (``os.replace``, atomic on POSIX and Windows): a reader, or a rerun after a
  crash, Ctrl-C or a full disk, finds either the old file or the new one.
  ``write_files`` stages every file of a run before it renames any, so a
  failure while writing leaves all the old files in place;
* a write that fails (no space left, permission denied) is an ``OutputError``
  that names the final path and the reason, not a traceback.

There is no ``fsync``: the renames protect against a process that stops, not
against a machine that loses power.

``summary.json`` is strict JSON (RFC 8259 has no NaN or Infinity): a value
that is not a finite number is written as ``null`` and explained under
``null_reasons`` (``strict_summary``).
"""

from __future__ import annotations

import json
import math
import os
import signal
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TextIO


class OutputError(ValueError):
    """An output path that cannot be written; the message names the option and the path."""


# --------------------------------------------------------------------------- checks

def check_output_dir(out: str | os.PathLike, *, option: str = "--out",
                     files: tuple[str, ...] = ()) -> Path:
    """Create the folder ``out`` (and its parents) and make sure a file can be written in it.

    ``files`` are the names the run will write there: each must not be a folder.
    """
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise OutputError(f"{option} {out}: is a file, not a folder; give a folder path "
                          f"(it is created if missing)")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise OutputError(f"{option} {out}: cannot create the folder: a part of the path "
                          f"is a file") from None
    except OSError as exc:
        raise OutputError(f"{option} {out}: cannot create the folder: {_reason(exc)}") from None
    for name in files:
        if (path / name).is_dir():
            raise OutputError(f"{option} {out}: {path / name} is a folder; the run writes a "
                              f"file there; remove it or choose another folder")
    _probe(path, option, out)
    return path


def check_output_file(target: str | os.PathLike, *, option: str) -> Path:
    """Make sure ``target`` can be written as a file (its folder is created if missing)."""
    path = Path(target)
    if path.is_dir():
        raise OutputError(f"{option} {target}: is a folder; give a file path")
    parent = path.parent
    if parent.exists() and not parent.is_dir():
        raise OutputError(f"{option} {target}: {parent} is a file, not a folder")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"{option} {target}: cannot create the folder {parent}: "
                          f"{_reason(exc)}") from None
    _probe(parent, option, target)
    return path


def _probe(folder: Path, option: str, given) -> None:
    """Create and remove a file in ``folder``: permissions and read-only mounts show here."""
    probe = folder / f".kvsim-probe.{os.getpid()}.tmp"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise OutputError(f"{option} {given}: cannot write in {folder}: {_reason(exc)}") from None


# --------------------------------------------------------------------------- writing

def temporary_name(target: Path, pid: int | None = None) -> Path:
    """The name a file is written under before it is renamed to ``target``
    (by this process, or by the process ``pid``)."""
    return target.with_name(f".{target.name}.{os.getpid() if pid is None else pid}.tmp")


def write_files(writers: Mapping[str | os.PathLike, Callable[[Path], None]], *,
                staged: list[tuple[Path, Path]] | None = None) -> None:
    """Write every file atomically: ``writers[target](temp_path)`` writes one file.

    All files are written under temporary names first, then renamed; if any
    write fails or is interrupted, the temporary files are removed and every
    target keeps its old content. ``staged``: the files are left under their
    temporary names and their (temporary, target) pairs added to it, for
    ``commit_files`` to rename (what a ``FilesApart`` child does).
    """
    pairs: list[tuple[Path, Path]] = []
    try:
        for target, write in writers.items():
            target = Path(target)
            temp = temporary_name(target)
            pairs.append((temp, target))
            try:
                write(temp)
            except OSError as exc:
                raise OutputError(f"cannot write {target}: {_reason(exc)}") from None
    except BaseException:
        for temp, _ in pairs:
            _remove(temp)
        raise
    if staged is not None:
        staged += pairs
    else:
        commit_files(pairs)


def commit_files(staged: list[tuple[Path, Path]]) -> None:
    """Rename each staged (temporary, target) file to its target; if one cannot
    be, the temporary files are removed (those renamed already stay renamed)."""
    try:
        for temp, target in staged:
            try:
                os.replace(temp, target)
            except OSError as exc:
                raise OutputError(f"cannot write {target}: {_reason(exc)}") from None
    except BaseException:
        for temp, _ in staged:
            _remove(temp)
        raise


class FilesApart:
    """Files made by a forked child while this process writes others: ``kvsim run``'s
    metrics.csv and bench_serve.json, beside its summary.json, requests.csv and
    steps.csv (the two groups are independent; one core would otherwise wait).

    ``job(staged)`` writes its files with ``write_files(..., staged=staged)``
    and returns a JSON value (lists, not tuples, come back). The child runs it,
    leaves its files under their temporary names, sends the pairs and the value
    through a pipe and exits; ``join()`` renames those files and returns the
    value. Where no child could run (forking not safe, ``fork_is_safe``; one
    core; no process to be had) or it failed (killed; an error, which the job then
    raises here again), ``join()`` runs ``job(None)`` here: the same files,
    written as ``write_files`` writes them. ``targets``: the files the job
    writes, whose temporary names a failed child may leave (removed). ``apart``:
    False runs no child (a job with nothing to write); ``join()`` runs it here. ``close()``
    ends a child not joined (an error or Ctrl-C in between) and removes its
    files; nothing is renamed then.
    """

    def __init__(self, job: Callable[[list | None], Any], targets, apart: bool = True) -> None:
        from kvsim.metrics.tables import fork_is_safe

        self._job = job
        self._targets = [Path(t) for t in targets]
        self._pid: int | None = None
        self._pipe: int | None = None
        if not apart or not fork_is_safe() or len(os.sched_getaffinity(0)) < 2:
            return                                    # (on one core the child would only wait)
        try:
            read, write = os.pipe()
        except OSError:
            return
        try:
            pid = os.fork()
        except OSError:
            os.close(read)
            os.close(write)
            return
        if pid == 0:                                  # the child
            code = 1
            try:
                os.close(read)
                staged: list[tuple[Path, Path]] = []
                value = job(staged)
                message = json.dumps({"staged": [[str(t), str(g)] for t, g in staged],
                                      "value": value}).encode("utf-8")
                with open(write, "wb") as f:
                    f.write(message)
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        self._pid, self._pipe = pid, read

    def join(self) -> Any:
        """The job's value, its files renamed to their targets (made here if the child failed)."""
        pid, message = self._pid, None
        if pid is not None:
            pipe, self._pipe = self._pipe, None
            with open(pipe, "rb") as f:               # (until the child closes it: done or dead)
                data = f.read()
            status = _reap(pid)
            self._pid = None
            if status == 0:
                try:
                    message = json.loads(data)
                except ValueError:
                    message = None
            if message is None:
                self._remove_files(pid)
        if message is None:
            return self._job(None)
        commit_files([(Path(t), Path(g)) for t, g in message["staged"]])
        return message["value"]

    def close(self) -> None:
        """End a child not joined and remove what it wrote (after ``join``: nothing)."""
        pid = self._pid
        if pid is None:
            return
        self._pid = None
        with suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        _reap(pid)
        if self._pipe is not None:
            with suppress(OSError):
                os.close(self._pipe)
            self._pipe = None
        self._remove_files(pid)

    def _remove_files(self, pid: int) -> None:
        for target in self._targets:
            _remove(temporary_name(target, pid))


def _reap(pid: int) -> int:
    """The child's exit status (0: it succeeded)."""
    try:
        return os.waitpid(pid, 0)[1]
    except ChildProcessError:
        return -1


@contextmanager
def atomic_open(target: str | os.PathLike, *, option: str | None = None) -> Iterator[TextIO]:
    """A text file written under a temporary name, renamed to ``target`` when the block ends.

    An exception (or Ctrl-C) inside the block removes the temporary file and
    leaves ``target`` as it was.
    """
    target = Path(target)
    temp = temporary_name(target)
    where = f"{option} {target}" if option else str(target)
    try:
        handle = open(temp, "w", encoding="utf-8")
    except OSError as exc:
        raise OutputError(f"cannot write {where}: {_reason(exc)}") from None
    try:
        try:
            yield handle
            handle.close()
        except OSError as exc:
            raise OutputError(f"cannot write {where}: {_reason(exc)}") from None
        try:
            os.replace(temp, target)
        except OSError as exc:
            raise OutputError(f"cannot write {where}: {_reason(exc)}") from None
    except BaseException:
        try:
            handle.close()
        except OSError:
            pass
        _remove(temp)
        raise


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


# --------------------------------------------------------------------------- strict JSON

def strict_summary(summary: Mapping[str, Any]) -> dict[str, Any]:
    """``summary`` with every NaN or infinite number replaced by ``None``, and why.

    The reasons go under ``null_reasons`` (key -> one sentence); the key is
    absent when every value is a finite number.
    """
    out: dict[str, Any] = {}
    reasons: dict[str, str] = {}
    for key, value in summary.items():
        if isinstance(value, float) and not math.isfinite(value):
            out[key] = None
            reasons[key] = null_reason(key, value, summary)
        else:
            out[key] = value
    if reasons:
        out["null_reasons"] = reasons
    return out


def summary_json(summary: Mapping[str, Any]) -> str:
    """The summary as strict JSON text (what ``summary.json`` and ``--json`` hold)."""
    return json.dumps(strict_summary(summary), indent=2, allow_nan=False) + "\n"


def null_reason(key: str, value: float, summary: Mapping[str, Any]) -> str:
    """One sentence saying why ``summary[key]`` has no finite value."""
    if math.isinf(value):
        return ("infinite: the simulated times overflowed (check workload time scales and "
                "arrival rates)")
    completed = summary.get("completed") or 0
    duration = summary.get("duration")
    timed = isinstance(duration, (int, float)) and math.isfinite(duration) and duration > 0
    if key == "request_goodput" and timed:
        return "no SLO given (slo: ttft_ms, tpot_ms, e2el_ms), so no goodput"
    if key == "duration":
        return "no request finished"
    if key == "slo_attainment":                   # a fleet's key (kvsim/metrics/fleet.py)
        return ("no SLO given (slo: ttft_ms, tpot_ms, e2el_ms), so no SLO attainment"
                if completed or summary.get("failed") else "no request arrived")
    if key.endswith("_throughput") or key == "request_goodput":
        return "the run has no duration (no request finished, or all at one instant)"
    if key.endswith(("_ttft_ms", "_e2el_ms")):
        return "no request completed" if not completed else "not defined for these requests"
    if key.endswith(("_tpot_ms", "_itl_ms")):
        if not completed:
            return "no request completed"
        return "no completed request generated more than one token"
    if key.startswith("kv_cache_usage") or key == "mean_batch_size":
        return "no engine step ran"
    if key == "prefix_cache_hit_rate":
        return "no prompt token was scheduled"
    return "not defined for this run (no data to compute it from)"
