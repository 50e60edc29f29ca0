"""Prefix-cache hits of a run in tokens and in blocks, as vLLM counts them.

vLLM's ``PrefixCacheStats.record(num_tokens, num_hits, preempted)``
(``vllm/v1/metrics/stats.py``) adds a request's lookup when it is first
scheduled: ``queries`` += its tokens, ``hits`` += the tokens found cached;
the Prometheus counters ``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits``
are those sums (``kvsim.metrics.prometheus``; re-admissions after a
preemption are vLLM's separate ``preempted_*`` fields, not counted here).

In blocks: a hit of ``h`` tokens covers ``h // block_size`` whole engine
blocks. vLLM's hash cache hits whole blocks only, so its ``partial_block_hit_tokens``
(``h % block_size``, summed) is always 0; SGLang's token-granular radix cache
(``engine.prefix_cache: radix``, page size 1) also hits the tokens of a last,
partly shared block, and that sum is exactly what token granularity gains.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def prefix_cache_stats(requests: pd.DataFrame, block_size: int) -> dict[str, float]:
    """vLLM's prefix-cache totals over the requests scheduled at least once.

    ``requests`` is ``Result.requests``; returns ``requests`` (lookups),
    ``queries`` and ``hits`` (tokens), ``hit_rate`` (hits / queries, NaN when
    nothing was looked up), ``hit_requests`` (lookups that hit anything),
    ``hit_blocks`` (whole engine blocks hit) and ``partial_block_hit_tokens``
    (hit tokens beyond the last whole block).
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    looked_up = np.isfinite(requests["scheduled_time_s"].to_numpy(dtype=float))
    queries = requests["num_prompt_tokens"].to_numpy(dtype=np.int64)[looked_up]
    hits = requests["num_cached_tokens"].to_numpy(dtype=np.int64)[looked_up]
    num_queries, num_hits = int(queries.sum()), int(hits.sum())
    return {
        "requests": int(looked_up.sum()),
        "queries": num_queries,
        "hits": num_hits,
        "hit_rate": num_hits / num_queries if num_queries else float("nan"),
        "hit_requests": int((hits > 0).sum()),
        "hit_blocks": int((hits // block_size).sum()),
        "partial_block_hit_tokens": int((hits % block_size).sum()),
    }
