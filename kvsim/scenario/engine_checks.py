"""The engine knobs ``load_scenario`` checks against each other and the scheduler
(split out of ``loader.py`` by concern): speculative decoding, the engine loop
(async scheduling, multi-step), the baseline schedulers, vLLM 0.33's scheduler
knobs, the radix cache; and ``named``, a catalog entry or a file by name.

Each refusal is one line naming the YAML path, the value and what is
allowed (``ScenarioError``), as vLLM refuses at start-up where it does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvsim.scenario.schema import RadixSection, ScenarioError
from kvsim.specs.catalog import load_model
from kvsim.workload.config import WorkloadConfig


def named(path: str, loader, value, base: Path):
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


def speculative_config(eng, seed: int, base: Path, max_num_batched_tokens: int):
    """``engine.speculative_config`` resolved (kvsim.sched.spec_decode), or None."""
    value = eng.speculative_config
    if value is None:
        return None
    from kvsim.sched.spec_decode import METHODS, SpeculativeConfig, acceptance_from_config
    where = "engine.speculative_config"
    if eng.scheduler != "chunked":
        raise ScenarioError(f"{where}: speculative decoding is modelled for vLLM V1 "
                            f"(scheduler: chunked), not {eng.scheduler!r}")
    if eng.async_scheduling:
        raise ScenarioError(f"{where}: with engine.async_scheduling, vLLM schedules drafts it "
                            f"has not verified yet; kvsim does not model that: set "
                            f"async_scheduling: false")
    allowed = ("method", "num_speculative_tokens", "model", "acceptance")
    for key in value:
        if key not in allowed:
            raise ScenarioError(f"{where}.{key}: unknown key; allowed: {', '.join(allowed)}")
    method = value.get("method")
    if method not in METHODS:
        raise ScenarioError(f"{where}.method: {method!r}; allowed: {', '.join(METHODS)}")
    k = value.get("num_speculative_tokens")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ScenarioError(f"{where}.num_speculative_tokens: {k!r}; expected an integer >= 1")
    model = value.get("model")
    if method == "draft_model":
        if not isinstance(model, str):
            raise ScenarioError(f"{where}.model: {model!r}; method draft_model needs the draft "
                                f"model's catalog name (kvsim capacity --list)")
        named(f"{where}.model", load_model, model, base)
    if "acceptance" not in value:
        raise ScenarioError(f"{where}.acceptance: missing; how many drafts are accepted is an "
                            f"input: {{rate: 0.7}}, {{per_position: [...]}} or {{trace: FILE}} (from "
                            f"vllm serve flags: synthetic_acceptance_rates, or --set "
                            f"engine.speculative_config.acceptance.rate=0.7)")
    try:
        acceptance = acceptance_from_config(value["acceptance"], k, seed, base)
    except ValueError as exc:
        raise ScenarioError(str(exc)) from None
    spec = SpeculativeConfig(method, k, acceptance, model)
    if max_num_batched_tokens <= spec.num_lookahead_tokens:
        # vllm/config/vllm.py VllmConfig._set_max_num_scheduled_tokens
        raise ScenarioError(f"engine.max_num_batched_tokens: {max_num_batched_tokens} leaves no slot "
                            f"for a token with {spec.num_lookahead_tokens} lookahead slots "
                            f"(num_speculative_tokens); raise it or lower num_speculative_tokens")
    return spec


def check_engine_loop(eng) -> None:
    """Engine-time knobs the chosen scheduler cannot run (docs/engine.md)."""
    if eng.async_scheduling and eng.scheduler != "chunked":
        raise ScenarioError(f"engine.async_scheduling: got true with scheduler {eng.scheduler!r}; "
                            f"async scheduling is vLLM V1's (scheduler: chunked); allowed: false")
    k = eng.num_scheduler_steps
    if k > 1:
        # vllm/engine/arg_utils.py (0.6.0-0.6.2) EngineArgs.create_engine_config
        if eng.speculative_config is not None:
            raise ScenarioError("engine.num_scheduler_steps: vLLM 0.6 refuses speculative decoding "
                                "with multi-step (--num-scheduler-steps > 1); drop one of them")
        if eng.scheduler != "continuous":
            raise ScenarioError(
                f"engine.num_scheduler_steps: {k} with scheduler {eng.scheduler!r}; multi-step "
                f"is vLLM 0.6's V0 engine without chunked prefill (0.6.0-0.6.2: 'Chunked prefill "
                f"is not supported with multi-step'; V1 has no multi-step): use scheduler: "
                f"continuous, or num_scheduler_steps: 1")
        if eng.preemption_mode == "swap":
            raise ScenarioError("engine.preemption_mode: swap with num_scheduler_steps > 1 is not "
                                "modelled (the swap-in lookahead slots); allowed: recompute")


def check_baseline_scheduler(eng) -> list[str]:
    """Knobs the baseline schedulers (``simple_chunking``, ``orca``) cannot honour; their notes."""
    notes = []
    if eng.orca_reservation is not None and eng.scheduler != "orca":
        raise ScenarioError(f"engine.orca_reservation: got {eng.orca_reservation!r}, but only the "
                            f"orca scheduler reserves contiguous KV; set engine.scheduler: orca "
                            f"or drop it")
    if eng.scheduler not in ("simple_chunking", "orca"):
        return notes
    if eng.preemption_mode == "swap":
        raise ScenarioError(f"engine.preemption_mode: got 'swap'; the {eng.scheduler} scheduler "
                            f"{'never preempts' if eng.scheduler == 'orca' else 'preempts by recompute'}"
                            f"; allowed: recompute (swap needs scheduler: continuous)")
    if eng.scheduler == "simple_chunking" and not eng.enable_chunked_prefill:
        raise ScenarioError("engine.enable_chunked_prefill: got false; simple_chunking (Sarathi-Serve) "
                            "always chunks prefills; for whole prompts use scheduler: continuous "
                            "or orca")
    if eng.enable_prefix_caching:
        notes.append(f"engine.enable_prefix_caching: the {eng.scheduler} scheduler has no prefix "
                     f"cache (as its source system); it runs without one (set it to false to "
                     f"silence this note)")
    return notes


# Knobs only the chunked (vLLM V1) scheduler has, with their "off" values.
_CHUNKED_ONLY = {"max_num_scheduled_tokens": None, "max_num_active_seqs": None,
                 "long_prefill_token_threshold_adaptive": False, "prefill_schedule_interval": 1}


def check_scheduler_knobs(eng, *, max_num_seqs: int, max_model_len: int,
                           max_num_batched_tokens: int) -> None:
    """The scheduler settings vLLM refuses at start-up (vllm/config/scheduler.py
    ``SchedulerConfig.verify_max_model_len``), and V1 knobs on a V0-style scheduler."""
    if eng.scheduler != "chunked":
        for key, off in _CHUNKED_ONLY.items():
            value = getattr(eng, key)
            if value != off:
                raise ScenarioError(f"engine.{key}: got {value!r}; only the chunked (vLLM V1) scheduler "
                                    f"has it, not {eng.scheduler}; remove it or use scheduler: chunked")
    if eng.scheduler != "static" and max_num_batched_tokens < max_num_seqs:
        # (the defaults never do this: max_num_seqs defaults to at most the budget)
        raise ScenarioError(f"engine.max_num_seqs: got {max_num_seqs}; vLLM refuses more than "
                            f"max_num_batched_tokens ({max_num_batched_tokens}), which must be >= "
                            f"max_num_seqs; lower it or raise engine.max_num_batched_tokens")
    if eng.max_num_active_seqs is not None and eng.max_num_active_seqs > max_num_seqs:
        raise ScenarioError(f"engine.max_num_active_seqs: got {eng.max_num_active_seqs}; it cannot be "
                            f"greater than max_num_seqs ({max_num_seqs}), as vLLM refuses")
    if eng.long_prefill_token_threshold > max_model_len:
        raise ScenarioError(f"engine.long_prefill_token_threshold: got {eng.long_prefill_token_threshold}; "
                            f"it cannot be greater than max_model_len ({max_model_len}), as vLLM refuses")


def radix_settings(eng, workload: WorkloadConfig, *, hybrid: bool) -> dict[str, Any]:
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
    elif hybrid:
        why = ("engine.prefix_cache: radix for a model with several KV-cache groups (sliding "
               "window, Mamba); the radix cache is modelled for full attention only: use "
               "prefix_cache: hash")
    elif eng.scheduler != "chunked":
        why = (f"engine.scheduler: {eng.scheduler!r} with engine.prefix_cache: radix; the radix "
               f"cache runs inside the chunked (vLLM V1) scheduler only")
    elif radix.page_size not in (1, eng.block_size):
        why = (f"engine.radix.page_size: got {radix.page_size}; allowed: 1 (token-granular) or "
               f"engine.block_size ({eng.block_size}): the radix pages are the engine's KV blocks")
    elif eng.watermark and radix.page_size != eng.block_size:
        why = (f"engine.watermark: got {eng.watermark}; the scheduler sizes it in blocks, which a "
               f"token-granular radix cache does not count in; allowed with radix page_size 1: 0")
    elif eng.speculative_config is not None:
        # Accepted drafts fill blocks after the step (vLLM's cache_blocks in
        # update_from_output); the radix tree takes tokens only at G3's points.
        why = ("engine.speculative_config: set with engine.prefix_cache: radix; drafts are "
               "modelled with vLLM's hash prefix cache only: use prefix_cache: hash")
    elif workload.cache_salt is not None:
        why = ("workload.cache_salt: set with engine.prefix_cache: radix; SGLang 0.4.6's radix "
               "tree has no cache salt (kvsim does not model 0.5.x's extra_key)")
    if why:
        raise ScenarioError(why)
    return {"prefix_cache": "radix", "radix_page_size": radix.page_size,
            "radix_eviction_policy": radix.eviction_policy, "radix_split_prompt": radix.split_prompt}
