"""Find a GPU or a model by name, inline mapping, or file.

``load_gpu`` and ``load_model`` accept what a user types:

* a catalog name (``h100-sxm``, ``llama-3.1-8b``; case-insensitive, ``_`` and
  spaces read as ``-``), or an alias listed in the catalog;
* a mapping with the dataclass fields (``memory_gib``/``memory_mib`` may
  replace ``memory_bytes`` for a GPU);
* a path to a YAML/JSON file holding such a mapping, or, for a model, a
  Hugging Face ``config.json``.

The catalogs are ``data/gpus.yaml`` and ``data/models.yaml``; each entry names
its source.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, fields
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

import yaml

from kvsim.specs.gpu import MIB, GPUSpec
from kvsim.specs.model import ModelSpec

DATA_DIR = Path(__file__).with_name("data")


# ---------------------------------------------------------------------- catalog files
@lru_cache(maxsize=None)
def _catalog(kind: str) -> tuple[dict[str, dict], dict[str, str]]:
    """(entries by canonical name, alias -> canonical name) of gpus or models."""
    with open(DATA_DIR / f"{kind}.yaml", encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    return data[kind], dict(data.get("aliases") or {})


def _normalise(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def _lookup(kind: str, name: str) -> tuple[str, dict] | None:
    entries, aliases = _catalog(kind)
    key = _normalise(name)
    key = aliases.get(key, key)
    if key in entries:
        return key, entries[key]
    return None


def list_gpus() -> list[str]:
    """Canonical GPU names in catalog order."""
    return list(_catalog("gpus")[0])


def list_models() -> list[str]:
    """Canonical model names in catalog order."""
    return list(_catalog("models")[0])


def gpu_aliases() -> dict[str, str]:
    return dict(_catalog("gpus")[1])


def model_aliases() -> dict[str, str]:
    return dict(_catalog("models")[1])


# ---------------------------------------------------------------------- GPUs
_GPU_FIELDS = {f.name for f in fields(GPUSpec)}
_GPU_MEMORY_KEYS = ("memory_bytes", "memory_mib", "memory_gib")
_GPU_INFO_KEYS = {"full_name", "memory_source", "notes"}  # kept in YAML, not in GPUSpec


def load_gpu(spec: str | Mapping[str, Any] | GPUSpec) -> GPUSpec:
    """A :class:`GPUSpec` from a catalog name, a mapping, or a YAML/JSON file path."""
    if isinstance(spec, GPUSpec):
        return spec
    if isinstance(spec, Mapping):
        return gpu_from_mapping(spec)
    if isinstance(spec, (str, Path)):
        found = _lookup("gpus", str(spec))
        if found:
            name, entry = found
            return gpu_from_mapping(entry, default_name=name)
        path = Path(spec)
        if path.is_file():
            return gpu_from_mapping(_read_mapping(path), default_name=path.stem)
        raise ValueError(f"unknown GPU {str(spec)!r}; known: {', '.join(list_gpus())} "
                         f"(or a path to a YAML/JSON file with GPUSpec fields)")
    raise ValueError(f"a GPU must be a catalog name, a mapping or a file path, got {spec!r}")


def gpu_from_mapping(mapping: Mapping[str, Any], default_name: str = "custom-gpu") -> GPUSpec:
    data = dict(mapping)
    name = str(data.pop("name", default_name))
    for key in _GPU_INFO_KEYS:
        data.pop(key, None)
    given = [k for k in _GPU_MEMORY_KEYS if k in data]
    if len(given) != 1:
        raise ValueError(f"gpu {name}: give exactly one of {', '.join(_GPU_MEMORY_KEYS)}, "
                         f"got {given or 'none'}")
    key = given[0]
    value = data.pop(key)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"gpu {name}: {key} must be a positive number, got {value!r}")
    scale = {"memory_bytes": 1, "memory_mib": MIB, "memory_gib": 1 << 30}[key]
    data["memory_bytes"] = int(round(value * scale))
    data.setdefault("fp8_tflops", None)
    data.setdefault("source", "user-supplied")
    unknown = sorted(set(data) - _GPU_FIELDS)
    missing = sorted(f.name for f in fields(GPUSpec)
                     if f.name not in data and f.name != "name" and f.default is MISSING)
    if unknown:
        raise ValueError(f"gpu {name}: unknown field(s) {', '.join(unknown)}; allowed: "
                         f"{', '.join(sorted(_GPU_FIELDS - {'name', 'memory_bytes'}))}, "
                         f"one of {', '.join(_GPU_MEMORY_KEYS)}")
    if missing:
        raise ValueError(f"gpu {name}: missing field(s) {', '.join(missing)}")
    return GPUSpec(name=name, **data)


# ---------------------------------------------------------------------- models
_MODEL_FIELDS = {f.name for f in fields(ModelSpec)}


def load_model(spec: str | Mapping[str, Any] | ModelSpec) -> ModelSpec:
    """A :class:`ModelSpec` from a catalog name, a mapping, or a file path.

    A mapping or file with ``num_hidden_layers`` is read as a Hugging Face
    ``config.json`` (a folder holding one works too); otherwise its keys must
    be ``ModelSpec`` fields.
    """
    if isinstance(spec, ModelSpec):
        return spec
    if isinstance(spec, Mapping):
        return model_from_mapping(spec)
    if isinstance(spec, (str, Path)):
        found = _lookup("models", str(spec))
        if found:
            name, entry = found
            return model_from_mapping(entry, default_name=name)
        path = Path(spec)
        if path.is_dir() and (path / "config.json").is_file():
            path = path / "config.json"  # a Hugging Face model folder
        if path.is_file():
            default = path.parent.name if path.name == "config.json" else path.stem
            return model_from_mapping(_read_mapping(path), default_name=default or "custom-model")
        raise ValueError(f"unknown model {str(spec)!r}; known: {', '.join(list_models())} "
                         f"(or a path to a Hugging Face config.json or a YAML/JSON file "
                         f"with ModelSpec fields)")
    raise ValueError(f"a model must be a catalog name, a mapping or a file path, got {spec!r}")


def model_from_mapping(mapping: Mapping[str, Any], default_name: str = "custom-model") -> ModelSpec:
    if "num_hidden_layers" in mapping:
        return model_from_hf_config(mapping, default_name=default_name)
    data = dict(mapping)
    name = str(data.pop("name", default_name))
    unknown = sorted(set(data) - _MODEL_FIELDS)
    if unknown:
        raise ValueError(f"model {name}: unknown field(s) {', '.join(unknown)}; allowed: "
                         f"{', '.join(f.name for f in fields(ModelSpec) if f.name != 'name')}")
    missing = [f.name for f in fields(ModelSpec)
               if f.name not in data and f.name != "name" and f.default is MISSING]
    if missing:
        raise ValueError(f"model {name}: missing field(s) {', '.join(missing)} (or give a Hugging "
                         f"Face config.json mapping, with num_hidden_layers)")
    return ModelSpec(name=name, **data)


# torch_dtype -> bytes. vLLM's dtype="auto" serves float32 checkpoints in
# 16 bits (it downcasts them), so float32 maps to 2 as well.
_HF_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "half": 2, "float32": 2, "float": 2,
                   "float8_e4m3fn": 1}


def model_from_hf_config(config: Mapping[str, Any], default_name: str = "custom-model") -> ModelSpec:
    """A :class:`ModelSpec` from a Hugging Face ``config.json`` mapping.

    Reads Llama/Qwen/Mistral names (num_hidden_layers, num_key_value_heads,
    head_dim or hidden/heads, intermediate_size), OPT names (ffn_dim,
    word_embed_proj_dim must equal hidden_size), DeepSeek-V2/V3 MLA and MoE
    names (kv_lora_rank, qk_rope_head_dim, n_routed_experts, n_shared_experts,
    first_k_dense_replace), and Mixtral/Qwen-MoE names (num_local_experts,
    num_experts). A nested ``text_config`` (multimodal wrappers) is used when
    present.
    """
    cfg = dict(config)
    if isinstance(cfg.get("text_config"), Mapping):
        cfg = {**cfg, **cfg["text_config"]}
    name = str(cfg.get("name") or cfg.get("_name_or_path") or default_name)
    name = name.rstrip("/").split("/")[-1].lower() or default_name

    def need(*keys: str):
        for key in keys:
            if cfg.get(key) is not None:
                return cfg[key]
        raise ValueError(f"config.json for {name}: missing {' or '.join(keys)}")

    hidden = need("hidden_size", "d_model", "n_embd")
    heads = need("num_attention_heads", "n_head")
    layers = need("num_hidden_layers", "n_layer")
    kv_heads = cfg.get("num_key_value_heads") or heads
    model_type = str(cfg.get("model_type", ""))
    is_opt = model_type == "opt" or "ffn_dim" in cfg
    if is_opt:
        intermediate = need("ffn_dim")
        gated = False
        proj = cfg.get("word_embed_proj_dim", hidden)
        if proj != hidden:
            raise ValueError(f"config.json for {name}: word_embed_proj_dim ({proj}) != "
                             f"hidden_size ({hidden}) is not supported")
        tie_default = True
        # OPTLearnedPositionalEmbedding keeps 2 extra rows (its offset).
        positions = (cfg.get("max_position_embeddings") or 2048) + 2
    else:
        intermediate = need("intermediate_size", "n_inner", "ffn_dim")
        act = str(cfg.get("hidden_act", cfg.get("activation_function", "silu")))
        # Llama-family configs use a gated (SwiGLU/GeGLU) MLP; GPT-style gelu/relu do not.
        gated = bool(cfg.get("gated_mlp", act in ("silu", "swiglu") or model_type in (
            "llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe",
            "deepseek_v2", "deepseek_v3", "gemma", "gemma2")))
        tie_default = False
        positions = 0
    tie = bool(cfg.get("tie_word_embeddings", tie_default))

    kv_lora = cfg.get("kv_lora_rank")
    if kv_lora is not None:
        nope = need("qk_nope_head_dim")
        rope = need("qk_rope_head_dim")
        head_dim = nope + rope
        mla = dict(kv_lora_rank=kv_lora, qk_rope_head_dim=rope, qk_nope_head_dim=nope,
                   v_head_dim=need("v_head_dim"), q_lora_rank=cfg.get("q_lora_rank"))
    else:
        head_dim = cfg.get("head_dim") or hidden // heads
        mla = {}

    experts = (cfg.get("n_routed_experts") or cfg.get("num_local_experts")
               or cfg.get("num_experts") or 0)
    moe: dict[str, int] = {}
    if experts:
        moe_width = cfg.get("moe_intermediate_size") or intermediate
        shared = cfg.get("n_shared_experts") or 0
        if not shared and cfg.get("shared_expert_intermediate_size"):
            # Qwen-MoE states the shared expert by its width; count it in expert units.
            shared = max(1, round(cfg["shared_expert_intermediate_size"] / moe_width))
        moe = dict(num_experts=experts, num_experts_per_tok=need("num_experts_per_tok"),
                   moe_intermediate_size=moe_width, num_shared_experts=shared,
                   first_k_dense_layers=cfg.get("first_k_dense_replace") or 0)

    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").replace("torch.", "")
    if dtype not in _HF_DTYPE_BYTES:
        raise ValueError(f"config.json for {name}: torch_dtype {dtype!r} is not supported; "
                         f"allowed: {', '.join(_HF_DTYPE_BYTES)}")

    return ModelSpec(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate,
        vocab_size=need("vocab_size"),
        gated_mlp=gated,
        tie_word_embeddings=tie,
        max_position_embeddings=cfg.get("max_position_embeddings") or cfg.get("n_positions") or 2048,
        dtype_bytes=_HF_DTYPE_BYTES[dtype],
        learned_position_embeddings=positions,
        source="Hugging Face config.json",
        **mla,
        **moe,
    )


def _read_mapping(path: Path) -> dict:
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'} "
                         f"({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of fields, got {type(data).__name__}")
    return data
