"""How long a step takes: the cost models the engine calls every step.

``build_cost_model`` turns a scenario's ``cost_model:`` mapping into a
``CostModel`` (see ``base.py``):

* ``{type: constant, step_time_s: 1.0}`` — every step the same (tests, teaching);
* ``{type: roofline, <RooflineParams fields>}`` — datasheet physics, any GPU/model;
* ``{type: fitted, profile: NAME_OR_PATH}`` — coefficients fitted to measurements
  (shipped in ``kvsim/cost/profiles/NAME.json``, or a path).

Nothing here imports torch or triton.
"""

from __future__ import annotations

from kvsim.cost.base import BatchShape, ConstantCostModel, CostModel, step_time_function

COST_MODEL_TYPES = ("constant", "roofline", "fitted")

__all__ = ["BatchShape", "ConstantCostModel", "CostModel", "build_cost_model", "step_time_function",
           "COST_MODEL_TYPES"]


def build_cost_model(config: dict, *, model, gpu, tp: int = 1,
                     kv_cache_dtype: str = "auto") -> CostModel:
    """The cost model a scenario's ``cost_model:`` mapping asks for."""
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
        return roofline_cost_model(model, gpu, tp, kv_cache_dtype, RooflineParams.from_config(config))
    if kind == "fitted":
        _check_keys(config, {"type", "profile"})
        if not isinstance(config.get("profile"), str) or not config["profile"]:
            raise ValueError(f"cost_model.profile: {config.get('profile')!r}; a fitted cost model "
                             f"needs a shipped profile name (kvsim/cost/profiles/NAME.json) or a path")
        from kvsim.cost.fitted import fitted_cost_model, load_profile
        return fitted_cost_model(load_profile(config["profile"]), model, gpu, tp, kv_cache_dtype)
    raise ValueError(f"cost_model.type: {kind!r} is not a cost model; "
                     f"allowed: {', '.join(COST_MODEL_TYPES)}")


def _check_keys(config: dict, allowed: set[str]) -> None:
    for key in config:
        if key not in allowed:
            raise ValueError(f"cost_model.{key}: unknown key for type {config.get('type')!r} "
                             f"(value {config[key]!r}); allowed: {', '.join(sorted(allowed))}")
