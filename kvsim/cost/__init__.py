"""How long a step takes: the cost models the engine calls every step.

``build_cost_model`` turns a scenario's ``cost_model:`` mapping into a
``CostModel`` (see ``base.py``):

* ``{type: constant, step_time_s: 1.0}`` — every step the same (tests, teaching);
* ``{type: roofline, <RooflineParams fields>}`` — datasheet physics, any GPU/model;
* ``{type: fitted, profile: NAME_OR_PATH}`` — coefficients fitted to measurements
  (shipped in ``kvsim/cost/profiles/NAME.json``, or a path);
* ``{type: distserve, profile: distserve | vllm}`` — DistServe's own fitted
  formulas for OPT on A100-80GB (``distserve.py``).

Roofline and fitted models also take the engine's time outside the GPU
(``overhead.py``, ``presets.py``): ``engine_preset: NAME``, ``engine_overhead:
{TERM: seconds} | FIT.json`` and ``gpu_scale``; the engine knobs they depend
on (``enforce_eager``, ``cudagraph_capture_sizes``, the batch budget) come in
as ``engine=EngineKnobs(...)``.

Nothing here imports torch or triton.
"""

from __future__ import annotations

from kvsim.cost.base import BatchShape, ConstantCostModel, CostModel, step_time_function

COST_MODEL_TYPES = ("constant", "roofline", "fitted", "distserve")

__all__ = ["BatchShape", "ConstantCostModel", "CostModel", "build_cost_model", "step_time_function",
           "COST_MODEL_TYPES"]


ENGINE_KEYS = ("engine_preset", "engine_overhead", "gpu_scale")


def build_cost_model(config: dict, *, model, gpu, tp: int = 1,
                     kv_cache_dtype: str = "auto", engine=None, parallel=None) -> CostModel:
    """The cost model a scenario's ``cost_model:`` mapping asks for.

    ``engine``: the scenario's ``presets.EngineKnobs`` (None: library use,
    vLLM-like defaults for the batch budget). ``parallel``: the replica's
    ``kvsim.specs.ParallelConfig`` (DP ranks, expert parallelism: the roofline's
    MoE terms, ``features._moe_ops``); None is tensor parallelism only.
    """
    if config is None:
        config = {"type": "roofline"}
    if not isinstance(config, dict):
        raise ValueError(f"cost_model: expected a mapping with a 'type' key, got {config!r}")
    kind = config.get("type")
    if kind == "constant":
        _check_keys(config, {"type", "step_time_s"})
        value = config.get("step_time_s", 1.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"cost_model.step_time_s: {value!r} is not a positive number")
        return ConstantCostModel(float(value))
    if kind == "roofline":
        from kvsim.cost.roofline import RooflineParams, roofline_cost_model
        gpu_config = {k: v for k, v in config.items() if k not in ENGINE_KEYS}
        if config.get("engine_preset") is not None:
            for key in ("step_overhead_s", "request_overhead_s"):
                if key in gpu_config:
                    raise ValueError(f"cost_model.{key}: with an engine_preset the engine's CPU "
                                     f"time is cost_model.engine_overhead (step_s, "
                                     f"per_request_s, ...); set it there")
        gpu_model = roofline_cost_model(model, gpu, tp, kv_cache_dtype,
                                        RooflineParams.from_config(gpu_config), parallel=parallel)
        return _with_engine(gpu_model, config, engine, tp, gpu)
    if kind == "fitted":
        _check_keys(config, {"type", "profile", *ENGINE_KEYS})
        if not isinstance(config.get("profile"), str) or not config["profile"]:
            raise ValueError(f"cost_model.profile: {config.get('profile')!r}; a fitted cost model "
                             f"needs a shipped profile name (kvsim/cost/profiles/NAME.json) or a path")
        from kvsim.cost.fitted import fitted_cost_model, load_profile
        if parallel is not None and (parallel.dp > 1 or parallel.use_ep):
            raise ValueError("cost_model.type: 'fitted' profiles are measured at tensor "
                             "parallelism only; hardware.dp > 1 or engine.enable_expert_parallel "
                             "need type: roofline")
        gpu_model = fitted_cost_model(load_profile(config["profile"]), model, gpu, tp, kv_cache_dtype)
        return _with_engine(gpu_model, config, engine, tp, gpu)
    if kind == "distserve":
        from kvsim.cost.distserve import distserve_cost_model
        if parallel is not None and (parallel.dp > 1 or parallel.use_ep):
            raise ValueError("cost_model.type: 'distserve' profiles are per TP degree; "
                             "hardware.dp > 1 or engine.enable_expert_parallel need type: roofline")
        return distserve_cost_model(config, model, gpu, tp)
    raise ValueError(f"cost_model.type: {kind!r} is not a cost model; "
                     f"allowed: {', '.join(COST_MODEL_TYPES)}")


def _with_engine(gpu_model, config: dict, engine, tp: int, gpu):
    """The GPU model with the engine part the config and knobs ask for (unchanged without a preset)."""
    from kvsim.cost.presets import resolve_engine_timing
    timing = resolve_engine_timing(config, engine, tp=tp, gpu_name=getattr(gpu, "name", ""))
    return gpu_model if timing is None else gpu_model.with_engine(timing)


def _check_keys(config: dict, allowed: set[str]) -> None:
    for key in config:
        if key not in allowed:
            raise ValueError(f"cost_model.{key}: unknown key for type {config.get('type')!r} "
                             f"(value {config[key]!r}); allowed: {', '.join(sorted(allowed))}")
