"""``engine.kv_offloading_size`` / ``engine.kv_offloading``: CPU (and disk) KV offload tiers for a run.

vLLM 0.33: ``--kv-offloading-size GiB`` with ``--kv-offloading-backend native``
sets the ``OffloadingConnector`` with ``cpu_bytes_to_use = size * 2**30``
(``VllmConfig._post_init_kv_transfer_config``); ``CPUOffloadingSpec`` holds
``cpu_bytes_to_use // round_up(bytes per chunk, page size)`` chunks, where a
chunk is ``blocks_per_chunk`` GPU blocks of every TP rank
(``worker_kv_bytes_per_block * world_size``). ``OffloadSettings`` is that
sizing, resolved once per scenario; ``make_connector()`` builds a fresh
connector (kv/offload_engine.py) for each run. docs/kv_tiers.md section 2.

``kv_offloading_backend: lmcache`` (vLLM: ``LMCacheMPConnector``, which does
not receive ``kv_offloading_size``) is ``LMCacheSettings``: the store is sized
by the LMCache server's own configuration, ``engine.lmcache``
(kv/lmcache_connector.py, kv/lmcache_server.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from kvsim.kv.offload import OffloadTier, TierSpec
from kvsim.metrics.schema import CONNECTOR_REQUEST_COLUMNS
from kvsim.scenario.schema import KVOffloadingSection, LMCacheSection, ScenarioError

if TYPE_CHECKING:           # the connectors are imported when one is made (not by every run)
    from kvsim.kv.lmcache_connector import LMCacheMPConnector
    from kvsim.kv.offload_engine import OffloadConnector

GIB = 1 << 30
UNBOUNDED = 1 << 60      # bytes: an L2 with no capacity of its own (LMCache's fs adapter)
PAGE_BYTES = 4096        # vLLM SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT = mmap.PAGESIZE (x86-64 Linux)


@dataclass(frozen=True)
class OffloadSettings:
    """What one engine's offload tiers are: sizes in chunks, links, the chunk."""

    block_size: int
    blocks_per_chunk: int
    chunk_bytes: int                 # one chunk, all TP ranks, page-aligned
    tp: int
    cpu: TierSpec
    disk: TierSpec | None = None
    remote: TierSpec | None = None

    def make_connector(self, shared: dict | None = None) -> OffloadConnector:
        """A fresh connector; with ``shared`` (one dict per fleet run) every replica's
        remote tier is the same store, and its network link one queue."""
        from kvsim.kv.offload_engine import OffloadConnector
        from kvsim.kv.offload_stack import OffloadTiers

        tiers = [OffloadTier(self.cpu, self.chunk_bytes)]
        if self.disk is not None:
            tiers.append(OffloadTier(self.disk, self.chunk_bytes))
        links = None
        if self.remote is not None:
            if shared is None:
                tiers.append(OffloadTier(self.remote, self.chunk_bytes))
            else:
                if shared.setdefault("chunk_bytes", self.chunk_bytes) != self.chunk_bytes:
                    raise ScenarioError("engine.kv_offloading.remote: the pools' chunks differ "
                                        "(model, TP or blocks_per_chunk); one shared store holds one size")
                tiers.append(shared.setdefault("remote", OffloadTier(self.remote, self.chunk_bytes)))
                links = shared.setdefault("links", {})
        return OffloadConnector(OffloadTiers(tiers), block_size=self.block_size,
                                blocks_per_chunk=self.blocks_per_chunk, link_parallelism=self.tp,
                                shared_links=links)

    @property
    def cpu_chunks(self) -> int:
        return self.cpu.capacity_bytes // self.chunk_bytes

    def describe(self) -> str:
        disk = "".join(f", {t.name} {t.capacity_bytes // self.chunk_bytes} chunks at "
                       f"{t.bandwidth_gbps:g} GB/s" for t in (self.disk, self.remote) if t)
        return (f"KV offloading: CPU tier {self.cpu_chunks} chunks of {self.blocks_per_chunk} "
                f"block(s) ({self.chunk_bytes} bytes each) at {self.cpu.bandwidth_gbps:g} GB/s "
                f"per direction{disk}")


@dataclass(frozen=True)
class LMCacheSettings:
    """``kv_offloading_backend: lmcache``: the LMCache server's L1 store, its eviction
    loop and the GPU<->server link (``engine.lmcache``)."""

    block_size: int
    chunk_size: int
    chunk_bytes: int                 # one chunk, all TP ranks, each rank's share 4 KiB-aligned
    tp: int
    l1: TierSpec
    trigger_watermark: float
    eviction_ratio: float
    kv_offloading_size: float        # GiB: switches the connector on, sizes nothing
    l2: TierSpec | None = None       # an fs L2 adapter (local disk)

    def make_connector(self, shared: dict | None = None) -> LMCacheMPConnector:
        """A fresh connector and server (``shared`` is ignored: one server per replica)."""
        from kvsim.kv.lmcache_connector import LMCacheMPConnector
        from kvsim.kv.lmcache_server import LMCacheServer

        l2 = OffloadTier(self.l2, self.chunk_bytes) if self.l2 is not None else None
        server = LMCacheServer(OffloadTier(self.l1, self.chunk_bytes), l2=l2,
                               trigger_watermark=self.trigger_watermark,
                               eviction_ratio=self.eviction_ratio)
        return LMCacheMPConnector(server, block_size=self.block_size, chunk_size=self.chunk_size,
                                  link_parallelism=self.tp)

    @property
    def l1_chunks(self) -> int:
        return self.l1.capacity_bytes // self.chunk_bytes

    def describe(self) -> str:
        l2 = "" if self.l2 is None else (
            ", L2 disk " + (f"{self.l2.capacity_bytes // self.chunk_bytes} chunks"
                             if self.l2.capacity_bytes < UNBOUNDED else "unbounded")
            + f" at {self.l2.bandwidth_gbps:g} GB/s")
        return (f"KV offloading: LMCache (LMCacheMPConnector): server L1 {self.l1_chunks} chunks "
                f"of {self.chunk_size} tokens ({self.chunk_bytes} bytes each) at "
                f"{self.l1.bandwidth_gbps:g} GB/s per direction, LRU evicted above "
                f"{self.trigger_watermark:g} of it{l2}; engine.kv_offloading_size "
                f"({self.kv_offloading_size:g} GiB) only switches it on: vLLM does not pass it "
                f"to LMCache (size the store with engine.lmcache.l1_size_gb)")


def _why_not(eng, scheduler: str, prefix_cache: str, hybrid: bool, what: str) -> str | None:
    """Why a connector cannot run with these engine settings (None: it can)."""
    if scheduler != "chunked":
        return (f"engine.scheduler: {scheduler!r} with KV offloading; vLLM's {what} "
                f"is a V1 connector: use scheduler: chunked")
    if not eng.enable_prefix_caching:
        return ("engine.enable_prefix_caching: false with KV offloading; the offloaded chunks are "
                "keyed by the block hashes: enable prefix caching")
    if prefix_cache != "hash":
        return ("engine.prefix_cache: radix with KV offloading; the radix cache takes no KV from a "
                "connector: use prefix_cache: hash")
    if hybrid:
        return ("KV offloading for a model with several KV-cache groups (sliding window, Mamba) is "
                "not modelled: one full-attention group only")
    return None


def lmcache_settings(eng, *, block_size: int, block_bytes_per_rank: int, tp: int,
                     pcie_bandwidth_gbps: float, scheduler: str, prefix_cache: str,
                     hybrid: bool) -> LMCacheSettings | None:
    """``kv_offloading_backend: lmcache``: vLLM 0.33 (config/vllm.py
    ``_post_init_kv_transfer_config``) sets LMCacheMPConnector only when
    ``kv_offloading_size`` is set, and passes it nothing else."""
    if eng.kv_offloading_size is None:
        if eng.lmcache is not None or eng.kv_offloading is not None:
            key = "lmcache" if eng.lmcache is not None else "kv_offloading"
            raise ScenarioError(f"engine.{key}: set, but vLLM turns KV offloading on only with "
                                f"engine.kv_offloading_size (with backend lmcache any size: "
                                f"LMCache's server sizes the store)")
        return None
    if eng.kv_offloading is not None:
        raise ScenarioError("engine.kv_offloading: the native connector's details with "
                            "kv_offloading_backend: lmcache; the LMCache store is engine.lmcache")
    why = _why_not(eng, scheduler, prefix_cache, hybrid, "LMCacheMPConnector")
    if why:
        raise ScenarioError(why)
    section = eng.lmcache or LMCacheSection()
    if section.chunk_size % block_size:
        # lmcache_integration/multi_process_adapter.py: assert chunk_size % vllm_block_size == 0
        raise ScenarioError(f"engine.lmcache.chunk_size: got {section.chunk_size}; it must be a "
                            f"multiple of engine.block_size ({block_size})")
    per_rank = block_bytes_per_rank * (section.chunk_size // block_size)
    chunk_bytes = -(-per_rank // PAGE_BYTES) * PAGE_BYTES * tp       # --l1-align-bytes 4096
    num_chunks = int(section.l1_size_gb * GIB) // chunk_bytes
    if num_chunks < 1:
        raise ScenarioError(f"engine.lmcache.l1_size_gb: got {section.l1_size_gb!r}; it holds no "
                            f"chunk of {section.chunk_size} tokens ({chunk_bytes} bytes): raise it")
    l1 = TierSpec("cpu", "cpu", num_chunks * chunk_bytes,
                  section.bandwidth_gbps or pcie_bandwidth_gbps, section.latency_us)
    l2 = None
    if (a := section.l2_adapter) is not None:
        size = UNBOUNDED if a.capacity_gib is None else int(a.capacity_gib * GIB)
        if size < chunk_bytes:
            raise ScenarioError(f"engine.lmcache.l2_adapter.capacity_gib: got {a.capacity_gib!r}; it "
                                f"holds no chunk of {chunk_bytes} bytes: raise it")
        l2 = TierSpec("disk", "disk", size // chunk_bytes * chunk_bytes, a.bandwidth_gbps, a.latency_us)
    return LMCacheSettings(l2=l2, block_size=block_size, chunk_size=section.chunk_size,
                           chunk_bytes=chunk_bytes, tp=tp, l1=l1,
                           trigger_watermark=section.eviction_trigger_watermark,
                           eviction_ratio=section.eviction_ratio,
                           kv_offloading_size=eng.kv_offloading_size)


def offload_settings(eng, *, block_size: int, block_bytes_per_rank: int, tp: int, pcie_bandwidth_gbps: float,
                     scheduler: str, prefix_cache: str,
                     hybrid: bool) -> OffloadSettings | LMCacheSettings | None:
    """The tiers ``engine`` asks for, or None; ScenarioError (one line) for what cannot run."""
    if eng.kv_offloading_backend == "lmcache":
        return lmcache_settings(eng, block_size=block_size, block_bytes_per_rank=block_bytes_per_rank,
                                tp=tp, pcie_bandwidth_gbps=pcie_bandwidth_gbps, scheduler=scheduler,
                                prefix_cache=prefix_cache, hybrid=hybrid)
    if eng.lmcache is not None:
        raise ScenarioError(f"engine.lmcache: set with kv_offloading_backend "
                            f"{eng.kv_offloading_backend!r}; it configures the LMCache server: "
                            f"set kv_offloading_backend: lmcache")
    section = eng.kv_offloading
    if eng.kv_offloading_size is None and (section is None or section.num_cpu_blocks is None):
        if section is not None:
            raise ScenarioError("engine.kv_offloading: set, but the CPU tier has no size; set "
                                "engine.kv_offloading_size (GiB) or engine.kv_offloading.num_cpu_blocks")
        return None
    if section is not None and section.num_cpu_blocks is not None and eng.kv_offloading_size is not None:
        raise ScenarioError("engine.kv_offloading.num_cpu_blocks: set with engine.kv_offloading_size; "
                            "give the CPU tier's size once (GiB or blocks)")
    why = _why_not(eng, scheduler, prefix_cache, hybrid, "OffloadingConnector")
    if why:
        raise ScenarioError(why)
    section = section or KVOffloadingSection()
    per_chunk = block_bytes_per_rank * tp * section.blocks_per_chunk
    chunk_bytes = -(-per_chunk // PAGE_BYTES) * PAGE_BYTES
    if section.num_cpu_blocks is not None:
        num_chunks = section.num_cpu_blocks // section.blocks_per_chunk
        where = f"engine.kv_offloading.num_cpu_blocks: got {section.num_cpu_blocks}"
    else:
        num_chunks = int(eng.kv_offloading_size * GIB) // chunk_bytes
        where = f"engine.kv_offloading_size: got {eng.kv_offloading_size!r} GiB"
    if num_chunks < 1:
        raise ScenarioError(f"{where}; it holds no chunk of {section.blocks_per_chunk} block(s) "
                            f"({chunk_bytes} bytes): raise it")
    cpu = TierSpec("cpu", "cpu", num_chunks * chunk_bytes,
                   section.bandwidth_gbps or pcie_bandwidth_gbps, section.latency_us)
    disk = _tier_behind_cpu("disk", section.disk, chunk_bytes)
    remote = _tier_behind_cpu("remote", section.remote, chunk_bytes, shared=True)
    return OffloadSettings(block_size=block_size, blocks_per_chunk=section.blocks_per_chunk,
                           chunk_bytes=chunk_bytes, tp=tp, cpu=cpu, disk=disk, remote=remote)


def with_connector_columns(requests: pd.DataFrame, connectors) -> pd.DataFrame:
    """``requests`` with the columns of ``CONNECTOR_REQUEST_COLUMNS`` (kvsim/metrics/schema.py):
    the GPU / connector split of each request's first-admission hit, and when its
    load started. A request that loaded nothing hit the GPU only
    (``num_cached_tokens``); one that loaded has the split the connector recorded
    (a full-prompt hit counts every token there, though its last is recomputed).
    ``connectors``: one connector (``OffloadConnector``, ``LMCacheMPConnector``) or a
    list (a fleet's replicas)."""
    if not isinstance(connectors, (list, tuple)):
        connectors = [connectors]
    hits: dict = {}
    starts: dict = {}
    for c in connectors:
        hits.update(c.external_hits)
        starts.update(c.load_start_s)
    ids = requests["request_id"]
    cached = requests["num_cached_tokens"].to_numpy(dtype=np.int64)
    local = np.array([hits[r][0] if r in hits else int(n) for r, n in zip(ids, cached)], dtype=np.int64)
    external = np.array([hits[r][1] if r in hits else 0 for r in ids], dtype=np.int64)
    start = np.array([starts.get(r, math.nan) for r in ids], dtype=float)
    return requests.assign(**dict(zip(CONNECTOR_REQUEST_COLUMNS, (local, external, start))))


def offload_summary(connectors, requests) -> dict:
    """The run's offload counters (``OffloadConnector.stats()``, summed over a fleet's
    replicas, a shared tier counted once) with the prefix-cache split vLLM's
    metrics make: ``vllm:prefix_cache_hits`` counts the GPU hit only,
    ``vllm:external_prefix_cache_queries`` the tokens past it and
    ``vllm:external_prefix_cache_hits`` the tokens the tiers supplied, both
    at a request's first admission (vLLM ``Scheduler.schedule``);
    ``prompt_tokens_cached_by_source`` splits the cached tokens into device
    (GPU) and host (loaded from the CPU tier; chunks found below it, on disk or
    in a remote store, are promoted into the CPU tier first and counted under
    ``promoted_chunks``). ``connectors``: one ``OffloadConnector`` or a list;
    ``requests``: ``Result.requests``.
    """
    if not isinstance(connectors, (list, tuple)):
        connectors = [connectors]
    out: dict = {}
    for c in connectors:
        for key, value in c.stats(tiers=False).items():
            out[key] = out.get(key, 0) + value
    seen = set()
    for c in connectors:
        for t in c.tiers.tiers:
            name = t.name            # a fleet: each replica's CPU tiers summed, a shared one once
            if id(t) in seen:
                continue
            seen.add(id(t))
            for key, value in (("chunks_held", len(t)), ("capacity_chunks", t.capacity_chunks),
                               ("chunks_evicted", t.num_evicted)):
                out[f"{name}_{key}"] = out.get(f"{name}_{key}", 0) + value
    looked_up = requests["scheduled_time_s"].notna() & (requests["scheduled_time_s"] < float("inf"))
    split = requests if "num_external_cached_tokens" in requests else with_connector_columns(
        requests, connectors)
    prompt = int(requests["num_prompt_tokens"][looked_up].sum())
    gpu = int(split["num_local_cached_tokens"][looked_up].sum())
    ext = int(split["num_external_cached_tokens"][looked_up].sum())
    queries = prompt - gpu
    out.update({
        "prefix_cache_queries": prompt,
        "prefix_cache_hits": gpu,
        "external_prefix_cache_queries": queries,
        "external_prefix_cache_hits": ext,
        "external_prefix_cache_hit_rate": ext / queries if queries else None,
        "prompt_tokens_cached_by_source": {"device": gpu, "host": ext},
        "promoted_chunks": out["num_promoted_chunks"],
    })
    del out["num_promoted_chunks"]
    return out


def _tier_behind_cpu(name: str, tier, chunk_bytes: int, shared: bool = False) -> TierSpec | None:
    """The ``disk`` or ``remote`` tier of ``engine.kv_offloading`` (None if absent); it must hold a chunk."""
    if tier is None:
        return None
    if int(tier.capacity_gib * GIB) < chunk_bytes:
        raise ScenarioError(f"engine.kv_offloading.{name}.capacity_gib: got {tier.capacity_gib!r}; "
                            f"it holds no chunk of {chunk_bytes} bytes: raise it")
    return TierSpec(name, name, int(tier.capacity_gib * GIB), tier.bandwidth_gbps, tier.latency_us,
                    shared=shared)
