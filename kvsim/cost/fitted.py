"""Fitted cost model: the roofline's physical terms with measured coefficients.

A *profile* is a small JSON file per (GPU, model, TP) (format below), written
by ``kvsim calibrate fit`` and shipped inside the package, in
``kvsim/cost/profiles/NAME.json`` (package data: an installed kvsim finds
them wherever it runs). Its
coefficients multiply the FLOPs and bytes of ``features.py``, so the step
formula is the roofline's (``step_model.py``) with every efficiency, floor
and overhead replaced by a number fitted to measurements::

    {
      "format": "kvsim-cost-profile/1",
      "name": "a100-80gb-sxm_llama-2-70b_tp2",
      "gpu": "a100-80gb-sxm", "model": "llama-2-70b", "tp": 2,
      "ops": {"qkv_proj": {"sec_per_flop": .., "sec_per_byte": .., "const_s": ..}, ...},
      "prefill_attention": {...}, "decode_attention": {..., "sec_per_token": ..},
      "mixed_decode_attention": {...},        # optional: decodes in a step with a prefill
      "allreduce": {"sec_per_byte": .., "const_s": ..},
      "overhead": {"const_s": .., "sec_per_request": ..},
      "sources": [{"part": .., "file": .., "rows": .., "n_rows": ..}, ...],
      "errors": {"<part>": {"n_train", "n_test", "fitted_median_ape", "fitted_p90_ape",
                            "roofline_median_ape", "roofline_p90_ape"}},
      "heldout": {"<part>": {"x": [...], "measured_s": [...], "fitted_s": [...],
                             "roofline_s": [...]}}
    }

Ops missing from ``ops`` fall back as documented in ``OP_FALLBACK``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from kvsim.cost.features import LINEAR_OPS, rank_shapes
from kvsim.cost.step_model import (CommCoefficients, OpCoefficients, OverheadCoefficients,
                                   StepCostModel)

PROFILE_FORMAT = "kvsim-cost-profile/1"
# The shipped profiles: package data next to this module (pyproject.toml
# [tool.setuptools.package-data]), as the GPU and model catalogs are.
PROFILE_DIR = Path(__file__).with_name("profiles")

# An op with no measurement borrows the coefficients of the op most like it
# (same kernel kind): the LM head is a GEMM like the MLP up-projection, the
# final norm is the per-layer RMSNorm, the sampler streams logits like an
# elementwise op.
OP_FALLBACK = {
    "lm_head": "mlp_gate_up",
    "final_norm": "input_norm",
    "post_attn_norm": "input_norm",
    "sampler": "mlp_act",
    "embedding": "residual_add",
    "rope": "residual_add",
    "mlp_act": "residual_add",
    "input_norm": "residual_add",
    "residual_add": "mlp_act",
    # GEMMs borrow from each other (a profile from a partial measurement)
    "o_proj": "qkv_proj",
    "qkv_proj": "mlp_gate_up",
    "mlp_gate_up": "mlp_down",
    "mlp_down": "o_proj",
}


def _coef(d: dict, cls, where: str):
    allowed = set(cls.__dataclass_fields__)
    unknown = set(d) - allowed
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(allowed)}")
    ints = {"tile_m", "tile_n", "num_sms", "wave_tile_m", "wave_kv_heads"}
    return cls(**{k: (int(v) if k in ints else float(v)) for k, v in d.items()})


def resolve_profile_path(name_or_path: str) -> Path:
    """A profile NAME (shipped: ``kvsim/cost/profiles/NAME.json``) or a path to a JSON file."""
    p = Path(name_or_path)
    if p.suffix == ".json" and p.exists():
        return p
    candidate = PROFILE_DIR / f"{name_or_path}.json"
    if candidate.exists():
        return candidate
    available = sorted(q.stem for q in PROFILE_DIR.glob("*.json"))
    raise ValueError(f"cost_model.profile: {name_or_path!r} is neither a JSON file nor a "
                     f"shipped profile; available: {', '.join(available) or 'none'}")


def dump_profile(profile: dict) -> str:
    """JSON text of a profile: one key per line, number lists kept on one line."""
    text = json.dumps(profile, indent=1)
    return re.sub(r"\[\s*([-0-9.e,\s]+?)\s*\]",
                  lambda m: "[" + ", ".join(v.strip() for v in m.group(1).split(",")) + "]",
                  text) + "\n"


def load_profile(name_or_path: str) -> dict:
    path = resolve_profile_path(name_or_path)
    profile = json.loads(path.read_text())
    if profile.get("format") != PROFILE_FORMAT:
        raise ValueError(f"cost_model.profile: {path} is not a {PROFILE_FORMAT} file "
                         f"(format {profile.get('format')!r})")
    return profile


def fitted_cost_model(profile: dict, model, gpu, tp: int = 1,
                      kv_cache_dtype: str = "auto") -> StepCostModel:
    """The cost model of ``profile`` for the scenario's model, GPU and TP.

    A profile describes one (GPU, model, TP); using it for another is an
    error (its constants, e.g. per-kernel overheads, belong to the measured
    shapes), with the names the scenario and the profile use.
    """
    name = profile.get("name", "?")
    for key, want in (("gpu", gpu.name), ("model", model.name), ("tp", tp)):
        if profile.get(key) != want:
            raise ValueError(f"cost_model.profile: profile {name!r} was fitted for "
                             f"{key} {profile.get(key)!r}, but the scenario has {key} {want!r}; "
                             f"fit one with `kvsim calibrate fit` or use cost_model.type: roofline")
    ops = {}
    for op in LINEAR_OPS:
        src = op
        seen = set()
        while src not in profile["ops"]:
            seen.add(src)
            src = OP_FALLBACK.get(src)
            if src is None or src in seen:
                raise ValueError(f"cost_model.profile: profile {name!r} has no coefficients "
                                 f"for op {op!r} nor a fallback for it")
        ops[op] = _coef(profile["ops"][src], OpCoefficients, f"profile {name} ops.{src}")
    pcie = float(getattr(gpu, "pcie_bandwidth_gbps", 0) or 0) * 1e9
    return StepCostModel(
        shapes=rank_shapes(model, tp, kv_cache_dtype),
        ops=ops,
        prefill_attention=_coef(profile["prefill_attention"], OpCoefficients,
                                f"profile {name} prefill_attention"),
        decode_attention=_coef(profile["decode_attention"], OpCoefficients,
                               f"profile {name} decode_attention"),
        allreduce=_coef(profile.get("allreduce", {}), CommCoefficients, f"profile {name} allreduce"),
        overhead=_coef(profile.get("overhead", {}), OverheadCoefficients, f"profile {name} overhead"),
        swap_sec_per_byte=1.0 / pcie if pcie > 0 else 0.0,
        mixed_decode_attention=(_coef(profile["mixed_decode_attention"], OpCoefficients,
                                      f"profile {name} mixed_decode_attention")
                                if "mixed_decode_attention" in profile else None),
    )
