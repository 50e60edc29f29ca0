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

    @property
    def step_token_budget(self) -> int:
        """The tokens one step may schedule (vLLM 0.33 ``Scheduler.schedule``).

        vLLM keeps two budgets: ``token_budget = max_num_scheduled_tokens``
        (what the scheduler issues; default ``max_num_batched_tokens``) and
        ``input_budget = max_num_batched_tokens`` (what the runner takes, less
        the draft slots of each request under speculative decoding). Each chunk
        is ``min(wanted, token_budget, input_budget - draft_slots)`` and both
        shrink by it, so without draft slots they are one budget: the smaller.
        """
        if self.max_num_scheduled_tokens is None:
            return self.max_num_batched_tokens
        return min(self.max_num_scheduled_tokens, self.max_num_batched_tokens)

    def make_kv_manager(self):
        """The paged KV manager these settings describe."""
        from kvsim.kv.manager import KVCacheManager
        return KVCacheManager(self.num_gpu_blocks, self.block_size, max_model_len=self.max_model_len,
                              enable_caching=self.enable_prefix_caching,
                              lifo_unhashed=self.lifo_unhashed_free, debug=self.debug)
