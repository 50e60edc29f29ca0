"""Engine knobs the schedulers read, under vLLM's names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SchedulerConfig:
    """Resolved scheduler settings (the scenario loader fills in the defaults).

    ``num_gpu_blocks`` counts vLLM's null block, so ``num_gpu_blocks - 1``
    blocks are usable (kv-semantics B2).
    """

    num_gpu_blocks: int
    block_size: int = 16
    max_model_len: int = 4096
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    policy: str = "fcfs"                      # fcfs | priority
    # vLLM 0.33 SchedulerConfig (vllm/config/scheduler.py); chunked only.
    max_num_scheduled_tokens: int | None = None   # tokens issued per step; None: max_num_batched_tokens
    max_num_active_seqs: int | None = None        # cap on RUNNING at admission; None: max_num_seqs
    long_prefill_token_threshold_adaptive: bool = False   # floor the threshold at a fair share
    prefill_schedule_interval: int = 1        # prefill only every N executed steps (1: every step)
    # vLLM's API server refuses requests past these with HTTP 503 (sim/admission.py)
    max_num_queued_reqs: int | None = None
    max_num_queued_tokens: int | None = None
    scheduler_reserve_full_isl: bool = True   # vLLM 0.20+ admission gate (N1)
    watermark: float = 0.0                    # fraction of blocks kept free at admission (N2)
    lifo_unhashed_free: bool = True           # vLLM 0.27+ LIFO reuse of unhashed blocks (B7)
    # continuous (V0) only
    preemption_mode: str = "recompute"        # recompute | swap
    num_cpu_blocks: int = 0                   # swap space, in blocks
    swap_block_bytes: int = 0                 # bytes of one block, for swap traffic
    debug: bool = False                       # keep tokens per block; check every hit
    # What the engine loop reads (kvsim.sim.engine; engine time, issue #13)
    stream_interval: int = 1                  # vLLM --stream-interval (kvsim.sim.client)
    async_scheduling: bool = False            # vLLM V1 async scheduling (kvsim.sim.inbox; chunked)
    speculative: object = None                # kvsim.sched.spec_decode.SpeculativeConfig or None
    # continuous only: vLLM 0.6 multi-step decode windows (kvsim.sched.multistep)
    num_scheduler_steps: int = 1
    # orca only: the contiguous reservation per request (kvsim.sched.orca)
    orca_reservation: str = "max"             # max | pow2 | oracle
    # vLLM's KV-cache groups (kvsim.specs.kv_groups.KVCacheGroups); several of them
    # run the hybrid KV manager (kv/hybrid.py). None: one full-attention group.
    kv_groups: Any = None
    # The prefix cache behind the KV manager facade: hash (vLLM's hashed full
    # blocks, kv/manager.py) or radix (SGLang's RadixCache, kv/radix_manager.py).
    prefix_cache: str = "hash"
    radix_page_size: int = 1                  # SGLang --page-size: 1 or block_size
    radix_eviction_policy: str = "lru"        # SGLang 0.5.x --radix-eviction-policy
    radix_split_prompt: bool = False          # SGLang 0.5.x's prompt insert at finish

    @property
    def keeps_token_ids(self) -> bool:
        """Whether requests keep their token ids: the radix tree is keyed by them."""
        return self.debug or self.prefix_cache == "radix"

    @property
    def hashes_blocks(self) -> bool:
        """Whether requests hash their blocks: only the hash prefix cache reads them."""
        return self.enable_prefix_caching and self.prefix_cache == "hash"

    @property
    def is_hybrid(self) -> bool:
        """Whether the KV manager keeps more than one full-attention table: several
        groups, or one that drops blocks (sliding window, chunked local, Mamba),
        which vLLM serves with the same single-type managers (one coordinator)."""
        g = self.kv_groups
        return g is not None and (g.is_hybrid or g.groups[0].kind != "full_attention")

    @property
    def max_in_flight_tokens(self) -> int:
        """vLLM VllmConfig.max_in_flight_tokens: max_concurrent_batches (2 with async
        scheduling, else 1) x max_num_batched_tokens; the hybrid manager's
        sliding/chunked groups reserve for them at admission (issue 16)."""
        return self.max_num_batched_tokens * (2 if self.async_scheduling else 1)

    def blocks_per_request(self, num_tokens: int) -> int:
        """Blocks one request of ``num_tokens`` tokens holds at most, all groups."""
        if not self.is_hybrid:
            return -(-min(num_tokens, self.max_model_len) // self.block_size)
        from kvsim.kv.hybrid import blocks_per_request
        return blocks_per_request(self.kv_groups, num_tokens, max_model_len=self.max_model_len,
                                  max_in_flight_tokens=self.max_in_flight_tokens,
                                  enable_caching=self.enable_prefix_caching)

    def make_kv_manager(self):
        """The paged KV manager these settings describe: SGLang's radix cache
        (``prefix_cache: radix``), vLLM's hybrid manager for several KV-cache
        groups (``disable_hybrid_kv_cache_manager`` leaves one), or vLLM's."""
        if self.prefix_cache not in ("hash", "radix"):
            raise ValueError(f"engine.prefix_cache: {self.prefix_cache!r} is not one of 'hash', 'radix'")
        if self.prefix_cache == "radix":
            if self.is_hybrid:
                raise ValueError("engine.prefix_cache: radix with several KV-cache groups is not modelled")
            from kvsim.kv.radix_manager import RadixKVManager
            return RadixKVManager(self.num_gpu_blocks, self.block_size, max_model_len=self.max_model_len,
                                  page_size=self.radix_page_size,
                                  eviction_policy=self.radix_eviction_policy,
                                  split_prompt=self.radix_split_prompt, debug=self.debug)
        if self.is_hybrid:
            from kvsim.kv.hybrid import HybridKVCacheManager
            return HybridKVCacheManager(
                self.kv_groups, self.num_gpu_blocks, max_model_len=self.max_model_len,
                max_num_batched_tokens=self.max_num_batched_tokens,
                long_prefill_token_threshold=self.long_prefill_token_threshold,
                enable_caching=self.enable_prefix_caching, lifo_unhashed=self.lifo_unhashed_free,
                max_in_flight_tokens=self.max_in_flight_tokens)
        from kvsim.kv.manager import KVCacheManager
        return KVCacheManager(self.num_gpu_blocks, self.block_size, max_model_len=self.max_model_len,
                              enable_caching=self.enable_prefix_caching,
                              lifo_unhashed=self.lifo_unhashed_free, debug=self.debug)
