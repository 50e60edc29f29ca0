"""The scenario file: schema, defaults and validation (pydantic v2).

A scenario is one YAML mapping::

    name: quickstart
    seed: 0
    model: llama-3.1-8b            # catalog name, inline mapping, or path to a HF config.json
    hardware: {gpu: h100-sxm, tp: 1}
    engine: {scheduler: chunked, max_num_batched_tokens: 2048, ...}   # vLLM knob names
    cost_model: {type: roofline}
    workload: {...}                # kvsim/workload/config.py
    slo: {ttft_ms: 2000, tpot_ms: 100}
    sweep: {...}                   # kvsim sweep only

pydantic gives path-aware messages, defaults and a JSON Schema for editors
for free; ``ScenarioError`` turns its errors into one line per problem that
names the YAML path, the bad value and what is allowed.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kvsim.scenario.dotted import EXAMPLE, join_path, list_item_problem, split_path
from kvsim.scenario.yamlio import YamlError, load_yaml, read_yaml_file
from kvsim.specs.parallel import ALL2ALL_BACKENDS


class ScenarioError(ValueError):
    """A scenario that cannot run; the message names the YAML path and value."""


class _Section(BaseModel):
    # strict: a YAML "16" or true is not silently taken for 16 (ints still pass for floats).
    model_config = ConfigDict(extra="forbid", validate_default=True, strict=True)


class HardwareSection(_Section):
    gpu: str | dict[str, Any] = "h100-sxm"
    tp: int = Field(1, ge=1, le=64, description="tensor-parallel degree (GPUs per replica)")
    dp: int = Field(1, ge=1, le=64, description="data-parallel ranks of one engine (vLLM "
                                                "--data-parallel-size); kvsim simulates one")


class RadixSection(_Section):
    """SGLang ``RadixCache`` knobs, for ``engine.prefix_cache: radix`` (docs/kv_tiers.md)."""

    page_size: int = Field(1, ge=1, description="SGLang --page-size: 1 (token-granular) or engine.block_size")
    eviction_policy: Literal["lru", "lfu", "fifo", "mru", "filo"] = Field(
        "lru", description="SGLang 0.5.x --radix-eviction-policy (0.4.6 has lru only)")
    split_prompt: bool = Field(False, description="SGLang 0.5.x: a finished request's prompt is "
                                                  "inserted alone too, so its output is evicted first")


class DiskTierSection(_Section):
    """A disk tier under the CPU one (vLLM's tiering ``secondary_tiers``, filesystem)."""

    capacity_gib: float = Field(gt=0, description="GiB of disk for offloaded KV")
    bandwidth_gbps: float = Field(gt=0, description="NVMe GB/s (1e9 bytes), reads and writes")
    latency_us: float = Field(0.0, ge=0, description="per transfer")


class RemoteTierSection(_Section):
    """A KV store over the network under the local tiers (LMCache remote backend,
    Mooncake store); in a cluster, one store shared by every replica."""

    capacity_gib: float = Field(gt=0, description="GiB the store holds")
    bandwidth_gbps: float = Field(gt=0, description="network GB/s (1e9 bytes) to the store")
    latency_us: float = Field(0.0, ge=0, description="per transfer")


class KVOffloadingSection(_Section):
    """kvsim's details of vLLM's native KV offloading (``engine.kv_offloading_size``;
    docs/kv_tiers.md): the chunk, the host link, a disk tier."""

    num_cpu_blocks: int | None = Field(None, ge=1, description="CPU tier size in GPU blocks "
                                       "(instead of engine.kv_offloading_size GiB)")
    blocks_per_chunk: int = Field(1, ge=1, description="vLLM kv_connector_extra_config "
                                  "blocks_per_chunk: GPU blocks per offloaded chunk")
    bandwidth_gbps: float | None = Field(None, gt=0, description="host<->GPU GB/s per direction "
                                         "(default: the GPU's pcie_bandwidth_gbps)")
    latency_us: float = Field(0.0, ge=0, description="host<->GPU latency per transfer")
    disk: DiskTierSection | None = None
    remote: RemoteTierSection | None = None


class LMCacheL2Section(_Section):
    """An L2 adapter behind the LMCache server's L1 (``--l2-adapter``; kvsim: ``fs``, a local disk)."""

    type: Literal["fs"] = Field("fs", description="LMCache L2 adapter type (fs only)")
    capacity_gib: float | None = Field(None, gt=0, description="kvsim: GiB it holds, LRU beyond "
                                       "(LMCache's fs adapter has no limit: None)")
    bandwidth_gbps: float = Field(gt=0, description="disk GB/s (1e9 bytes), reads and writes")
    latency_us: float = Field(0.0, ge=0, description="per transfer")


class LMCacheSection(_Section):
    """The LMCache server's store behind ``kv_offloading_backend: lmcache`` (vLLM's
    LMCacheMPConnector; kv/lmcache_server.py, docs/kv_tiers.md), under the LMCache
    multi-process server's flag names (``lmcache/v1/multiprocess/config.py``,
    ``lmcache/v1/distributed/config.py``)."""

    chunk_size: int = Field(256, ge=1, description="LMCache --chunk-size: tokens per chunk "
                            "(a multiple of engine.block_size)")
    l1_size_gb: float = Field(5.0, gt=0, description="LMCache --l1-size-gb: the server's CPU "
                              "memory for KV, GiB (2**30 bytes); LMCache requires it, kvsim "
                              "defaults to LMCache's in-process max_local_cpu_size 5.0")
    eviction_policy: Literal["LRU"] = Field("LRU", description="LMCache --eviction-policy "
                                            "(ARC, IsolatedLRU, noop: not modelled)")
    eviction_trigger_watermark: float = Field(0.8, gt=0, le=1, description="LMCache "
                                              "--eviction-trigger-watermark")
    eviction_ratio: float = Field(0.2, gt=0, le=1, description="LMCache --eviction-ratio")
    bandwidth_gbps: float | None = Field(None, gt=0, description="kvsim: GPU<->server GB/s per "
                                         "direction (default: the GPU's pcie_bandwidth_gbps)")
    latency_us: float = Field(0.0, ge=0, description="kvsim: per transfer")
    l2_adapter: LMCacheL2Section | None = None


class EngineSection(_Section):
    """vLLM engine knobs, under vLLM's names. ``None`` means vLLM's default for the GPU."""

    scheduler: Literal["chunked", "continuous", "static", "simple_chunking", "orca"] = "chunked"
    block_size: int = Field(16, ge=1, le=1024)
    num_gpu_blocks_override: int | None = Field(None, ge=2)
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0)
    max_model_len: int | None = Field(None, ge=2)
    max_num_seqs: int | None = Field(None, ge=1)
    max_num_batched_tokens: int | None = Field(None, ge=1)
    enable_prefix_caching: bool = True
    prefix_cache: Literal["hash", "radix"] = Field(
        "hash", description="hash: vLLM's hashed full blocks; radix: SGLang's RadixCache")
    radix: RadixSection | None = None
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = Field(0, ge=0)
    # vLLM 0.33 SchedulerConfig knobs (vllm/config/scheduler.py); the first four: chunked only
    max_num_scheduled_tokens: int | None = Field(None, ge=1, description="tokens one step may issue "
                                                 "(default: max_num_batched_tokens)")
    max_num_active_seqs: int | None = Field(None, ge=1, description="requests admitted into RUNNING "
                                            "(default: max_num_seqs, which it may not exceed)")
    long_prefill_token_threshold_adaptive: bool = Field(
        False, description="floor long_prefill_token_threshold at max_num_batched_tokens // requests")
    prefill_schedule_interval: int = Field(1, ge=1, description="prefill only every N executed steps "
                                           "while requests decode")
    max_num_queued_reqs: int | None = Field(None, ge=0, description="refuse (HTTP 503) a request when "
                                            "this many are unfinished")
    max_num_queued_tokens: int | None = Field(None, ge=0, description="refuse (HTTP 503) a request "
                                              "when the prompts not yet answered hold this many tokens")
    policy: Literal["fcfs", "priority"] = "fcfs"
    preemption_mode: Literal["recompute", "swap"] | None = None
    swap_space: float = Field(4.0, ge=0.0, description="GiB of CPU swap space per GPU (continuous)")
    # vLLM 0.33 CacheConfig: CPU KV offloading through the OffloadingConnector (docs/kv_tiers.md)
    kv_offloading_size: float | None = Field(None, gt=0, description="GiB of CPU memory for "
                                             "offloaded KV, all TP ranks together (vLLM "
                                             "--kv-offloading-size)")
    kv_offloading_backend: Literal["native", "lmcache"] = "native"
    kv_offloading: KVOffloadingSection | None = None
    lmcache: LMCacheSection | None = None    # kv_offloading_backend: lmcache (docs/kv_tiers.md)
    kv_cache_dtype: Literal["auto", "fp16", "bf16", "fp8", "fp8_e4m3", "fp8_e5m2", "int8"] = "auto"
    watermark: float | None = Field(None, ge=0.0, lt=1.0)
    scheduler_reserve_full_isl: bool = True
    # MoE layouts (kvsim/specs/parallel.py) and vLLM's hybrid KV manager (kv/hybrid.py)
    enable_expert_parallel: bool = False
    all2all_backend: Literal[ALL2ALL_BACKENDS] = "allgather_reducescatter"
    disable_hybrid_kv_cache_manager: bool | None = Field(
        None, description="None: vLLM 0.33's choice (off for chunked local attention)")
    # CUDA graphs, modelled by cost_model.engine_preset (kvsim/cost/presets.py); None: the preset's default
    enforce_eager: bool | None = None
    cudagraph_capture_sizes: list[Annotated[int, Field(ge=1)]] | None = Field(None, min_length=1)
    max_cudagraph_capture_size: int | None = Field(None, ge=1, description="vLLM V1: the largest "
                                                   "default capture size (issue #13)")
    orca_reservation: Literal["max", "pow2", "oracle"] | None = Field(
        None, description="orca scheduler: KV reserved per request (default max: max_model_len)")
    # The engine loop and what the client sees (engine time, issue #13; docs/cost_models.md)
    stream_interval: int = Field(1, ge=1, description="vLLM --stream-interval: stream every k "
                                                      "tokens, plus the first and the last")
    async_scheduling: bool = Field(False, description="vLLM V1 --async-scheduling: schedule step "
                                                      "N+1 while step N runs (chunked only)")
    num_scheduler_steps: int = Field(1, ge=1, description="vLLM 0.6 --num-scheduler-steps: "
                                     "decode windows of this many steps (continuous only)")
    speculative_config: dict[str, Any] | None = Field(
        None, description="vLLM --speculative-config {method, num_speculative_tokens, model} "
                          "plus kvsim's acceptance: {rate | per_position | trace} (docs/engine.md)")
    debug: bool = False
    serve_args: str | None = Field(None, description="`vllm serve` flags, expanded into the keys "
                                                      "above when the file is read (docs/vllm.md)")

    @field_validator("serve_args")
    @classmethod
    def _serve_args_expanded(cls, v):
        # read_scenario_dict expands it; one given later (--set) would be ignored.
        if v is not None:
            raise ValueError("give vllm serve flags in the scenario file or with --serve-args, not with --set")
        return v


class SloSection(_Section):
    ttft_ms: float | None = Field(None, gt=0)
    tpot_ms: float | None = Field(None, gt=0)
    e2el_ms: float | None = Field(None, gt=0)

    def as_dict(self) -> dict[str, float]:
        return {k: v for k, v in self.model_dump().items() if v is not None}


class MetricsSection(_Section):
    streaming: bool = Field(False, description="keep no per-request/per-step tables; bounded-memory summary")


class Scenario(_Section):
    name: str = "scenario"
    description: str = ""
    seed: int = Field(0, ge=0)
    model: str | dict[str, Any] = "llama-3.1-8b"
    hardware: HardwareSection = HardwareSection()
    engine: EngineSection = EngineSection()
    cost_model: dict[str, Any] = Field(default_factory=lambda: {"type": "roofline"})
    workload: dict[str, Any] = Field(default_factory=dict)
    slo: SloSection = SloSection()
    metrics: MetricsSection = MetricsSection()
    sweep: dict[str, Any] | None = None
    plan: dict[str, Any] | None = None     # read by `kvsim plan` only (docs/plan.md)
    cluster: dict[str, Any] | None = None  # replicas, pools, routers: kvsim/fleet/config.py
    # Not part of the YAML: where relative paths in it resolve.
    base_dir: str = Field(".", exclude=True)

    @field_validator("name")
    @classmethod
    def _name_is_simple(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be empty")
        return v


SECTIONS = tuple(k for k in Scenario.model_fields if k != "base_dir")


def format_validation_error(exc: ValidationError, prefix: str = "") -> str:
    """One line per problem: ``engine.block_size: got -1; Input should be >= 1``."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-"))
        path = f"{prefix}{loc}" if loc else prefix.rstrip(".") or "scenario"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            parent = path.rsplit(".", 1)[0] if "." in path else "the scenario"
            allowed = _allowed_keys(err["loc"][:-1])
            hint = f"; allowed: {', '.join(allowed)}" if allowed else ""
            lines.append(f"{path}: unknown key (not allowed in {parent}){hint}")
            continue
        given = err.get("input")
        shown = repr(given) if not isinstance(given, dict) else "a mapping"
        lines.append(f"{path}: got {shown}; {msg}")
    return "\n".join(lines)


def _allowed_keys(loc: tuple) -> list[str]:
    """The keys a section at ``loc`` accepts (for "unknown key" messages)."""
    model: Any = Scenario
    for part in loc:
        field = model.model_fields.get(str(part)) if isinstance(model, type) else None
        ann = getattr(field, "annotation", None)
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return []
        model = ann
    return [k for k in model.model_fields if k != "base_dir"]


def set_dotted(d: dict, path: str, value: Any) -> None:
    """Set ``a.b.c`` in nested dicts, creating intermediate mappings; ``a.b[1].c``
    enters item 1 of the list ``a.b``, which must be there (kvsim/scenario/dotted.py)."""
    parts = split_path(path)
    if parts is None:
        raise ScenarioError(f"{path}: not a dotted path like {EXAMPLE}")
    cur: Any = d
    for depth, k in enumerate(parts):
        if isinstance(k, int):
            problem = list_item_problem(cur, k, join_path(parts[:depth]))
            if problem:
                raise ScenarioError(f"{path}: {problem}")
        if depth == len(parts) - 1:
            cur[k] = value
            return
        nxt = cur[k] if isinstance(k, int) else cur.get(k)
        if isinstance(parts[depth + 1], int):
            cur = nxt                             # (a list, checked at its index)
            continue
        if nxt is None and isinstance(k, str):
            nxt = cur[k] = {}
        elif not isinstance(nxt, dict):
            name = k if isinstance(k, str) else join_path(parts[:depth + 1])
            raise ScenarioError(f"{path}: cannot set inside {name!r}, which is {nxt!r}, not a mapping")
        cur = nxt


def parse_overrides(items: list[str] | None) -> list[tuple[str, Any]]:
    """``--set engine.block_size=32`` -> [("engine.block_size", 32)] (YAML-typed values)."""
    out = []
    for item in items or ():
        if "=" not in item:
            raise ScenarioError(f"--set {item!r}: expected KEY=VALUE, e.g. engine.block_size=32")
        key, raw = item.split("=", 1)
        try:
            value = load_yaml(raw, where=f"--set {key.strip()}") if raw.strip() else None
        except YamlError as exc:
            raise ScenarioError(str(exc)) from None
        out.append((key.strip(), value))
    return out


def _expand_vllm_args(data: dict) -> dict:
    """``engine.serve_args`` / ``workload.bench_args`` -> the keys they set (kvsim/scenario/vllm_args)."""
    engine, workload = data.get("engine"), data.get("workload")
    if not ((isinstance(engine, dict) and "serve_args" in engine)
            or (isinstance(workload, dict) and "bench_args" in workload)):
        return data           # nothing to expand: skip importing the flag tables (~40 ms)
    from kvsim.scenario.vllm_args import VllmArgsError, expand_scenario_args
    try:
        return expand_scenario_args(data)
    except VllmArgsError as exc:
        raise ScenarioError(str(exc)) from None


def read_scenario_dict(path_or_dict: str | Path | dict, *, overrides=None) -> tuple[dict, Path]:
    """The raw mapping (with overrides applied) and the folder paths resolve against."""
    if isinstance(path_or_dict, dict):
        data = copy.deepcopy(path_or_dict)
        base = Path(data.pop("base_dir", ".")).resolve()
    else:
        path = Path(path_or_dict)
        if path.is_dir():
            raise ScenarioError(f"scenario file {str(path)!r} is a folder; give a YAML file")
        if not path.is_file():
            raise ScenarioError(f"scenario file {str(path)!r} does not exist")
        try:
            data = read_yaml_file(path, what="scenario YAML file")
        except YamlError as exc:
            raise ScenarioError(str(exc)) from None
        if data is None:
            # An empty file is a mistake (a wrong path, a truncated copy), not "all defaults".
            raise ScenarioError(f"{path}: the scenario file is empty; write at least one key "
                                f"(e.g. name: my-run); allowed: {', '.join(SECTIONS)}")
        if not isinstance(data, dict):
            raise ScenarioError(f"{path}: a scenario must be a YAML mapping, got {type(data).__name__}")
        base = path.parent.resolve()
    data = _expand_vllm_args(data)
    for key, value in overrides or ():
        section = (split_path(key) or [key.split(".")[0]])[0]
        if section not in SECTIONS:
            raise ScenarioError(f"{key}: unknown section {section!r}; "
                                f"allowed: {', '.join(SECTIONS)}")
        set_dotted(data, key, value)
    return data, base
