"""Scenario sweeps: expand a ``sweep:`` section into points, run them, stream rows.

A sweep is embarrassingly parallel (DESIGN.md, "Scale beyond one machine"): one
point is one simulation. This module turns the section ::

    sweep:
      zip:                                  # advanced together
        workload.arrival.rate: [1, 2, 4]
        workload.num_requests: [100, 200, 400]
      grid:                                 # cartesian product
        engine.block_size: [16, 32]
        engine.enable_prefix_caching: [true, false]
      repeat: 3                             # seeds seed+0, seed+1, seed+2

into points, in this order: zip tuple (outermost), then grid combination
(``itertools.product`` order: the last grid key varies fastest), then repeat
(innermost). Here: 3 x 4 x 3 = 36 points.

Each point has a ``point_id`` (a hash of its swept values and repeat index, so
it is the same on every run and does not depend on key order), and runs on a
local process pool or on Ray. Every finished point is appended to
``OUT/results.jsonl`` at once (the durable log); ``OUT/results.csv`` is rebuilt
from it with pandas when the sweep starts and ends. A rerun with the same
``OUT`` skips points that already have an ``ok`` row and retries failed ones.

Where a swept key may point (the rule "setting a path creates nothing new"):
the key's parent mapping must already be in the scenario, except a top-level
schema section left out of the file (``slo``, say), which starts empty because
the loader fills in its defaults. The key itself may be absent (a default the
user never wrote); whether it exists is checked against the pydantic schema
(when ``kvsim.scenario.schema`` is importable) and by loading every point
before anything runs.
"""

from __future__ import annotations

import collections.abc
import contextlib
import copy
import functools
import hashlib
import importlib
import itertools
import json
import math
import os
import shutil
import sys
import time
import traceback
import types
import typing
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

# The scenario's top-level sections (the contract of kvsim.scenario.schema);
# used when the schema module cannot be imported.
SCENARIO_SECTIONS = ("name", "seed", "model", "hardware", "engine", "cost_model", "workload", "slo")
SWEEP_KEYS = ("grid", "zip", "repeat")
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


class SweepError(ValueError):
    """Bad sweep input; the message names the YAML path or argument, the value and what is allowed."""


@dataclass(frozen=True)
class SweepPoint:
    """One simulation of a sweep.

    ``params`` maps each swept dotted path to its value at this point;
    ``scenario`` is the full point scenario (sweep section removed, swept
    values set, ``seed`` = base seed + ``repeat``).
    """

    point_id: str
    index: int
    repeat: int
    seed: int
    params: dict
    scenario: dict


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


@dataclass(frozen=True)
class _SweepSpec:
    zip: dict       # dotted path -> list of values, all the same length
    grid: dict      # dotted path -> list of values
    repeat: int


# ----------------------------------------------------------------------------
# Parsing and expansion
# ----------------------------------------------------------------------------

def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, str) else _canonical(value)


def _check_values(where: str, values: Any) -> list:
    if not isinstance(values, list):
        raise SweepError(f"{where}: expected a non-empty list of values, got {_show(values)}")
    if not values:
        raise SweepError(f"{where}: empty list; give at least one value")
    return values


def _check_path(where: str, path: Any) -> str:
    if not isinstance(path, str) or not all(path.split(".")):
        raise SweepError(f"{where}: {_show(path)} is not a dotted path like engine.block_size")
    if path == "seed":
        raise SweepError(f"{where}: the seed is swept by `repeat: N` (seeds seed+0 .. seed+N-1), not by a list")
    if path.split(".")[0] == "sweep":
        raise SweepError(f"{where}: the sweep section cannot be swept")
    return path


def _parse_spec(section: Any) -> _SweepSpec:
    if section is None:
        section = {}
    if not isinstance(section, dict):
        raise SweepError(f"sweep: expected a mapping with {', '.join(SWEEP_KEYS)}, got {_show(section)}")
    for key in section:
        if key not in SWEEP_KEYS:
            raise SweepError(f"sweep.{key}: unknown key; allowed: {', '.join(SWEEP_KEYS)}")

    lists: dict[str, dict] = {}
    for kind in ("zip", "grid"):
        raw = section.get(kind) or {}
        if not isinstance(raw, dict):
            raise SweepError(f"sweep.{kind}: expected a mapping of dotted.path: [values], got {_show(raw)}")
        lists[kind] = {}
        for path, values in raw.items():
            where = f"sweep.{kind}.{path}"
            lists[kind][_check_path(where, path)] = _check_values(where, values)
            if kind == "grid":
                _check_unique(where, [_canonical(v) for v in values], values)

    zipped = lists["zip"]
    lengths = {path: len(values) for path, values in zipped.items()}
    if len(set(lengths.values())) > 1:
        got = ", ".join(f"{path}: {n}" for path, n in lengths.items())
        raise SweepError(f"sweep.zip: lists must all have the same length; got {got}")
    if zipped:
        tuples = [_canonical(t) for t in zip(*zipped.values())]
        _check_unique("sweep.zip", tuples, list(zip(*zipped.values())))

    swept = [(f"sweep.{kind}.{p}", p) for kind in ("zip", "grid") for p in lists[kind]]
    for (where_a, a), (where_b, b) in itertools.combinations(swept, 2):
        if a == b:
            raise SweepError(f"{where_b}: also swept as {where_a}; sweep each key once")
        if b.startswith(a + ".") or a.startswith(b + "."):
            raise SweepError(f"{where_b}: overlaps {where_a}; sweep a key or its parent, not both")

    repeat = section.get("repeat", 1)
    if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
        raise SweepError(f"sweep.repeat: expected an integer >= 1, got {_show(repeat)}")
    return _SweepSpec(zip=zipped, grid=lists["grid"], repeat=repeat)


def _check_unique(where: str, keys: list[str], values: list) -> None:
    seen: set[str] = set()
    for key, value in zip(keys, values):
        if key in seen:
            raise SweepError(f"{where}: value {_show(value)} appears twice; each point must differ")
        seen.add(key)


def set_dotted(scenario: dict, path: str, value: Any, *, where: str,
               sections: tuple[str, ...] = SCENARIO_SECTIONS) -> None:
    """Set ``scenario[a][b][c] = value`` for ``path == "a.b.c"``, in place.

    Creates nothing but a missing top-level section from ``sections`` (see the
    module docstring); ``where`` names the input in error messages.
    """
    parts = path.split(".")
    node = scenario
    for depth, key in enumerate(parts[:-1]):
        prefix = ".".join(parts[: depth + 1])
        if key not in node:
            if depth == 0 and key in sections:
                node[key] = {}
            elif depth == 0:
                raise SweepError(f"{where}: {key} is not a scenario section; allowed: {', '.join(sections)}")
            else:
                raise SweepError(f"{where}: {prefix} is not in the scenario; "
                                 f"the parent of a swept key must exist (keys of "
                                 f"{'.'.join(parts[:depth])}: {', '.join(map(str, node)) or 'none'})")
        if not isinstance(node[key], dict):
            raise SweepError(f"{where}: {prefix} is {_show(node[key])}, not a mapping; "
                             f"sweep {prefix} itself, or write it out as a mapping")
        node = node[key]
    leaf = parts[-1]
    if len(parts) == 1 and leaf not in scenario and leaf not in sections:
        raise SweepError(f"{where}: {leaf} is not a scenario section; allowed: {', '.join(sections)}")
    node[leaf] = value


def point_id(params: dict, repeat: int) -> str:
    """Stable id of a point: the same swept values and repeat give the same id on every run."""
    digest = hashlib.sha256(_canonical({"params": params, "repeat": repeat}).encode()).hexdigest()
    return digest[:12]


def base_seed(scenario: dict) -> int:
    seed = scenario["seed"] if "seed" in scenario else _schema_default_seed()
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise SweepError(f"seed: expected an integer, got {_show(seed)}")
    return seed


def _schema_default_seed() -> int:
    root = _schema_root()
    field = root.model_fields.get("seed") if root is not None else None
    default = getattr(field, "default", None)
    return default if isinstance(default, int) and not isinstance(default, bool) else 0


def base_fingerprint(scenario_dict: dict) -> str:
    """Hash of the scenario without its sweep section: resume is refused when it changes."""
    base = {k: v for k, v in scenario_dict.items() if k != "sweep"}
    return hashlib.sha256(_canonical(base).encode()).hexdigest()[:16]


def expand_sweep(scenario_dict: dict, *, sections: tuple[str, ...] | None = None) -> list[SweepPoint]:
    """All points of the scenario's sweep, in order (zip, then grid, then repeat).

    A scenario without a ``sweep`` section is one point. Raises
    :class:`SweepError` naming the ``sweep.*`` path for malformed input.
    """
    if not isinstance(scenario_dict, dict):
        raise SweepError(f"scenario: expected a mapping of sections, got {_show(scenario_dict)}")
    sections = sections or _schema_sections()
    spec = _parse_spec(scenario_dict.get("sweep"))
    base = {k: v for k, v in scenario_dict.items() if k != "sweep"}
    where = {p: f"sweep.zip.{p}" for p in spec.zip} | {p: f"sweep.grid.{p}" for p in spec.grid}

    zip_rows = [dict(zip(spec.zip, values)) for values in zip(*spec.zip.values())] or [{}]
    grid_rows = [dict(zip(spec.grid, values)) for values in itertools.product(*spec.grid.values())]
    points = []
    for zip_params, grid_params in itertools.product(zip_rows, grid_rows):
        params = zip_params | grid_params
        scenario = copy.deepcopy(base)
        for path, value in params.items():
            set_dotted(scenario, path, copy.deepcopy(value), where=where[path], sections=sections)
        seed0 = base_seed(scenario)
        for repeat in range(spec.repeat):
            point_scenario = copy.deepcopy(scenario) if repeat else scenario
            point_scenario["seed"] = seed0 + repeat
            points.append(SweepPoint(point_id=point_id(params, repeat), index=len(points),
                                     repeat=repeat, seed=seed0 + repeat, params=params,
                                     scenario=point_scenario))
    return points


# ----------------------------------------------------------------------------
# Validation against the schema and the loader
# ----------------------------------------------------------------------------

def _schema_root():
    """The pydantic model of a whole scenario, or None while kvsim.scenario.schema is not there."""
    try:
        schema = importlib.import_module("kvsim.scenario.schema")
    except ModuleNotFoundError as exc:
        if exc.name in ("kvsim.scenario.schema", "pydantic"):
            return None
        raise
    from pydantic import BaseModel
    for name in ("Scenario", "ScenarioSpec", "ScenarioModel", "ScenarioConfig"):
        cls = getattr(schema, name, None)
        if isinstance(cls, type) and issubclass(cls, BaseModel):
            return cls
    return None


def _schema_sections() -> tuple[str, ...]:
    root = _schema_root()
    if root is None:
        return SCENARIO_SECTIONS
    # Fields excluded from dumps (the loader's base_dir) are not YAML sections.
    return tuple(name for name, field in root.model_fields.items()
                 if name != "sweep" and not field.exclude)


def _models_in(annotation: Any) -> list:
    """The pydantic models a field annotation may hold (through Optional, Union, Annotated)."""
    from pydantic import BaseModel
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _models_in(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return []


def _field_names(model) -> dict[str, Any]:
    names = {}
    for name, field in model.model_fields.items():
        names[name] = field
        for alias in (field.alias, field.validation_alias):
            if isinstance(alias, str):
                names[alias] = field
    return names


def schema_path_error(root_model, path: str) -> str | None:
    """Why ``path`` names no key of the pydantic model ``root_model``, or None if it may.

    Only sure answers: a path is accepted once it reaches a field that is not a
    model (a dict, Any, a value with a before-validator...) or a model that
    allows extra keys; the loader judges the rest.
    """
    models = [root_model]
    parts = path.split(".")
    for depth, key in enumerate(parts):
        if any(m.model_config.get("extra") == "allow" for m in models):
            return None
        found = [_field_names(m)[key] for m in models if key in _field_names(m)]
        if not found:
            allowed = sorted({n for m in models for n in m.model_fields})
            section = ".".join(parts[:depth]) or "the scenario"
            return f"{section} has no key {key!r}; allowed: {', '.join(allowed)}"
        models = [m for field in found for m in _models_in(field.annotation)]
        if not models:
            return None
    return None


def load_point(scenario: dict, *, base_dir: str | os.PathLike | None = None):
    """Validate one point with the scenario loader (raises its ScenarioError)."""
    from kvsim.scenario import load_scenario
    return load_scenario(scenario, base_dir=base_dir)


_AUTO = "auto"


def validate_sweep(scenario_dict: dict, *, check_point: Callable[[dict], Any] | None = load_point,
                   schema_model: Any = _AUTO) -> list[SweepPoint]:
    """Expand the sweep and check every point before anything runs; return the points.

    Checks, in order: the sweep section's shape (lists, lengths, repeat), that
    each swept key's parent exists (module docstring), that each key exists in
    the pydantic schema (``schema_model``: the root model, ``"auto"`` to find
    it in ``kvsim.scenario.schema``, None to skip), then loads each distinct
    point with ``check_point`` (None to skip) and reports the first error with
    that point's swept values. Repeats differ only by seed, so only repeat 0
    is loaded.
    """
    points = expand_sweep(scenario_dict)
    root = _schema_root() if schema_model == _AUTO else schema_model
    if root is not None and points:
        for path in points[0].params:
            kind = "zip" if path in ((scenario_dict.get("sweep") or {}).get("zip") or {}) else "grid"
            problem = schema_path_error(root, path)
            if problem:
                raise SweepError(f"sweep.{kind}.{path}: {problem}")
    if check_point is not None:
        for point in points:
            if point.repeat:
                continue
            try:
                check_point(point.scenario)
            except ValueError as exc:
                raise SweepError(f"sweep point {_describe(point)}: {exc}") from exc
    return points


def _describe(point: SweepPoint) -> str:
    values = ", ".join(f"{path}={_show(v)}" for path, v in point.params.items())
    return f"{point.point_id} ({values or 'no swept keys'})"


# ----------------------------------------------------------------------------
# Running one point (in a worker process or a Ray task)
# ----------------------------------------------------------------------------

def simulate_point(scenario: dict, point_dir: str | None = None, *,
                   base_dir: str | os.PathLike | None = None) -> dict:
    """The default point runner: load, simulate, optionally write the run's files; return the summary."""
    import kvsim
    from kvsim.scenario import load_scenario
    result = kvsim.simulate(load_scenario(scenario, base_dir=base_dir))
    if point_dir is not None:
        result.write(point_dir)
    return dict(result.summary)


def _plain(value: Any) -> Any:
    # numpy scalars -> Python, so rows pickle small and serialise as JSON.
    if hasattr(value, "item") and not isinstance(value, (list, dict, str)):
        try:
            return value.item()
        except (TypeError, ValueError):
            return value
    return value


def run_task(run_point: RunPoint, scenario: dict, point_dir: str | None) -> dict:
    """Run one point and never raise: the record says ok or carries the error."""
    start = time.perf_counter()
    try:
        summary = run_point(scenario, point_dir)
        if not isinstance(summary, collections.abc.Mapping):
            raise TypeError(f"run_point returned {type(summary).__name__}, expected a dict of summary metrics")
        record = {"summary": {str(k): _plain(v) for k, v in summary.items()}, "error": "", "traceback": ""}
    except Exception as exc:  # a failing point is a row, not the end of the sweep
        record = {"summary": None, "error": _one_line(exc), "traceback": traceback.format_exc()}
    record["wall_time_s"] = time.perf_counter() - start
    return record


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _crash_record(why: str) -> dict:
    return {"summary": None, "error": why, "traceback": "", "wall_time_s": float("nan")}


# ----------------------------------------------------------------------------
# Executors: each calls on_done(point, record) in the driver as points finish
# ----------------------------------------------------------------------------

def _execute_inline(tasks, run_point, on_done) -> None:
    for point, point_dir in tasks:
        on_done(point, run_task(run_point, point.scenario, point_dir))


def _execute_local(tasks, run_point, on_done, workers: int) -> None:
    """A process pool; at most 2 x workers points in flight, so a crash loses only those."""
    queue = collections.deque(tasks)
    max_in_flight = 2 * workers
    while queue:
        in_flight: dict = {}
        with ProcessPoolExecutor(max_workers=workers) as pool, _cancel_on_error(pool):
            broken = False
            while queue or in_flight:
                while queue and len(in_flight) < max_in_flight and not broken:
                    point, point_dir = queue[0]
                    try:
                        future = pool.submit(run_task, run_point, point.scenario, point_dir)
                    except BrokenProcessPool:
                        broken = True
                        break
                    queue.popleft()
                    in_flight[future] = point
                if not in_flight:
                    break
                done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                for future in done:
                    point = in_flight.pop(future)
                    try:
                        record = future.result()
                    except BrokenProcessPool:
                        # A worker died (segfault, OOM kill, os._exit): every point in
                        # flight fails with it; the rest go to a fresh pool.
                        broken = True
                        record = _crash_record("worker process died while this point was running "
                                               "(BrokenProcessPool)")
                    except Exception as exc:  # e.g. a summary that does not pickle
                        record = _crash_record(_one_line(exc))
                    on_done(point, record)
            if not broken:
                return


def _import_ray():
    try:
        import ray
    except ImportError as exc:
        raise SweepError(f"--executor ray: ray is not installed ({exc}); "
                         f"install the extra: pip install 'kvsim[ray]'") from None
    return ray


@contextlib.contextmanager
def _cancel_on_error(pool: ProcessPoolExecutor):
    """On Ctrl-C or an error in the driver, drop queued points instead of waiting for them."""
    try:
        yield
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise


def _execute_ray(tasks, run_point, on_done, workers: int | None, address: str | None) -> None:
    """The same points as Ray tasks, on a local Ray (default) or the cluster at ``address``."""
    ray = _import_ray()
    started_here = False
    if not ray.is_initialized():
        options = dict(address=address or None, include_dashboard=False, log_to_driver=False)
        if not address:
            options["num_cpus"] = workers  # a cluster sizes itself; Ray refuses num_cpus there
        ray.init(**options)
        started_here = True
    try:
        max_in_flight = 2 * (workers or max(1, int(ray.cluster_resources().get("CPU", 1))))
        remote_task = ray.remote(num_cpus=1, max_retries=0)(run_task)
        runner_ref = ray.put(run_point)
        queue = collections.deque(tasks)
        in_flight: dict = {}
        while queue or in_flight:
            while queue and len(in_flight) < max_in_flight:
                point, point_dir = queue.popleft()
                in_flight[remote_task.remote(runner_ref, point.scenario, point_dir)] = point
            ready, _ = ray.wait(list(in_flight), num_returns=1)
            for ref in ready:
                point = in_flight.pop(ref)
                try:
                    record = ray.get(ref)
                except Exception as exc:  # the worker died or the result did not come back
                    record = _crash_record(_one_line(exc))
                on_done(point, record)
    finally:
        if started_here:
            ray.shutdown()


# ----------------------------------------------------------------------------
# Results: the JSON-lines log and the CSV rebuilt from it
# ----------------------------------------------------------------------------

def read_results_log(out_dir: str | os.PathLike) -> dict[str, dict]:
    """The latest record of each point id in ``OUT/results.jsonl`` ({} when there is none).

    A line that does not parse (a sweep killed mid-write) is ignored; that
    point simply runs again.
    """
    path = Path(out_dir) / RESULTS_JSONL
    latest: dict[str, dict] = {}
    if not path.exists():
        return latest
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and isinstance(record.get("point_id"), str):
                latest[record["point_id"]] = record
    return latest


class _ResultsLog:
    """Append-only ``results.jsonl``: one record per finished point, flushed and synced at once."""

    def __init__(self, out_dir: Path):
        self.path = out_dir / RESULTS_JSONL
        needs_newline = self.path.exists() and self.path.stat().st_size > 0 and \
            not self.path.read_bytes().endswith(b"\n")
        self.file = open(self.path, "a", encoding="utf-8")
        if needs_newline:  # finish a line torn by a crash so the next record starts clean
            self.file.write("\n")

    def append(self, record: dict) -> None:
        self.file.write(json.dumps(record, default=_json_default) + "\n")
        self.file.flush()
        os.fsync(self.file.fileno())

    def close(self) -> None:
        self.file.close()


def _json_default(value: Any) -> Any:
    plain = _plain(value)
    return plain if plain is not value else str(value)


def _cell(value: Any) -> Any:
    return _canonical(value) if isinstance(value, (dict, list, tuple)) else value


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


def _check_same_base(out_dir: Path, scenario_dict: dict) -> None:
    """Refuse to mix points of a different base scenario into an existing OUT."""
    path = out_dir / SWEEP_JSON
    fingerprint = base_fingerprint(scenario_dict)
    if path.exists():
        try:
            previous = json.loads(path.read_text(encoding="utf-8")).get("base_fingerprint")
        except (json.JSONDecodeError, AttributeError):
            previous = None
        if previous is not None and previous != fingerprint:
            raise SweepError(f"--out {out_dir}: holds a sweep of a different base scenario "
                             f"(fingerprint {previous}, now {fingerprint}); only the sweep "
                             f"section may change between reruns; use a new --out")
    info = {"base_fingerprint": fingerprint, "sweep": scenario_dict.get("sweep")}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(info, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


class _OutLock:
    """An exclusive lock on OUT so two sweeps never interleave rows (released if we die)."""

    def __init__(self, out_dir: Path):
        self.path = out_dir / ".lock"
        self.file = None

    def __enter__(self):
        self.file = open(self.path, "w")
        try:
            import fcntl
        except ImportError:  # not POSIX: no lock, as before
            return self
        try:
            fcntl.flock(self.file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self.file.close()
            raise SweepError(f"--out {self.path.parent}: another sweep is writing there now") from None
        return self

    def __exit__(self, *exc_info):
        self.file.close()


# ----------------------------------------------------------------------------
# Progress bar
# ----------------------------------------------------------------------------

def _format_eta(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m"


class ProgressBar:
    """One redrawn line on a terminal: points done/total, failures, rate, ETA.

    Called as ``bar(done, failed, total)``; the first call starts the clock.
    Redraws at most every ``min_interval_s`` except the last, which ends the line.
    """

    def __init__(self, stream=None, *, width: int = 24, min_interval_s: float = 0.1,
                 clock: Callable[[], float] = time.monotonic):
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.min_interval_s = min_interval_s
        self.clock = clock
        self.start_s: float | None = None
        self.last_draw_s = -math.inf
        self.last_len = 0

    def render(self, done: int, failed: int, total: int, elapsed_s: float) -> str:
        filled = self.width * done // total if total else self.width
        rate = done / elapsed_s if elapsed_s > 0 else 0.0
        eta = (total - done) / rate if rate > 0 else math.inf
        failures = f", {failed} failed" if failed else ""
        return (f"sweep [{'#' * filled}{'.' * (self.width - filled)}] {done}/{total} points"
                f"{failures}, {rate:.1f} points/s, ETA {_format_eta(eta)}")

    def __call__(self, done: int, failed: int, total: int) -> None:
        now = self.clock()
        if self.start_s is None:
            self.start_s = now
        final = done >= total
        if not final and now - self.last_draw_s < self.min_interval_s:
            return
        self.last_draw_s = now
        line = self.render(done, failed, total, now - self.start_s)
        padded = line.ljust(self.last_len)  # blank out the rest of a longer previous line
        self.last_len = len(line)
        self.stream.write("\r" + padded + ("\n" if final else ""))
        self.stream.flush()


def auto_progress(stream=None) -> ProgressBar | None:
    """A progress bar when ``stream`` (stderr) is a terminal; nothing in CI or when piped."""
    stream = stream if stream is not None else sys.stderr
    isatty = getattr(stream, "isatty", None)
    return ProgressBar(stream) if isatty is not None and isatty() else None


# ----------------------------------------------------------------------------
# The sweep
# ----------------------------------------------------------------------------

def default_workers() -> int:
    """All cores this process may use."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def run_sweep(scenario_dict: dict, out_dir: str | os.PathLike, *, workers: int | None = None,
              executor: str = "local", address: str | None = None, keep_points: bool = False,
              run_point: RunPoint | None = None, progress: Progress | bool | None = None,
              check_point: Callable[[dict], Any] | None = None,
              base_dir: str | os.PathLike | None = None) -> SweepOutcome:
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
    in the scenario (the scenario file's folder).
    """
    start = time.perf_counter()
    if executor not in ("local", "ray"):
        raise SweepError(f"--executor: {executor!r} is not an executor; allowed: local, ray")
    if address and executor != "ray":
        raise SweepError(f"--address: {address!r} is only used with --executor ray")
    if executor == "ray":
        _import_ray()  # fail before anything runs, not after the log is open
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise SweepError(f"--workers: expected an integer >= 1, got {workers!r}")

    if run_point is None:
        points = validate_sweep(scenario_dict, check_point=functools.partial(load_point, base_dir=base_dir))
        run_point = functools.partial(simulate_point, base_dir=base_dir)
    else:
        points = validate_sweep(scenario_dict, check_point=check_point, schema_model=None)
    if workers is None and not (executor == "ray" and address):
        workers = default_workers()

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with _OutLock(out):
        _check_same_base(out, scenario_dict)
        records = read_results_log(out)
        finished = {pid for pid, rec in records.items() if rec.get("status") == "ok"}
        todo = [p for p in points if p.point_id not in finished]
        if records:  # resume: show what is already there before running the rest
            write_results_csv(out, points, records)
        tasks = [(point, _prepare_point_dir(out, point) if keep_points else None) for point in todo]

        if progress is None:
            progress = auto_progress()
        elif progress is False:
            progress = None
        counts = {"ok": 0, "failed": 0}

        def on_done(point: SweepPoint, result: dict) -> None:
            status = "ok" if result.get("summary") is not None and not result.get("error") else "failed"
            record = {"point_id": point.point_id, "repeat": point.repeat, "seed": point.seed,
                      "params": point.params, "summary": result.get("summary"), "status": status,
                      "error": result.get("error", ""), "wall_time_s": result.get("wall_time_s"),
                      "traceback": result.get("traceback", "")}
            log.append(record)
            records[point.point_id] = record
            counts[status] += 1
            if progress:
                progress(counts["ok"] + counts["failed"], counts["failed"], len(todo))

        log = _ResultsLog(out)
        try:
            if progress and todo:
                progress(0, 0, len(todo))
            if executor == "ray":
                if todo:
                    _execute_ray(tasks, run_point, on_done, workers, address)
            elif workers == 1 or len(todo) <= 1:
                _execute_inline(tasks, run_point, on_done)
            else:
                _execute_local(tasks, run_point, on_done, min(workers, len(todo)))
        finally:
            log.close()
            csv_path = write_results_csv(out, points, records)

    return SweepOutcome(num_points=len(points), num_done=counts["ok"], num_failed=counts["failed"],
                        num_skipped=len(points) - len(todo), wall_time_s=time.perf_counter() - start,
                        workers=workers, results_csv=csv_path)


def _prepare_point_dir(out: Path, point: SweepPoint) -> str:
    """``OUT/points/<id>/`` emptied (a retried point must not keep a failed attempt's files),
    with the point's scenario in ``scenario.yaml`` so ``kvsim run`` can replay it."""
    point_dir = out / POINTS_DIR / point.point_id
    shutil.rmtree(point_dir, ignore_errors=True)
    point_dir.mkdir(parents=True)
    with open(point_dir / "scenario.yaml", "w", encoding="utf-8") as f:
        yaml.safe_dump(point.scenario, f, sort_keys=False)
    return str(point_dir)
