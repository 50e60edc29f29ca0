"""The KV-transfer link of disaggregated serving, and how long a transfer takes.

In prefill/decode disaggregation (vLLM's NixlConnector, llm-d, Dynamo) the
decode replica *pulls* the prompt's KV blocks from the prefill replica once it
has allocated room for them. kvsim models one transfer as::

    time = latency_s + bytes_per_stream / (bandwidth_gbps * 1e9)

where ``bytes_per_stream`` is what one GPU pair moves: the TP ranks move
their shards at the same time, one pair each (NIXL: every worker reads its
own shard; DGX-class nodes have one NIC per GPU). With different TP degrees
on the two sides the side with fewer ranks bounds the transfer
(``kv_bytes_per_stream``).

Transfers that share a port queue behind each other: ``LinkPorts`` gives each
replica one port (all its GPUs' NICs together) and starts a transfer when both
the sending and the receiving replica's ports are free, first come first
served. This keeps the bandwidth a replica can move bounded without modelling
packets.

The catalog is ``data/links.yaml`` (NVLink, InfiniBand, RoCE, TCP), each entry
with the measurement it comes from.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

import yaml

DATA_FILE = Path(__file__).with_name("data") / "links.yaml"


@dataclass(frozen=True)
class LinkSpec:
    """One GPU pair's link: per-direction bandwidth and the fixed cost of a transfer."""

    name: str
    bandwidth_gbps: float
    latency_s: float
    scope: str = "inter_node"

    def __post_init__(self) -> None:
        if not self.bandwidth_gbps > 0:
            raise ValueError(f"link {self.name!r}: bandwidth_gbps must be > 0, got {self.bandwidth_gbps}")
        if not self.latency_s >= 0:
            raise ValueError(f"link {self.name!r}: latency_s must be >= 0, got {self.latency_s}")

    def transfer_time_s(self, bytes_per_stream: int) -> float:
        """Seconds for one GPU pair to move ``bytes_per_stream`` (the pairs run in parallel)."""
        if bytes_per_stream < 0:
            raise ValueError(f"bytes_per_stream must be >= 0, got {bytes_per_stream}")
        if bytes_per_stream == 0:
            return 0.0          # nothing to pull (a full prefix hit on the decode side)
        return self.latency_s + bytes_per_stream / (self.bandwidth_gbps * 1e9)


@lru_cache(maxsize=None)
def _catalog() -> tuple[dict[str, dict], dict[str, str]]:
    with open(DATA_FILE, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    return data["links"], dict(data.get("aliases") or {})


def list_links() -> list[str]:
    """Catalog names, in file order."""
    return list(_catalog()[0])


def link_entry(name: str) -> dict:
    """The raw catalog entry (with its ``source``) of a link name or alias."""
    entries, aliases = _catalog()
    key = name.strip().lower().replace("_", "-")
    key = aliases.get(key, key)
    if key not in entries:
        raise ValueError(f"unknown link {name!r}; catalog: {', '.join(entries)} "
                         f"(aliases: {', '.join(aliases)}), or a mapping "
                         f"{{bandwidth_gbps, latency_s}}")
    return {"name": key, **entries[key]}


def load_link(spec: str | Mapping[str, Any] | LinkSpec) -> LinkSpec:
    """A :class:`LinkSpec` from a catalog name or alias, or a mapping of its fields."""
    if isinstance(spec, LinkSpec):
        return spec
    if hasattr(spec, "model_dump"):              # a cluster.link mapping, validated (config.py)
        spec = spec.model_dump()
    if isinstance(spec, str):
        entry = link_entry(spec)
        return LinkSpec(entry["name"], float(entry["bandwidth_gbps"]), float(entry["latency_s"]),
                        entry.get("scope", "inter_node"))
    return LinkSpec(str(spec.get("name", "custom-link")), float(spec["bandwidth_gbps"]),
                    float(spec.get("latency_s", 0.0)), str(spec.get("scope", "inter_node")))


def kv_bytes_per_stream(num_blocks: int, block_bytes_per_rank: int, tp_prefill: int,
                        tp_decode: int, *, replicated: bool = False) -> int:
    """Bytes one GPU pair moves when ``num_blocks`` KV blocks go from prefill to decode.

    ``block_bytes_per_rank`` is one block's KV on one rank of the prefill
    replica (``ModelSpec.kv_bytes_per_block(block_size, dtype, tp_prefill)``).
    Sharded KV (heads split over TP ranks): the block is that times
    ``tp_prefill`` and moves over ``min(tp_prefill, tp_decode)`` pairs at once.
    ``replicated`` KV (MLA's latent cache, the same on every rank): each decode
    rank pulls a whole copy over its own pair.
    """
    if replicated:
        return num_blocks * block_bytes_per_rank
    return -(-num_blocks * block_bytes_per_rank * tp_prefill // min(tp_prefill, tp_decode))


class LinkPorts:
    """First-come-first-served transfer slots, one port per replica.

    ``reserve(src, dst, now, seconds)`` books a transfer that starts when both
    ``src``'s and ``dst``'s ports are free (and not before ``now``) and returns
    its (start, end). Bookings are made in event order, so the same run books
    the same slots.
    """

    def __init__(self) -> None:
        self._free_at: dict[str, float] = {}

    def reserve(self, src: str, dst: str, now: float, seconds: float) -> tuple[float, float]:
        start = max(now, self._free_at.get(src, 0.0), self._free_at.get(dst, 0.0))
        end = start + seconds
        self._free_at[src] = self._free_at[dst] = end
        return start, end

    def free_at(self, port: str) -> float:
        return self._free_at.get(port, 0.0)
