"""Find a GPU or a model by name, inline mapping, or file.

``load_gpu`` and ``load_model`` accept what a user types:

* a catalog name (``h100-sxm``, ``llama-3.1-8b``; case-insensitive, ``_`` and
  spaces read as ``-``), or an alias listed in the catalog;
* a mapping with the dataclass fields (``memory_gib``/``memory_mib`` may
  replace ``memory_bytes`` for a GPU), or ``base: NAME`` and the fields that
  differ from that catalog entry;
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
from kvsim.specs.hf_config import model_from_hf_config
from kvsim.specs.model import ModelSpec

DATA_DIR = Path(__file__).with_name("data")


# ---------------------------------------------------------------------- catalog files
@lru_cache(maxsize=None)
def _catalog(kind: str) -> tuple[dict[str, dict], dict[str, str]]:
    """(entries by canonical name, alias -> canonical name) of gpus or models."""
    with open(DATA_DIR / f"{kind}.yaml", encoding="utf-8") as fh:
        # libyaml's parser where PyYAML has it: the same safe constructors and
        # the same data (tests/test_speed_paths.py), ~10x faster than the
        # pure-Python one (0.14 s of every `kvsim run` on the two catalogs).
        data = yaml.load(fh, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
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
    """A :class:`GPUSpec` from its fields, or from ``base: NAME`` plus the fields to change."""
    data = dict(mapping)
    if "base" in data:
        data = _with_base("gpus", data, memory_keys=_GPU_MEMORY_KEYS)
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
        raise ValueError(f"gpu {name}: missing field(s) {', '.join(missing)}; give them, or "
                         f"start from a catalog GPU with base: NAME ({', '.join(list_gpus())})")
    return GPUSpec(name=name, **data)


def _with_base(kind: str, data: dict, memory_keys: tuple[str, ...] = ()) -> dict:
    """``{base: NAME, field: value, ...}`` -> the catalog entry NAME with those fields replaced.

    The name stays the base's unless one is given (vLLM's per-GPU defaults, e.g.
    the A100 rule of kv-semantics D4, keep applying); the source says what changed.
    """
    singular = kind[:-1]
    base = data.pop("base")
    if not isinstance(base, str) or not base:
        raise ValueError(f"{singular}.base must be a catalog {singular} name, got {base!r}")
    found = _lookup(kind, base)
    if found is None:
        known = list_gpus() if kind == "gpus" else list_models()
        raise ValueError(f"{singular}.base: {base!r} is not in the catalog; known: "
                         f"{', '.join(known)}")
    base_name, entry = found
    merged = dict(entry)
    if any(k in data for k in memory_keys):      # a new memory figure replaces the base's
        for k in memory_keys:
            merged.pop(k, None)
    changed = sorted(k for k in data if k not in ("name", "source"))
    merged.update(data)
    merged.setdefault("name", base_name)
    if "source" not in data:
        merged["source"] = (f"catalog {singular} {base_name} with {', '.join(changed)} changed "
                            f"(base source: {entry.get('source', '')})" if changed
                            else entry.get("source", ""))
    return merged


# ---------------------------------------------------------------------- models
_MODEL_FIELDS = {f.name for f in fields(ModelSpec)}
_MODEL_INFO_KEYS = {"hf_repo", "notes"}  # kept in YAML, not in ModelSpec


def load_model(spec: str | Mapping[str, Any] | ModelSpec) -> ModelSpec:
    """A :class:`ModelSpec` from a catalog name, a mapping, or a file path.

    A mapping or file that looks like a Hugging Face ``config.json``
    (``num_hidden_layers``, ``model_type``, ``architectures`` or a nested
    ``text_config``; a folder holding one works too) is read as one; otherwise
    its keys must be ``ModelSpec`` fields, or ``base:`` and overrides.
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
    """A :class:`ModelSpec` from its fields, ``base: NAME`` plus changes, or a HF config.json."""
    if _is_hf_config(mapping) and "base" not in mapping:
        return model_from_hf_config(mapping, default_name=default_name)
    data = dict(mapping)
    if "base" in data:
        data = _with_base("models", data)
    name = str(data.pop("name", default_name))
    for key in _MODEL_INFO_KEYS:
        data.pop(key, None)
    unknown = sorted(set(data) - _MODEL_FIELDS)
    if unknown:
        raise ValueError(f"model {name}: unknown field(s) {', '.join(unknown)}; allowed: "
                         f"{', '.join(f.name for f in fields(ModelSpec) if f.name != 'name')}, "
                         f"base")
    missing = [f.name for f in fields(ModelSpec)
               if f.name != "name" and f.name not in data and f.default is MISSING]
    if missing:
        raise ValueError(f"model {name}: missing field(s) {', '.join(missing)}; give them, or "
                         f"start from a catalog model with base: NAME, or give a Hugging Face "
                         f"config.json")
    try:
        return ModelSpec(name=name, **data)
    except TypeError as exc:  # defensive: a field of the wrong kind
        raise ValueError(f"model {name}: {exc}") from None


def _is_hf_config(mapping: Mapping[str, Any]) -> bool:
    """A Hugging Face config.json: its own layer-count key, or a multimodal text_config."""
    return ("num_hidden_layers" in mapping or isinstance(mapping.get("text_config"), Mapping)
            or "model_type" in mapping or "architectures" in mapping)


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
