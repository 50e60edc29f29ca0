"""Turn a validated scenario into the objects a run needs.

Everything that can be wrong with a scenario is found here, before any
simulation starts: unknown keys, bad values, unknown model or GPU names, a
model that does not fit the GPU, a cost profile that does not exist, a
workload file that cannot be read.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from kvsim.cost import build_cost_model
from kvsim.cost.base import CostModel
from kvsim.cost.presets import EngineKnobs
from kvsim.scenario.engine_checks import (check_baseline_scheduler, check_engine_loop,
                                          check_scheduler_knobs, named, radix_settings,
                                          speculative_config)
from kvsim.scenario.kv_offload import LMCacheSettings, OffloadSettings, offload_settings
from kvsim.sched.config import SchedulerConfig
from kvsim.scenario.schema import (Scenario, ScenarioError, format_validation_error,
                                   parse_overrides, read_scenario_dict)
from kvsim.specs.capacity import KVCapacity, kv_capacity, model_kv_cache_groups
from kvsim.specs.catalog import load_gpu, load_model
from kvsim.specs.gpu import GPUSpec
from kvsim.specs.model import ModelSpec
from kvsim.specs.parallel import ParallelConfig
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
    # CPU/disk KV offload tiers (engine.kv_offloading_size; kvsim/scenario/kv_offload.py)
    kv_offload: OffloadSettings | LMCacheSettings | None = None

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
    model = named("model", load_model, sc.model, base)
    gpu = named("hardware.gpu", load_gpu, sc.hardware.gpu, base)
    tp = sc.hardware.tp
    _check_tensor_parallel(model, tp)
    eng = sc.engine
    parallel = _parallel_layout(model, sc.hardware, eng)
    notes = []
    batched, seqs = _default_budget(gpu)
    max_num_batched_tokens = eng.max_num_batched_tokens or batched
    max_num_seqs = eng.max_num_seqs or min(seqs, max_num_batched_tokens)
    disable_hybrid = _hybrid_manager_choice(model, eng, notes)

    capacity = None
    try:
        if eng.num_gpu_blocks_override is not None:
            num_gpu_blocks = eng.num_gpu_blocks_override
            groups, block_size, _ = model_kv_cache_groups(
                model, eng.block_size, eng.kv_cache_dtype, tp, disable_hybrid,
                eng.enable_prefix_caching)
        else:
            capacity = kv_capacity(model, gpu, tp=tp, dp=parallel.dp,
                                   enable_expert_parallel=parallel.enable_expert_parallel,
                                   gpu_memory_utilization=eng.gpu_memory_utilization,
                                   block_size=eng.block_size, kv_cache_dtype=eng.kv_cache_dtype,
                                   max_num_batched_tokens=max_num_batched_tokens,
                                   max_num_seqs=max_num_seqs,
                                   disable_hybrid_kv_cache_manager=disable_hybrid,
                                   enable_prefix_caching=eng.enable_prefix_caching)
            num_gpu_blocks = capacity.num_gpu_blocks
            groups, block_size = capacity.kv_groups, capacity.block_size
    except ValueError as exc:
        raise ScenarioError(f"model/hardware: {exc}") from None
    if eng.scheduler == "chunked" and any(g.uniform_type for g in groups.groups):
        # vLLM KVCacheSpecRegistry.get_manager_class(UniformTypeKVCacheSpecs) is None:
        # get_manager_for_kv_cache_spec asserts when the scheduler is built.
        raise ScenarioError(
            f"engine.disable_hybrid_kv_cache_manager: got true; {model.name}'s layers then form "
            f"one group of specs that do not merge (sliding and chunked layers promoted to full "
            f"attention: vLLM UniformTypeKVCacheSpecs), and vLLM 0.33's scheduler has no KV "
            f"manager for such a group (it fails at start-up); leave the hybrid manager on")
    if block_size != eng.block_size:
        notes.append(f"engine.block_size: {eng.block_size} raised to {block_size} so that one "
                     f"attention page holds {model.name}'s linear-attention state (vLLM "
                     f"Platform._align_hybrid_block_size)")
    # The hybrid KV manager (kv/hybrid.py) when a group drops blocks or there are several.
    uses_groups = groups.is_hybrid or groups.groups[0].kind != "full_attention"
    kv_groups = groups if uses_groups and eng.scheduler == "chunked" else None
    probe = SchedulerConfig(num_gpu_blocks=num_gpu_blocks, block_size=block_size,
                            max_model_len=model.max_position_embeddings,
                            max_num_batched_tokens=max_num_batched_tokens,
                            enable_prefix_caching=eng.enable_prefix_caching, kv_groups=kv_groups,
                            async_scheduling=eng.async_scheduling)   # in-flight tokens x2
    usable = num_gpu_blocks - 1
    token_capacity = _longest_fitting(probe, usable, model.max_position_embeddings)
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
    else:
        need = replace(probe, max_model_len=max_model_len).blocks_per_request(max_model_len)
        if need > usable:
            raise ScenarioError(
                f"engine.max_model_len: got {max_model_len}; one request of that length needs "
                f"{need} blocks{' (all KV-cache groups)' if kv_groups else ''} but the KV cache "
                f"has {usable} usable blocks ({token_capacity} tokens); lower it or give the "
                f"cache more memory")
    if model.sliding_window and max_model_len <= model.sliding_window:
        notes.append(f"engine.max_model_len: {max_model_len} <= {model.name}'s sliding_window "
                     f"({model.sliding_window}): its sliding layers keep every token")
    notes += check_baseline_scheduler(eng)
    check_engine_loop(eng)
    speculative = speculative_config(eng, sc.seed, base, max_num_batched_tokens)
    if speculative is not None and model.has_linear_attention:
        # vLLM MambaSpec.num_speculative_blocks: drafts keep extra state blocks (not modelled).
        raise ScenarioError(f"engine.speculative_config: {model.name}'s linear-attention (Mamba) "
                            f"state keeps num_speculative_blocks more state blocks per request "
                            f"with drafts (vLLM MambaManager); kvsim does not model that: drop "
                            f"speculative_config or use an attention-only model")
    # The continuous (V0) scheduler never chunks a prefill; orca runs prompts whole, with no budget.
    chunking = eng.enable_chunked_prefill and eng.scheduler not in ("continuous", "orca")
    if not chunking and eng.scheduler not in ("static", "orca"):
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
    check_scheduler_knobs(eng, max_num_seqs=max_num_seqs, max_model_len=max_model_len,
                           max_num_batched_tokens=max_num_batched_tokens)
    # V0 and the Sarathi artifact keep 1% of the blocks free at admission.
    watermark = eng.watermark if eng.watermark is not None else (
        0.01 if eng.scheduler in ("continuous", "simple_chunking") else 0.0)
    block_bytes = model.kv_bytes_per_block(eng.block_size, eng.kv_cache_dtype, tp)
    sched_config = SchedulerConfig(
        num_gpu_blocks=num_gpu_blocks, block_size=block_size, max_model_len=max_model_len,
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
        enable_prefix_caching=(eng.enable_prefix_caching
                               and eng.scheduler not in ("simple_chunking", "orca")),
        enable_chunked_prefill=eng.enable_chunked_prefill,
        long_prefill_token_threshold=eng.long_prefill_token_threshold, policy=eng.policy,
        max_num_scheduled_tokens=eng.max_num_scheduled_tokens,
        max_num_active_seqs=eng.max_num_active_seqs,
        long_prefill_token_threshold_adaptive=eng.long_prefill_token_threshold_adaptive,
        prefill_schedule_interval=eng.prefill_schedule_interval,
        max_num_queued_reqs=eng.max_num_queued_reqs, max_num_queued_tokens=eng.max_num_queued_tokens,
        scheduler_reserve_full_isl=eng.scheduler_reserve_full_isl, watermark=watermark,
        preemption_mode=eng.preemption_mode or "recompute",
        num_cpu_blocks=int(eng.swap_space * GIB) // block_bytes,
        swap_block_bytes=block_bytes, debug=eng.debug, stream_interval=eng.stream_interval,
        async_scheduling=eng.async_scheduling,
        num_scheduler_steps=eng.num_scheduler_steps,
        speculative=speculative,
        orca_reservation=eng.orca_reservation or "max", kv_groups=kv_groups,
        **radix_settings(eng, workload, hybrid=kv_groups is not None))
    knobs = EngineKnobs(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                        enforce_eager=eng.enforce_eager,
                        cudagraph_capture_sizes=(tuple(eng.cudagraph_capture_sizes)
                                                 if eng.cudagraph_capture_sizes else None),
                        max_cudagraph_capture_size=eng.max_cudagraph_capture_size)
    cost_config = sc.cost_model
    fit_file = cost_config.get("engine_overhead") if isinstance(cost_config, dict) else None
    if isinstance(fit_file, str) and not Path(fit_file).is_absolute():
        # a `kvsim calibrate serve` result next to the scenario
        cost_config = {**cost_config, "engine_overhead": str(base / fit_file)}
    try:
        cost_model = build_cost_model(cost_config, model=model, gpu=gpu, tp=tp,
                                      kv_cache_dtype=eng.kv_cache_dtype, engine=knobs,
                                      parallel=parallel if parallel.world_size > 1 else None)
        if speculative is not None and hasattr(cost_model, "with_draft"):
            from kvsim.cost.spec_decode import draft_cost
            cost_model = cost_model.with_draft(draft_cost(speculative, model, gpu, tp,
                                                          eng.kv_cache_dtype, load_model))
    except (ValueError, FileNotFoundError) as exc:
        msg = str(exc)
        raise ScenarioError(msg if msg.startswith(("cost_model", "engine."))
                            else f"cost_model: {msg}") from None
    kv_offload = offload_settings(eng, block_size=block_size, block_bytes_per_rank=block_bytes,
                                  tp=tp, pcie_bandwidth_gbps=gpu.pcie_bandwidth_gbps,
                                  scheduler=eng.scheduler, prefix_cache=eng.prefix_cache,
                                  hybrid=kv_groups is not None)
    if kv_offload is not None:
        notes.append(kv_offload.describe())
    return LoadedScenario(sc, data, base, model, gpu, tp, capacity, sched_config, cost_model, workload,
                          tuple(notes), kv_offload)


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


def _parallel_layout(model: ModelSpec, hardware, eng) -> ParallelConfig:
    """The replica's TP/DP/EP layout; what vLLM refuses, as one line naming the key."""
    parallel = ParallelConfig(hardware.tp, hardware.dp, eng.enable_expert_parallel,
                              eng.all2all_backend)
    try:
        parallel.check(model)
    except ValueError as exc:
        msg = str(exc)
        if msg.startswith("enable_expert_parallel"):
            raise ScenarioError(f"engine.{msg}") from None
        if msg.startswith("expert-parallel size"):
            raise ScenarioError(f"hardware.dp: got {hardware.dp} (with hardware.tp {hardware.tp} "
                                f"and engine.enable_expert_parallel): {msg}") from None
        raise ScenarioError(f"hardware.tp: got {hardware.tp}; {msg}") from None
    return parallel


def _hybrid_manager_choice(model: ModelSpec, eng, notes: list[str]) -> bool | None:
    """``disable_hybrid_kv_cache_manager`` as the run uses it (None: vLLM's default)."""
    disable = eng.disable_hybrid_kv_cache_manager
    mamba = model.has_linear_attention
    if mamba and disable:
        raise ScenarioError(f"engine.disable_hybrid_kv_cache_manager: got true; {model.name}'s "
                            f"linear-attention (Mamba) layers need vLLM's hybrid KV cache manager")
    if mamba and eng.enable_prefix_caching and not eng.enable_chunked_prefill:
        raise ScenarioError(f"engine.enable_chunked_prefill: got false; vLLM requires chunked "
                            f"prefill for prefix caching of {model.name}'s Mamba state "
                            f"(MambaModelConfig); turn it on or engine.enable_prefix_caching off")
    if model.is_hybrid and eng.scheduler != "chunked":
        if mamba:
            raise ScenarioError(f"engine.scheduler: got {eng.scheduler!r}; {model.name}'s Mamba "
                                f"state needs vLLM V1's hybrid KV cache manager: scheduler chunked")
        if disable is False:
            raise ScenarioError(f"engine.disable_hybrid_kv_cache_manager: got false; the "
                                f"{eng.scheduler} scheduler keeps one block table per request "
                                f"(vLLM V0): the hybrid KV cache manager needs scheduler chunked")
        notes.append(f"engine.scheduler: {eng.scheduler} keeps every token of {model.name}'s "
                     f"sliding/chunked layers (one block table per request, as "
                     f"--disable-hybrid-kv-cache-manager)")
        return True
    return disable


def _longest_fitting(config: SchedulerConfig, usable: int, limit: int) -> int:
    """The longest request (tokens, at most ``limit``) whose blocks fit in ``usable``."""
    if not config.is_hybrid:
        return usable * config.block_size
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if replace(config, max_model_len=mid).blocks_per_request(mid) <= usable:
            lo = mid
        else:
            hi = mid - 1
    return lo


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


def _default_budget(gpu: GPUSpec) -> tuple[int, int]:
    """vLLM V1 ``vllm serve`` defaults for this GPU (kv-semantics D4)."""
    if gpu.memory_bytes >= _HUGE_GPU_BYTES:
        return 16384, 1024
    if gpu.memory_bytes >= _LARGE_GPU_BYTES and "a100" not in gpu.name.lower():
        return 8192, 1024
    return 2048, 256
