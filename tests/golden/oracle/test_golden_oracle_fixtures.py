"""The golden oracle fixtures are what they claim to be.

* ``make_cases.py`` regenerates the committed inputs byte for byte;
* every case has a well-formed trace in which every request finishes once;
* the traces of the ``tv*`` cases show the numbers of the test vectors in
  ``kv-semantics.md`` (vLLM 0.33 variants), so the fixtures and the document
  cannot drift apart silently.

Steps in the traces are numbered from 0; the test vectors number them from 1.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def _load_make_cases():
    spec = importlib.util.spec_from_file_location("golden_make_cases", HERE / "make_cases.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # @dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


make_cases = _load_make_cases()
CASE_NAMES = [c.name for c in make_cases.all_cases()]


def trace(name: str) -> list[dict]:
    lines = (HERE / name / "expected.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line]


def workload(name: str) -> list[dict]:
    lines = (HERE / name / "workload.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line]


def test_committed_case_folders_are_exactly_the_generated_cases():
    folders = sorted(p.parent.name for p in HERE.glob("*/config.json"))
    assert folders == sorted(CASE_NAMES)


def test_make_cases_rewrites_the_committed_inputs_byte_for_byte(tmp_path):
    for case in make_cases.all_cases():
        make_cases.write_case(case, str(tmp_path))
        for fname in ("workload.jsonl", "config.json"):
            assert (tmp_path / case.name / fname).read_bytes() == \
                (HERE / case.name / fname).read_bytes(), f"{case.name}/{fname}"


@pytest.mark.parametrize("name", CASE_NAMES)
def test_trace_finishes_every_request_exactly_once(name):
    finished = [rid for step in trace(name) for rid in step["finished"]]
    assert sorted(finished) == sorted(r["id"] for r in workload(name))


@pytest.mark.parametrize("name", CASE_NAMES)
def test_trace_steps_count_from_zero_and_last_at_least_one_second(name):
    steps = trace(name)
    assert [s["step"] for s in steps] == list(range(len(steps)))
    gaps = [b["start_time"] - a["start_time"] for a, b in zip(steps, steps[1:])]
    assert all(g >= 1.0 for g in gaps)


@pytest.mark.parametrize("name", CASE_NAMES)
def test_trace_records_the_first_admission_of_every_request_once(name):
    admitted = [rid for step in trace(name) for rid in step["prefix_hit_tokens"]]
    assert sorted(admitted) == sorted(r["id"] for r in workload(name))


def column(name: str, key: str) -> list:
    return [s[key] for s in trace(name)]


def test_tv1_partial_hit_while_owner_runs():
    steps = trace("tv1_partial_hit_running_owner")
    assert steps[1]["scheduled"] == {"A": 1, "B": 1}
    assert steps[1]["prefix_hit_tokens"] == {"B": 8}
    assert column("tv1_partial_hit_running_owner", "num_free_blocks")[:2] == [7, 6]


def test_tv2_exact_multiple_prompt_recomputes_its_last_block():
    steps = trace("tv2_exact_multiple_full_match")
    assert steps[2]["scheduled"] == {"C": 4}
    assert steps[2]["prefix_hit_tokens"] == {"C": 4}


def test_tv3_lru_evicts_the_oldest_request_blocks_first():
    steps = trace("tv3_reverse_free_lru")
    assert column("tv3_reverse_free_lru", "num_free_blocks") == [4, 4, 4, 4]
    assert steps[3]["prefix_hit_tokens"] == {"P": 8}


def test_tv3_reverse_free_evicts_a_request_tail_block_first():
    assert trace("tv3b_tail_block_evicted_first")[3]["prefix_hit_tokens"] == {"P": 4}


def test_tv4_hit_on_blocks_in_the_free_queue():
    steps = trace("tv4_hit_on_free_blocks")
    assert steps[1]["scheduled"] == {"D": 1}
    assert steps[1]["prefix_hit_tokens"] == {"D": 8}
    assert steps[1]["num_free_blocks"] == 4


def test_tv5_identical_prompts_share_blocks_in_the_same_step():
    step = trace("tv5_same_step_sharing")[0]
    assert step["scheduled"] == {"A": 9, "B": 1}
    assert step["prefix_hit_tokens"] == {"A": 0, "B": 8}
    assert step["num_free_blocks"] == 6


def test_tv6_fcfs_preemption_and_resume_with_self_hit():
    name = "tv6_preempt_resume"
    steps = trace(name)
    assert column(name, "scheduled")[:7] == [
        {"A": 6, "B": 6}, {"A": 1, "B": 1}, {"A": 1, "B": 1}, {"A": 1}, {"A": 1}, {"A": 1},
        {"B": 5}]
    assert steps[3]["preempted"] == ["B"]
    assert steps[6]["resume_hit_tokens"] == {"B": 4}
    assert column(name, "num_free_blocks")[:7] == [0, 0, 0, 1, 1, 4, 1]


def test_tv7_running_decode_goes_before_the_chunked_prefill():
    assert column("tv7_chunked_decode_first", "scheduled")[1:5] == [
        {"R": 1, "A": 7}, {"R": 1, "A": 7}, {"R": 1, "A": 6}, {"R": 1, "A": 1}]


def test_tv8_long_prefill_threshold_caps_chunks():
    name = "tv8_long_prefill_threshold"
    assert column(name, "scheduled") == [
        {"A": 4, "B": 4}, {"A": 4, "B": 4}, {"A": 2, "B": 2}, {"A": 1, "B": 1}]
    assert trace(name)[3]["finished"] == ["A", "B"]


def test_tv8_threshold_is_ignored_for_a_single_request():
    steps = trace("tv8b_threshold_single_request")
    assert steps[0]["scheduled"] == {"A": 10}
    assert steps[3]["scheduled"] == {"B": 10}


def test_tv9_max_num_seqs_caps_running_requests():
    assert column("tv9_max_num_seqs", "scheduled")[:3] == [
        {"A": 3, "B": 3}, {"A": 1, "B": 1}, {"C": 3}]


def test_tv10_head_of_line_blocking():
    step = trace("tv10_head_of_line")[1]
    assert step["scheduled"] == {"R": 1}
    assert (step["num_free_blocks"], step["num_waiting"]) == (1, 2)


def test_tv11_priority_self_preemption_continues_the_step():
    steps = trace("tv11_priority_self_preempt")
    assert steps[3]["scheduled"] == {"P0": 1}
    assert steps[3]["preempted"] == ["P5"]
    assert [steps[3]["num_free_blocks"], steps[4]["num_free_blocks"]] == [2, 1]


def test_tv12_chunking_off_breaks_at_a_prompt_over_the_budget():
    step = trace("tv12_chunking_off")[1]
    assert step["scheduled"] == {"R": 1, "A": 12}
    assert step["num_waiting"] == 3


def test_tv12_chunking_off_keeps_the_waiting_order():
    assert column("tv12b_chunking_off_order", "prefix_hit_tokens")[1:5] == [
        {"A": 0}, {"BIG1": 0}, {"BIG2": 0}, {"S1": 0}]


def test_tv13_reserve_full_isl_keeps_a_long_prompt_waiting():
    step = trace("tv13_reserve_full_isl")[1]
    assert step["scheduled"] == {"R": 1}
    assert (step["num_free_blocks"], step["num_waiting"]) == (2, 1)


def test_tv13_without_reserve_full_isl_the_prompt_preempts_itself():
    steps = trace("tv13b_reserve_full_isl_off")
    assert steps[1]["scheduled"] == {"R": 1, "L": 7}
    assert steps[2]["preempted"] == ["L"]
    assert steps[2]["num_free_blocks"] == 2


# ---------------------------------------------------- vLLM 0.33 knob cases
# Their configs name the knobs under "_knobs"; run_cases.py also wrote
# baseline.jsonl, the real scheduler's trace without them.
KNOB_CASES = [c.name for c in make_cases.all_cases() if c.config.get("_knobs")]


def baseline(name: str) -> list[dict]:
    lines = (HERE / name / "baseline.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line]


def test_there_are_knob_cases_for_every_vllm_033_knob():
    knobs = {k for name in KNOB_CASES
             for k in json.loads((HERE / name / "config.json").read_text())["_knobs"]}
    assert knobs == {"max_num_scheduled_tokens", "max_num_active_seqs",
                     "long_prefill_token_threshold_adaptive", "prefill_schedule_interval"}


@pytest.mark.parametrize("name", KNOB_CASES)
def test_the_knob_changes_the_trace(name):
    config = json.loads((HERE / name / "config.json").read_text())
    assert set(config["_knobs"]) <= set(config["extra_scheduler_config"])
    assert trace(name) != baseline(name)
    finished = [rid for step in baseline(name) for rid in step["finished"]]
    assert sorted(finished) == sorted(r["id"] for r in workload(name))


def test_max_num_scheduled_tokens_caps_every_step():
    assert max(sum(s["scheduled"].values()) for s in trace("max_num_scheduled_tokens_cap")) == 160
    assert max(sum(s["scheduled"].values()) for s in baseline("max_num_scheduled_tokens_cap")) > 160


def test_max_num_active_seqs_caps_the_running_requests():
    assert max(s["num_running"] for s in trace("max_num_active_seqs_cap")) == 3
    assert max(s["num_running"] for s in baseline("max_num_active_seqs_cap")) > 3
