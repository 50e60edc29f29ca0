"""The fast path gives the same results as the step-by-step path.

Both paths run the same scenarios (prefix hits, chunking, preemption, arrivals
during decode runs, a roofline cost model) and must agree on every per-request
time, every step and the summary. Times are compared exactly: the fast path
accumulates step times left to right, as the clock does, and the cost model's
vectorised decode time equals its per-step time bit for bit.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import kvsim

TRACES = "../../shared/data/traces"


def scenario(**over) -> dict:
    sc = {
        "name": "fast-vs-step", "seed": 3, "model": "llama-3.1-8b",
        "hardware": {"gpu": "h100-sxm"},
        "engine": {"max_num_batched_tokens": 512, "max_model_len": 4096},
        "cost_model": {"type": "roofline"},
        "workload": {"num_requests": 120, "arrival": {"type": "poisson", "rate": 20.0},
                     "prompt_len": {"type": "lognormal", "median": 300, "sigma": 0.8, "max": 2000},
                     "output_len": {"type": "uniform", "low": 20, "high": 300},
                     "prefix": {"shared_prompt_tokens": 128, "num_groups": 3}},
    }
    for key, value in over.items():
        section, _, name = key.partition("__")
        if name:
            sc[section] = {**sc[section], name: value}
        else:
            sc[section] = value
    return sc


CASES = {
    "prefix_hits_and_chunking": scenario(),
    "tight_memory_preemptions": scenario(engine__num_gpu_blocks_override=300),
    "caching_off_block_32": scenario(engine__enable_prefix_caching=False, engine__block_size=32),
    "constant_cost_closed_loop": scenario(
        cost_model={"type": "constant", "step_time_s": 0.01},
        workload={"num_requests": 60, "arrival": {"type": "closed_loop", "concurrency": 7},
                  "output_len": {"type": "uniform", "low": 5, "high": 90}}),
    "overloaded_max_num_seqs": scenario(engine__max_num_seqs=6,
                                        workload={**scenario()["workload"],
                                                  "arrival": {"type": "poisson", "rate": 80.0}}),
    "overloaded_kv_blocked_head": scenario(engine__num_gpu_blocks_override=300,
                                           workload={**scenario()["workload"],
                                                     "arrival": {"type": "poisson", "rate": 80.0}}),
    "overloaded_chunking_off_threshold": scenario(
        engine={"max_num_batched_tokens": 4096, "max_model_len": 4096, "max_num_seqs": 10,
                "enable_chunked_prefill": False, "long_prefill_token_threshold": 64},
        workload={**scenario()["workload"], "arrival": {"type": "poisson", "rate": 80.0}}),
    "multi_turn_sessions": scenario(
        workload={"num_requests": 60, "arrival": {"type": "poisson", "rate": 5.0},
                  "sessions": {"turns": 3, "think_time_s": 0.5},
                  "output_len": {"type": "fixed", "value": 40}}),
    # Requests capped at max_model_len (and some too long to run at all).
    "max_model_len_cap": scenario(engine__max_model_len=640, engine__max_num_batched_tokens=256),
    # Priority scheduling with preemptions: the victim is the worst running request.
    "priority_tight_memory": scenario(
        engine={"max_num_batched_tokens": 512, "max_model_len": 4096, "policy": "priority",
                "num_gpu_blocks_override": 300},
        workload={**scenario()["workload"], "arrival": {"type": "poisson", "rate": 60.0},
                  "priority": {"values": [0, 1, 2]}}),
    # n > 1: siblings share their prompt blocks through the prefix cache.
    "parallel_sampling": scenario(workload={**scenario()["workload"], "num_requests": 50, "n": 3}),
}

# vLLM 0.33 scheduler knobs and queue limits (issue #17): each on, loaded.
_BUSY = {**scenario()["workload"], "arrival": {"type": "poisson", "rate": 80.0}}
CASES.update({
    "max_num_scheduled_tokens": scenario(engine__max_num_scheduled_tokens=160, workload=_BUSY),
    "max_num_active_seqs": scenario(engine__max_num_active_seqs=4, workload=_BUSY),
    "adaptive_long_prefill_threshold": scenario(engine__long_prefill_token_threshold=32,
                                                engine__long_prefill_token_threshold_adaptive=True,
                                                workload=_BUSY),
    "prefill_schedule_interval": scenario(engine__prefill_schedule_interval=4),
    "prefill_schedule_interval_backlog": scenario(engine__prefill_schedule_interval=3,
                                                  engine__max_num_seqs=8, workload=_BUSY),
    "prefill_schedule_interval_tight_memory_priority": scenario(
        engine={"max_num_batched_tokens": 512, "max_model_len": 4096, "policy": "priority",
                "num_gpu_blocks_override": 300, "prefill_schedule_interval": 3},
        workload={**scenario()["workload"], "arrival": {"type": "poisson", "rate": 60.0},
                  "priority": {"values": [0, 1, 2]}}),
    # A chunk of a resumed request that stops one token short of its end looks
    # like a decode, but a held step skips it.
    "prefill_schedule_interval_resumed_chunks": scenario(
        seed=1, engine={"block_size": 4, "num_gpu_blocks_override": 24, "max_num_batched_tokens": 16,
                        "max_num_seqs": 3, "max_model_len": 52, "prefill_schedule_interval": 2,
                        "policy": "priority"},
        cost_model={"type": "constant", "step_time_s": 1.0},
        workload={"num_requests": 30, "arrival": {"type": "poisson", "rate": 0.2},
                  "prompt_len": {"type": "uniform", "low": 2, "high": 30},
                  "output_len": {"type": "uniform", "low": 1, "high": 30},
                  "prefix": {"shared_prompt_tokens": 8, "num_groups": 2},
                  "priority": {"values": [0, 1, 2]}}),
    "queue_limits": scenario(engine__max_num_queued_reqs=40, engine__max_num_queued_tokens=1500,
                             workload=_BUSY),
})


def radix_case(name: str, page_size: int) -> dict:
    """A case above with SGLang's radix cache behind the chunked scheduler."""
    sc = CASES[name]
    return {**sc, "engine": {**sc["engine"], "prefix_cache": "radix",
                             "radix": {"page_size": page_size}}}


# The radix strategy (kv/radix_manager.py): token-granular (page 1) and paged.
RADIX_CASES = {f"radix_p{ps}_{name}": radix_case(name, ps)
               for name in ("prefix_hits_and_chunking", "tight_memory_preemptions",
                            "overloaded_kv_blocked_head", "multi_turn_sessions",
                            "priority_tight_memory", "parallel_sampling")
               for ps in (1, 16)}


def both(sc: dict):
    steps_fast, steps_slow = [], []
    fast = kvsim.simulate(sc, trace=steps_fast.append)
    slow = kvsim.simulate(sc, trace=steps_slow.append, fast_path=False)
    return fast, slow, steps_fast, steps_slow


@pytest.mark.parametrize("name", list(CASES) + list(RADIX_CASES))
def test_fast_path_equals_step_path(name):
    fast, slow, trace_fast, trace_slow = both({**CASES, **RADIX_CASES}[name])
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)
    assert trace_fast == trace_slow
    np.testing.assert_array_equal(fast.itl_s, slow.itl_s)
    assert fast.summary == slow.summary


def test_fast_path_actually_skips_steps():
    stats = kvsim.simulate(CASES["prefix_hits_and_chunking"]).stats
    assert stats.num_run_steps > stats.num_steps / 2


def test_prompt_ending_on_a_one_token_chunk_gets_its_first_token_time():
    # A 1,025-token prompt with a 512-token budget leaves a 1-token last chunk:
    # it looks like a decode but produces the request's first token.
    sc = scenario(workload={"num_requests": 3, "arrival": {"type": "poisson", "rate": 1.0},
                            "prompt_len": {"type": "fixed", "value": 1025},
                            "output_len": {"type": "fixed", "value": 30}})
    fast, slow, _, _ = both(sc)
    assert fast.requests["first_token_time_s"].notna().all()
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)


def test_streaming_metrics_match_the_full_tables():
    sc = CASES["prefix_hits_and_chunking"]
    full = kvsim.simulate(sc)
    streamed = kvsim.simulate(sc, streaming=True)
    assert streamed.requests.empty
    for key, value in full.summary.items():
        got = streamed.summary[key]
        if key.startswith(("p90_", "p99_", "median_")):
            assert got == pytest.approx(value, rel=0.005), key   # log-histogram percentiles
        elif isinstance(value, float):
            assert got == pytest.approx(value, rel=1e-9, nan_ok=True), key
        else:
            assert got == value, key


def test_streaming_flushes_in_chunks_without_losing_requests_or_steps():
    from kvsim.scenario.loader import load_scenario
    from kvsim.scenario.simulate import StreamingSink
    from kvsim.sim.run import run_engine
    from kvsim.workload import build_workload
    sc = load_scenario(CASES["prefix_hits_and_chunking"])
    full = kvsim.simulate(sc)
    wl = build_workload(sc.workload, rng=np.random.default_rng(sc.seed), base_dir=sc.base_dir)
    sink = StreamingSink(None)
    seen_steps = []
    original = sink.add_steps
    sink.add_steps = lambda cols: (seen_steps.extend(cols["step"]), original(cols))
    run_engine(wl.requests(), sc.sched_config, cost_model=sc.cost_model, sink=sink, flush_every=7)
    assert sink.stats.completed == full.summary["completed"]
    assert seen_steps == list(range(len(full.steps)))


def test_blocked_head_whose_prefix_a_running_request_is_writing(tmp_path):
    # B quotes A's prompt and A's answer; B waits (too few blocks) while A
    # decodes the very blocks B would hit: the fast path must not skip past
    # the step where B's hit grows.
    import json
    prompt = list(range(1, 41))
    answer = list(range(500, 560))
    lines = [
        {"id": "A", "arrival_time": 0.0, "prompt_token_ids": prompt, "max_tokens": 60,
         "output_token_ids": answer},
        {"id": "B", "arrival_time": 0.125, "prompt_token_ids": prompt + answer + [7, 8, 9],
         "max_tokens": 20},
    ]
    path = tmp_path / "reqs.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    # 26 usable blocks: B (26 blocks) fits only when every block A has filled is a hit.
    sc = scenario(engine={"block_size": 4, "num_gpu_blocks_override": 27,
                          "max_num_batched_tokens": 64, "max_model_len": 104},
                  cost_model={"type": "constant", "step_time_s": 1.0},
                  workload={"requests_file": str(path)})
    fast, slow, trace_fast, trace_slow = both(sc)
    assert trace_fast == trace_slow
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    assert fast.requests.set_index("request_id").loc["B", "num_cached_tokens"] > 40


def test_a_held_head_is_admitted_when_a_running_request_caches_its_prefix(tmp_path):
    # prefill_schedule_interval holds H (13 tokens, prompt left) while Q decodes;
    # Q writes the blocks H quotes, and once H's hit covers all but its last
    # token (step 9) a held step admits it: a decode run must stop there.
    import json
    answer = list(range(300, 330))
    lines = [
        {"id": "Q", "arrival_time": 0.0, "prompt_token_ids": [60, 61, 62], "max_tokens": 30,
         "output_token_ids": answer},
        {"id": "H", "arrival_time": 1.5, "prompt_token_ids": [60, 61, 62] + answer[:9] + [999],
         "max_tokens": 5},
    ]
    path = tmp_path / "reqs.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    sc = scenario(engine={"block_size": 4, "num_gpu_blocks_override": 64, "max_num_batched_tokens": 64,
                          "max_model_len": 128, "prefill_schedule_interval": 16},
                  cost_model={"type": "constant", "step_time_s": 1.0},
                  workload={"requests_file": str(path)})
    fast, slow, trace_fast, trace_slow = both(sc)
    assert trace_fast == trace_slow
    assert [s["step"] for s in trace_slow if "H" in s["prefix_hit_tokens"]] == [9]
    assert trace_slow[9]["prefix_hit_tokens"] == {"H": 12}
    assert fast.stats.num_run_steps > 0


def test_the_fast_path_skips_the_steps_a_prefill_interval_holds():
    stats = kvsim.simulate(CASES["prefill_schedule_interval"]).stats
    assert stats.num_run_steps > stats.num_steps / 2


def test_radix_fast_path_skips_steps_and_radix_runs_differ_from_hash():
    fast = kvsim.simulate(RADIX_CASES["radix_p1_prefix_hits_and_chunking"])
    assert fast.stats.num_run_steps > fast.stats.num_steps / 2
    hashed = kvsim.simulate(CASES["parallel_sampling"]).summary["prefix_cache_hit_rate"]
    radix = kvsim.simulate(RADIX_CASES["radix_p1_parallel_sampling"]).summary["prefix_cache_hit_rate"]
    assert radix < hashed              # siblings admitted together miss in the tree (G3)


def test_radix_blocked_head_sees_a_running_requests_answer_only_at_its_finish(tmp_path):
    # As the hash test above, paged radix (page = block = 4 tokens): B waits,
    # 16 new pages short of 15 free; the tree takes A's answer in only when A
    # finishes (G3), so B's hit never grows while A decodes, as the hash
    # cache's does; at A's finish it is (prompt + answer)[:-1] in whole pages.
    import json
    prompt = list(range(1, 41))
    answer = list(range(500, 560))
    lines = [
        {"id": "A", "arrival_time": 0.0, "prompt_token_ids": prompt, "max_tokens": 60,
         "output_token_ids": answer},
        {"id": "B", "arrival_time": 0.125, "prompt_token_ids": prompt + answer + [7, 8, 9],
         "max_tokens": 20},
    ]
    path = tmp_path / "reqs.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    sc = scenario(engine={"block_size": 4, "num_gpu_blocks_override": 27,
                          "max_num_batched_tokens": 64, "max_model_len": 104,
                          "prefix_cache": "radix", "radix": {"page_size": 4}},
                  cost_model={"type": "constant", "step_time_s": 1.0},
                  workload={"requests_file": str(path)})
    fast, slow, trace_fast, trace_slow = both(sc)
    assert trace_fast == trace_slow
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    b = fast.requests.set_index("request_id").loc["B"]
    a = fast.requests.set_index("request_id").loc["A"]
    assert b["num_cached_tokens"] == (40 + 60 - 1) // 4 * 4
    assert b["scheduled_time_s"] >= a["finish_time_s"]
