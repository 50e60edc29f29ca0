"""Engine time outside the GPU kernels: CPU work per step, the TP worker hop, CUDA graphs.

The GPU models (``roofline.py``, ``fitted.py``) give the kernels' time. What
the engine adds around them is a separate, named part of every cost model::

    step time = max(kernels, launch) + cpu

* ``kernels``: the GPU model on the step as the GPU runs it. A step that
  replays a CUDA graph runs the graph's padded token count (vLLM pads the
  batch up to the next capture size; ``CudaGraphs``).
* ``launch``: the CPU time to issue the kernels that are not in a graph. The
  launches run ahead of the GPU, so they cost nothing while the kernels are
  longer, and set the pace when they are shorter (small batches in eager
  mode): hence the ``max``.
* ``cpu``: the engine's serial work around the forward pass (``EngineOverhead``)::

      step_s + tp_hop_s [tp > 1] + per_request_s x requests
      + per_prefill_request_s x prefill requests + per_sampled_token_s x sampled tokens

  vLLM's engine core schedules, prepares inputs, runs the model and processes
  outputs one after the other (``vllm/v1/engine/core.py``: ``EngineCore.step``;
  ``engine.async_scheduling`` overlaps them, issue #13 phase 2), so they add.

``EngineTiming`` is what a cost model holds: the overhead terms, the graph
settings and the tensor-parallel degree. Presets per engine generation are in
``presets.py``; fitting the terms to measurements in ``overhead_fit.py``.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, fields

# vLLM's CUDAGraphMode names (vllm/config/compilation.py), lower case.
CUDAGRAPH_MODES = ("none", "piecewise", "full", "full_decode_only", "full_and_piecewise")


@dataclass(frozen=True)
class EngineOverhead:
    """Seconds the engine spends outside the GPU kernels (all >= 0).

    * ``step_s``: fixed serial CPU work per step (schedule, prepare inputs,
      launch the forward, output processing).
    * ``per_request_s``: per scheduled request (its slot in the input
      tensors, block table, bookkeeping).
    * ``per_prefill_request_s``: extra per request that runs a prefill chunk
      (more than one new token) in the step.
    * ``per_sampled_token_s``: per sampled token (sampler, detokenizer,
      stop checks, streaming the output).
    * ``tp_hop_s``: per step when tp > 1: handing the step to the TP workers
      and getting the result back (a Ray call in vLLM V0 and Sarathi-Serve;
      a shared-memory broadcast in V1's multiprocessing executor).
    * ``eager_launch_s_per_layer``: CPU time to launch one decoder layer's
      kernels outside a CUDA graph.
    * ``piecewise_launch_s_per_layer``: the same under a piecewise graph
      (only the splitting ops, attention and the KV-cache write, are
      launched one by one; ``CompilationConfig.splitting_ops``).
    """

    step_s: float = 0.0
    per_request_s: float = 0.0
    per_prefill_request_s: float = 0.0
    per_sampled_token_s: float = 0.0
    tp_hop_s: float = 0.0
    eager_launch_s_per_layer: float = 0.0
    piecewise_launch_s_per_layer: float = 0.0

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def updated(self, values: dict, where: str = "engine_overhead") -> "EngineOverhead":
        """A copy with ``values`` (term -> seconds) replaced; a bad key or value names ``where.key``."""
        allowed = self.field_names()
        new = {}
        for key, value in values.items():
            if key not in allowed:
                raise ValueError(f"{where}.{key}: unknown engine-overhead term; "
                                 f"allowed: {', '.join(allowed)}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"{where}.{key}: {value!r} is not a non-negative number of seconds")
            new[key] = float(value)
        return EngineOverhead(**{**self.as_dict(), **new})

    def as_dict(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in self.field_names()}


@dataclass(frozen=True)
class CudaGraphs:
    """Which steps replay a CUDA graph, and the batch sizes graphs were captured for.

    vLLM V1 (``vllm/v1/cudagraph_dispatcher.py``: ``CudagraphDispatcher.dispatch``):
    a step of more tokens than the largest capture size runs eagerly; any
    other is padded up to the next capture size and replays a FULL graph if
    it is a uniform decode batch (every request one new token) and the mode
    captures full graphs, else a PIECEWISE graph if the mode has them, else
    runs eagerly (unpadded).
    """

    mode: str = "none"
    capture_sizes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.mode not in CUDAGRAPH_MODES:
            raise ValueError(f"cudagraph mode {self.mode!r}; allowed: {', '.join(CUDAGRAPH_MODES)}")
        if list(self.capture_sizes) != sorted(set(self.capture_sizes)) or \
                any(s < 1 for s in self.capture_sizes):
            raise ValueError(f"capture sizes {self.capture_sizes!r} must be distinct, "
                             f"positive and ascending")

    @property
    def max_capture_size(self) -> int:
        return self.capture_sizes[-1] if self.capture_sizes and self.mode != "none" else 0

    @property
    def decode_graph(self) -> str:
        """What a uniform decode batch replays: 'full', 'piecewise' or 'none'."""
        if self.mode in ("full", "full_decode_only", "full_and_piecewise"):
            return "full"
        return "piecewise" if self.mode == "piecewise" else "none"

    @property
    def mixed_graph(self) -> str:
        """What a step with a prefill chunk replays."""
        if self.mode in ("piecewise", "full_and_piecewise"):
            return "piecewise"
        return "full" if self.mode == "full" else "none"

    def padded_size(self, num_tokens: int) -> int:
        """The capture size a step of ``num_tokens`` tokens is padded to (itself above the largest)."""
        if num_tokens > self.max_capture_size or num_tokens <= 0:
            return num_tokens
        return self.capture_sizes[bisect.bisect_left(self.capture_sizes, num_tokens)]


def default_capture_sizes(max_num_seqs: int, max_num_batched_tokens: int, *,
                          data_center_blackwell: bool = False,
                          max_capture_size: int | None = None) -> tuple[int, ...]:
    """vLLM V1's default ``cudagraph_capture_sizes`` (vLLM 0.33, no speculative decoding).

    ``vllm/config/vllm.py``: ``VllmConfig._set_cudagraph_sizes``: the largest
    size is ``min(2 x max_num_seqs, 512)`` (1024 on data-center Blackwell), or
    ``max_cudagraph_capture_size`` when given (``max_capture_size``), then at
    most ``max_num_batched_tokens``; sizes are 1, 2, 4, multiples of 8 below
    256, multiples of 16 from 256, plus ``max_num_batched_tokens`` when it fits
    under the largest, and ``max_num_seqs`` too when the largest is vLLM's
    own (a given maximum adds no uniform decode size).
    """
    ceiling = 1024 if data_center_blackwell else 512
    given = max_capture_size is not None
    largest = min(max_capture_size if given else min(max_num_seqs * 2, ceiling),
                  max_num_batched_tokens)
    sizes = [s for s in (1, 2, 4) if s <= largest]
    if largest >= 8:
        sizes += list(range(8, min(largest + 1, 256), 8))
    if largest >= 256:
        sizes += list(range(256, largest + 1, 16))
    if max_num_batched_tokens <= largest:
        sizes.append(max_num_batched_tokens)
    if max_num_seqs <= largest and not given:
        sizes.append(max_num_seqs)
    return tuple(sorted(set(sizes)))


def user_capture_sizes(sizes, max_num_batched_tokens: int) -> tuple[int, ...]:
    """User-given capture sizes as vLLM keeps them: distinct, ascending, <= max_num_batched_tokens."""
    return tuple(sorted({int(s) for s in sizes if int(s) <= max_num_batched_tokens}))


@dataclass(frozen=True)
class EngineTiming:
    """The engine side of a cost model: overhead terms, CUDA graphs, TP degree, a GPU scale.

    ``gpu_scale`` multiplies the kernels' time (a GPU-efficiency correction
    fitted by ``kvsim calibrate serve``; 1 leaves the GPU model as it is).
    ``preset`` names where the numbers came from (for reports).
    """

    overhead: EngineOverhead = EngineOverhead()
    cudagraphs: CudaGraphs = CudaGraphs()
    tp: int = 1
    gpu_scale: float = 1.0
    preset: str = ""

    @property
    def fixed_cpu_s(self) -> float:
        """The CPU time every step pays whatever its batch."""
        hop = self.overhead.tp_hop_s if self.tp > 1 else 0.0
        return self.overhead.step_s + hop

    def launch_s(self, graph: str, num_layers: int) -> float:
        """CPU time to launch a step's kernels that are outside a graph of kind ``graph``."""
        if graph == "full":
            return 0.0     # one graph launch; its few microseconds are part of step_s
        per_layer = (self.overhead.piecewise_launch_s_per_layer if graph == "piecewise"
                     else self.overhead.eager_launch_s_per_layer)
        return num_layers * per_layer

    def padding_table(self, graph: str) -> list[int]:
        """``table[n]``: the tokens a step of ``n`` tokens runs under ``graph`` ([] without graphs)."""
        if graph == "none" or self.cudagraphs.max_capture_size == 0:
            return []
        return [self.cudagraphs.padded_size(n) for n in range(self.cudagraphs.max_capture_size + 1)]


def step_terms(engine: EngineTiming | None, gpu_overhead, num_layers: int) -> tuple:
    """What the per-step path of ``StepCostModel`` reads, as plain floats and lists.

    (fixed CPU, per request, per prefill request, per sampled token, decode
    padding table, mixed padding table, decode launch, mixed launch, eager
    launch, GPU scale). Without an engine part, the GPU model's own
    ``gpu_overhead`` (``const_s``, ``sec_per_request``) and no graphs.
    """
    if engine is None:
        return (float(gpu_overhead.const_s), float(gpu_overhead.sec_per_request), 0.0, 0.0,
                [], [], 0.0, 0.0, 0.0, 1.0)
    o, g = engine.overhead, engine.cudagraphs
    return (float(engine.fixed_cpu_s), float(o.per_request_s), float(o.per_prefill_request_s),
            float(o.per_sampled_token_s), engine.padding_table(g.decode_graph),
            engine.padding_table(g.mixed_graph), float(engine.launch_s(g.decode_graph, num_layers)),
            float(engine.launch_s(g.mixed_graph, num_layers)),
            float(engine.launch_s("none", num_layers)), float(engine.gpu_scale))
