"""What is simulated: GPUs, models, and the KV capacity vLLM gives them.

* :mod:`kvsim.specs.gpu` - :class:`GPUSpec`
* :mod:`kvsim.specs.model` - :class:`ModelSpec` (KV bytes, weights, FLOPs)
* :mod:`kvsim.specs.catalog` - names, inline mappings and files -> specs
* :mod:`kvsim.specs.capacity` - :func:`kv_capacity` (vLLM's block count)
* :mod:`kvsim.specs.cli` - ``kvsim capacity``
"""

from kvsim.specs.capacity import KVCapacity, kv_capacity
from kvsim.specs.catalog import list_gpus, list_models, load_gpu, load_model
from kvsim.specs.gpu import GPUSpec
from kvsim.specs.model import ModelSpec

__all__ = ["GPUSpec", "ModelSpec", "KVCapacity", "kv_capacity", "load_gpu", "load_model",
           "list_gpus", "list_models"]
