"""``engine.async_scheduling``: vLLM V1 schedules step N+1 while step N runs.

A request submitted during step N is first scheduled in step N+2; a request
whose last token is in flight keeps its slot and blocks through the next
schedule; a step lasts max(GPU, CPU) instead of GPU + CPU. Hand-worked with
1 s steps, then the fast path against the step path.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from test_fast_path import both, scenario

import kvsim
from kvsim.cost import build_cost_model
from kvsim.cost.base import decode_run_function, step_time_function
from kvsim.cost.presets import EngineKnobs
from kvsim.specs import load_gpu, load_model


def requests_file(tmp_path, rows) -> str:
    path = tmp_path / "reqs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def run(tmp_path, rows, **engine):
    sc = {"name": "async", "model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm"},
          "engine": {"num_gpu_blocks_override": 200, "block_size": 4, "max_model_len": 128,
                     **engine},
          "cost_model": {"type": "constant", "step_time_s": 1.0},
          "workload": {"requests_file": requests_file(tmp_path, rows)}}
    traces = []
    res = kvsim.simulate(sc, trace=traces.append)
    return res.requests.set_index("request_id"), traces


def req(rid, at, prompt=8, out=4):
    base = 1000 * (ord(rid) - ord("A") + 1)       # no prefix shared between requests
    return {"id": rid, "arrival_time": at, "prompt_token_ids": list(range(base, base + prompt)),
            "max_tokens": out}


@pytest.mark.parametrize("arrival, sync_first, async_first", [
    (2.5, 3.0, 4.0),     # mid step [2, 3]: sync schedules it at 3, async at 4
    (3.0, 3.0, 4.0),     # at the boundary: the step starting at 3 was scheduled at 2
])
def test_a_request_arriving_during_step_n_is_first_scheduled_in_step_n_plus_2(
        tmp_path, arrival, sync_first, async_first):
    rows = [req("A", 0.0, out=10), req("B", arrival)]
    for flag, want in ((False, sync_first), (True, async_first)):
        reqs, _ = run(tmp_path, rows, async_scheduling=flag)
        assert reqs.loc["B", "scheduled_time_s"] == want
        assert reqs.loc["B", "first_token_time_s"] == want + 1.0


def test_an_idle_engine_schedules_an_arrival_at_once(tmp_path):
    reqs, _ = run(tmp_path, [req("A", 0.5)], async_scheduling=True)
    assert reqs.loc["A", "scheduled_time_s"] == 0.5
    assert reqs.loc["A", "finish_time_s"] == 4.5        # 1 prefill + 3 decode steps


def test_a_finishing_request_holds_its_slot_until_the_next_schedule_which_skips_it(tmp_path):
    # max_num_seqs 1: A's last token is sampled in step [1, 2]. Synchronously B starts at 2.
    # Async: the step due at 2 was scheduled while A's last token was in flight, so it
    # skips A and cannot admit B (A holds the only slot): an empty batch, which costs
    # nothing; the next schedule, after A's outputs, admits B, still at 2.
    rows = [req("A", 0.0, out=2), req("B", 0.0, out=2)]
    for flag in (False, True):
        reqs, traces = run(tmp_path, rows, async_scheduling=flag, max_num_seqs=1)
        assert reqs.loc["A", "finish_time_s"] == 2.0
        assert reqs.loc["B", "scheduled_time_s"] == 2.0
        assert [t["scheduled"] for t in traces] == [{"A": 8}, {"A": 1}, {"B": 8}, {"B": 1}]


def test_blocks_of_a_finishing_request_are_not_free_for_the_schedule_made_during_its_last_step(
        tmp_path):
    # 8 usable blocks of 4. A (12-token prompt, 4 blocks with its decode) finishes in
    # step [1, 2]; B (20 tokens, 6 blocks with its decode) waits. Synchronously A's blocks
    # are free at 2 and B starts then. Async: the schedule at 2 still sees A's blocks held
    # and skips A: an empty batch; the schedule after A's outputs admits B, at 2 as well.
    rows = [req("A", 0.0, prompt=12, out=2), req("B", 0.5, prompt=20, out=2)]
    for flag in (False, True):
        reqs, _ = run(tmp_path, rows, async_scheduling=flag, num_gpu_blocks_override=9,
                      max_model_len=32)
        assert reqs.loc["B", "scheduled_time_s"] == 2.0


def test_blocks_held_by_a_finishing_request_delay_an_admission_when_others_run(tmp_path):
    # A and C decode; A finishes in step [2, 3]. B (needs 5 blocks) waits for A's.
    # Sync: the schedule at 3 sees A's blocks free and admits B next to C.
    # Async: the schedule for the step at 3 was made at 2, with A's blocks held; C runs
    # alone at 3; B is admitted at 4.
    rows = [req("A", 0.0, prompt=12, out=3), req("C", 0.0, prompt=4, out=8),
            req("B", 0.5, prompt=20, out=2)]
    sync, _ = run(tmp_path, rows, num_gpu_blocks_override=11, max_model_len=32)
    asyn, _ = run(tmp_path, rows, num_gpu_blocks_override=11, max_model_len=32,
                  async_scheduling=True)
    assert sync.loc["B", "scheduled_time_s"] == 3.0
    assert asyn.loc["B", "scheduled_time_s"] == 4.0
    assert (sync.loc["A", "finish_time_s"], asyn.loc["A", "finish_time_s"]) == (3.0, 3.0)


def test_async_scheduling_needs_the_chunked_scheduler():
    with pytest.raises(kvsim.ScenarioError, match="engine.async_scheduling"):
        kvsim.load_scenario(scenario(engine__scheduler="continuous", engine__async_scheduling=True))


# ---------------------------------------------------------------- step period

def cost(preset):
    return build_cost_model({"type": "roofline", "engine_preset": preset},
                            model=load_model("llama-3.1-8b"), gpu=load_gpu("h100-sxm"), tp=1,
                            engine=EngineKnobs(max_num_seqs=256, max_num_batched_tokens=2048))


@pytest.mark.parametrize("preset", ["vllm-v1", "sarathi-serve-2024"])
def test_an_overlapped_step_lasts_the_longer_of_kernels_and_cpu(preset):
    m = cost(preset)
    new, ctx = [1] * 32, [900] * 32
    parts = m.breakdown(kvsim.cost.BatchShape.from_lists(new, ctx, 32))
    cpu = parts.pop("overhead")
    wait = parts.pop("launch_wait")
    parts.pop("swap")
    kernels = sum(parts.values())
    launch = m._decode_launch_s
    sync = step_time_function(m)(new, ctx, 32, 0)
    over = step_time_function(m, overlap_cpu=True)(new, ctx, 32, 0)
    assert sync == pytest.approx(kernels + wait + cpu, rel=1e-12)
    assert over == pytest.approx(max(kernels, launch + cpu), rel=1e-12)
    assert over < sync
    if preset == "sarathi-serve-2024":
        assert over == pytest.approx(launch + cpu)      # 7 ms + 1.2 ms per request: CPU-bound


def test_overlapped_decode_runs_equal_overlapped_steps_bit_for_bit():
    m = cost("sarathi-serve-2024")
    times, durations = decode_run_function(m, overlap_cpu=True)(8, 8 * 700, 0.0, 40, 1e9)
    step = step_time_function(m, overlap_cpu=True)
    assert list(durations) == [step([1] * 8, [700 + k] * 8, 8, 0) for k in range(40)]
    assert m.decode_step_times(8, np.array([5600.0 + 8 * k for k in range(40)]),
                               overlap_cpu=True).tolist() == list(durations)


def test_constant_cost_steps_keep_their_time_under_async_scheduling():
    m = kvsim.cost.base.ConstantCostModel(0.25)
    assert step_time_function(m, overlap_cpu=True)([5], [0], 1, 0) == 0.25


# ------------------------------------------------------------ fast vs step

ASYNC_CASES = {
    "prefix_hits_and_chunking": scenario(engine__async_scheduling=True),
    "tight_memory_preemptions": scenario(engine__async_scheduling=True,
                                         engine__num_gpu_blocks_override=300),
    "overloaded_max_num_seqs": scenario(engine__async_scheduling=True, engine__max_num_seqs=6,
                                        workload={**scenario()["workload"],
                                                  "arrival": {"type": "poisson", "rate": 80.0}}),
    "constant_cost_closed_loop": scenario(
        engine__async_scheduling=True, cost_model={"type": "constant", "step_time_s": 0.01},
        workload={"num_requests": 60, "arrival": {"type": "closed_loop", "concurrency": 7},
                  "output_len": {"type": "uniform", "low": 5, "high": 90}}),
    "vllm_v1_preset": scenario(engine__async_scheduling=True,
                               cost_model={"type": "roofline", "engine_preset": "vllm-v1"}),
    "priority_tight_memory": scenario(
        engine={"max_num_batched_tokens": 512, "max_model_len": 4096, "policy": "priority",
                "num_gpu_blocks_override": 300, "async_scheduling": True},
        workload={**scenario()["workload"], "arrival": {"type": "poisson", "rate": 60.0},
                  "priority": {"values": [0, 1, 2]}}),
}


@pytest.mark.parametrize("name", list(ASYNC_CASES))
def test_fast_path_equals_step_path_under_async_scheduling(name):
    fast, slow, trace_fast, trace_slow = both(ASYNC_CASES[name])
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)
    assert trace_fast == trace_slow
    np.testing.assert_array_equal(fast.itl_s, slow.itl_s)
    assert fast.summary == slow.summary
    assert fast.stats.num_run_steps > 0


def test_async_scheduling_changes_the_run():
    sync = kvsim.simulate(scenario(cost_model={"type": "roofline", "engine_preset": "vllm-v1"}))
    asyn = kvsim.simulate(ASYNC_CASES["vllm_v1_preset"])
    assert asyn.summary["median_tpot_ms"] < sync.summary["median_tpot_ms"]    # CPU overlapped
    assert not asyn.requests["first_token_time_s"].equals(sync.requests["first_token_time_s"])
