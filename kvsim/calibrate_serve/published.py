"""The published serving runs kvsim calibrates and checks its engine time on.

LLMServingSim's real vLLM 0.19 runs (``llmservingsim/vllm_serving_bench``
under the published-data folder, ``../shared/data/profiles`` in the project;
MORE.md there): 300 ShareGPT-like requests at 10 req/s on one RTX 4090 and
one RTX PRO 6000, Llama-3.1-8B bf16, chunked prefill with
``max_num_batched_tokens`` 2048, block 16, prefix caching and CUDA graphs on
(the RTX 4090 run's resolved config: FULL_AND_PIECEWISE, async scheduling).
The server settings below are those runs' ``meta.json`` engine arguments; the
GPU model is the profile fitted to the same GPU's vLLM kernel tables
(``<gpu>_llama-3.1-8b_tp1``), never to these runs.

The RTX 4090 and RTX PRO 6000 are not in kvsim's GPU catalog: their specs are
inline (datasheet figures; the same as the profiles were fitted with).
"""

from __future__ import annotations

from pathlib import Path

from kvsim.calibrate_serve.results import ServingRun, read_results

RTX4090 = {"name": "rtx-4090", "memory_mib": 24564, "hbm_bandwidth_gbps": 1008,
           "bf16_tflops": 165.2, "fp8_tflops": 330.3, "interconnect_bandwidth_gbps": 32,
           "interconnect_latency_us": 35, "pcie_bandwidth_gbps": 32,
           "source": "NVIDIA Ada GPU architecture whitepaper (RTX 4090)"}
RTXPRO6000 = {"name": "rtx-pro-6000", "memory_mib": 97887, "hbm_bandwidth_gbps": 1792,
              "bf16_tflops": 503.8, "fp8_tflops": 1007.6, "interconnect_bandwidth_gbps": 64,
              "interconnect_latency_us": 35, "pcie_bandwidth_gbps": 64,
              "source": "NVIDIA RTX PRO 6000 Blackwell Server Edition datasheet"}

# (run name, bench folder, GPU, max_num_seqs, max_model_len, logged KV blocks)
LLAMA_RUNS = (
    ("rtx4090-llama-3.1-8b", "RTX4090/Llama-3.1-8B", RTX4090, 256, 32768, 2588),
    ("rtxpro6000-llama-3.1-8b", "RTXPRO6000/Llama-3.1-8B", RTXPRO6000, 128, None, None),
)


def server_scenario(gpu: dict, max_num_seqs: int, max_model_len: int | None,
                    num_gpu_blocks: int | None, preset: str | None = "vllm-v1") -> dict:
    engine = {"scheduler": "chunked", "max_num_batched_tokens": 2048, "max_num_seqs": max_num_seqs,
              "block_size": 16, "enable_prefix_caching": True, "gpu_memory_utilization": 0.9}
    if max_model_len:
        engine["max_model_len"] = max_model_len
    if num_gpu_blocks:
        engine["num_gpu_blocks_override"] = num_gpu_blocks
    cost = {"type": "fitted", "profile": f"{gpu['name']}_llama-3.1-8b_tp1"}
    if preset:
        cost["engine_preset"] = preset
    return {"name": f"server-{gpu['name']}", "model": "llama-3.1-8b",
            "hardware": {"gpu": dict(gpu), "tp": 1}, "engine": engine, "cost_model": cost}


def llmservingsim_runs(root: str | Path, splits: dict[str, str] | None = None,
                       preset: str | None = "vllm-v1") -> list[ServingRun]:
    """The Llama-3.1-8B runs under the published-data folder ``root``; ``splits``: name -> train/test."""
    root = Path(root)
    runs = []
    for name, folder, gpu, seqs, max_len, blocks in LLAMA_RUNS:
        path = root / "llmservingsim" / "vllm_serving_bench" / folder / "requests.jsonl"
        if not path.is_file():
            raise ValueError(f"published data: {path} is missing; give the folder of published "
                             f"tables (llmservingsim/, vidur/, ...) with --data")
        runs.append(ServingRun(name, server_scenario(gpu, seqs, max_len, blocks, preset),
                               read_results(path), (splits or {}).get(name, "train")))
    return runs
