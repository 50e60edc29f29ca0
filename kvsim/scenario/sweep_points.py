"""Sweep points: a ``sweep:`` section expanded into points, each checked before anything runs.

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
it is the same on every run and does not depend on key order). Running them
is ``sweep.py``'s (with ``executor.py`` and ``results_log.py``).

Where a swept key may point (the rule "setting a path creates nothing new"):
the key's parent mapping must already be in the scenario, except a top-level
schema section left out of the file (``slo``, say), which starts empty because
the loader fills in its defaults. The key itself may be absent (a default the
user never wrote); whether it exists is checked against the pydantic schema
(when ``kvsim.scenario.schema`` is importable) and by loading every point
before anything runs. An index names an item of a list the scenario holds
(``cluster.pools[0].replicas``, kvsim/scenario/dotted.py); a list and one of
its items are not swept together.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import itertools
import json
import os
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable

from kvsim.scenario.dotted import EXAMPLE, join_path, list_item_problem, split_path

# The scenario's top-level sections (the contract of kvsim.scenario.schema);
# used when the schema module cannot be imported.
SCENARIO_SECTIONS = ("name", "seed", "model", "hardware", "engine", "cost_model", "workload", "slo")
SWEEP_KEYS = ("grid", "zip", "repeat")


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
class _SweepSpec:
    zip: dict       # dotted path -> list of values, all the same length
    grid: dict      # dotted path -> list of values
    repeat: int



# ----------------------------------------------------------------------------
# Parsing and expansion
# ----------------------------------------------------------------------------

def canonical_json(value: Any) -> str:
    """One JSON text per value: sorted keys, no spaces (what ids and fingerprints hash)."""
    return json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, str) else canonical_json(value)


def _check_values(where: str, values: Any) -> list:
    if not isinstance(values, list):
        raise SweepError(f"{where}: expected a non-empty list of values, got {_show(values)}")
    if not values:
        raise SweepError(f"{where}: empty list; give at least one value")
    return values


def _check_path(where: str, path: Any) -> str:
    if split_path(path) is None:
        raise SweepError(f"{where}: {_show(path)} is not a dotted path like {EXAMPLE}")
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
                _check_unique(where, [canonical_json(v) for v in values], values)

    zipped = lists["zip"]
    lengths = {path: len(values) for path, values in zipped.items()}
    if len(set(lengths.values())) > 1:
        got = ", ".join(f"{path}: {n}" for path, n in lengths.items())
        raise SweepError(f"sweep.zip: lists must all have the same length; got {got}")
    if zipped:
        tuples = [canonical_json(t) for t in zip(*zipped.values())]
        _check_unique("sweep.zip", tuples, list(zip(*zipped.values())))

    swept = [(f"sweep.{kind}.{p}", split_path(p)) for kind in ("zip", "grid") for p in lists[kind]]
    for (where_a, parts_a), (where_b, parts_b) in itertools.combinations(swept, 2):
        if parts_a == parts_b:
            raise SweepError(f"{where_b}: also swept as {where_a}; sweep each key once")
        n = min(len(parts_a), len(parts_b))
        if parts_a[:n] == parts_b[:n]:            # (cluster.pools and cluster.pools[0].replicas too)
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
    parts = split_path(path)
    node: Any = scenario
    for depth, key in enumerate(parts[:-1]):
        prefix = join_path(parts[: depth + 1])
        if isinstance(key, int):                  # an item of the list at hand (kvsim/scenario/dotted.py)
            problem = list_item_problem(node, key, join_path(parts[:depth]))
            if problem:
                raise SweepError(f"{where}: {problem}")
        elif key not in node:
            if depth == 0 and key in sections:
                node[key] = {}
            elif depth == 0:
                raise SweepError(f"{where}: {key} is not a scenario section; allowed: {', '.join(sections)}")
            else:
                raise SweepError(f"{where}: {prefix} is not in the scenario; "
                                 f"the parent of a swept key must exist (keys of "
                                 f"{join_path(parts[:depth])}: {', '.join(map(str, node)) or 'none'})")
        if isinstance(parts[depth + 1], int):
            node = node[key]                      # (a list: checked at its index)
            continue
        if not isinstance(node[key], dict):
            raise SweepError(f"{where}: {prefix} is {_show(node[key])}, not a mapping; "
                             f"sweep {prefix} itself, or write it out as a mapping")
        node = node[key]
    leaf = parts[-1]
    if isinstance(leaf, int):
        problem = list_item_problem(node, leaf, join_path(parts[:-1]))
        if problem:
            raise SweepError(f"{where}: {problem}")
    if len(parts) == 1 and leaf not in scenario and leaf not in sections:
        raise SweepError(f"{where}: {leaf} is not a scenario section; allowed: {', '.join(sections)}")
    node[leaf] = value


def point_id(params: dict, repeat: int) -> str:
    """Stable id of a point: the same swept values and repeat give the same id on every run."""
    digest = hashlib.sha256(canonical_json({"params": params, "repeat": repeat}).encode()).hexdigest()
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
    return hashlib.sha256(canonical_json(base).encode()).hexdigest()[:16]


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
    return [a for a in _alternatives(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]


def _alternatives(annotation: Any) -> list:
    """The annotations a field may hold, through Optional, Union and Annotated."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _alternatives(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [a for arg in typing.get_args(annotation) for a in _alternatives(arg)]
    return [annotation]


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
    parts = split_path(path) or []
    annotations: list = []
    for depth, key in enumerate(parts):
        if isinstance(key, int):
            # An item of a list field: the models its items may be (set_dotted checks the index).
            items = [a for a in annotations if typing.get_origin(a) is list]
            models = [m for a in items for m in _models_in(typing.get_args(a)[0])]
            if not models:
                return None
            continue
        if any(m.model_config.get("extra") == "allow" for m in models):
            return None
        found = [_field_names(m)[key] for m in models if key in _field_names(m)]
        if not found:
            allowed = sorted({n for m in models for n in m.model_fields})
            section = join_path(parts[:depth]) or "the scenario"
            return f"{section} has no key {key!r}; allowed: {', '.join(allowed)}"
        annotations = [a for field in found for a in _alternatives(field.annotation)]
        models = [m for field in found for m in _models_in(field.annotation)]
        if not models and not (depth + 1 < len(parts) and isinstance(parts[depth + 1], int)):
            return None
    return None



def load_point(scenario: dict, *, base_dir: str | os.PathLike | None = None):
    """Validate one point with the scenario loader (raises its ScenarioError).

    A point with ``cluster:`` has its pools resolved too (kvsim/scenario/cluster.py),
    so a bad ``cluster.*`` value stops the sweep before anything runs.
    """
    from kvsim.scenario import load_scenario
    sc = load_scenario(scenario, base_dir=base_dir)
    if sc.scenario.cluster is not None:
        from kvsim.scenario.cluster import load_cluster
        load_cluster(sc)
    return sc


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
