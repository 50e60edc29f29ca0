"""vLLM 0.6 multi-step scheduling (``engine.num_scheduler_steps``) on the V0 scheduler.

Hand-worked with 1 s steps: a decode window of k steps that no arrival
enters, its tokens in one burst at its end, requests that finish inside a
window kept as padding; the V0 lookahead feasibility; the fast path; bad input.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from helpers import Driver, spec
from test_fast_path import both, scenario

import kvsim


def run(tmp_path, rows, **engine):
    path = tmp_path / "reqs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sc = {"name": "ms", "model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm"},
          "engine": {"scheduler": "continuous", "num_gpu_blocks_override": 200, "block_size": 4,
                     "max_model_len": 128, "max_num_batched_tokens": 128, **engine},
          "cost_model": {"type": "constant", "step_time_s": 1.0},
          "workload": {"requests_file": str(path)}}
    traces = []
    res = kvsim.simulate(sc, trace=traces.append)
    return res, traces


def req(rid, at, prompt, out):
    base = 1000 * (ord(rid) - ord("A") + 1)
    return {"id": rid, "arrival_time": at, "prompt_token_ids": list(range(base, base + prompt)),
            "max_tokens": out}


def test_a_prefill_waits_out_the_window_and_tokens_arrive_in_bursts(tmp_path):
    rows = [req("A", 0.0, 8, 10), req("B", 1.5, 8, 6)]
    res, traces = run(tmp_path, rows, num_scheduler_steps=4)
    assert [t["scheduled"] for t in traces] == (
        [{"A": 8}] + [{"A": 1}] * 4 + [{"B": 8}] + [{"A": 1, "B": 1}] * 8)
    reqs = {r.request_id: r for r in res.requests.itertuples()}
    assert reqs["B"].scheduled_time_s == 5.0             # the window [1, 5] runs A alone
    assert reqs["B"].first_token_time_s == 6.0
    # A and B finish in step [10, 11] but stay in the window as padding until 14.
    assert reqs["A"].finish_time_s == reqs["B"].finish_time_s == 14.0
    assert list(res.steps["num_generated_tokens"]) == [1] * 6 + [2] * 5 + [0] * 3
    assert list(res.steps["num_finished"])[-1] == 2
    # Client: A gets 1 | 2-5 | 6-9 | 10 at t = 1, 5, 10, 14 (three ITLs).
    assert res.summary["mean_ttft_ms"] == pytest.approx((1.0 + 4.5) / 2 * 1000)
    assert sorted(res.itl_s) == [4.0, 4.0, 4.0, 4.0, 5.0]


def test_without_multi_step_the_same_arrival_starts_one_step_after_it(tmp_path):
    res, _ = run(tmp_path, [req("A", 0.0, 8, 10), req("B", 1.5, 8, 6)])
    b = res.requests.set_index("request_id").loc["B"]
    assert (b.scheduled_time_s, b.first_token_time_s) == (2.0, 3.0)


@pytest.mark.parametrize("computed, unseen, want", [
    # block_size 16, k = 8 (7 lookahead slots): 1 + ceil((unseen + 7 - first_chunk) / 16)
    (20, 1, 1), (30, 1, 2), (40, 8, 1), (47, 8, 2), (31, 1, 2), (32, 1, 1),
])
def test_blocks_touched_is_v0s_worst_case_for_the_unseen_tokens_and_the_lookahead(
        computed, unseen, want):
    from kvsim.sched.request import Request
    d = Driver("continuous", num_gpu_blocks=64, block_size=16, num_scheduler_steps=8)
    r = Request(spec("A", range(1, computed + 1), max_tokens=50), 0, block_size=16,
                max_model_len=256)
    r.num_computed_tokens = computed
    r.num_output_tokens = 1                    # num_tokens = computed + 1
    d.sched._unseen["A"] = unseen
    assert d.sched.blocks_touched(r) == want


def test_a_window_start_preempts_when_the_lookahead_does_not_fit(tmp_path):
    # 6 usable blocks of 4; k = 4 reserves each decode 1 + 3 slots. A and B (6-token
    # prompts) take 2 blocks each; a window start touches 1 + ceil((1 + 3 - 2) / 4) = 2 blocks
    # each: A finds 2 free and takes one, B finds 1 and is preempted (recompute). One step
    # decoding would need only one free block each, and fit.
    res, traces = run(tmp_path, [req("A", 0.0, 6, 6), req("B", 0.0, 6, 6)],
                      num_scheduler_steps=4, num_gpu_blocks_override=7, max_model_len=24)
    assert traces[0]["scheduled"] == {"A": 6, "B": 6}
    assert traces[1]["scheduled"] == {"A": 1} and traces[1]["preempted"] == ["B"]
    assert res.summary["completed"] == 2
    assert res.requests.set_index("request_id").loc["B", "num_preemptions"] == 2


def test_window_steps_after_the_first_pay_no_scheduling_cpu():
    sc = scenario(engine={"scheduler": "continuous", "max_model_len": 4096,
                          "max_num_batched_tokens": 4096, "num_scheduler_steps": 8},
                  cost_model={"type": "roofline", "engine_preset": "vllm-v0.6"},
                  workload={"num_requests": 1, "arrival": {"type": "poisson", "rate": 1.0},
                            "prompt_len": {"type": "fixed", "value": 100},
                            "output_len": {"type": "fixed", "value": 17}})
    d = kvsim.simulate(sc).steps["duration_s"].to_numpy()
    # prefill, then windows [1..8], [9..16]: each window's first step schedules and prepares.
    from kvsim.cost.presets import PRESETS
    o = PRESETS["vllm-v0.6"].overhead
    assert d[1] - d[2] == pytest.approx(o.step_s + o.per_request_s, rel=1e-6)
    assert d[9] - d[10] == pytest.approx(o.step_s + o.per_request_s, rel=1e-6)


MS_CASES = {
    "vllm_v0_6_preset": scenario(engine={"scheduler": "continuous", "max_model_len": 4096,
                                         "max_num_batched_tokens": 4096, "num_scheduler_steps": 8},
                                 cost_model={"type": "roofline", "engine_preset": "vllm-v0.6"}),
    "tight_memory": scenario(engine={"scheduler": "continuous", "max_model_len": 4096,
                                     "max_num_batched_tokens": 4096, "num_scheduler_steps": 4,
                                     "num_gpu_blocks_override": 300}),
    "closed_loop": scenario(
        engine={"scheduler": "continuous", "max_model_len": 4096, "max_num_batched_tokens": 4096,
                "num_scheduler_steps": 16},
        cost_model={"type": "constant", "step_time_s": 0.01},
        workload={"num_requests": 60, "arrival": {"type": "closed_loop", "concurrency": 7},
                  "output_len": {"type": "uniform", "low": 5, "high": 90}}),
}


@pytest.mark.parametrize("name", list(MS_CASES))
def test_fast_path_equals_step_path_with_multi_step(name):
    fast, slow, trace_fast, trace_slow = both(MS_CASES[name])
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)
    assert trace_fast == trace_slow
    np.testing.assert_array_equal(fast.itl_s, slow.itl_s)
    assert fast.summary == slow.summary
    assert fast.stats.num_run_steps > 0


def test_multi_step_trades_ttft_for_cpu_time():
    one = kvsim.simulate(scenario(engine={"scheduler": "continuous", "max_model_len": 4096,
                                          "max_num_batched_tokens": 4096},
                                  cost_model={"type": "roofline", "engine_preset": "vllm-v0.6"}))
    eight = kvsim.simulate(MS_CASES["vllm_v0_6_preset"])
    assert eight.summary["median_ttft_ms"] > 1.5 * one.summary["median_ttft_ms"]
    assert eight.summary["median_tpot_ms"] < one.summary["median_tpot_ms"]
    assert eight.summary["median_itl_ms"] > 4 * one.summary["median_itl_ms"]


@pytest.mark.parametrize("engine, words", [
    ({"num_scheduler_steps": 8}, ["engine.num_scheduler_steps", "Chunked prefill is not supported",
                                  "continuous"]),
    ({"num_scheduler_steps": 8, "scheduler": "continuous", "preemption_mode": "swap"},
     ["preemption_mode", "recompute"]),
    ({"num_scheduler_steps": 8, "speculative_config": {"method": "ngram",
                                                       "num_speculative_tokens": 2,
                                                       "acceptance": {"rate": 0.5}}},
     ["num_scheduler_steps", "speculative decoding"]),
    ({"num_scheduler_steps": 0}, ["engine.num_scheduler_steps"]),
])
def test_multi_step_refuses_what_vllm_0_6_refuses(engine, words):
    sc = scenario()
    sc["engine"] = {**sc["engine"], **engine}
    with pytest.raises(kvsim.ScenarioError) as exc:
        kvsim.load_scenario(sc)
    assert all(w in str(exc.value) for w in words), str(exc.value)
