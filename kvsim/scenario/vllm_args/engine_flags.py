"""The engine-time ``vllm serve`` flags (issue #13): how their values become scenario keys.

* ``--async-scheduling`` / ``--no-async-scheduling`` -> ``engine.async_scheduling``.
  vLLM 0.33's default (neither flag) is *on* where the model runner allows it
  (``VllmConfig`` in ``vllm/config/vllm.py``: ``async_scheduling is None`` ->
  True); kvsim's default stays off, so a command line without the flag
  simulates the synchronous engine: pass ``--async-scheduling`` to get vLLM
  0.33's default (docs/vllm.md).
* ``--stream-interval N`` -> ``engine.stream_interval``.
* ``--enforce-eager`` / ``--no-enforce-eager`` -> ``engine.enforce_eager``;
  ``--cudagraph-capture-sizes 1 2 4 8`` -> ``engine.cudagraph_capture_sizes``
  (both need ``cost_model.engine_preset``, which models the graphs).
* ``--speculative-config JSON`` (``-sc``), ``--spec-method``, ``--spec-model``,
  ``--spec-tokens`` -> ``engine.speculative_config``. vLLM's synthetic
  rejection sampler (``rejection_sample_method: synthetic`` with
  ``synthetic_acceptance_rates`` or ``synthetic_acceptance_length``,
  ``vllm/config/speculative.py``) is an acceptance model kvsim has
  (``acceptance.per_position``: the same unconditional per-position rates);
  with vLLM's real sampler the acceptance is an input the command line does
  not hold: give it in the scenario (``engine.speculative_config.acceptance``)
  or with ``--set engine.speculative_config.acceptance.rate=0.7``.
"""

from __future__ import annotations

from kvsim.scenario.vllm_args.parse import VllmArgsError
from kvsim.sched.spec_decode import METHODS as SPEC_METHODS

# vllm/config/speculative.py SpeculativeConfig keys kvsim reads; the others change
# what kvsim does not model (draft TP, quantization, tree shapes ...).
SPEC_KEYS = ("method", "num_speculative_tokens", "model", "rejection_sample_method",
             "synthetic_acceptance_rates", "synthetic_acceptance_length")


class Unmodelled(Exception):
    """A value vLLM accepts that kvsim does not model; the message says what kvsim models."""


def speculative_config(value: dict) -> dict:
    """vLLM's speculative config -> ``engine.speculative_config`` (kvsim's keys)."""
    value = {k.replace("-", "_"): v for k, v in value.items()}   # as create_speculative_config
    extra = [k for k in value if k not in SPEC_KEYS]
    if extra:
        raise Unmodelled(f"kvsim models the speculative-config keys {', '.join(SPEC_KEYS)} "
                         f"(not {', '.join(extra)})")
    out = {}
    if "method" in value:
        out["method"] = spec_method(value["method"])
    for key in ("num_speculative_tokens", "model"):
        if key in value:
            out[key] = value[key]
    sampler = value.get("rejection_sample_method", "standard")
    if sampler not in ("standard", "synthetic"):
        raise Unmodelled(f"kvsim models rejection_sample_method standard (acceptance given in "
                         f"the scenario) and synthetic (not {sampler!r})")
    rates, length = value.get("synthetic_acceptance_rates"), value.get("synthetic_acceptance_length")
    if sampler != "synthetic":
        if rates is not None or length is not None:
            raise VllmArgsError("--speculative-config: synthetic_acceptance_rates/_length need "
                                "rejection_sample_method 'synthetic' (vLLM refuses them otherwise)")
        return out
    if (rates is None) == (length is None):
        raise VllmArgsError("--speculative-config: rejection_sample_method 'synthetic' needs "
                            "exactly one of synthetic_acceptance_rates, synthetic_acceptance_length "
                            "(as vLLM)")
    if rates is not None:
        out["acceptance"] = {"per_position": rates}
        return out
    k = value.get("num_speculative_tokens")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise VllmArgsError("--speculative-config: synthetic_acceptance_length needs "
                            "num_speculative_tokens (an integer >= 1) in kvsim")
    if isinstance(length, bool) or not isinstance(length, (int, float)) or not 1 <= length <= k + 1:
        raise VllmArgsError(f"--speculative-config: synthetic_acceptance_length {length!r}: vLLM "
                            f"refuses it: must be in [1, num_speculative_tokens + 1 = {k + 1}]")
    out["acceptance"] = {"per_position": acceptance_length_rates(float(length), k)}
    return out


def acceptance_length_rates(length: float, k: int) -> list[float]:
    """vLLM ``SpeculativeConfig._acceptance_length_to_rates``: the minimum-variance schedule.

    A mean of ``length`` tokens per verification (the bonus token included):
    the first ``floor(length - 1)`` drafts always accepted, the next one with
    the fractional part, none after.
    """
    drafts = length - 1
    full = int(drafts)
    return ([1.0] * full + [drafts - full] + [0.0] * (k - full - 1))[:k]


def spec_method(method) -> str:
    """A vLLM method name -> kvsim's (vLLM folds every ``*_mtp`` type into ``mtp``)."""
    if isinstance(method, str) and method.endswith("_mtp"):
        return "mtp"
    if method not in SPEC_METHODS:
        raise Unmodelled(f"kvsim models the speculative methods {', '.join(SPEC_METHODS)} "
                         f"(and vLLM's *_mtp types), not {method!r}")
    return method


def fold_speculative(overrides: dict, label: str) -> dict:
    """``--spec-method/--spec-model/--spec-tokens`` into ``engine.speculative_config``.

    vLLM (``EngineArgs.create_speculative_config``) adds each to the JSON
    config and refuses one that the JSON also sets.
    """
    parts = {k: overrides.pop(k) for k in list(overrides)
             if k.startswith("engine.speculative_config.")}
    if not parts:
        return overrides
    config = dict(overrides.get("engine.speculative_config") or {})
    for key, value in parts.items():
        sub = key.removeprefix("engine.speculative_config.")
        if sub in config:
            flag = {"method": "--spec-method", "model": "--spec-model",
                    "num_speculative_tokens": "--spec-tokens"}[sub]
            raise VllmArgsError(f"{label}: {flag} and --speculative-config['{sub}'] are mutually "
                                f"exclusive (as vLLM)")
        config[sub] = value
    overrides["engine.speculative_config"] = config
    return overrides
