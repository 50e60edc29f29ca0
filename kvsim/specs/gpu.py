"""What kvsim knows about a GPU: memory, bandwidths and peak compute.

One :class:`GPUSpec` per device type; the catalog (``data/gpus.yaml``, read by
:mod:`kvsim.specs.catalog`) holds the published figures with their sources.
Everything is per GPU: a tensor-parallel group is ``tp`` of these.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1 << 30
MIB = 1 << 20


@dataclass(frozen=True)
class GPUSpec:
    """One GPU, as the KV sizing and the cost model see it.

    * ``memory_bytes``: device total as the driver reports it (what
      ``torch.cuda.mem_get_info()[1]`` returns, which is what vLLM multiplies
      by ``gpu_memory_utilization``). The catalog records per GPU whether the
      figure is that torch total or the ``nvidia-smi`` total (a few hundred
      MiB higher on an H100).
    * ``hbm_bandwidth_gbps``: peak device-memory bandwidth, GB/s (1e9 bytes).
    * ``bf16_tflops`` / ``fp8_tflops``: dense tensor-core peaks (no 2:4
      sparsity); ``fp8_tflops`` is None where there are no FP8 tensor cores.
    * ``interconnect_bandwidth_gbps``: per-GPU, per-direction bandwidth the TP
      all-reduce can use (NVLink where present, else the PCIe link).
    * ``interconnect_latency_us``: fixed cost of one small all-reduce.
    * ``pcie_bandwidth_gbps``: host link per direction (CPU swap).
    * ``fp4_tflops``: dense FP4 tensor-core peak (Blackwell NVFP4/MXFP4), None
      where there is none.
    * ``nvlink_domain_size``: how many GPUs share ``interconnect_bandwidth_gbps``
      (8 in an HGX board, 72 in a GB200 NVL72 rack); None: no limit given.
      A TP/EP group larger than this crosses the scale-out network,
      ``scaleout_bandwidth_gbps`` per GPU per direction (e.g. one 400 Gb/s NIC
      per GPU = 50 GB/s).
    """

    name: str
    memory_bytes: int
    hbm_bandwidth_gbps: float
    bf16_tflops: float
    fp8_tflops: float | None
    interconnect_bandwidth_gbps: float
    interconnect_latency_us: float
    pcie_bandwidth_gbps: float
    source: str = ""
    fp4_tflops: float | None = None
    nvlink_domain_size: int | None = None
    scaleout_bandwidth_gbps: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"gpu.name must be a non-empty string, got {self.name!r}")
        _positive(self.name, "memory_bytes", self.memory_bytes, integer=True)
        for field in ("hbm_bandwidth_gbps", "bf16_tflops", "interconnect_bandwidth_gbps",
                      "pcie_bandwidth_gbps"):
            _positive(self.name, field, getattr(self, field))
        for field in ("fp8_tflops", "fp4_tflops", "scaleout_bandwidth_gbps"):
            if getattr(self, field) is not None:
                _positive(self.name, field, getattr(self, field))
        if self.nvlink_domain_size is not None:
            _positive(self.name, "nvlink_domain_size", self.nvlink_domain_size, integer=True)
        if not _is_number(self.interconnect_latency_us) or self.interconnect_latency_us < 0:
            raise ValueError(f"gpu {self.name}: interconnect_latency_us must be >= 0, "
                             f"got {self.interconnect_latency_us!r}")

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB

    def link_bandwidth_gbps(self, group_size: int) -> float:
        """Per-GPU bandwidth a collective over ``group_size`` GPUs can use.

        Inside the NVLink domain: ``interconnect_bandwidth_gbps``; beyond it,
        the ring or all-to-all is held back by the scale-out network.
        """
        if (self.nvlink_domain_size is not None and group_size > self.nvlink_domain_size
                and self.scaleout_bandwidth_gbps is not None):
            return min(self.interconnect_bandwidth_gbps, self.scaleout_bandwidth_gbps)
        return self.interconnect_bandwidth_gbps


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _positive(owner: str, field: str, value, integer: bool = False) -> None:
    ok = (isinstance(value, int) and not isinstance(value, bool)) if integer else _is_number(value)
    if not ok or value <= 0:
        kind = "a positive integer" if integer else "a positive number"
        raise ValueError(f"gpu {owner}: {field} must be {kind}, got {value!r}")
