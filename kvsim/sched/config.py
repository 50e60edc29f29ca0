"""Engine knobs the schedulers read, under vLLM's names."""

from __future__ import annotations

from dataclasses import dataclass


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
    scheduler_reserve_full_isl: bool = True   # vLLM 0.20+ admission gate (N1)
    watermark: float = 0.0                    # fraction of blocks kept free at admission (N2)
    lifo_unhashed_free: bool = True           # vLLM 0.27+ LIFO reuse of unhashed blocks (B7)
    # continuous (V0) only
    preemption_mode: str = "recompute"        # recompute | swap
    num_cpu_blocks: int = 0                   # swap space, in blocks
    swap_block_bytes: int = 0                 # bytes of one block, for swap traffic
    debug: bool = False                       # keep tokens per block; check every hit
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

    def make_kv_manager(self):
        """The paged KV manager these settings describe."""
        if self.prefix_cache == "radix":
            from kvsim.kv.radix_manager import RadixKVManager
            return RadixKVManager(self.num_gpu_blocks, self.block_size, max_model_len=self.max_model_len,
                                  page_size=self.radix_page_size,
                                  eviction_policy=self.radix_eviction_policy,
                                  split_prompt=self.radix_split_prompt, debug=self.debug)
        if self.prefix_cache != "hash":
            raise ValueError(f"engine.prefix_cache: {self.prefix_cache!r} is not one of 'hash', 'radix'")
        from kvsim.kv.manager import KVCacheManager
        return KVCacheManager(self.num_gpu_blocks, self.block_size, max_model_len=self.max_model_len,
                              enable_caching=self.enable_prefix_caching,
                              lifo_unhashed=self.lifo_unhashed_free, debug=self.debug)
