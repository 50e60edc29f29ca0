"""The plan file: a scenario plus a ``plan:`` section -> candidates, SLOs, seeds, rate bounds.

The format is in docs/plan.md; every bad key or value is a :class:`PlanError`
naming its YAML path, the value and what is allowed.
"""

from __future__ import annotations

import copy
import itertools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PLAN_KEYS = ("gpus", "tp", "kv_cache_dtype", "max_num_batched_tokens", "max_num_seqs", "slo",
             "target_rate", "seeds", "rate", "tolerance", "workers", "fleet")
RATE_KEYS = ("start", "min", "max")
FLEET_KEYS = ("routers", "max_replicas", "start_replicas")
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
LATENCY_STATS = ("mean", "median", "p90", "p99")
# A probe at or above this KV usage had requests waiting for blocks (the pool


class PlanError(ValueError):
    """Bad plan input; the message names the YAML path or flag, the value and what is allowed."""



@dataclass(frozen=True)
class RateBounds:
    """The search range in req/s and the relative tolerance of the answer."""

    start_req_s: float = 1.0
    min_req_s: float = 0.05
    max_req_s: float = 1024.0
    tolerance: float = 0.05
    growth: float = 2.0


@dataclass(frozen=True)
class Candidate:
    gpu: str
    tp: int
    kv_cache_dtype: str
    max_num_batched_tokens: int | None
    max_num_seqs: int | None
    label: str = ""          # names the GPU, TP and whatever else the plan varies

    def apply(self, scenario: dict) -> dict:
        """The base scenario with this candidate's hardware and knobs (a new dict)."""
        sc = copy.deepcopy(scenario)
        sc["hardware"] = {**(sc.get("hardware") or {}), "gpu": self.gpu, "tp": self.tp}
        engine = dict(sc.get("engine") or {})
        engine["kv_cache_dtype"] = self.kv_cache_dtype
        if self.max_num_batched_tokens is not None:
            engine["max_num_batched_tokens"] = self.max_num_batched_tokens
        if self.max_num_seqs is not None:
            engine["max_num_seqs"] = self.max_num_seqs
        sc["engine"] = engine
        return sc


@dataclass(frozen=True)
class FleetSpec:
    """``plan.fleet`` (kvsim/plan/fleet.py): the routers to compare and the range of fleet sizes."""

    routers: tuple                  # router configs, as cluster.router takes them
    max_replicas: int = 64
    start_replicas: int = 1
    pd: bool = False                # the base has a prefill and a decode pool: size P + D


def parse_fleet(section, base: Mapping) -> FleetSpec:
    """``plan.fleet`` of a plan file (``True`` or ``{}``: every default) -> FleetSpec."""
    from kvsim.fleet.config import parse_cluster_config

    if section is True or section is None:
        section = {}
    if not isinstance(section, Mapping):
        raise PlanError(f"plan.fleet: got {section!r}; expected a mapping with keys {', '.join(FLEET_KEYS)}")
    for key in section:
        if key not in FLEET_KEYS:
            raise PlanError(f"plan.fleet.{key}: unknown key; allowed: {', '.join(FLEET_KEYS)}")
    cluster = base.get("cluster") or {}
    pd = isinstance(cluster, Mapping) and cluster.get("pools") is not None
    if pd:
        pools = cluster["pools"]
        roles = sorted(p.get("role", "mixed") for p in pools) if isinstance(pools, list) and all(
            isinstance(p, Mapping) for p in pools) else None
        if roles != ["decode", "prefill"] or any("hardware" in p for p in pools):
            raise PlanError("plan.fleet: the base scenario's cluster.pools must be one prefill and one "
                            "decode pool without their own hardware (a fleet plan sizes P + D replicas "
                            "of the candidate's GPU x TP), or use cluster.replicas")
    routers = section.get("routers", [cluster.get("router", "round_robin")]
                          if isinstance(cluster, Mapping) else ["round_robin"])
    if not isinstance(routers, list) or not routers:
        raise PlanError(f"plan.fleet.routers: got {routers!r}; expected a list of router policies "
                        f"(round_robin, prefix_aware, ...) or {{policy: ..., options}}")
    for i, router in enumerate(routers):
        try:
            parse_cluster_config({"replicas": 1, "router": router}, path=f"plan.fleet.routers[{i}]")
        except ValueError as exc:
            raise PlanError(str(exc).replace(f"plan.fleet.routers[{i}].router", f"plan.fleet.routers[{i}]")) \
                from None
    sizes = {}
    for key, default in (("max_replicas", 64), ("start_replicas", 1)):
        value = section.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PlanError(f"plan.fleet.{key}: got {value!r}; expected an integer >= 1")
        sizes[key] = value
    if pd:                                     # one prefill and one decode replica at least
        sizes = {k: max(v, 2) for k, v in sizes.items()}
    if sizes["start_replicas"] > sizes["max_replicas"]:
        raise PlanError(f"plan.fleet: start_replicas {sizes['start_replicas']} > max_replicas "
                        f"{sizes['max_replicas']}")
    return FleetSpec(tuple(routers), **sizes, pd=pd)


@dataclass(frozen=True)
class Plan:
    base: dict                       # the scenario without its plan section
    base_dir: Path
    candidates: tuple[Candidate, ...]
    slo_ms: dict[str, float]         # summary key (p99_ttft_ms) -> limit
    seeds: tuple[int, ...]
    bounds: RateBounds
    target_rate_req_s: float | None
    workers: int | None
    fleet: FleetSpec | None = None   # plan.fleet: a fleet plan (kvsim/plan/fleet.py)


def normalize_slo_key(key: str) -> str:
    """``p99_ttft_ms``, ``ttft_p99_ms`` or ``ttft_p99`` -> the summary key ``p99_ttft_ms``."""
    parts = key.strip().removesuffix("_ms").split("_")
    if len(parts) == 2:
        a, b = parts
        stat, metric = (a, b) if a in LATENCY_STATS else (b, a)
        if stat in LATENCY_STATS and metric in LATENCY_METRICS:
            return f"{stat}_{metric}_ms"
    allowed = ", ".join(f"{s}_{m}_ms" for m in ("ttft", "tpot") for s in ("p90", "p99"))
    raise PlanError(f"plan.slo.{key}: not a latency percentile; allowed: "
                    f"{{mean,median,p90,p99}}_{{ttft,tpot,itl,e2el}}_ms, e.g. {allowed}")


def _label(combo: tuple, dtypes: list, knobs: dict) -> str:
    gpu, tp, dtype, mnbt, seqs = combo
    parts = [gpu, f"tp{tp}"]
    if len(dtypes) > 1 or dtype != "auto":
        parts.append(f"kv {dtype}")
    if len(knobs["max_num_batched_tokens"]) > 1:
        parts.append(f"mnbt {mnbt}")
    if len(knobs["max_num_seqs"]) > 1:
        parts.append(f"seqs {seqs}")
    return " ".join(parts)


def _as_list(where: str, value: Any, kind: type, allowed: str) -> list:
    items = value if isinstance(value, list) else [value]
    if not items:
        raise PlanError(f"{where}: empty list; give at least one value ({allowed})")
    for item in items:
        ok = item is None if kind is type(None) else (
            isinstance(item, kind) and not isinstance(item, bool))
        if not ok:
            raise PlanError(f"{where}: got {item!r}; expected {allowed}")
    return items


def _positive(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise PlanError(f"{where}: got {value!r}; expected a number > 0")
    return float(value)


def parse_plan(data: Mapping, base_dir: str | os.PathLike = ".") -> Plan:
    """A plan from a mapping: a scenario plus a ``plan:`` section (docs/plan.md)."""
    if not isinstance(data, Mapping):
        raise PlanError(f"plan file: expected a mapping (a scenario with a plan: section), "
                        f"got {type(data).__name__}")
    section = data.get("plan") or {}
    if not isinstance(section, Mapping):
        raise PlanError(f"plan: expected a mapping with keys {', '.join(PLAN_KEYS)}, got {section!r}")
    for key in section:
        if key not in PLAN_KEYS:
            raise PlanError(f"plan.{key}: unknown key; allowed: {', '.join(PLAN_KEYS)}")
    base = {k: copy.deepcopy(v) for k, v in data.items() if k not in ("plan", "sweep")}
    hardware = base.get("hardware") or {}
    engine = base.get("engine") or {}

    gpus = _as_list("plan.gpus", section.get("gpus", hardware.get("gpu", "h100-sxm")), str,
                    "GPU catalog names (kvsim capacity --list)")
    tps = _as_list("plan.tp", section.get("tp", hardware.get("tp", 1)), int, "integers >= 1")
    if any(tp < 1 for tp in tps):
        raise PlanError(f"plan.tp: got {tps}; every degree must be >= 1")
    dtypes = _as_list("plan.kv_cache_dtype", section.get("kv_cache_dtype",
                                                         engine.get("kv_cache_dtype", "auto")),
                      str, "auto, fp16, bf16, fp8, fp8_e4m3, fp8_e5m2 or int8")
    knobs = {}
    for knob in ("max_num_batched_tokens", "max_num_seqs"):
        values = section.get(knob, engine.get(knob))
        knobs[knob] = [None] if values is None else _as_list(f"plan.{knob}", values, int,
                                                             "integers >= 1")
    combos = list(itertools.product(gpus, tps, dtypes, knobs["max_num_batched_tokens"],
                                    knobs["max_num_seqs"]))
    candidates = tuple(Candidate(*combo, label=_label(combo, dtypes, knobs)) for combo in combos)

    slo_raw = section.get("slo")
    if slo_raw is None:  # fall back on the scenario's slo section (p99 of each)
        slo_raw = {f"p99_{k}": v for k, v in (base.get("slo") or {}).items() if v is not None}
    if not isinstance(slo_raw, Mapping) or not slo_raw:
        raise PlanError("plan.slo: give at least one SLO, e.g. {p99_ttft_ms: 2000, p99_tpot_ms: 100}")
    slo_ms = {normalize_slo_key(str(k)): _positive(f"plan.slo.{k}", v) for k, v in slo_raw.items()}

    seeds_raw = section.get("seeds", 3)
    if isinstance(seeds_raw, list):
        seeds = tuple(_as_list("plan.seeds", seeds_raw, int, "integers >= 0"))
    elif isinstance(seeds_raw, int) and not isinstance(seeds_raw, bool) and seeds_raw >= 1:
        first = base.get("seed", 0)
        seeds = tuple(range(first, first + seeds_raw))
    else:
        raise PlanError(f"plan.seeds: got {seeds_raw!r}; expected a count >= 1 or a list of seeds")

    rate = section.get("rate") or {}
    if not isinstance(rate, Mapping):
        raise PlanError(f"plan.rate: got {rate!r}; expected a mapping with {', '.join(RATE_KEYS)}")
    for key in rate:
        if key not in RATE_KEYS:
            raise PlanError(f"plan.rate.{key}: unknown key; allowed: {', '.join(RATE_KEYS)}")
    defaults = RateBounds()
    bounds = RateBounds(
        start_req_s=_positive("plan.rate.start", rate.get("start", defaults.start_req_s)),
        min_req_s=_positive("plan.rate.min", rate.get("min", defaults.min_req_s)),
        max_req_s=_positive("plan.rate.max", rate.get("max", defaults.max_req_s)),
        tolerance=_positive("plan.tolerance", section.get("tolerance", defaults.tolerance)))
    if not bounds.min_req_s <= bounds.start_req_s <= bounds.max_req_s:
        raise PlanError(f"plan.rate: need min <= start <= max, got min={bounds.min_req_s}, "
                        f"start={bounds.start_req_s}, max={bounds.max_req_s}")
    target = section.get("target_rate")
    target = None if target is None else _positive("plan.target_rate", target)
    workers = section.get("workers")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise PlanError(f"plan.workers: got {workers!r}; expected an integer >= 1")
    _check_rate_settable(base.get("workload") or {})
    fleet = None
    if "fleet" in section:               # the fewest replicas at the target rate: plan/fleet.py
        fleet = parse_fleet(section["fleet"], base)
        if target is None:
            raise PlanError("plan.target_rate: missing; a fleet plan (plan.fleet) sizes the fleet for "
                            "a target rate in req/s, e.g. target_rate: 50")
    return Plan(base, Path(base_dir).resolve(), candidates, slo_ms, seeds, bounds, target, workers, fleet)


def _check_rate_settable(workload: Mapping) -> None:
    arrival = workload.get("arrival")
    if arrival is None:
        return  # synthetic default (poisson) or a trace replayed at a Poisson rate
    kind = arrival.get("type") if isinstance(arrival, Mapping) else None
    if kind not in ("poisson", "gamma", "constant"):
        raise PlanError(f"workload.arrival.type: got {kind!r}; kvsim plan varies the request "
                        f"rate, so the arrival must be poisson, gamma or constant")
    if "requests_file" in workload:
        raise PlanError("workload.requests_file: fixed arrival times cannot be re-rated; "
                        "use a synthetic workload or a trace")


def with_rate(scenario: dict, rate_req_s: float, seed: int) -> dict:
    """The scenario with the arrival rate (and seed) of one probe (a new dict)."""
    sc = copy.deepcopy(scenario)
    sc["seed"] = seed
    workload = sc.setdefault("workload", {})
    arrival = dict(workload.get("arrival") or {"type": "poisson"})
    if arrival.get("type") == "constant":
        arrival["interval_s"] = 1.0 / rate_req_s
    else:
        arrival["rate"] = rate_req_s
    workload["arrival"] = arrival
    return sc
