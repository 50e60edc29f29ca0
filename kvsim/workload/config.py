"""The scenario's ``workload:`` section: pydantic models, defaults, validation.

Four kinds of workload, chosen by which key is present (see docs/workloads.md):

    workload: {num_requests, arrival, prompt_len, output_len, prefix, sessions, ...}   # synthetic
    workload: {trace: {format, path, max_requests, time_scale, offset}, arrival?, ...}  # real trace
    workload: {requests_file: PATH}                                                      # explicit requests
    workload: {bench: {dataset_name, request_rate, ...}}              # vllm bench serve (bench_config.py)

Every model forbids unknown keys and is strict about types (a quoted ``"4"`` is
not a number), so a typo fails before any simulation starts. Use
``parse_workload_config`` to get a ``ValueError`` whose message names the YAML
path, the bad value and what is allowed; ``format_validation_error`` does the
same for a scenario model that embeds ``WorkloadConfig``.

Relative file paths are resolved by ``resolve_path`` against a base directory
the caller passes (the scenario file's folder), never against the process's
working directory unless no base is given.
"""

from __future__ import annotations

import os
import typing
from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import (BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError,
                      model_validator)
from pydantic_core import PydanticCustomError

from kvsim.workload.bench_config import BenchConfig


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# --- arrivals -------------------------------------------------------------------------

class PoissonArrival(_Section):
    """Exponential gaps with mean ``1/rate``; the first request at t=0 (as ``vllm bench serve``)."""
    type: Literal["poisson"]
    rate: float = Field(gt=0, allow_inf_nan=False, description="requests per second")


class GammaArrival(_Section):
    """Gamma gaps, shape ``burstiness``, mean ``1/rate`` (``vllm bench serve --burstiness``; 1 = Poisson)."""
    type: Literal["gamma"]
    rate: float = Field(gt=0, allow_inf_nan=False, description="requests per second")
    burstiness: float = Field(1.0, gt=0, allow_inf_nan=False)


class ConstantArrival(_Section):
    type: Literal["constant"]
    interval_s: float = Field(ge=0, allow_inf_nan=False)


class ClosedLoopArrival(_Section):
    """``concurrency`` clients; each sends its next request when its last one finishes."""
    type: Literal["closed_loop"]
    concurrency: int = Field(ge=1)


class AllAtOnceArrival(_Section):
    type: Literal["all_at_once"]


ArrivalConfig = Annotated[
    Union[PoissonArrival, GammaArrival, ConstantArrival, ClosedLoopArrival, AllAtOnceArrival],
    Field(discriminator="type"),
]


# --- lengths --------------------------------------------------------------------------

class _Clipped(_Section):
    """Every sample is rounded to an integer, then clipped to ``[min, max]``."""
    min: int = Field(1, ge=1)
    max: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _max_not_below_min(self):
        if self.max is not None and self.max < self.min:
            raise PydanticCustomError(
                "clip_range", "max = {max} is below min = {min}; need min <= max",
                {"field": "max", "max": self.max, "min": self.min})
        return self


class FixedLength(_Clipped):
    type: Literal["fixed"]
    value: int = Field(ge=1)


class UniformLength(_Clipped):
    """Integers ``low..high`` inclusive, each equally likely."""
    type: Literal["uniform"]
    low: int = Field(ge=1)
    high: int = Field(ge=1)

    @model_validator(mode="after")
    def _high_not_below_low(self):
        if self.high < self.low:
            raise PydanticCustomError(
                "uniform_range", "high = {high} is below low = {low}; need low <= high",
                {"field": "high", "high": self.high, "low": self.low})
        return self


class NormalLength(_Clipped):
    type: Literal["normal"]
    mean: float = Field(allow_inf_nan=False)
    std: float = Field(ge=0, allow_inf_nan=False)


class LognormalLength(_Clipped):
    """``median * exp(sigma * Z)``, Z standard normal (so ``median`` is the median before clipping)."""
    type: Literal["lognormal"]
    median: float = Field(gt=0, allow_inf_nan=False)
    sigma: float = Field(ge=0, allow_inf_nan=False)


class EmpiricalLength(_Clipped):
    """Values drawn with replacement from one column of a CSV or JSONL file."""
    type: Literal["empirical"]
    file: str = Field(min_length=1)
    column: str = Field(min_length=1)


LengthConfig = Annotated[
    Union[FixedLength, UniformLength, NormalLength, LognormalLength, EmpiricalLength],
    Field(discriminator="type"),
]


# --- structure ------------------------------------------------------------------------

class PrefixConfig(_Section):
    """A system prompt of ``shared_prompt_tokens`` tokens, one per group; each session picks a group."""
    shared_prompt_tokens: int = Field(0, ge=0)
    num_groups: int = Field(1, ge=1)


class SessionsConfig(_Section):
    """Multi-turn chats: each turn resends the history and the previous answer."""
    turns: int = Field(1, ge=1)
    think_time_s: float = Field(0.0, ge=0, allow_inf_nan=False)


class PriorityChoice(_Section):
    """Each request's priority drawn from ``values`` (with ``weights``, default equal)."""
    values: list[int] = Field(min_length=1)
    weights: list[float] | None = None

    @model_validator(mode="after")
    def _weights_match(self):
        if self.weights is None:
            return self
        if len(self.weights) != len(self.values):
            raise PydanticCustomError(
                "weights_length", "{n_w} weights for {n_v} values; give one weight per value",
                {"field": "weights", "n_w": len(self.weights), "n_v": len(self.values)})
        if min(self.weights) < 0 or sum(self.weights) <= 0:
            raise PydanticCustomError(
                "weights_sign", "weights {weights} must be >= 0 with a positive sum",
                {"field": "weights", "weights": self.weights})
        return self


class TraceConfig(_Section):
    """A real trace; requests are sorted by time (stably) and shifted so the first is at t=0."""
    format: Literal["azure", "mooncake", "vidur", "sharegpt"]
    path: str = Field(min_length=1)
    max_requests: int | None = Field(None, ge=0)
    time_scale: float = Field(1.0, gt=0, allow_inf_nan=False)
    offset: int = Field(0, ge=0)


# Keys that describe how synthetic requests look; a trace or a requests file gives those itself.
SYNTHETIC_ONLY_KEYS = ("num_requests", "prompt_len", "output_len", "prefix", "sessions")
REQUESTS_FILE_KEYS = ("requests_file",)


class WorkloadConfig(_Section):
    num_requests: int = Field(1000, ge=0)
    arrival: ArrivalConfig | None = None
    prompt_len: LengthConfig = LognormalLength(type="lognormal", median=512, sigma=0.8, max=4096)
    output_len: LengthConfig = FixedLength(type="fixed", value=128)
    prefix: PrefixConfig = PrefixConfig()
    sessions: SessionsConfig = SessionsConfig()
    n: int = Field(1, ge=1)
    beam_width: int = Field(1, ge=1)
    priority: Annotated[
        Union[Annotated[int, Tag("int")], Annotated[PriorityChoice, Tag("choice")]],
        Discriminator(lambda v: "choice" if isinstance(v, (dict, PriorityChoice)) else "int"),
    ] = 0
    cache_salt: str | None = None
    trace: TraceConfig | None = None
    requests_file: str | None = Field(None, min_length=1)
    bench: BenchConfig | None = None

    @property
    def kind(self) -> Literal["synthetic", "trace", "requests_file", "bench"]:
        if self.requests_file is not None:
            return "requests_file"
        if self.bench is not None:
            return "bench"
        return "trace" if self.trace is not None else "synthetic"

    @model_validator(mode="after")
    def _one_kind_of_workload(self):
        given = self.model_fields_set
        others = sorted(given - {"bench"})
        if self.bench is not None and others:
            raise _conflict(others[0], ": not allowed with bench (vllm bench serve's options give the "
                                       "whole workload); remove it or remove bench")
        extra = sorted(given - set(REQUESTS_FILE_KEYS))
        if self.requests_file is not None and extra:
            raise _conflict(extra[0], ": not allowed with requests_file (the file gives every request); "
                                      "remove it or remove requests_file")
        synthetic = [key for key in SYNTHETIC_ONLY_KEYS if key in given]
        if self.trace is not None and synthetic:
            raise _conflict(synthetic[0], ": not allowed with trace (the trace gives lengths and count; "
                                          "use trace.max_requests); allowed with trace: arrival, n, "
                                          "beam_width, priority, cache_salt")
        if self.sessions.turns > 1:
            if isinstance(self.arrival, ClosedLoopArrival):
                raise _conflict("sessions.turns", " = {turns} with arrival closed_loop is not supported; "
                                            "use turns: 1 or an open-loop arrival", turns=self.sessions.turns)
            if self.n > 1 or self.beam_width > 1:
                raise _conflict("sessions.turns", " = {turns} needs n: 1 and beam_width: 1 (a later turn "
                                            "quotes exactly one answer)", turns=self.sessions.turns)
        return self

    def arrival_or_default(self) -> ArrivalConfig | None:
        """The arrival process; ``None`` means "replay the trace's timestamps"."""
        if self.arrival is not None:
            return self.arrival
        if self.kind == "synthetic":
            return PoissonArrival(type="poisson", rate=4.0)
        if self.kind == "trace" and self.trace.format == "sharegpt":
            # ShareGPT has no timestamps; vllm bench serve's default rate is inf (all at once).
            return AllAtOnceArrival(type="all_at_once")
        return None


def _conflict(key: str, message: str, **ctx) -> PydanticCustomError:
    return PydanticCustomError("workload_conflict", f"{key}{message}", {"field": key, **ctx})


# --- error messages -------------------------------------------------------------------

def parse_workload_config(data, *, path: str = "workload") -> WorkloadConfig:
    """Validate a ``workload:`` mapping; raise ``ValueError`` naming path, value, allowed."""
    if isinstance(data, WorkloadConfig):
        return data
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping, got {_short(data)}")
    try:
        return WorkloadConfig.model_validate(data)
    except ValidationError as exc:
        raise ValueError(format_validation_error(exc, prefix=path, root=WorkloadConfig)) from None


def format_validation_error(exc: ValidationError, *, prefix: str = "workload",
                            root: type[BaseModel] = WorkloadConfig) -> str:
    """One clause per problem: ``workload.arrival.rate = -1: Input should be greater than 0``.

    Union tags that pydantic puts in an error's location (``arrival.poisson.rate``)
    are dropped, so the path is the one a user writes in YAML.
    """
    by_path: dict[str, list[str]] = {}
    for err in exc.errors():
        names, parents, inner = _yaml_path(root, err["loc"], err["type"] == "extra_forbidden")
        ctx = err.get("ctx") or {}
        if "field" in ctx:  # our own model-level checks say which key they are about
            names = names + [ctx["field"]]
        path = ".".join([prefix, *names]) if names else prefix
        by_path.setdefault(path, []).append(_describe(err, parents, inner))
    return "; ".join(f"{path}{' or '.join(dict.fromkeys(msgs))}" for path, msgs in by_path.items())


_OWN_ERRORS = ("workload_conflict", "clip_range", "uniform_range", "weights_length", "weights_sign")


def _describe(err: dict, parents: list[type[BaseModel]], inner: list[type[BaseModel]]) -> str:
    kind, ctx, value = err["type"], err.get("ctx") or {}, err.get("input")
    if kind == "extra_forbidden":
        allowed = sorted({f for m in parents for f in m.model_fields})
        return f": unknown key (allowed: {', '.join(allowed)})"
    if kind == "missing":
        return ": missing (required)"
    if kind == "union_tag_invalid":
        return f".type = {ctx.get('tag')!r}: unknown type (allowed: {ctx.get('expected_tags')})"
    if kind == "union_tag_not_found":
        tags = ", ".join(repr(_tag(m)) for m in inner if _tag(m))
        return f".type: missing (allowed: {tags})"
    if kind == "workload_conflict":  # the message starts with the key, already in the path
        return err["msg"].removeprefix(ctx["field"])
    if kind in _OWN_ERRORS:
        return f": {err['msg']}"
    return f" = {_short(value)}: {err['msg']}"


def _yaml_path(root: type[BaseModel], loc: tuple, last_is_key: bool):
    """YAML key names along ``loc``, the model(s) holding the last key, and the model(s) in it."""
    names: list[str] = []
    models: list[type[BaseModel]] = [root]
    parents = models
    for i, part in enumerate(loc):
        if isinstance(part, int):
            names[-1:] = [f"{names[-1]}[{part}]"] if names else [f"[{part}]"]
            continue
        owners = [m for m in models if part in m.model_fields]
        if not owners and not (last_is_key and i == len(loc) - 1):
            # A union member pydantic names in the location (a tag or a type name): narrow to it.
            tagged = [m for m in models if _tag(m) == part or m.__name__ == part]
            models = parents = tagged or models
            continue
        names.append(part)
        parents = models
        models = _models_in(owners[0].model_fields[part].annotation) if owners else []
    return names, parents, models


def _models_in(annotation) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        found.extend(_models_in(arg))
    return found


def _tag(model: type[BaseModel]) -> str | None:
    field = model.model_fields.get("type")
    args = typing.get_args(field.annotation) if field else ()
    return args[0] if args else None


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# --- paths ----------------------------------------------------------------------------

def resolve_path(path: str, base_dir: Path | None, *, yaml_path: str) -> Path:
    """A scenario path as a file on disk.

    ``$VARS`` and ``~`` are expanded; a relative path is joined to ``base_dir`` (the
    scenario file's folder, so ``../../shared/data/traces/x.csv`` works from
    ``scenarios/``), or to the working directory when no base is given.
    """
    expanded = Path(os.path.expanduser(os.path.expandvars(path)))
    full = expanded if expanded.is_absolute() or base_dir is None else Path(base_dir) / expanded
    if not full.is_file():
        where = f" (relative paths resolve against {base_dir})" if base_dir is not None and not expanded.is_absolute() else ""
        raise ValueError(f"{yaml_path} = {path!r}: file not found: {full}{where}")
    return full
