"""``engine.prefix_cache: radix`` in scenario files: it runs, and bad input is one line.

The hash default is byte-identical to before (the golden and oracle tests
check it); here: the radix keys reach the KV manager, a run is deterministic,
and every knob a radix cache cannot honour is refused with a line naming it.
"""

from __future__ import annotations

import pytest

import kvsim
from kvsim.kv.radix_manager import RadixKVManager
from kvsim.scenario.loader import load_scenario


def base(**engine) -> dict:
    return {"name": "radix", "seed": 1, "model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm"},
            "engine": {"num_gpu_blocks_override": 200, "block_size": 16, "max_model_len": 1024,
                       "max_num_batched_tokens": 256, "prefix_cache": "radix", **engine},
            "cost_model": {"type": "constant", "step_time_s": 0.01},
            "workload": {"num_requests": 40, "arrival": {"type": "poisson", "rate": 50.0},
                         "prompt_len": {"type": "uniform", "low": 20, "high": 300},
                         "output_len": {"type": "uniform", "low": 1, "high": 40},
                         "prefix": {"shared_prompt_tokens": 100, "num_groups": 2}}}


def test_the_radix_keys_reach_the_kv_manager():
    sc = load_scenario(base(radix={"page_size": 16, "eviction_policy": "lfu", "split_prompt": True}))
    kv = sc.sched_config.make_kv_manager()
    assert isinstance(kv, RadixKVManager)
    assert (kv.page_size, kv.tree.eviction_policy, kv.tree.split_prompt) == (16, "lfu", True)
    assert load_scenario(base()).sched_config.radix_page_size == 1


def test_a_radix_run_is_deterministic_and_hits_a_100_token_prefix_token_for_token():
    a, b = kvsim.simulate(base()), kvsim.simulate(base())
    assert a.summary == b.summary and a.requests.equals(b.requests)
    assert a.summary["completed"] == 40
    # A 100-token shared prompt: the tree hits all 100 (and no more: the user
    # turns are fresh ids); vLLM's hash cache hits the 6 full 16-token blocks.
    assert set(a.requests["num_cached_tokens"]) == {0, 100}
    hashed = kvsim.simulate(base(prefix_cache="hash")).requests
    assert set(hashed["num_cached_tokens"]) == {0, 96}


@pytest.mark.parametrize("engine, workload, message", [
    ({"enable_prefix_caching": False}, {},
     "engine.enable_prefix_caching: false with engine.prefix_cache: radix"),
    ({"scheduler": "continuous", "max_num_batched_tokens": 1024}, {},
     "engine.scheduler: 'continuous' with engine.prefix_cache: radix"),
    ({"radix": {"page_size": 8}}, {}, "engine.radix.page_size: got 8; allowed: 1"),
    ({"watermark": 0.01}, {}, "engine.watermark: got 0.01"),
    ({"radix": {"eviction_policy": "slru"}}, {}, "engine.radix.eviction_policy: got 'slru'"),
    ({"radix": {"bogus": 1}}, {}, "engine.radix.bogus: unknown key"),
    ({"prefix_cache": "hash", "radix": {"page_size": 1}}, {},
     "engine.radix: set, but engine.prefix_cache is 'hash'"),
    ({}, {"cache_salt": "s"}, "workload.cache_salt: set with engine.prefix_cache: radix"),
])
def test_a_knob_radix_cannot_honour_is_one_line_naming_it(engine, workload, message):
    sc = base(**engine)
    sc["workload"].update(workload)
    with pytest.raises(kvsim.ScenarioError) as err:
        load_scenario(sc)
    text = str(err.value)
    assert text.startswith(message) and "\n" not in text


def test_watermark_is_honoured_with_pages_of_the_block_size():
    sc = load_scenario(base(watermark=0.01, radix={"page_size": 16}))
    assert sc.sched_config.watermark == 0.01
