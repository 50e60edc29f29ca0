"""The scenario's ``cluster:`` section: replicas, pools, routers, the P/D link.

::

    cluster:
      replicas: 8                          # identical copies of the scenario's model/hardware/engine
      router: {policy: round_robin}        # or just `router: round_robin`

    cluster:                               # or pools, each with its own hardware/engine
      pools:
        - {name: prefill, role: prefill, replicas: 2, hardware: {gpu: h100-sxm, tp: 1}}
        - {name: decode,  role: decode,  replicas: 6, engine: {max_num_seqs: 512}}
      router: {policy: prefix_aware, mode: precise}      # picks the prefill (or mixed) replica
      decode_router: {policy: least_loaded}              # picks the decode replica
      link: roce-400g                                    # kvsim/fleet/data/links.yaml, or a mapping

A pool's ``model``, ``hardware``, ``engine`` and ``cost_model`` default to the
scenario's (``engine`` and ``hardware`` mappings are merged key by key over
it). A scenario without ``cluster:`` is one replica, exactly as before.

``parse_cluster_config`` validates the section alone and raises a
``ValueError`` with one line per problem that names the YAML path, the bad
value and what is allowed. ``check_pools`` does the checks that need every
pool resolved (same model in a P/D pair, a decode pool that can hold what the
prefill pool accepts). Router semantics: kvsim/fleet/routers.py.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from kvsim.fleet.links import link_entry

SCORERS = ("queue", "kv_cache_utilization", "prefix_cache", "precise_prefix_cache",
           "session_affinity")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# --- routers --------------------------------------------------------------------------

class RoundRobinRouter(_Section):
    """Replica ``k mod N`` for the k-th request (Vidur RoundRobinGlobalScheduler)."""
    policy: Literal["round_robin"]


class RandomRouter(_Section):
    """Uniform over the replicas, from the run's seeded generator (Vidur RandomGlobalScheduler)."""
    policy: Literal["random"]


class LeastLoadedRouter(_Section):
    """Fewest running + waiting requests; ties to the lowest index (Vidur LOR, SGLang shortest queue)."""
    policy: Literal["least_loaded"]


class KvUtilizationRouter(_Section):
    """Lowest KV-cache usage; ties to the lowest index (llm-d kv-cache-utilization scorer alone)."""
    policy: Literal["kv_utilization"]


class PrefixAwareRouter(_Section):
    """SGLang's cache-aware rule (sgl-router policies/cache_aware.rs); defaults: RouterArgs."""
    policy: Literal["prefix_aware"]
    mode: Literal["approximate", "precise"] = "approximate"
    cache_threshold: float = Field(0.3, ge=0.0, le=1.0)
    balance_abs_threshold: int = Field(64, ge=0)
    balance_rel_threshold: float = Field(1.5, ge=1.0)
    eviction_interval_s: float = Field(120.0, gt=0)
    max_tree_size: int = Field(2**26, ge=1, description="tokens per replica in the router's tree")


class SessionAffinityRouter(_Section):
    """A later turn goes where the previous turn went (llm-d session-affinity scorer)."""
    policy: Literal["session_affinity"]
    fallback: Literal["round_robin", "random", "least_loaded", "kv_utilization"] = "least_loaded"


class PrefixCacheScorer(_Section):
    """llm-d / gateway-api-inference-extension ``prefix-cache-scorer`` (router-side LRU)."""
    lru_capacity_per_server: int = Field(31250, ge=1, description="blocks remembered per replica")
    max_prefix_blocks_to_match: int = Field(256, ge=1)


class PrecisePrefixCacheScorer(_Section):
    """llm-d ``precise-prefix-cache-scorer`` (the replicas' own cached blocks)."""
    max_prefix_blocks_to_match: int = Field(256, ge=1)
    speculative_ttl_s: float | None = Field(None, gt=0, description="speculative indexing (off: null)")


class WeightedRouter(_Section):
    """Sum of weighted scorers, highest wins, ties at random (llm-d scheduling profile, max-score picker)."""
    policy: Literal["weighted"]
    scorers: dict[str, float] = Field(min_length=1)
    prefix_cache: PrefixCacheScorer = PrefixCacheScorer()
    precise_prefix_cache: PrecisePrefixCacheScorer = PrecisePrefixCacheScorer()

    @model_validator(mode="after")
    def _known_scorers(self):
        for name, weight in self.scorers.items():
            if name not in SCORERS:
                raise _error(f"scorers.{name}", "unknown scorer {name!r}; allowed: {allowed}",
                             name=name, allowed=", ".join(SCORERS))
            if not weight >= 0:
                raise _error(f"scorers.{name}", "got {weight}; a weight must be >= 0", weight=weight)
        return self


class KvRouter(_Section):
    """NVIDIA Dynamo's KV router cost (lib/llm/src/kv_router/scheduler.rs, see routers.py)."""
    policy: Literal["kv_router"]
    overlap_score_weight: float = Field(1.0, ge=0.0)
    temperature: float = Field(0.0, ge=0.0)


RouterConfig = Annotated[
    Union[RoundRobinRouter, RandomRouter, LeastLoadedRouter, KvUtilizationRouter, PrefixAwareRouter,
          SessionAffinityRouter, WeightedRouter, KvRouter],
    Field(discriminator="policy"),
]
POLICIES = tuple(typing.get_args(m.model_fields["policy"].annotation)[0]
                 for m in typing.get_args(typing.get_args(RouterConfig)[0]))


# --- pools and the cluster ------------------------------------------------------------

class PoolConfig(_Section):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    replicas: int = Field(1, ge=1)
    role: Literal["mixed", "prefill", "decode"] = "mixed"
    model: str | dict[str, Any] | None = None
    hardware: dict[str, Any] | None = None
    engine: dict[str, Any] | None = None
    cost_model: dict[str, Any] | None = None


class LinkConfig(_Section):
    name: str = "custom-link"
    bandwidth_gbps: float = Field(gt=0, description="GB/s per GPU pair, one direction")
    latency_s: float = Field(0.0, ge=0)
    scope: Literal["intra_node", "inter_node"] = "inter_node"


class ClusterConfig(_Section):
    replicas: int | None = Field(None, ge=1)
    pools: list[PoolConfig] | None = Field(None, min_length=1)
    router: RouterConfig = RoundRobinRouter(policy="round_robin")
    decode_router: RouterConfig | None = None
    link: str | LinkConfig | None = None
    # Processes that simulate replicas which run apart (kvsim/scenario/cluster_parallel.py);
    # "auto": every core this process may use. Any other fleet runs in one process.
    workers: int | Literal["auto"] = 1

    @property
    def disaggregated(self) -> bool:
        return any(p.role != "mixed" for p in self.pools or ())

    @field_validator("workers", mode="before")
    @classmethod
    def _workers(cls, value):
        if (type(value) is int and value >= 1) or value == "auto":
            return value
        raise PydanticCustomError("workers", "allowed: an integer >= 1 (processes) or 'auto' "
                                             "(every core this process may use)")

    def pool_list(self) -> list[PoolConfig]:
        """The pools; ``replicas: N`` is one mixed pool named ``replica``."""
        if self.pools is not None:
            return list(self.pools)
        return [PoolConfig(name="replica", replicas=self.replicas)]

    @model_validator(mode="after")
    def _consistent(self):
        if (self.replicas is None) == (self.pools is None):
            raise _error("replicas", "give either replicas (identical copies of the scenario's "
                                     "model/hardware/engine) or pools, not {which}",
                         which="both" if self.replicas is not None else "neither")
        names = [p.name for p in self.pools or ()]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise _error(f"pools[{i}].name", "{name!r} names two pools; pool names must be unique",
                             name=name)
        roles = [p.role for p in self.pools or ()]
        if self.disaggregated:
            for i, role in enumerate(roles):
                if role == "mixed":
                    raise _error(f"pools[{i}].role", "'mixed' next to prefill/decode pools is not "
                                                     "supported; make every pool mixed, or split into "
                                                     "prefill and decode pools")
            for need in ("prefill", "decode"):
                if need not in roles:
                    raise _error("pools", "disaggregated serving needs a {need} pool; roles given: "
                                          "{roles}", need=need, roles=", ".join(roles))
            if self.link is None:
                raise _error("link", "missing; prefill/decode pools move KV over a link: a catalog "
                                     "name ({names}) or {{bandwidth_gbps, latency_s}}",
                             names=", ".join(_link_names()))
        else:
            if self.decode_router is not None:
                raise _error("decode_router", "only used with a decode pool (pools with role: decode)")
            if self.link is not None:
                raise _error("link", "only used with prefill/decode pools (the KV transfer link)")
        if isinstance(self.link, str):
            try:
                link_entry(self.link)
            except ValueError as exc:
                raise _error("link", "{msg}", msg=str(exc)) from None
        return self


def _link_names() -> list[str]:
    from kvsim.fleet.links import list_links
    return list_links()


def _error(key: str, message: str, **ctx) -> PydanticCustomError:
    """A model-level error about ``key`` (a path below the model); ``message`` is str.format'ted."""
    return PydanticCustomError("cluster_key", "{key}: {msg}", {"key": key, "msg": message.format(**ctx)})


# --- error messages -------------------------------------------------------------------

def parse_cluster_config(data, *, path: str = "cluster") -> ClusterConfig:
    """Validate a ``cluster:`` mapping; raise ``ValueError`` naming path, value, allowed."""
    if isinstance(data, ClusterConfig):
        return data
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping, got {_short(data)}")
    data = dict(data)
    for key in ("router", "decode_router"):          # `router: round_robin` shorthand
        if isinstance(data.get(key), str):
            data[key] = {"policy": data[key]}
    try:
        return ClusterConfig.model_validate(data)
    except ValidationError as exc:
        raise ValueError(format_cluster_error(exc, prefix=path)) from None


def format_cluster_error(exc: ValidationError, *, prefix: str = "cluster") -> str:
    """One line per problem: ``cluster.router.policy: got 'fastest'; allowed: ...``."""
    lines = []
    errors = exc.errors()
    for err in errors:
        if _wrong_union_branch(err, errors):
            continue
        names, models = _yaml_path(err["loc"])
        kind, ctx = err["type"], err.get("ctx") or {}
        where = ".".join([prefix, *names]) if names else prefix
        if kind == "cluster_key":
            where = f"{where.removesuffix('.')}.{ctx['key']}" if names else f"{prefix}.{ctx['key']}"
            lines.append(f"{where}{err['msg'].removeprefix(ctx['key'])}")
        elif kind == "extra_forbidden":
            allowed = sorted({f for m in models for f in m.model_fields})
            lines.append(f"{where}: unknown key; allowed: {', '.join(allowed)}")
        elif kind == "union_tag_invalid":
            lines.append(f"{where}.policy: got {ctx.get('tag')!r}; allowed: {', '.join(POLICIES)}")
        elif kind == "union_tag_not_found":
            lines.append(f"{where}.policy: missing; allowed: {', '.join(POLICIES)}")
        elif kind == "missing":
            lines.append(f"{where}: missing (required)")
        else:
            got = f"{where}: got {_short(err.get('input'))}; "
            same = next((i for i, line in enumerate(lines) if line.startswith(got)), None)
            if same is None:
                lines.append(got + err["msg"])
            else:                                # another member of the same union
                lines[same] += " or " + err["msg"][0].lower() + err["msg"][1:]
    return "\n".join(dict.fromkeys(lines))


_TYPE_ERRORS = ("string_type", "model_type", "dict_type", "model_attributes_type", "int_type",
                "float_type")


def _wrong_union_branch(err: dict, errors: list[dict]) -> bool:
    """A type mismatch with one member of a union (``link: str | LinkConfig``) when another
    member reports a real problem: only the member the user meant is worth a line."""
    loc = err["loc"]
    if err["type"] not in _TYPE_ERRORS or len(loc) < 2 or isinstance(loc[-1], int):
        return False
    head = loc[:-1]
    return any(e is not err and e["loc"][:len(head)] == head and e["loc"] != loc
               and e["type"] not in _TYPE_ERRORS for e in errors)


def _yaml_path(loc: tuple) -> tuple[list[str], list[type[BaseModel]]]:
    """YAML key names along a pydantic error location, and the model(s) holding the last key.

    Union members pydantic names in the location (a policy tag, ``str``) are
    dropped, so the path reads as the user wrote it.
    """
    names: list[str] = []
    models: list[type[BaseModel]] = [ClusterConfig]
    parents = models
    for part in loc:
        if isinstance(part, int):
            if names:
                names[-1] = f"{names[-1]}[{part}]"
            continue
        owners = [m for m in models if part in m.model_fields]
        if not owners:
            tagged = [m for m in models if _policy(m) == part or m.__name__ == part]
            if tagged or part in ("str", "float", "int", "dict[str,any]", "list[PoolConfig]"):
                models = parents = tagged or models
                continue
            names.append(str(part))           # an unknown key
            continue
        names.append(part)
        parents = owners
        models = _models_in(owners[0].model_fields[part].annotation)
    return names, parents


def _models_in(annotation) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        found.extend(_models_in(arg))
    return found


def _policy(model: type[BaseModel]) -> str | None:
    field = model.model_fields.get("policy")
    args = typing.get_args(field.annotation) if field else ()
    return args[0] if args else None


def _short(value) -> str:
    if isinstance(value, dict):
        return "a mapping"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# --- checks across resolved pools -----------------------------------------------------

@dataclass(frozen=True)
class PoolFacts:
    """What the cross-pool checks need of one resolved pool (filled by the scenario layer)."""

    index: int
    name: str
    role: str
    model_name: str
    block_size: int
    kv_cache_dtype: str
    max_model_len: int
    token_capacity: int          # (num_gpu_blocks - 1) * block_size


def check_pools(pools: list[PoolFacts], *, path: str = "cluster") -> None:
    """Raise ``ValueError`` when resolved pools cannot serve together.

    * one cluster serves one model (in a P/D pair the decode side continues
      the prefill side's KV, so it must be the same model);
    * a P/D pair must agree on ``block_size`` and ``kv_cache_dtype`` (the
      blocks move as they are);
    * a decode pool must hold every request its prefill pools accept: its
      ``max_model_len`` (never above its KV capacity) must reach theirs.
    """
    problems = []
    first = pools[0]
    for p in pools[1:]:
        if p.model_name != first.model_name:
            pair = " in one P/D pair" if {p.role, first.role} == {"prefill", "decode"} else ""
            problems.append(f"{path}.pools[{p.index}].model: {p.model_name!r} differs from pool "
                            f"{first.name!r} ({first.model_name!r}){pair}; one cluster serves one model")
    prefill = [p for p in pools if p.role == "prefill"]
    for d in (p for p in pools if p.role == "decode"):
        for p in prefill:
            for key in ("block_size", "kv_cache_dtype"):
                if getattr(d, key) != getattr(p, key):
                    problems.append(f"{path}.pools[{d.index}].engine.{key}: {getattr(d, key)!r} differs "
                                    f"from prefill pool {p.name!r} ({getattr(p, key)!r}); the KV blocks "
                                    f"move between them as they are")
            if d.max_model_len < p.max_model_len:
                problems.append(
                    f"{path}.pools[{d.index}]: decode pool {d.name!r} can never hold a request of "
                    f"{p.max_model_len} tokens that prefill pool {p.name!r} accepts (its max_model_len is "
                    f"{d.max_model_len}, its KV cache {d.token_capacity} tokens); give it more KV memory "
                    f"(hardware.tp, engine.gpu_memory_utilization) or lower the prefill pool's "
                    f"engine.max_model_len")
    if problems:
        raise ValueError("\n".join(dict.fromkeys(problems)))
