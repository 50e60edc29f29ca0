"""How a model is split over GPUs: tensor, data and expert parallelism, vLLM's way.

vLLM's flags (``vllm serve``): ``--tensor-parallel-size`` (TP),
``--data-parallel-size`` (DP), ``--enable-expert-parallel`` and
``--all2all-backend``. One engine replica uses ``tp x dp`` GPUs::

    attention, dense MLPs, shared experts, embeddings    split tp ways; each of the
                                                        dp ranks has its own copy
                                                        and its own batch and KV cache
    routed experts, no EP    every GPU holds every expert, its width split tp x dp ways
    routed experts, EP       every GPU holds whole experts: ep = tp x dp ranks,
                             num_experts // ep each, the first num_experts % ep
                             ranks one more

vLLM ``FusedMoEParallelConfig.make`` (model_executor/layers/fused_moe/config.py):
the MoE layer flattens TP across DP (``flatten_tp_across_dp_and_pcp``); with
``enable_expert_parallel`` that flattened size becomes the EP size and the
expert TP size becomes 1. ``determine_expert_map`` (expert_map_manager.py)
places ``num_experts // ep`` experts per rank, the remainder on the first
ranks. "Data-parallel attention" is DP > 1 with EP: attention runs on each DP
rank's own batch while the experts are shared by all ranks.

With DP > 1 the tokens of all DP ranks meet in every MoE layer
(``use_all2all_kernels``: EP and DP > 1): they are dispatched to the experts'
GPUs and combined back, by an all-gather + reduce-scatter
(``all2all_backend="allgather_reducescatter"``, vLLM's default) or an
all-to-all (DeepEP, pplx, ...). kvsim simulates one DP rank and assumes every
rank runs a batch like it (vLLM steps DP ranks in lockstep, idle ranks run
dummy batches).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# vLLM ParallelConfig.all2all_backend values (config/parallel.py, All2AllBackend).
# allgather_reducescatter and naive gather every token to every rank; the
# others send each token only to the ranks that hold its experts.
GATHER_BACKENDS = ("allgather_reducescatter", "naive")
ALL_TO_ALL_BACKENDS = ("pplx", "deepep_high_throughput", "deepep_low_latency", "deepep_v2",
                       "mori_high_throughput", "mori_low_latency", "moonep", "nixl_ep",
                       "flashinfer_all2allv", "flashinfer_nvlink_two_sided",
                       "flashinfer_nvlink_one_sided")
ALL2ALL_BACKENDS = GATHER_BACKENDS + ALL_TO_ALL_BACKENDS
# vLLM ParallelConfig.use_sequence_parallel_moe: with EP, TP > 1 and DP > 1 these
# backends split each DP rank's tokens over its TP ranks before dispatch.
_SEQUENCE_PARALLEL_BACKENDS = ("allgather_reducescatter", "deepep_high_throughput",
                               "deepep_low_latency", "deepep_v2", "flashinfer_nvlink_one_sided",
                               "mori_high_throughput", "mori_low_latency", "nixl_ep")


@dataclass(frozen=True)
class ParallelConfig:
    """One engine replica's parallel layout, under vLLM's names."""

    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    enable_expert_parallel: bool = False
    all2all_backend: str = "allgather_reducescatter"

    def __post_init__(self) -> None:
        for name in ("tensor_parallel_size", "data_parallel_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.enable_expert_parallel, bool):
            raise ValueError(f"enable_expert_parallel must be true or false, "
                             f"got {self.enable_expert_parallel!r}")
        if self.all2all_backend not in ALL2ALL_BACKENDS:
            raise ValueError(f"all2all_backend {self.all2all_backend!r} is not a vLLM backend; "
                             f"allowed: {', '.join(ALL2ALL_BACKENDS)}")

    # ------------------------------------------------------------------ sizes
    @property
    def tp(self) -> int:
        return self.tensor_parallel_size

    @property
    def dp(self) -> int:
        return self.data_parallel_size

    @property
    def world_size(self) -> int:
        """GPUs of one replica."""
        return self.tp * self.dp

    @property
    def use_ep(self) -> bool:
        # FusedMoEParallelConfig.make: use_ep = dp * tp > 1 and enable_expert_parallel
        return self.enable_expert_parallel and self.world_size > 1

    @property
    def expert_parallel_size(self) -> int:
        """EP size: ``tp x dp`` with expert parallelism, else 1."""
        return self.world_size if self.use_ep else 1

    @property
    def moe_tensor_parallel_size(self) -> int:
        """How many ways each routed expert's width is split: 1 under EP, else ``tp x dp``."""
        return 1 if self.use_ep else self.world_size

    @property
    def uses_moe_dispatch(self) -> bool:
        """Whether tokens of several DP ranks must be moved to and from the experts."""
        return self.dp > 1

    @property
    def uses_all_to_all(self) -> bool:
        """vLLM use_all2all_kernels with a backend that sends tokens only where needed."""
        return self.use_ep and self.dp > 1 and self.all2all_backend in ALL_TO_ALL_BACKENDS

    @property
    def sequence_parallel_moe(self) -> bool:
        """vLLM ParallelConfig.use_sequence_parallel_moe."""
        return (self.enable_expert_parallel and self.tp > 1 and self.dp > 1
                and self.all2all_backend in _SEQUENCE_PARALLEL_BACKENDS)

    def local_experts(self, num_experts: int) -> int:
        """Experts on the busiest GPU (vLLM determine_expert_map; KV is sized for it)."""
        if not self.use_ep:
            return num_experts
        return math.ceil(num_experts / self.expert_parallel_size)

    # ------------------------------------------------------------------ checks
    def check(self, model) -> None:
        """Refuse a layout vLLM refuses for ``model``, naming the flag (one line).

        * ``num_attention_heads % tp`` (vLLM ModelConfig.verify_with_parallel_config);
        * KV heads: ``kv % tp`` when tp < kv heads, else ``tp % kv`` (replicas;
          QKVParallelLinear uses ``divide``); MLA keeps one latent per rank;
        * linear-attention (Gated DeltaNet) heads and conv channels ``% tp``
          (MambaStateShapeCalculator.gated_delta_net_state_shape uses ``divide``);
        * ``--enable-expert-parallel`` needs an MoE model
          (ModelConfig._verify_with_expert_parallelism), and at least one expert
          per EP rank.
        """
        tp = self.tp
        name = model.name
        if model.num_attention_heads % tp:
            raise ValueError(
                f"tensor_parallel_size {tp} does not divide {name}'s num_attention_heads "
                f"({model.num_attention_heads}); vLLM refuses it; allowed: "
                f"{_divisors(model.num_attention_heads)}")
        kv = model.num_kv_heads
        if not model.is_mla and kv % tp and tp % kv:
            raise ValueError(
                f"tensor_parallel_size {tp} and {name}'s num_kv_heads ({kv}) do not divide "
                f"one another (KV heads are split, or replicated when tp > kv heads); "
                f"allowed: {_kv_compatible(model.num_attention_heads, kv)}")
        if model.has_linear_attention:
            conv_dim = model.linear_conv_channels
            for what, value in (("linear_num_value_heads", model.linear_num_value_heads),
                                ("linear-attention conv channels", conv_dim)):
                if value % tp:
                    raise ValueError(f"tensor_parallel_size {tp} does not divide {name}'s "
                                     f"{what} ({value}); vLLM refuses it")
        if self.enable_expert_parallel and not model.is_moe:
            raise ValueError(f"enable_expert_parallel: {name} has no experts; vLLM refuses "
                             f"expert parallelism for a dense model")
        ep = self.expert_parallel_size
        if model.is_moe and ep > model.num_experts:
            raise ValueError(
                f"expert-parallel size {ep} (tensor_parallel_size x data_parallel_size) "
                f"exceeds {name}'s num_experts ({model.num_experts}): some GPUs would hold "
                f"no expert; use at most {model.num_experts} GPUs per replica with EP")


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, min(n, 64) + 1) if n % d == 0)


def _kv_compatible(heads: int, kv: int) -> str:
    return ", ".join(str(t) for t in range(1, min(heads, 64) + 1)
                     if heads % t == 0 and (kv % t == 0 or t % kv == 0))
