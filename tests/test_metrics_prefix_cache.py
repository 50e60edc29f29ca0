"""Prefix-cache hits in tokens and blocks (kvsim/metrics/prefix_cache.py), hash and radix.

The totals are vLLM's ``PrefixCacheStats`` (first admissions only), so they
must equal the last sample of the Prometheus counters and the summary's hit
rate; the hash cache never hits part of a block, the radix cache does.
"""

from __future__ import annotations

import math

import pytest
from test_radix_scenarios import base

import kvsim
from kvsim.metrics.prefix_cache import prefix_cache_stats
from kvsim.metrics.prometheus import prometheus_series


@pytest.mark.parametrize("cache", ["hash", "radix"])
def test_hits_in_tokens_and_blocks_match_vllms_counters(cache):
    res = kvsim.simulate(base(prefix_cache=cache))
    stats = prefix_cache_stats(res.requests, block_size=16)
    series = prometheus_series(res.requests, res.steps, max_model_len=1024)
    assert stats["queries"] == series["vllm:prefix_cache_queries_total"].iloc[-1]
    assert stats["hits"] == series["vllm:prefix_cache_hits_total"].iloc[-1]
    assert stats["hit_rate"] == pytest.approx(res.summary["prefix_cache_hit_rate"], rel=1e-12)
    assert stats["hit_blocks"] * 16 + stats["partial_block_hit_tokens"] == stats["hits"]
    # 100-token shared prompts: 6 whole blocks (96 tokens) per hit, plus 4 tokens under radix.
    num_hits = sum(res.requests["num_cached_tokens"] > 0)
    assert stats["hit_blocks"] == 6 * num_hits
    assert stats["partial_block_hit_tokens"] == (4 * num_hits if cache == "radix" else 0)


def test_no_lookup_no_rate():
    import pandas as pd
    empty = pd.DataFrame({"scheduled_time_s": [float("nan")], "num_prompt_tokens": [5],
                          "num_cached_tokens": [0]})
    stats = prefix_cache_stats(empty, block_size=16)
    assert stats["requests"] == 0 and math.isnan(stats["hit_rate"])
    with pytest.raises(ValueError, match="block_size"):
        prefix_cache_stats(empty, block_size=0)
