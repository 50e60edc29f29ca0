"""How many KV blocks fit on a GPU, computed the way vLLM sizes its cache.

vLLM (kv-semantics D2-D3) profiles one dummy forward pass of
``max_num_batched_tokens`` tokens and then gives the KV cache what is left of
its share of the device::

    requested    = total_memory x gpu_memory_utilization
    available_kv = requested - weights - activation_peak - non_torch - cudagraph
    num_blocks   = available_kv // block_bytes        (per rank; ranks are alike,
                                                       vLLM takes the minimum)
    block_bytes  = block_size x kv_bytes_per_token    (all layers, one rank)

``num_gpu_blocks_override`` replaces ``num_blocks``. Block 0 is vLLM's null
block (kv-semantics B2), so requests can use ``num_blocks - 1`` blocks.

For a model whose layers mix attention types, ``block_bytes`` is vLLM's bytes
per block over its KV-cache groups (:mod:`kvsim.specs.kv_groups`: one block id
covers a page in each layer of a group, and ``group_size`` layers, not all of
them, share one block), and how many requests fit depends on how many blocks
each group holds (:meth:`KVCapacity.max_concurrent_requests`). Weights are
per GPU under TP, DP and EP as :mod:`kvsim.specs.parallel` describes.

The three overhead terms are estimates of what vLLM *measures* on the real
GPU; each can be given explicitly (``activation_bytes``, ``non_torch_bytes``,
``cudagraph_bytes``) to reproduce a logged run. Defaults and why:

* activation peak: :func:`estimate_activation_peak_bytes`, the live tensors at
  the widest point of the profile forward (the MLP) plus the sampler's logits.
  Against vLLM's log for Meta-Llama-3-8B on an H100 (``PyTorch activation
  peak memory 1.26GiB`` at 8192 tokens, 256 seqs; vLLM PR #10511) it gives
  1.27 GiB.
* non-torch increase during profiling (cuBLAS workspace, NCCL buffers):
  :data:`DEFAULT_NON_TORCH_BYTES` = 0.15 GiB at tp=1. Published V1-era logs
  report 0.07 GiB (gemma-3-4b, vLLM PR #21489), 0.16 GiB (Llama-3.2-11B,
  PR #12126) and 0.28 GiB (a TP run, issue #15039). With tp > 1 NCCL and the
  custom all-reduce keep their buffers outside torch: we add
  :data:`DEFAULT_NON_TORCH_TP_EXTRA_BYTES` = 0.75 GiB (an older vLLM log shows
  non-torch memory going from 1.79 to 3.58 GiB when Llama-3-8B moves from tp=1
  to tp=2, PR #10511; that version also counted the CUDA context).
* CUDA graphs: vLLM 0.33 subtracts an estimate of the graph pool by default
  (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1, kv-semantics D2 [new]).
  :data:`DEFAULT_CUDAGRAPH_BYTES` = 0.5 GiB; logged graph pools are 0.65 GiB
  (gemma-3-4b, PR #21489) and ~1.3 GB (Llama-4 Maverick, same PR). Pass
  ``cudagraph_bytes=0`` for vLLM <= 0.11 or ``--enforce-eager``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvsim.specs.gpu import GIB, GPUSpec
from kvsim.specs.kv_groups import KVCacheGroups, get_kv_cache_groups, model_layer_specs
from kvsim.specs.model import ModelSpec
from kvsim.specs.parallel import ParallelConfig

DEFAULT_NON_TORCH_BYTES = int(0.15 * GIB)
DEFAULT_NON_TORCH_TP_EXTRA_BYTES = int(0.75 * GIB)
DEFAULT_CUDAGRAPH_BYTES = int(0.5 * GIB)

# Bytes per element of the sampled logits in the profile run: the logits in
# the model dtype, then three float32 tensors the sampler makes (upcast logits,
# probabilities, log-probabilities).
SAMPLER_FP32_COPIES = 3

# vLLM V1 default max_num_seqs (kv-semantics D4, API-server context): 1024 on
# GPUs with >= 70 GiB that are not A100s, 256 elsewhere.
LARGE_GPU_BYTES = 70 * GIB
HUGE_GPU_BYTES = 160 * GIB


def default_max_num_seqs(gpu: GPUSpec, max_num_batched_tokens: int) -> int:
    """vLLM V1's default ``max_num_seqs`` for this GPU (D4), capped by the token budget."""
    large = gpu.memory_bytes >= LARGE_GPU_BYTES and "a100" not in gpu.name.lower()
    return min(1024 if large else 256, max_num_batched_tokens)


def default_max_num_batched_tokens(gpu: GPUSpec) -> int:
    """``vllm serve``'s default token budget for this GPU (kv-semantics D4).

    8192 on >= 70 GiB GPUs that are not A100s, 2048 elsewhere; [new] 16384 on
    >= 160 GiB devices. The same rule as ``kvsim run`` (scenario/loader.py).
    """
    if gpu.memory_bytes >= HUGE_GPU_BYTES:
        return 16384
    if gpu.memory_bytes >= LARGE_GPU_BYTES and "a100" not in gpu.name.lower():
        return 8192
    return 2048


def default_non_torch_bytes(tp: int) -> int:
    """Non-torch memory growth during profiling (see module docstring)."""
    return DEFAULT_NON_TORCH_BYTES + (DEFAULT_NON_TORCH_TP_EXTRA_BYTES if tp > 1 else 0)


def estimate_activation_peak_bytes(model: ModelSpec, max_num_batched_tokens: int,
                                   max_num_seqs: int, tp: int = 1, dp: int = 1) -> int:
    """Peak torch memory of vLLM's profile forward pass, beyond the weights.

    The profile run pushes ``T = max_num_batched_tokens`` tokens through the
    model and samples ``S = min(max_num_seqs, T)`` of them. Live at the
    widest point, per rank, in the model dtype (b bytes):

    * the residual stream, the hidden state and the normed MLP input:
      ``3 x T x hidden``;
    * the MLP's intermediates: gated ``T x (2W + W)`` (gate_up output and the
      activation's output), plain ``T x 2W``, with ``W`` the per-rank width
      (MoE: ``(top_k + shared) x moe_width / tp`` per token, plus the fused
      kernel's ``T x top_k x hidden`` output buffer); the attention block's
      ``T x (q + 2 kv + o) heads x head_dim`` if that is wider;
    * the sampler: ``S x vocab`` logits in the model dtype plus
      :data:`SAMPLER_FP32_COPIES` float32 copies (logits are gathered to the
      full vocabulary before sampling).

    With ``dp`` > 1 every DP rank's tokens meet in the MoE layers: a GPU does
    ``1 / (tp x dp)`` of the expert work of ``dp x T`` tokens (with or without
    EP), the same intermediates as above, but holds the gathered
    ``dp x T x top_k x hidden`` output buffer.

    Grows linearly with ``max_num_batched_tokens`` x (hidden + intermediate),
    as the issue asks; calibrated against one vLLM log (module docstring).
    """
    T = max_num_batched_tokens
    S = min(max_num_seqs, T)
    b = model.dtype_bytes
    h = model.hidden_size
    mlp_factor = 3 if model.gated_mlp else 2
    widest = mlp_factor * model.intermediate_size / tp
    extra = 0.0
    if model.is_moe:
        active = (model.num_experts_per_tok + model.num_shared_experts)
        moe = mlp_factor * active * model.moe_intermediate_size / tp
        if moe > widest:
            widest = moe
            extra = model.num_experts_per_tok * h * dp
    heads = model.num_attention_heads / tp
    if model.is_mla:
        qk = model.qk_nope_head_dim + model.qk_rope_head_dim
        attn = heads * (qk + qk + model.v_head_dim + model.v_head_dim)
    else:
        attn = (2 * heads + 2 * model.kv_heads_per_rank(tp)) * model.head_dim
    widest = max(widest + extra, attn)
    forward = T * (3 * h + widest) * b
    sampler = S * model.vocab_size * (b + 4 * SAMPLER_FP32_COPIES)
    return int(forward + sampler)


@dataclass(frozen=True)
class KVCapacity:
    """The KV cache of one tensor-parallel rank, in bytes, blocks and tokens."""

    model_name: str
    gpu_name: str
    tp: int
    kv_cache_dtype: str
    gpu_memory_utilization: float
    max_num_batched_tokens: int
    max_num_seqs: int
    total_memory_bytes: int
    requested_memory_bytes: int
    weight_bytes: int
    activation_peak_bytes: int
    non_torch_bytes: int
    cudagraph_bytes: int
    available_kv_bytes: int
    kv_bytes_per_token: int
    block_size: int
    block_bytes: int
    num_gpu_blocks: int
    token_capacity: int
    num_gpu_blocks_overridden: bool = False
    dp: int = 1
    enable_expert_parallel: bool = False
    expert_parallel_size: int = 1
    num_local_experts: int = 0
    weight_bytes_by_part: dict | None = None
    kv_groups: KVCacheGroups | None = None
    disable_hybrid_kv_cache_manager: bool = False
    max_in_flight_tokens: int = 0

    @property
    def num_usable_blocks(self) -> int:
        """Blocks requests can hold: all but vLLM's null block (B2)."""
        return self.num_gpu_blocks - 1

    @property
    def is_hybrid(self) -> bool:
        """More than one KV-cache group (vLLM's hybrid KV cache manager at work)."""
        return self.kv_groups is not None and self.kv_groups.is_hybrid

    @property
    def vllm_logged_tokens(self) -> int:
        """What vLLM logs as ``GPU KV cache size: N tokens`` (null block included).

        For one full-attention group: ``num_blocks x block_size`` (vLLM 0.33
        logs ``concurrency x max_model_len``, the same when ``max_model_len``
        is a multiple of the block size; see :meth:`logged_kv_cache_size_tokens`).
        """
        return self.num_gpu_blocks * self.block_size

    def logged_kv_cache_size_tokens(self, max_model_len: int) -> int:
        """vLLM 0.33 get_kv_cache_capacity: ``int(max_concurrency x max_model_len)``."""
        return int(self.max_concurrency(max_model_len) * max_model_len)

    def max_concurrency(self, max_model_len: int) -> float:
        """vLLM's "Maximum concurrency for N tokens per request: X x" (null block included)."""
        _check_int("max_model_len", max_model_len)
        return self.num_gpu_blocks / sum(self.blocks_per_group(max_model_len))

    def blocks_per_group(self, seq_len: int) -> list[int]:
        """Blocks one request of ``seq_len`` tokens holds in each KV-cache group (at most)."""
        _check_int("seq_len", seq_len)
        if self.kv_groups is None:
            return [math.ceil(seq_len / self.block_size)]
        return self.kv_groups.blocks_per_request(seq_len, self.max_in_flight_tokens)

    def blocks_per_request(self, seq_len: int) -> int:
        """Blocks one request of ``seq_len`` tokens holds, all groups together."""
        return sum(self.blocks_per_group(seq_len))

    def max_concurrent_requests(self, seq_len: int) -> int:
        """How many requests of ``seq_len`` tokens (prompt + output) fit at once."""
        return self.num_usable_blocks // self.blocks_per_request(seq_len)


def kv_capacity(model: ModelSpec, gpu: GPUSpec, *, tp: int = 1, dp: int = 1,
                enable_expert_parallel: bool = False,
                gpu_memory_utilization: float = 0.9, block_size: int = 16,
                kv_cache_dtype: str = "auto", max_num_batched_tokens: int = 8192,
                max_num_seqs: int | None = None,
                num_gpu_blocks_override: int | None = None,
                activation_bytes: int | None = None, non_torch_bytes: int | None = None,
                cudagraph_bytes: int | None = None,
                disable_hybrid_kv_cache_manager: bool | None = None,
                enable_prefix_caching: bool = True, async_scheduling: bool = True) -> KVCapacity:
    """Size the KV cache of one GPU as vLLM does (kv-semantics D2-D3).

    ``max_num_seqs`` defaults to vLLM V1's default for this GPU
    (:func:`default_max_num_seqs`); the overhead terms default as the module
    docstring explains. ``tp`` x ``dp`` GPUs form one replica, experts split
    by EP when ``enable_expert_parallel`` (:mod:`kvsim.specs.parallel`).
    ``disable_hybrid_kv_cache_manager`` None is vLLM 0.33's choice: off
    (hybrid manager on) except for chunked local attention (Llama 4), where
    vLLM turns it off unless VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1
    (VllmConfig.__post_init__). ``async_scheduling`` (on by default in 0.33)
    keeps two batches in flight, which sliding-window and chunked groups reserve
    for (``max_in_flight_tokens``). Raises ``ValueError`` naming the bad
    argument, or, when weights and overheads leave no room for KV, what is
    needed and what to try.
    """
    _check_int("tp", tp)
    _check_int("dp", dp)
    _check_int("block_size", block_size)
    _check_int("max_num_batched_tokens", max_num_batched_tokens)
    parallel = ParallelConfig(tp, dp, enable_expert_parallel)
    parallel.check(model)
    if max_num_seqs is None:
        max_num_seqs = default_max_num_seqs(gpu, max_num_batched_tokens)
    _check_int("max_num_seqs", max_num_seqs)
    if (not isinstance(gpu_memory_utilization, (int, float))
            or isinstance(gpu_memory_utilization, bool)
            or not 0 < gpu_memory_utilization <= 1):
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], "
                         f"got {gpu_memory_utilization!r}")
    if num_gpu_blocks_override is not None:
        _check_int("num_gpu_blocks_override", num_gpu_blocks_override, minimum=2)
    for name, value in (("activation_bytes", activation_bytes),
                        ("non_torch_bytes", non_torch_bytes),
                        ("cudagraph_bytes", cudagraph_bytes)):
        if value is not None:
            _check_int(name, value, minimum=0)
    groups, block_size, disable_hybrid_kv_cache_manager = model_kv_cache_groups(
        model, block_size, kv_cache_dtype, tp, disable_hybrid_kv_cache_manager,
        enable_prefix_caching)
    kv_per_token = model.kv_bytes_per_token(kv_cache_dtype, tp)
    block_bytes = groups.bytes_per_block
    total = gpu.memory_bytes
    requested = int(total * gpu_memory_utilization)
    by_part = model.weight_bytes_by_part(tp, dp=dp, expert_parallel=enable_expert_parallel)
    weights = model.weight_bytes(tp, dp=dp, expert_parallel=enable_expert_parallel)
    activation = (estimate_activation_peak_bytes(model, max_num_batched_tokens, max_num_seqs,
                                                 tp, dp)
                  if activation_bytes is None else activation_bytes)
    non_torch = (default_non_torch_bytes(parallel.world_size) if non_torch_bytes is None
                 else non_torch_bytes)
    cudagraph = DEFAULT_CUDAGRAPH_BYTES if cudagraph_bytes is None else cudagraph_bytes
    overhead = activation + non_torch + cudagraph
    available = requested - weights - overhead

    if available < 2 * block_bytes:
        raise ValueError(_does_not_fit(model, gpu, parallel, gpu_memory_utilization, requested,
                                       weights, overhead, available, block_bytes,
                                       kv_cache_dtype, block_size))

    num_blocks = groups.num_blocks(available)
    if num_gpu_blocks_override is not None:
        num_blocks = num_gpu_blocks_override  # vLLM: replaces the profiled count (D3)
    return KVCapacity(
        model_name=model.name, gpu_name=gpu.name, tp=tp, kv_cache_dtype=kv_cache_dtype,
        gpu_memory_utilization=float(gpu_memory_utilization),
        max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
        total_memory_bytes=total, requested_memory_bytes=requested, weight_bytes=weights,
        activation_peak_bytes=activation, non_torch_bytes=non_torch, cudagraph_bytes=cudagraph,
        available_kv_bytes=available, kv_bytes_per_token=kv_per_token, block_size=block_size,
        block_bytes=block_bytes, num_gpu_blocks=num_blocks,
        token_capacity=(num_blocks - 1) * block_size,
        num_gpu_blocks_overridden=num_gpu_blocks_override is not None,
        dp=dp, enable_expert_parallel=enable_expert_parallel,
        expert_parallel_size=parallel.expert_parallel_size,
        num_local_experts=parallel.local_experts(model.num_experts) if model.is_moe else 0,
        weight_bytes_by_part=by_part, kv_groups=groups,
        disable_hybrid_kv_cache_manager=disable_hybrid_kv_cache_manager,
        # VllmConfig.max_in_flight_tokens: two batches with async scheduling (0.33 default)
        max_in_flight_tokens=(2 if async_scheduling else 1) * max_num_batched_tokens,
    )


def model_kv_cache_groups(model: ModelSpec, block_size: int, kv_cache_dtype: str = "auto",
                          tp: int = 1, disable_hybrid_kv_cache_manager: bool | None = None,
                          enable_prefix_caching: bool = True) -> tuple[KVCacheGroups, int, bool]:
    """vLLM's KV-cache groups of ``model``: (groups, block size, hybrid manager off).

    ``disable_hybrid_kv_cache_manager`` None is vLLM 0.33's choice (see
    :func:`kv_capacity`). The block size is raised for Mamba state
    (:func:`kvsim.specs.kv_groups.model_layer_specs`). Raises ``ValueError``
    when vLLM cannot put the layers in one group with the manager off.
    """
    if disable_hybrid_kv_cache_manager is None:
        disable_hybrid_kv_cache_manager = "chunked_attention" in model.layer_types
    specs, block_size = model_layer_specs(
        model, block_size, kv_cache_dtype, tp,
        mamba_cache_mode="align" if enable_prefix_caching else "none")
    return (get_kv_cache_groups(specs, disable_hybrid_kv_cache_manager), block_size,
            disable_hybrid_kv_cache_manager)


def _does_not_fit(model: ModelSpec, gpu: GPUSpec, parallel: ParallelConfig, util: float,
                  requested: int, weights: int, overhead: int, available: int,
                  block_bytes: int, kv_cache_dtype: str, block_size: int) -> str:
    gib = lambda n: f"{n / GIB:.1f} GiB"  # noqa: E731
    layout = f"tp={parallel.tp}" + (f", dp={parallel.dp}" if parallel.dp > 1 else "") + (
        f", ep={parallel.expert_parallel_size}" if parallel.use_ep else "")
    what = (f"{model.name} needs {gib(weights)} of weights per GPU at {layout} "
            f"plus {gib(overhead)} of activations and overheads")
    have = f"{gpu.name} has {gib(requested)} at gpu_memory_utilization={util:g}"
    if available > 0:
        have += f", leaving {available:,} bytes, less than 2 KV blocks of {block_bytes:,}"
    hint = _fitting_tp(model, parallel, requested, overhead, block_size, kv_cache_dtype)
    return f"{what}; {have}; {hint}"


def _fitting_tp(model: ModelSpec, parallel: ParallelConfig, requested: int, overhead: int,
                block_size: int, kv_cache_dtype: str) -> str:
    # The smallest larger TP vLLM accepts for this model (parallel.check) whose
    # weights leave room; overheads kept at the current layout's: a safe bound.
    for t in range(parallel.tp + 1, 65):
        p = ParallelConfig(t, parallel.dp, parallel.enable_expert_parallel)
        try:
            p.check(model)
        except ValueError:
            continue
        block_bytes = model.kv_bytes_per_block(block_size, kv_cache_dtype, t)
        weights = model.weight_bytes(t, dp=p.dp, expert_parallel=p.enable_expert_parallel)
        if requested - weights - overhead >= 2 * block_bytes:
            return f"try --tp {t} or more, a GPU with more memory, or a higher gpu_memory_utilization"
    return "it does not fit at any tp up to 64; choose a GPU with more memory"


def _check_int(name: str, value, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"{name} must be {what}, got {value!r}")
