"""LLMServingSim's published vLLM serving runs: their GPUs, engine arguments and profiles.

``llmservingsim/vllm_serving_bench/<GPU>/Llama-3.1-8B`` holds real vLLM 0.19
serving runs (300 ShareGPT-like requests at 10 req/s) and
``llmservingsim/vllm_layerwise/<GPU>`` the kernel tables of the same GPUs.
This module fits a profile to each GPU's kernel tables
(:func:`fit_run_profile`, shipped as ``kvsim/cost/profiles/<gpu>_llama-3.1-8b_tp1.json``);
``kvsim.reports.replay`` replays the runs through ``kvsim.simulate`` with it.

The RTX 4090 and RTX PRO 6000 are not in kvsim's GPU catalog: their specs are
inline here (datasheet figures). The kernel tables exclude CPU time, so the
profiles take the roofline's default per-step overhead; :func:`with_vidur_overhead`
swaps in Vidur's A100 CPU-overhead fit for the sensitivity run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# Datasheet figures (dense bf16 with fp32 accumulate for the GeForce card).
RTX4090 = {"name": "rtx-4090", "memory_mib": 24564, "hbm_bandwidth_gbps": 1008,
           "bf16_tflops": 165.2, "fp8_tflops": 330.3, "interconnect_bandwidth_gbps": 32,
           "interconnect_latency_us": 35, "pcie_bandwidth_gbps": 32,
           "source": "NVIDIA Ada GPU architecture whitepaper (RTX 4090); inline in kvsim/cost/published_runs.py"}
RTXPRO6000 = {"name": "rtx-pro-6000", "memory_mib": 97887, "hbm_bandwidth_gbps": 1792,
              "bf16_tflops": 503.8, "fp8_tflops": 1007.6, "interconnect_bandwidth_gbps": 64,
              "interconnect_latency_us": 35, "pcie_bandwidth_gbps": 64,
              "source": "NVIDIA RTX PRO 6000 Blackwell Server Edition datasheet; inline in kvsim/cost/published_runs.py"}


@dataclass(frozen=True)
class ServingRun:
    bench_dir: str          # vllm_serving_bench/<bench_dir>
    layerwise_dir: str      # vllm_layerwise/<layerwise_dir>
    gpu: dict
    max_num_seqs: int
    num_gpu_blocks: int | None

    @property
    def profile_name(self) -> str:
        return f"{self.gpu['name']}_llama-3.1-8b_tp1"


RUNS = (
    ServingRun("RTX4090/Llama-3.1-8B", "RTX4090", RTX4090, 256, 2588),
    ServingRun("RTXPRO6000/Llama-3.1-8B", "RTXPRO6000", RTXPRO6000, 128, None),
)


def fit_run_profile(run: ServingRun, *, root: Path) -> dict:
    """The profile of ``run``'s GPU, fitted to its vLLM kernel tables under ``root``."""
    from kvsim.cost.fit import fit_profile
    from kvsim.cost.published import read_vllm_layerwise
    from kvsim.cost.roofline import RooflineParams
    from kvsim.specs import load_gpu, load_model

    rows, src = read_vllm_layerwise(run.layerwise_dir, "meta-llama/Llama-3.1-8B", root=root)
    profile = fit_profile(rows, model=load_model("llama-3.1-8b"), gpu=load_gpu(run.gpu), tp=1,
                          name=run.profile_name, sources=[src],
                          description="vLLM 0.19 kernel tables (LLMServingSim); residual adds are "
                                      "fused into vLLM's RMSNorm, so they cost nothing here; CPU "
                                      "overhead not measured: the roofline's default prior.")
    profile["ops"]["residual_add"] = {"sec_per_flop": 0.0, "sec_per_byte": 0.0, "const_s": 0.0}
    prior = RooflineParams()
    profile["overhead"] = {"const_s": prior.step_overhead_s, "sec_per_request": prior.request_overhead_s}
    return profile


def with_vidur_overhead(profile: dict, *, root: Path) -> dict:
    """The same profile with Vidur's A100 CPU-overhead fit (Llama-2-7B, TP1): the sensitivity run."""
    from kvsim.cost.fit import fit_profile
    from kvsim.cost.published import read_vidur_overhead
    from kvsim.specs import load_gpu, load_model
    rows, _ = read_vidur_overhead("meta-llama/Llama-2-7b-hf", 1, root=root)
    fit = fit_profile(rows, model=load_model("llama-3.1-8b"), gpu=load_gpu("a100-80gb-sxm"),
                      require_attention=False)
    return dict(profile, overhead=fit["overhead"])
