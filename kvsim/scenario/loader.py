"""Turn a validated scenario into the objects a run needs.

Everything that can be wrong with a scenario is found here, before any
simulation starts: unknown keys, bad values, unknown model or GPU names, a
model that does not fit the GPU, a cost profile that does not exist, a
workload file that cannot be read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from kvsim.cost import build_cost_model
from kvsim.cost.base import CostModel
from kvsim.cost.presets import EngineKnobs
from kvsim.sched.config import SchedulerConfig
from kvsim.scenario.schema import (RadixSection, Scenario, ScenarioError, format_validation_error,
                                   parse_overrides, read_scenario_dict)
from kvsim.specs.capacity import KVCapacity, kv_capacity
from kvsim.specs.catalog import load_gpu, load_model
from kvsim.specs.gpu import GPUSpec
from kvsim.specs.model import ModelSpec
from kvsim.workload.config import WorkloadConfig, parse_workload_config, resolve_path

GIB = 1 << 30
# vLLM V1 `vllm serve` defaults (kv-semantics D4): (max_num_batched_tokens, max_num_seqs)
_LARGE_GPU_BYTES = 70 * GIB
_HUGE_GPU_BYTES = 160 * GIB


@dataclass(frozen=True)
class LoadedScenario:
    """A scenario with every name resolved and every default filled in."""

    scenario: Scenario
    raw: dict[str, Any]
    base_dir: Path
    model: ModelSpec
    gpu: GPUSpec
    tp: int
    capacity: KVCapacity | None          # None when num_gpu_blocks_override sizes the cache
    sched_config: SchedulerConfig
    cost_model: CostModel
    workload: WorkloadConfig
    # What the run does that the scenario does not say (kvsim run prints them).
    notes: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.scenario.name

    @property
    def seed(self) -> int:
        return self.scenario.seed

    @property
    def scheduler(self) -> str:
        return self.scenario.engine.scheduler


def load_scenario(path_or_dict, *, overrides: list[str] | list[tuple[str, Any]] | None = None,
                  base_dir: str | Path | None = None) -> LoadedScenario:
    """Validate a scenario (file path or mapping) and resolve it; raises ScenarioError."""
    if overrides and isinstance(overrides[0], str):
        overrides = parse_overrides(overrides)
    data, base = read_scenario_dict(path_or_dict, overrides=overrides)
    if base_dir is not None:
        base = Path(base_dir).resolve()
    try:
        sc = Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(format_validation_error(exc)) from None
    try:
        workload = parse_workload_config(sc.workload)
    except ValidationError as exc:
        raise ScenarioError(format_validation_error(exc, prefix="workload.")) from None
    except ValueError as exc:
        raise ScenarioError(str(exc)) from None
    _check_workload_files(workload, base)
    if workload.beam_width > 1:
        raise ScenarioError(
            f"workload.beam_width: got {workload.beam_width}; the engine schedulers serve parallel "
            f"samples (workload.n) but not beam search, which vLLM runs outside its scheduler; "
            f"beam-search block sharing is measured by `kvsim report sharing` (kvsim/kv/sharing.py)")
    model = _named("model", load_model, sc.model, base)
    gpu = _named("hardware.gpu", load_gpu, sc.hardware.gpu, base)
    tp = sc.hardware.tp
    _check_tensor_parallel(model, tp)
    eng = sc.engine
    notes = []
    batched, seqs = _default_budget(gpu)
    max_num_batched_tokens = eng.max_num_batched_tokens or batched
    max_num_seqs = eng.max_num_seqs or min(seqs, max_num_batched_tokens)

    capacity = None
    if eng.num_gpu_blocks_override is not None:
        num_gpu_blocks = eng.num_gpu_blocks_override
    else:
        try:
            capacity = kv_capacity(model, gpu, tp=tp, gpu_memory_utilization=eng.gpu_memory_utilization,
                                   block_size=eng.block_size, kv_cache_dtype=eng.kv_cache_dtype,
                                   max_num_batched_tokens=max_num_batched_tokens,
                                   max_num_seqs=max_num_seqs,
                                   # The engine keeps one block table per request until the
                                   # hybrid KV manager lands (#16): size the pool as vLLM's
                                   # --disable-hybrid-kv-cache-manager does (same for one group).
                                   disable_hybrid_kv_cache_manager=True)
        except ValueError as exc:
            raise ScenarioError(f"model/hardware: {exc}") from None
        num_gpu_blocks = capacity.num_gpu_blocks
    token_capacity = (num_gpu_blocks - 1) * eng.block_size
    max_model_len = eng.max_model_len
    if max_model_len is None:
        # vLLM would refuse to start; kvsim caps the default at what fits, and says so.
        max_model_len = max(2, min(model.max_position_embeddings, token_capacity))
        if max_model_len < model.max_position_embeddings:
            sized_by = ("engine.num_gpu_blocks_override = "
                        f"{eng.num_gpu_blocks_override}" if capacity is None else
                        f"the KV cache on {gpu.name} (tp {tp})")
            notes.append(
                f"engine.max_model_len: not set, and {sized_by} holds only {token_capacity} "
                f"tokens, less than the model's {model.max_position_embeddings}; capped at "
                f"{max_model_len} (vLLM would refuse to start): longer prompts fail and "
                f"outputs stop at that length; set engine.max_model_len to choose")
    elif max_model_len > token_capacity:
        raise ScenarioError(
            f"engine.max_model_len: got {max_model_len}; one request of that length needs "
            f"{-(-max_model_len // eng.block_size)} blocks but the KV cache has {num_gpu_blocks - 1} "
            f"usable blocks ({token_capacity} tokens); lower it or give the cache more memory")
    # The continuous (V0) scheduler never chunks a prefill.
    chunking = eng.enable_chunked_prefill and eng.scheduler != "continuous"
    if not chunking and eng.scheduler != "static":
        if eng.max_num_batched_tokens is None:
            max_num_batched_tokens = max(max_num_batched_tokens, max_model_len)   # V0 default (V7)
        elif max_num_batched_tokens < max_model_len:
            raise ScenarioError(
                f"engine.max_num_batched_tokens: got {max_num_batched_tokens}; without chunked "
                f"prefill ({eng.scheduler} scheduler) it must be >= max_model_len ({max_model_len}), "
                f"as vLLM requires; raise it or lower engine.max_model_len")
    if eng.scheduler == "chunked" and eng.preemption_mode == "swap":
        raise ScenarioError("engine.preemption_mode: got 'swap'; the chunked (vLLM V1) scheduler "
                            "only preempts by recompute; allowed: recompute (swap needs "
                            "scheduler: continuous)")
    watermark = eng.watermark if eng.watermark is not None else (
        0.01 if eng.scheduler == "continuous" else 0.0)
    block_bytes = model.kv_bytes_per_block(eng.block_size, eng.kv_cache_dtype, tp)
    sched_config = SchedulerConfig(
        num_gpu_blocks=num_gpu_blocks, block_size=eng.block_size, max_model_len=max_model_len,
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
        enable_prefix_caching=eng.enable_prefix_caching,
        enable_chunked_prefill=eng.enable_chunked_prefill,
        long_prefill_token_threshold=eng.long_prefill_token_threshold, policy=eng.policy,
        scheduler_reserve_full_isl=eng.scheduler_reserve_full_isl, watermark=watermark,
        preemption_mode=eng.preemption_mode or "recompute",
        num_cpu_blocks=int(eng.swap_space * GIB) // block_bytes,
        swap_block_bytes=block_bytes, debug=eng.debug, **_radix_settings(eng, workload))
    knobs = EngineKnobs(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                        enforce_eager=eng.enforce_eager,
                        cudagraph_capture_sizes=(tuple(eng.cudagraph_capture_sizes)
                                                 if eng.cudagraph_capture_sizes else None))
    cost_config = sc.cost_model
    fit_file = cost_config.get("engine_overhead") if isinstance(cost_config, dict) else None
    if isinstance(fit_file, str) and not Path(fit_file).is_absolute():
        # a `kvsim calibrate serve` result next to the scenario
        cost_config = {**cost_config, "engine_overhead": str(base / fit_file)}
    try:
        cost_model = build_cost_model(cost_config, model=model, gpu=gpu, tp=tp,
                                      kv_cache_dtype=eng.kv_cache_dtype, engine=knobs)
    except (ValueError, FileNotFoundError) as exc:
        msg = str(exc)
        raise ScenarioError(msg if msg.startswith(("cost_model", "engine."))
                            else f"cost_model: {msg}") from None
    return LoadedScenario(sc, data, base, model, gpu, tp, capacity, sched_config, cost_model, workload,
                          tuple(notes))


def _radix_settings(eng, workload: WorkloadConfig) -> dict[str, Any]:
    """``engine.prefix_cache`` / ``engine.radix`` as SchedulerConfig fields; a radix
    cache with a knob it cannot honour is an error that names the knob."""
    if eng.prefix_cache == "hash":
        if eng.radix is not None:
            raise ScenarioError("engine.radix: set, but engine.prefix_cache is 'hash'; "
                                "set engine.prefix_cache: radix to use it")
        return {}
    radix = eng.radix or RadixSection()
    why = None
    if not eng.enable_prefix_caching:
        why = ("engine.enable_prefix_caching: false with engine.prefix_cache: radix; a radix "
               "cache always caches (SGLang --disable-radix-cache is prefix caching off: use "
               "enable_prefix_caching: false with prefix_cache: hash)")
    elif eng.scheduler != "chunked":
        why = (f"engine.scheduler: {eng.scheduler!r} with engine.prefix_cache: radix; the radix "
               f"cache runs inside the chunked (vLLM V1) scheduler only")
    elif radix.page_size not in (1, eng.block_size):
        why = (f"engine.radix.page_size: got {radix.page_size}; allowed: 1 (token-granular) or "
               f"engine.block_size ({eng.block_size}): the radix pages are the engine's KV blocks")
    elif eng.watermark and radix.page_size != eng.block_size:
        why = (f"engine.watermark: got {eng.watermark}; the scheduler sizes it in blocks, which a "
               f"token-granular radix cache does not count in; allowed with radix page_size 1: 0")
    elif workload.cache_salt is not None:
        why = ("workload.cache_salt: set with engine.prefix_cache: radix; SGLang 0.4.6's radix "
               "tree has no cache salt (kvsim does not model 0.5.x's extra_key)")
    if why:
        raise ScenarioError(why)
    return {"prefix_cache": "radix", "radix_page_size": radix.page_size,
            "radix_eviction_policy": radix.eviction_policy, "radix_split_prompt": radix.split_prompt}


def _check_tensor_parallel(model: ModelSpec, tp: int) -> None:
    """The head splits vLLM requires before it loads a model."""
    # vllm/config/model.py ModelConfig.verify_with_parallel_config
    if model.num_attention_heads % tp:
        raise ScenarioError(
            f"hardware.tp: got {tp}; model {model.name} has {model.num_attention_heads} attention "
            f"heads, which tp must divide (vLLM refuses: heads must be divisible by tensor "
            f"parallel size); allowed: {_divisors(model.num_attention_heads)}")
    # vllm/model_executor/layers/linear.py QKVParallelLinear: divide(kv heads, tp), or
    # divide(tp, kv heads) when the KV heads are replicated.
    # (MLA models have no KV heads to split: one latent vector per token.)
    kv = model.num_kv_heads
    if model.kv_lora_rank is None and kv % tp and tp % kv:
        raise ScenarioError(
            f"hardware.tp: got {tp}; model {model.name} has {kv} KV heads: tp must divide them "
            f"or be a multiple of them (vLLM shards or replicates KV heads evenly)")


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, min(n, 64) + 1) if n % d == 0)


def _check_workload_files(workload: WorkloadConfig, base: Path) -> None:
    """Every file the workload names must exist now, before any simulation starts."""
    paths = []
    if workload.requests_file is not None:
        paths.append(("workload.requests_file", workload.requests_file))
    if workload.trace is not None:
        paths.append(("workload.trace.path", workload.trace.path))
    for key in ("prompt_len", "output_len"):
        length = getattr(workload, key)
        if getattr(length, "type", None) == "empirical":
            paths.append((f"workload.{key}.file", length.file))
    for yaml_path, path in paths:
        try:
            resolve_path(path, base, yaml_path=yaml_path)
        except ValueError as exc:
            raise ScenarioError(str(exc)) from None


def _named(path: str, loader, value, base: Path):
    """Load a catalog entry; a relative file path resolves against the scenario folder."""
    if isinstance(value, str) and (value.endswith((".json", ".yaml", ".yml"))):
        candidate = Path(value)
        if not candidate.is_absolute():
            candidate = base / candidate
        value = str(candidate)
    try:
        return loader(value)
    except UnicodeDecodeError as exc:
        raise ScenarioError(f"{path}: {value}: not a UTF-8 text file (byte {exc.start} cannot be "
                            f"decoded); expected YAML or JSON") from None
    except IsADirectoryError:
        raise ScenarioError(f"{path}: {value}: is a folder without a config.json") from None
    except (ValueError, FileNotFoundError, KeyError, TypeError) as exc:
        raise ScenarioError(f"{path}: {exc}") from None


def _default_budget(gpu: GPUSpec) -> tuple[int, int]:
    """vLLM V1 ``vllm serve`` defaults for this GPU (kv-semantics D4)."""
    if gpu.memory_bytes >= _HUGE_GPU_BYTES:
        return 16384, 1024
    if gpu.memory_bytes >= _LARGE_GPU_BYTES and "a100" not in gpu.name.lower():
        return 8192, 1024
    return 2048, 256
