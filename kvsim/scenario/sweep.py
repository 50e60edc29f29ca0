"""Scenario sweeps: expand a ``sweep:`` section into points, run them, stream rows to ``OUT``.

A sweep is embarrassingly parallel (DESIGN.md, "Scale beyond one machine"):
one point is one simulation. The parts:

    sweep_points.py  the sweep: section -> points (zip, grid, repeat), each checked first
    executor.py      points on worker processes or Ray (shared with kvsim plan)
    results_log.py   the durable log, the lock on OUT, the code version
    progress.py      the progress line
    sweep.py         this driver: resume, results.csv

Every finished point is appended to ``OUT/results.jsonl`` at once (flushed and
synced), with the identity it was run under: the fingerprint of the base
scenario (everything but the sweep section, ``--set`` overrides and seed
included) and the code version. ``OUT/results.csv`` is rebuilt from the log
when the sweep starts and ends (and when it is interrupted).

Resume: a rerun with the same ``OUT`` skips points that have an ``ok`` record
of the same identity and runs the rest. Identity is checked on every record,
not only on ``OUT/sweep.json``: a record of another base scenario makes the
rerun refuse (use a new ``--out``); a record of other kvsim code, or one with
no identity (an older kvsim), is run again. A record is never relabelled with
the current seed or values.

Ctrl-C or SIGTERM (under ``executor.signals_as_interrupts``) stop the workers;
every finished point stays in the log and a rerun resumes. If the driver is
killed outright, its workers die with it and the next sweep takes its lock over.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kvsim.scenario.executor import (ExecutorError, Task, check_options, default_workers, execute,
                                     run_task)
from kvsim.scenario.progress import ProgressBar, auto_progress
from kvsim.scenario.results_log import OutLock, LockedError, ResultsLog, code_version, read_log
from kvsim.scenario.sweep_points import (SweepError, SweepPoint, base_fingerprint, canonical_json,
                                         expand_sweep, load_point, point_id, schema_path_error,
                                         set_dotted, validate_sweep)

__all__ = ["ProgressBar", "SweepError", "SweepOutcome", "SweepPoint", "auto_progress",
           "base_fingerprint", "default_workers", "expand_sweep", "load_point", "point_id",
           "read_results_log", "run_sweep", "run_task", "schema_path_error", "set_dotted",
           "simulate_point", "validate_sweep", "write_results_csv"]

# Columns every row has; a summary key that collides with one gets a "summary_"
# prefix (no dot: plots take dotted columns for swept keys).
LEADING_COLUMNS = ("point_id", "repeat", "seed")
TRAILING_COLUMNS = ("status", "error", "wall_time_s")
RESULTS_JSONL = "results.jsonl"
RESULTS_CSV = "results.csv"
SWEEP_JSON = "sweep.json"
POINTS_DIR = "points"
MAX_EXIT_STATUS = 100

RunPoint = Callable[[dict, "str | None"], dict]
Progress = Callable[[int, int, int], None]


@dataclass(frozen=True)
class SweepOutcome:
    """What a ``run_sweep`` call did. ``num_failed`` counts points that failed in this call."""

    num_points: int
    num_done: int          # points run ok in this call
    num_failed: int
    num_skipped: int       # points that already had an ok row in OUT (resume)
    wall_time_s: float
    workers: int | None
    results_csv: Path

    @property
    def exit_status(self) -> int:
        # The CLI's exit status: how many points failed, capped so it stays a valid status.
        return min(self.num_failed, MAX_EXIT_STATUS)


def simulate_point(scenario: dict, point_dir: str | None = None, *,
                   base_dir: str | os.PathLike | None = None) -> dict:
    """The default point runner: load, simulate, optionally write the run's files; return the summary."""
    from kvsim.scenario import load_scenario, simulate
    result = simulate(load_scenario(scenario, base_dir=base_dir))
    if point_dir is not None:
        result.write(point_dir)
    return dict(result.summary)


def read_results_log(out_dir: str | os.PathLike) -> dict[str, dict]:
    """The latest record of each point id in ``OUT/results.jsonl`` ({} when there is none)."""
    return read_log(Path(out_dir) / RESULTS_JSONL, "point_id")


def run_sweep(scenario_dict: dict, out_dir: str | os.PathLike, *, workers: int | None = None,
              executor: str = "local", address: str | None = None, keep_points: bool = False,
              run_point: RunPoint | None = None, progress: Progress | bool | None = None,
              check_point: Callable[[dict], Any] | None = None,
              base_dir: str | os.PathLike | None = None,
              log: Callable[[str], None] | None = None) -> SweepOutcome:
    """Run every point of the scenario's sweep, streaming rows to ``out_dir``; resume if it has some.

    ``run_point(scenario, point_dir) -> summary dict`` runs one point
    (``point_dir`` is ``OUT/points/<id>`` with ``keep_points``, else None). It
    must pickle (a module-level function or a ``functools.partial`` of one).
    By default it is :func:`simulate_point`, and every point is first checked
    against the schema and the loader. An injected ``run_point`` defines its
    own scenarios: then only ``check_point`` (if given) checks them.

    ``workers``: processes (local) or concurrent tasks (Ray); default all
    cores (local, local Ray) or the cluster's CPUs (Ray at ``address``).
    ``workers == 1`` with the local executor runs in this process.
    ``progress``: None for a bar on a terminal stderr, False for none, or a
    callable ``(done, failed, total)``. ``base_dir`` resolves relative paths
    in the scenario (the scenario file's folder). ``log`` gets one-line
    notices (a lock taken over, records run again); default: stderr.
    """
    start = time.perf_counter()
    try:
        check_options(executor, workers, address)   # before anything runs or the log opens
    except ExecutorError as exc:
        raise SweepError(str(exc)) from None
    log = log or _stderr_line
    if run_point is None:
        points = validate_sweep(scenario_dict, check_point=functools.partial(load_point, base_dir=base_dir))
        run_point = functools.partial(simulate_point, base_dir=base_dir)
    else:
        points = validate_sweep(scenario_dict, check_point=check_point, schema_model=None)
    if workers is None and not (executor == "ray" and address):
        workers = default_workers()

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    identity = {"base_fingerprint": base_fingerprint(scenario_dict), "code_version": code_version()}
    with _locked(out, log):
        _check_sweep_json(out, scenario_dict, identity)
        records = _usable_records(out, points, identity, log)
        finished = {pid for pid, rec in records.items() if rec.get("status") == "ok"}
        todo = [p for p in points if p.point_id not in finished]
        if records:  # resume: show what is already there before running the rest
            write_results_csv(out, points, records)
        if progress is None:
            progress = auto_progress()
        elif progress is False:
            progress = None
        counts = {"ok": 0, "failed": 0}

        def on_done(task: Task, result: dict) -> None:
            point = task.key
            status = "ok" if result.get("summary") is not None and not result.get("error") else "failed"
            record = {"point_id": point.point_id, "repeat": point.repeat, "seed": point.seed,
                      "params": point.params, "summary": result.get("summary"), "status": status,
                      "error": result.get("error", ""), "wall_time_s": result.get("wall_time_s"),
                      "traceback": result.get("traceback", ""), **identity}
            results.append(record)
            records[point.point_id] = record
            counts[status] += 1
            if progress:
                progress(counts["ok"] + counts["failed"], counts["failed"], len(todo))

        results = ResultsLog(out / RESULTS_JSONL)
        try:
            if progress and todo:
                progress(0, 0, len(todo))
            tasks = [Task(p, p.scenario, _prepare_point_dir(out, p) if keep_points else None) for p in todo]
            if tasks:
                execute(tasks, run_point, on_done, executor=executor, address=address,
                        workers=1 if executor == "local" and len(tasks) <= 1 else workers)
        finally:
            results.close()
            # The log is the truth: a point logged as an interrupt came (in append's
            # fsync, before `records` saw it) belongs in results.csv too.
            records.update(_usable_records(out, points, identity, lambda _: None))
            csv_path = write_results_csv(out, points, records)

    return SweepOutcome(num_points=len(points), num_done=counts["ok"], num_failed=counts["failed"],
                        num_skipped=len(points) - len(todo), wall_time_s=time.perf_counter() - start,
                        workers=workers, results_csv=csv_path)


@contextlib.contextmanager
def _locked(out: Path, log: Callable[[str], None]):
    """Hold OUT's lock (two sweeps never interleave rows); a live holder is a SweepError."""
    try:
        lock = OutLock(out, what="sweep", log=log)
        lock.__enter__()
    except LockedError as exc:
        raise SweepError(str(exc)) from None
    try:
        yield
    finally:
        lock.__exit__(None, None, None)


def _stderr_line(text: str) -> None:
    print(f"kvsim sweep: {text}", file=sys.stderr)


# ----------------------------------------------------------------------------
# Resume: which records belong to this sweep
# ----------------------------------------------------------------------------

def _check_sweep_json(out: Path, scenario_dict: dict, identity: dict) -> None:
    """Refuse an OUT whose sweep.json names another base scenario; then (re)write it."""
    path = out / SWEEP_JSON
    fingerprint = identity["base_fingerprint"]
    if path.exists():
        try:
            previous = json.loads(path.read_text(encoding="utf-8")).get("base_fingerprint")
        except (json.JSONDecodeError, AttributeError, UnicodeDecodeError):
            previous = None   # damaged: the records' own fingerprints still decide
        if previous is not None and previous != fingerprint:
            raise SweepError(_different_base(out, previous, fingerprint))
    info = {"base_fingerprint": fingerprint, "code_version": identity["code_version"],
            "sweep": scenario_dict.get("sweep")}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(info, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _different_base(out: Path, previous: str, now: str) -> str:
    return (f"--out {out}: holds a sweep of a different base scenario (fingerprint {previous}, "
            f"now {now}); only the sweep section may change between reruns; use a new --out")


def _usable_records(out: Path, points: list[SweepPoint], identity: dict,
                    log: Callable[[str], None]) -> dict[str, dict]:
    """The log's records that this sweep may reuse or show, by point id.

    Every record is checked: one of another base scenario refuses the rerun;
    one of other code, with no identity, or whose values are not its point's
    is dropped (that point runs again).
    """
    by_id = {p.point_id: p for p in points}
    usable, other_code, unlabelled = {}, 0, 0
    for pid, record in read_results_log(out).items():
        base = record.get("base_fingerprint")
        if base is not None and base != identity["base_fingerprint"]:
            raise SweepError(_different_base(out, base, identity["base_fingerprint"]))
        point = by_id.get(pid)
        if point is None:
            continue                      # a point the sweep section no longer has
        if base is None:
            unlabelled += 1
        elif record.get("code_version") != identity["code_version"]:
            other_code += 1
        elif (record.get("seed"), record.get("repeat")) != (point.seed, point.repeat) or \
                canonical_json(record.get("params")) != canonical_json(point.params):
            unlabelled += 1
        else:
            usable[pid] = record
    if other_code:
        log(f"{other_code} recorded point(s) in {out} came from other kvsim code; running them again")
    if unlabelled:
        log(f"{unlabelled} recorded point(s) in {out} carry no identity that matches their point "
            f"(an older kvsim, or a damaged log); running them again")
    return usable


# ----------------------------------------------------------------------------
# results.csv and the points' folders
# ----------------------------------------------------------------------------

def _cell(value: Any) -> Any:
    return canonical_json(value) if isinstance(value, (dict, list, tuple)) else value


def write_results_csv(out_dir: str | os.PathLike, points: list[SweepPoint],
                      records: dict[str, dict]) -> Path:
    """Rebuild ``OUT/results.csv``: one row per point that has a record, in sweep order.

    Columns: point_id, repeat, seed, the swept paths, every summary key (in
    first-seen order; empty in failed rows), status, error, wall_time_s.
    """
    import pandas as pd

    swept = list(points[0].params) if points else []
    reserved = set(LEADING_COLUMNS) | set(TRAILING_COLUMNS) | set(swept)
    rows, metric_columns = [], {}
    for point in points:
        record = records.get(point.point_id)
        if record is None:
            continue
        row = {"point_id": point.point_id, "repeat": point.repeat, "seed": point.seed}
        row |= {path: _cell(value) for path, value in point.params.items()}
        for key, value in (record.get("summary") or {}).items():
            column = f"summary_{key}" if key in reserved else key
            metric_columns.setdefault(column, None)
            row[column] = _cell(value)
        row |= {"status": record.get("status", "failed"), "error": record.get("error", ""),
                "wall_time_s": record.get("wall_time_s")}
        rows.append(row)
    columns = [*LEADING_COLUMNS, *swept, *metric_columns, *TRAILING_COLUMNS]
    path = Path(out_dir) / RESULTS_CSV
    tmp = path.with_suffix(".csv.tmp")
    pd.DataFrame(rows, columns=columns).to_csv(tmp, index=False)
    os.replace(tmp, path)  # readers never see a half-written table
    return path


def _prepare_point_dir(out: Path, point: SweepPoint) -> str:
    """``OUT/points/<id>/`` emptied (a retried point must not keep a failed attempt's files),
    with the point's scenario in ``scenario.yaml`` so ``kvsim run`` can replay it."""
    point_dir = out / POINTS_DIR / point.point_id
    shutil.rmtree(point_dir, ignore_errors=True)
    point_dir.mkdir(parents=True)
    with open(point_dir / "scenario.yaml", "w", encoding="utf-8") as f:
        yaml.safe_dump(point.scenario, f, sort_keys=False)
    return str(point_dir)
