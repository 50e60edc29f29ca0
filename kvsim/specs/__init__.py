"""What is simulated: GPUs, models, parallel layouts, and the KV capacity vLLM gives them.

* :mod:`kvsim.specs.gpu` - :class:`GPUSpec`
* :mod:`kvsim.specs.model` - :class:`ModelSpec` (layer types, KV bytes); its
  parameters, weights and FLOPs in :mod:`kvsim.specs.model_params`
* :mod:`kvsim.specs.parallel` - :class:`ParallelConfig` (TP, DP, EP as vLLM derives them)
* :mod:`kvsim.specs.catalog` - names, inline mappings (``base:`` + overrides) and files -> specs;
  :mod:`kvsim.specs.hf_config` reads a Hugging Face ``config.json``
* :mod:`kvsim.specs.kv_groups` - vLLM's KV-cache groups for models that mix layer types
* :mod:`kvsim.specs.capacity` - :func:`kv_capacity` (vLLM's block count)
* :mod:`kvsim.specs.cli` - ``kvsim capacity``
"""

from kvsim.specs.capacity import KVCapacity, kv_capacity
from kvsim.specs.catalog import list_gpus, list_models, load_gpu, load_model
from kvsim.specs.gpu import GPUSpec
from kvsim.specs.model import ModelSpec
from kvsim.specs.parallel import ParallelConfig

__all__ = ["GPUSpec", "ModelSpec", "ParallelConfig", "KVCapacity", "kv_capacity", "load_gpu",
           "load_model", "list_gpus", "list_models"]
