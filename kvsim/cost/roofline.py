"""Roofline cost model: any GPU and model from the catalogs, no measurements.

Each operator takes ``max(FLOPs / (peak x compute efficiency), bytes /
(HBM bandwidth x memory efficiency), kernel floor)``; a TP all-reduce takes
``2 (tp-1)/tp x bytes / (link bandwidth x efficiency) + latency``; a step
adds a CPU/launch overhead. The efficiencies are named parameters; their
defaults come from the published A100/H100 operator profiles (Vidur), see
``docs/cost_models.md`` and ``reports/calibration.md`` (numbers are what the
shipped profiles' fitted coefficients imply):

* ``gemm_compute_efficiency`` 0.75: the projections reach 0.68-0.88 of the
  dense bf16 peak at large token counts (A100 and H100, 7B to 70B, TP 1-8).
* ``memory_efficiency`` 0.80: a single-pass elementwise op (residual add)
  streams at 0.9-1.0 of HBM bandwidth, multi-pass ones (RMSNorm, SiLU-mul,
  rope) at 0.35-0.6; 0.8 is a middle for fused engines.
* ``attention_compute_efficiency`` 0.45 and ``attention_memory_efficiency``
  0.75: FlashAttention prefill in the A100 table costs 1/0.75 of peak per
  FLOP plus per-token and causal-diagonal terms the roofline does not have,
  about 0.45 of peak overall at the chunk sizes served; decode attention
  streams KV at 0.77 of HBM bandwidth.
* ``kernel_floor_s`` 4 µs: the fitted launch floors of small kernels are 1-15 µs.
* ``allreduce_efficiency`` 0.65 and the catalog's link latency: NCCL ring
  all-reduce reaches 0.52 (A100 DGX) to 0.74 (H100 DGX) of the per-direction
  NVLink rate, plus 16-39 µs per call (Vidur network tables).
* ``step_overhead_s`` 1 ms and ``request_overhead_s`` 20 µs: Vidur's vLLM
  CPU-overhead table (schedule + prepare inputs + sampler + output
  processing) fits 0.8-1.4 ms + 42 µs per request; current vLLM batches that
  CPU work, so the per-request part is halved here.
* ``all2all_efficiency`` 0.7: MoE dispatch/combine between DP ranks (vLLM
  DP + EP, ``features.moe_dispatch_bytes_per_token``), with the link
  latency added per call; groups larger than the GPU's
  ``nvlink_domain_size`` use ``scaleout_bandwidth_gbps``. Chosen from NCCL on
  8 H200s (apex_plus/comm in shared/data/profiles): all-gather and
  reduce-scatter (vLLM's default ``allgather_reducescatter`` backend) and
  all-to-all move 7/8 of a 128 MiB buffer at 0.65-0.68 of the 450 GB/s
  NVLink rate (latency included); with 0.7 and the catalog's 25 µs link
  latency the model is within -7%..+15% of all three at 4-128 MiB, and
  1.7-2.5x above at 1 MiB and below, where NCCL takes 10-17 µs and the
  catalog's link latency is 25 µs (tests/test_moe_published.py). DeepEP
  reports ~150 of the H800's 160 GB/s at 4096 tokens, less at decode sizes.
* ``expert_load_imbalance`` 1.0: the busiest EP rank's routed tokens over
  the mean (``features._moe_ops``); 1.0 is perfectly balanced (what EPLB
  aims for). No public table gives it for a vLLM deployment, so it is an
  input: raise it to model skewed routing without EPLB.

GEMMs of a model with quantized weights (``weight_dtype_bytes`` 1: FP8
checkpoints) run at the FP8 peak; attention runs at the model dtype's.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from kvsim.cost.features import LINEAR_OPS, rank_shapes
from kvsim.cost.step_model import (CommCoefficients, OpCoefficients, OverheadCoefficients,
                                   StepCostModel)


@dataclass(frozen=True)
class RooflineParams:
    gemm_compute_efficiency: float = 0.75
    memory_efficiency: float = 0.80
    attention_compute_efficiency: float = 0.45
    attention_memory_efficiency: float = 0.75
    allreduce_efficiency: float = 0.65
    all2all_efficiency: float = 0.7
    expert_load_imbalance: float = 1.0
    kernel_floor_s: float = 4e-6
    step_overhead_s: float = 1.0e-3
    request_overhead_s: float = 20e-6

    @classmethod
    def from_config(cls, config: dict) -> "RooflineParams":
        allowed = {f.name for f in fields(cls)}
        values = {}
        for key, value in config.items():
            if key == "type":
                continue
            if key not in allowed:
                raise ValueError(f"cost_model.{key}: unknown roofline parameter {key!r}; "
                                 f"allowed: type, {', '.join(sorted(allowed))}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"cost_model.{key}: {value!r} is not a non-negative number")
            if key.endswith("efficiency") and not 0 < value <= 1:
                raise ValueError(f"cost_model.{key}: {value!r} must be in (0, 1]")
            if key == "expert_load_imbalance" and value < 1:
                raise ValueError(f"cost_model.{key}: {value!r} is the busiest EP rank's "
                                 f"tokens over the mean: at least 1 (1 = balanced)")
            values[key] = float(value)
        return cls(**values)


def peak_flops(gpu, dtype_bytes: float) -> float:
    """Dense FLOP/s for the weights' precision (fp8 weights run fp8 GEMMs)."""
    tflops = gpu.fp8_tflops if dtype_bytes == 1 and gpu.fp8_tflops else gpu.bf16_tflops
    return float(tflops) * 1e12


def roofline_cost_model(model, gpu, tp: int = 1, kv_cache_dtype: str = "auto",
                        params: RooflineParams | None = None, parallel=None) -> StepCostModel:
    """The roofline model of ``model`` on ``gpu``; ``parallel`` (a ParallelConfig) adds DP/EP."""
    p = params or RooflineParams()
    if p.expert_load_imbalance != 1.0 and not (parallel is not None and parallel.use_ep):
        raise ValueError(f"cost_model.expert_load_imbalance: {p.expert_load_imbalance!r} acts "
                         f"only under expert parallelism (engine.enable_expert_parallel with "
                         f"more than one GPU per replica); {model.name} runs without it")
    shapes = rank_shapes(model, tp, kv_cache_dtype, parallel, p.expert_load_imbalance)
    wdb = shapes.weight_dtype_bytes
    peak = peak_flops(gpu, shapes.dtype_bytes if wdb is None else wdb)
    attn_peak = peak if wdb is None else peak_flops(gpu, shapes.dtype_bytes)
    bw = float(gpu.hbm_bandwidth_gbps) * 1e9
    gemm = OpCoefficients(1.0 / (peak * p.gemm_compute_efficiency), 1.0 / (bw * p.memory_efficiency),
                          floor_s=p.kernel_floor_s)
    attn = OpCoefficients(1.0 / (attn_peak * p.attention_compute_efficiency),
                          1.0 / (bw * p.attention_memory_efficiency), floor_s=p.kernel_floor_s)
    link = float(gpu.link_bandwidth_gbps(tp) if hasattr(gpu, "link_bandwidth_gbps")
                 else gpu.interconnect_bandwidth_gbps) * 1e9
    comm = CommCoefficients(1.0 / (link * p.allreduce_efficiency) if link > 0 else 0.0,
                            float(gpu.interconnect_latency_us) * 1e-6)
    ops = {name: gemm for name in LINEAR_OPS}
    if parallel is not None and parallel.uses_moe_dispatch:
        group = parallel.world_size
        moe_link = float(gpu.link_bandwidth_gbps(group) if hasattr(gpu, "link_bandwidth_gbps")
                         else gpu.interconnect_bandwidth_gbps) * 1e9
        ops["moe_all2all"] = OpCoefficients(sec_per_byte=1.0 / (moe_link * p.all2all_efficiency),
                                            const_s=float(gpu.interconnect_latency_us) * 1e-6)
    pcie = float(getattr(gpu, "pcie_bandwidth_gbps", 0) or 0) * 1e9
    return StepCostModel(
        shapes=shapes,
        ops=ops,
        prefill_attention=attn,
        decode_attention=attn,
        allreduce=comm,
        overhead=OverheadCoefficients(p.step_overhead_s, p.request_overhead_s),
        swap_sec_per_byte=1.0 / pcie if pcie > 0 else 0.0,
    )
