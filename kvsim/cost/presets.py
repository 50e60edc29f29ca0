"""Engine presets: the engine time of the engine generations published data come from.

A scenario picks one with ``cost_model.engine_preset`` and may override any
term with ``cost_model.engine_overhead: {step_s: ..., ...}`` (or a JSON file
written by ``kvsim calibrate serve``). The engine's own knobs, under vLLM's
names, sit in ``engine:`` (``enforce_eager``, ``cudagraph_capture_sizes``);
``resolve_engine_timing`` checks them against the preset and builds the
``EngineTiming`` the cost model holds. Without a preset the cost model keeps
the GPU model's own per-step term and models no CUDA graphs (what kvsim did
before presets existed), and the graph knobs are refused.

Where every number comes from is in ``Preset.sources`` and in
docs/cost_models.md ("Engine presets").
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from kvsim.cost.overhead import (CudaGraphs, EngineOverhead, EngineTiming, default_capture_sizes,
                                 user_capture_sizes)

ENGINE_FIT_FORMAT = "kvsim-engine-overhead/1"


@dataclass(frozen=True)
class EngineKnobs:
    """The scenario's engine settings a preset needs (``engine:`` section, resolved)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    enforce_eager: bool | None = None                 # None: the preset's default
    cudagraph_capture_sizes: tuple[int, ...] | None = None
    max_cudagraph_capture_size: int | None = None     # vLLM V1 only


@dataclass(frozen=True)
class Preset:
    name: str
    engine: str                 # the engine generation it stands for
    overhead: EngineOverhead
    cudagraph_mode: str         # vLLM CUDAGraphMode name (overhead.CUDAGRAPH_MODES)
    capture_rule: str           # how default capture sizes are chosen (_default_sizes)
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def has_cudagraphs(self) -> bool:
        return self.cudagraph_mode != "none"


def _default_sizes(rule: str, knobs: EngineKnobs, gpu_name: str) -> tuple[int, ...]:
    if rule == "vllm-v1":
        blackwell = gpu_name.lower().startswith(("b200", "b300", "gb200", "gb300"))
        return default_capture_sizes(knobs.max_num_seqs, knobs.max_num_batched_tokens,
                                     data_center_blackwell=blackwell,
                                     max_capture_size=knobs.max_cudagraph_capture_size)
    if rule == "vllm-v0":
        # vllm/worker/model_runner.py (v0.6): _BATCH_SIZES_TO_CAPTURE = [1, 2, 4] + 8..256,
        # kept up to max_num_seqs rounded up to a multiple of 8 (_get_graph_batch_size).
        top = min(256, -(-knobs.max_num_seqs // 8) * 8)
        return tuple(s for s in [1, 2, 4] + list(range(8, 257, 8)) if s <= top)
    if rule == "sglang-0.4":
        # sglang/srt/model_executor/cuda_graph_runner.py (0.4.0): capture_bs = [1, 2, 4] +
        # 8..160 by 8, at most cuda_graph_max_bs (server_args.py: 160; 8 under 25 GB).
        return tuple(s for s in [1, 2, 4] + list(range(8, 161, 8))
                     if s <= max(1, knobs.max_num_seqs))
    return ()


# ------------------------------------------------------------------ the presets

# Vidur's CPU-overhead table of the Sarathi-Serve engine (vidur/cpu_overheads/a100.csv,
# CodeLlama-34B TP2, fitted by overhead_fit.fit_to_vidur_cpu_table): per sampled token,
# the TP hop (Ray) and the eager launch time per layer.
_VIDUR_STEP_S = 1.94911e-3
_VIDUR_REQUEST_S = 20.8849e-6
_VIDUR_SAMPLED_S = 22.3587e-6
_VIDUR_RAY_HOP_S = 5.79608e-3
_VIDUR_LAUNCH_S = 30.8012e-6

PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset(
        "sarathi-serve-2024", "Sarathi-Serve OSDI'24 artifact (vLLM-derived, eager, Ray workers)",
        EngineOverhead(step_s=6.97253e-3, per_request_s=1.22538e-3,
                       per_sampled_token_s=_VIDUR_SAMPLED_S, tp_hop_s=_VIDUR_RAY_HOP_S,
                       eager_launch_s_per_layer=_VIDUR_LAUNCH_S),
        "none", "none",
        {"step_s, per_request_s": "fitted (engine_points.TRAIN_POINTS, L1) to the artifact's "
                                  "figure-2 decode batches 2-64 and prefills 512 / 2,048 and "
                                  "Table 2's decode-4, on the fitted Yi-34B TP2 profile; the "
                                  "eight checked points are held out",
         "per_sampled_token_s, tp_hop_s, eager_launch_s_per_layer":
             "Vidur cpu_overheads/a100.csv (the Sarathi engine), CodeLlama-34B TP2",
         "cudagraphs": "none: sarathi/model_executor/model_runner.py (02d2567) runs eagerly"}),
    Preset(
        "vllm-v0.6", "vLLM 0.6 V0 engine, one scheduler step per forward (no multi-step)",
        EngineOverhead(step_s=_VIDUR_STEP_S, per_request_s=_VIDUR_REQUEST_S,
                       per_sampled_token_s=_VIDUR_SAMPLED_S, tp_hop_s=_VIDUR_RAY_HOP_S,
                       eager_launch_s_per_layer=_VIDUR_LAUNCH_S),
        "full_decode_only", "vllm-v0",
        {"step_s, per_request_s, per_sampled_token_s, tp_hop_s, eager_launch_s_per_layer":
             "Vidur cpu_overheads/a100.csv, CodeLlama-34B TP2: the Sarathi engine, a fork of "
             "vLLM's V0 engine (same scheduler / prepare_inputs / sampler / output path, Ray "
             "workers); no CPU timings of vLLM 0.6 itself are published with the data here. "
             "vLLM 0.6 on one node defaults to the mp executor, whose hop is smaller: set "
             "engine_overhead.tp_hop_s for it",
         "cudagraphs": "vllm/worker/model_runner.py (v0.6): decode-only batches up to 256 "
                       "replay graphs (_use_captured_graph); prefill and mixed batches eager"}),
    Preset(
        "vllm-v1", "vLLM V1 engine (0.8 - 0.33), FULL_AND_PIECEWISE CUDA graphs",
        EngineOverhead(step_s=0.674004e-3, per_request_s=10.7074e-6,
                       per_prefill_request_s=0.234754e-3, eager_launch_s_per_layer=_VIDUR_LAUNCH_S,
                       piecewise_launch_s_per_layer=_VIDUR_LAUNCH_S / 4),
        "full_and_piecewise", "vllm-v1",
        {"step_s, per_request_s, per_prefill_request_s":
             "kvsim calibrate serve scenarios/calibrate_serve/llmservingsim.manifest.yaml: fitted to "
             "LLMServingSim's vLLM 0.19 RTX 4090 run (Llama-3.1-8B, 300 requests; latencies "
             "from the engine's queued_ts), the RTX PRO 6000 run held out; replayed "
             "synchronously although vLLM 0.19 ran with async_scheduling, so these are the "
             "CPU time that did not overlap the GPU (docs/engine.md, Async scheduling)",
         "tp_hop_s": "0: no TP serving run of a catalog model is published with the data here "
                     "(V1's multiprocessing executor broadcasts each step through shared memory)",
         "eager_launch_s_per_layer": "Vidur cpu_overheads/a100.csv forward CPU time per layer "
                                     "(an eager vLLM-style engine on an A100 host)",
         "piecewise_launch_s_per_layer": "estimate: a quarter of the eager launches (the "
                                         "splitting ops, attention and KV-cache update, of "
                                         "~8 kernels per layer)",
         "cudagraphs": "vllm/config/vllm.py (0.33) _set_cudagraph_sizes; "
                       "vllm/v1/cudagraph_dispatcher.py dispatch"}),
    Preset(
        "sglang-0.4", "SGLang 0.4 (decode CUDA graphs up to batch 160, eager extend)",
        EngineOverhead(step_s=0.674004e-3, per_request_s=10.7074e-6,
                       per_prefill_request_s=0.234754e-3, eager_launch_s_per_layer=_VIDUR_LAUNCH_S),
        "full_decode_only", "sglang-0.4",
        {"step_s, per_request_s, per_prefill_request_s, eager_launch_s_per_layer":
             "borrowed from vllm-v1: no CPU timings or serving runs of SGLang are published "
             "with the data here (fit your own with kvsim calibrate serve)",
         "cudagraphs": "sglang 0.4.0 model_executor/model_runner.py forward_decode (graphs) "
                       "vs forward_extend (eager); cuda_graph_runner.py capture_bs"}),
)}


def get_preset(name) -> Preset:
    if not isinstance(name, str) or name not in PRESETS:
        raise ValueError(f"cost_model.engine_preset: {name!r} is not an engine preset; "
                         f"allowed: {', '.join(PRESETS)}")
    return PRESETS[name]


def load_engine_fit(path: str | Path) -> dict:
    """A ``kvsim calibrate serve`` result: {"format", "engine_preset", "engine_overhead", ...}."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"cost_model.engine_overhead: {str(path)!r} is neither a mapping of "
                         f"terms nor an existing JSON file")
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"cost_model.engine_overhead: {p} is not JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != ENGINE_FIT_FORMAT:
        raise ValueError(f"cost_model.engine_overhead: {p} is not a {ENGINE_FIT_FORMAT} file "
                         f"(written by kvsim calibrate serve)")
    return data


def resolve_engine_timing(config: dict, knobs: EngineKnobs | None, *, tp: int,
                          gpu_name: str = "") -> EngineTiming | None:
    """The engine part a ``cost_model:`` mapping and the engine knobs ask for (None: no preset).

    Reads ``engine_preset``, ``engine_overhead`` (a mapping of terms or a
    fit file, which may also carry ``gpu_scale`` and its preset) and
    ``gpu_scale``. Knob combinations the engine refuses, or that a preset
    cannot run, are ValueErrors naming the key.
    """
    preset_name = config.get("engine_preset")
    overrides = config.get("engine_overhead")
    gpu_scale = config.get("gpu_scale")
    if isinstance(overrides, str):
        fit = load_engine_fit(overrides)
        preset_name = preset_name or fit.get("engine_preset")
        if fit.get("engine_preset") and preset_name != fit["engine_preset"]:
            raise ValueError(f"cost_model.engine_preset: {preset_name!r}, but "
                             f"{overrides} was fitted on {fit['engine_preset']!r}")
        gpu_scale = fit.get("gpu_scale", 1.0) if gpu_scale is None else gpu_scale
        overrides = fit.get("engine_overhead", {})
    if preset_name is None:
        for key in ("engine_overhead", "gpu_scale"):
            if config.get(key) is not None:
                raise ValueError(f"cost_model.{key}: needs cost_model.engine_preset (the engine "
                                 f"whose time it changes); allowed: {', '.join(PRESETS)}")
        if knobs is not None:
            for key in ("enforce_eager", "cudagraph_capture_sizes"):
                if getattr(knobs, key) is not None:
                    raise ValueError(f"engine.{key}: CUDA graphs are modelled by an engine "
                                     f"preset; set cost_model.engine_preset (e.g. vllm-v1)")
        return None
    preset = get_preset(preset_name)
    overhead = preset.overhead
    if overrides is not None:
        if not isinstance(overrides, dict):
            raise ValueError(f"cost_model.engine_overhead: {overrides!r} is neither a mapping of "
                             f"terms nor a JSON file path")
        overhead = overhead.updated(overrides, "cost_model.engine_overhead")
    if gpu_scale is None:
        gpu_scale = 1.0
    if isinstance(gpu_scale, bool) or not isinstance(gpu_scale, (int, float)) or not gpu_scale > 0:
        raise ValueError(f"cost_model.gpu_scale: {gpu_scale!r} is not a positive number")
    graphs = _resolve_cudagraphs(preset, knobs, gpu_name)
    return EngineTiming(overhead=overhead, cudagraphs=graphs, tp=tp, gpu_scale=float(gpu_scale),
                        preset=preset.name)


# Engine settings assumed when a cost model is built without a scenario (library use).
DEFAULT_KNOBS = EngineKnobs(max_num_seqs=256, max_num_batched_tokens=8192)


def _resolve_cudagraphs(preset: Preset, knobs: EngineKnobs | None, gpu_name: str) -> CudaGraphs:
    knobs = knobs or DEFAULT_KNOBS
    eager, sizes = knobs.enforce_eager, knobs.cudagraph_capture_sizes
    largest = knobs.max_cudagraph_capture_size
    for key, value in (("cudagraph_capture_sizes", sizes), ("max_cudagraph_capture_size", largest)):
        if value is not None and eager:
            # vLLM drops the sizes under eager mode ("Cudagraph is disabled under eager mode",
            # vllm/config/vllm.py); kvsim refuses so that they are not believed to be modelled.
            raise ValueError(f"engine.{key}: given with engine.enforce_eager: true, "
                             f"which captures no graphs; drop one of them")
    if not preset.has_cudagraphs:
        for key, value in (("enforce_eager", eager is False), ("cudagraph_capture_sizes", sizes),
                           ("max_cudagraph_capture_size", largest)):
            if value:
                raise ValueError(f"engine.{key}: the {preset.name} engine has no CUDA graphs "
                                 f"(it always runs eagerly); drop engine.{key}")
        return CudaGraphs()
    if eager:
        return CudaGraphs()
    if largest is not None and preset.capture_rule != "vllm-v1":
        raise ValueError(f"engine.max_cudagraph_capture_size: vLLM V1's knob; the "
                         f"{preset.name} engine captures its own sizes (use "
                         f"engine.cudagraph_capture_sizes)")
    if sizes is not None:
        kept = user_capture_sizes(sizes, knobs.max_num_batched_tokens)
        if not kept:
            raise ValueError(f"engine.cudagraph_capture_sizes: {list(sizes)} has no size <= "
                             f"max_num_batched_tokens ({knobs.max_num_batched_tokens}), so no "
                             f"graph would be captured")
        if largest is not None and largest != kept[-1]:
            # vllm/config/vllm.py _set_cudagraph_sizes: both given and inconsistent
            raise ValueError(f"engine.max_cudagraph_capture_size: {largest}, but the largest "
                             f"engine.cudagraph_capture_sizes kept is {kept[-1]}; vLLM refuses "
                             f"both when they differ")
    else:
        kept = _default_sizes(preset.capture_rule, knobs, gpu_name)
    return CudaGraphs(preset.cudagraph_mode, kept)


def with_preset_overhead(engine: EngineTiming, **terms) -> EngineTiming:
    """``engine`` with some overhead terms replaced (fitting helpers)."""
    return replace(engine, overhead=engine.overhead.updated(terms))
