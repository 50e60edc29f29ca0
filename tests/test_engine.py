"""Edge cases of whole runs, through ``kvsim.simulate`` and the ``kvsim run`` CLI.

Every scenario here uses the constant cost model (1 s per step), block size 4
and a small cache (``num_gpu_blocks_override``), so times are step counts and
every number below is exact.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

import kvsim
from helpers import spec
from kvsim.cli import main as kvsim_main
from kvsim.cost.base import ConstantCostModel
from kvsim.sched.config import SchedulerConfig
from kvsim.sim.run import run_engine
from kvsim.workload import build_workload

DATA = Path(__file__).parent / "data"

TRACE_KEYS = {"step", "start_time", "scheduled", "preempted", "finished", "num_free_blocks",
              "num_running", "num_waiting", "prefix_hit_tokens", "resume_hit_tokens"}


def scenario(workload: dict, *, seed: int = 1, **engine) -> dict:
    eng = {"num_gpu_blocks_override": 64, "block_size": 4, "max_model_len": 128,
           "max_num_batched_tokens": 128, **engine}
    return {"name": "edge", "seed": seed, "model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm"},
            "engine": eng, "cost_model": {"type": "constant", "step_time_s": 1.0},
            "workload": workload}


def fixed(num_requests: int, prompt: int, output: int, **more) -> dict:
    return {"num_requests": num_requests, "prompt_len": {"type": "fixed", "value": prompt},
            "output_len": {"type": "fixed", "value": output}, **more}


def write_requests(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def by_id(result) -> dict:
    return {row.request_id: row for row in result.requests.itertuples()}


# ------------------------------------------------------------------ sizes of runs


def test_zero_requests_give_an_empty_run():
    res = kvsim.simulate(scenario({"num_requests": 0}))
    assert res.summary["completed"] == 0 and res.summary["failed"] == 0
    assert len(res.requests) == 0 and len(res.steps) == 0
    assert list(res.requests.columns)[:2] == ["request_id", "arrival_time_s"]


def test_one_request_prefills_then_decodes_one_token_per_step():
    res = kvsim.simulate(scenario(fixed(1, prompt=10, output=5)))
    (row,) = res.requests.itertuples()
    assert (row.status, row.first_token_time_s, row.finish_time_s) == ("completed", 1.0, 5.0)
    assert res.steps.num_prefill_tokens.tolist() == [10, 0, 0, 0, 0]
    assert res.steps.num_decode_tokens.tolist() == [0, 1, 1, 1, 1]
    assert res.summary["mean_ttft_ms"] == 1000.0 and res.summary["mean_e2el_ms"] == 5000.0


def test_time_columns_are_floats_even_when_everything_happens_at_zero():
    res = kvsim.simulate(scenario(fixed(1, prompt=10, output=5)))
    assert res.requests.scheduled_time_s.dtype == np.float64


def test_all_requests_at_time_zero_are_scheduled_in_the_first_step():
    wl = fixed(4, prompt=10, output=3, arrival={"type": "all_at_once"})
    res = kvsim.simulate(scenario(wl))
    assert res.requests.request_id.tolist() == ["r0", "r1", "r2", "r3"]
    assert res.requests.scheduled_time_s.tolist() == [0.0] * 4
    assert res.requests.finish_time_s.tolist() == [3.0] * 4
    assert res.steps.num_prefill_tokens.tolist() == [40, 0, 0]


def test_a_trace_with_unsorted_timestamps_is_replayed_in_time_order():
    wl = {"trace": {"format": "azure", "path": str(DATA / "workload_azure_unsorted.csv")}}
    res = kvsim.simulate(scenario(wl, num_gpu_blocks_override=256, max_model_len=512,
                                  max_num_batched_tokens=512))
    req = res.requests
    assert req.arrival_time_s.tolist() == [0.0, 0.25, 1.5, 1.5]
    assert req.num_prompt_tokens.tolist() == [100, 200, 300, 400]   # ties keep file order
    assert req.num_output_tokens.tolist() == [10, 20, 30, 40]
    assert req.scheduled_time_s.tolist() == [0.0, 1.0, 2.0, 2.0]
    assert (req.status == "completed").all()


def test_an_unsorted_tmp_azure_csv_gives_the_same_run_as_its_sorted_copy(tmp_path):
    rows = ["2024-01-01 00:00:03.0,8,2", "2024-01-01 00:00:00.0,5,3", "2024-01-01 00:00:01.5,6,1"]
    header = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    (tmp_path / "u.csv").write_text(header + "\n".join(rows) + "\n")
    (tmp_path / "s.csv").write_text(header + "\n".join(sorted(rows, key=lambda s: s[:24])) + "\n")
    runs = [kvsim.simulate(scenario({"trace": {"format": "azure", "path": str(tmp_path / f)}}))
            for f in ("u.csv", "s.csv")]
    assert runs[0].requests.equals(runs[1].requests)
    assert runs[0].requests.num_prompt_tokens.tolist() == [5, 6, 8]
    assert runs[0].requests.arrival_time_s.tolist() == [0.0, 1.5, 3.0]


# --------------------------------------------------------------- requests that fail


def test_requests_that_can_never_fit_fail_with_reasons_and_the_others_complete(tmp_path):
    path = write_requests(tmp_path / "reqs.jsonl", [
        {"id": "ok1", "arrival_time": 0.0, "prompt_token_ids": list(range(1, 6)), "max_tokens": 3},
        {"id": "long", "arrival_time": 0.0, "prompt_token_ids": list(range(100, 230)),
         "max_tokens": 3},
        {"id": "ok2", "arrival_time": 1.0, "prompt_token_ids": list(range(300, 304)), "max_tokens": 2},
    ])
    res = kvsim.simulate(scenario({"requests_file": path}))
    rows = by_id(res)
    assert rows["long"].status == "failed"
    assert rows["long"].fail_reason == "prompt of 130 tokens >= max_model_len 128"
    assert rows["long"].num_output_tokens == 0
    assert (rows["ok1"].status, rows["ok2"].status) == ("completed", "completed")
    assert (res.summary["completed"], res.summary["failed"]) == (2, 1)


def test_a_prompt_above_the_v0_watermark_of_the_whole_cache_fails_and_the_run_ends(tmp_path):
    # 100 blocks of 16, watermark 0.01 -> 1 block: a 99-block prompt can never be admitted.
    path = write_requests(tmp_path / "reqs.jsonl", [
        {"id": "huge", "arrival_time": 0.0, "prompt_token_ids": list(range(1583)), "max_tokens": 1},
        {"id": "small", "arrival_time": 0.0, "prompt_token_ids": [1, 2, 3], "max_tokens": 2},
    ])
    res = kvsim.simulate(scenario({"requests_file": path}, scheduler="continuous",
                                  num_gpu_blocks_override=100, block_size=16, max_model_len=1584,
                                  max_num_batched_tokens=1584))
    rows = by_id(res)
    assert rows["huge"].status == "failed"
    assert rows["huge"].fail_reason == "needs more blocks than the cache holds above the watermark"
    assert rows["small"].status == "completed"


@pytest.mark.parametrize("scheduler", ["chunked", "continuous", "static"])
def test_a_request_longer_than_the_whole_kv_cache_fails_with_its_reason(scheduler):
    # run_engine does not validate max_model_len against the cache (the loader does).
    cfg = SchedulerConfig(num_gpu_blocks=11, block_size=4, max_model_len=256,
                          max_num_batched_tokens=256)
    engine = run_engine([spec("big", range(1, 40), max_tokens=10), spec("ok", [1, 2, 3], 2)],
                        cfg, scheduler=scheduler, cost_model=ConstantCostModel(1.0))
    done = {q.request_id: q for q in engine.done}
    assert done["big"].fail_reason == "needs 13 KV blocks for 49 tokens; the cache has only 10 usable blocks"
    assert done["ok"].num_output_tokens == 2 and not done["ok"].fail_reason
    assert engine.num_arrived == 2


# --------------------------------------------------------------------- determinism


def test_same_seed_gives_identical_files(tmp_path):
    wl = {"num_requests": 20, "arrival": {"type": "poisson", "rate": 2.0},
          "prompt_len": {"type": "uniform", "low": 2, "high": 30},
          "output_len": {"type": "uniform", "low": 1, "high": 10},
          "prefix": {"shared_prompt_tokens": 8, "num_groups": 2}}
    for d, seed in (("a", 5), ("b", 5), ("c", 6)):
        kvsim.simulate(scenario(wl, seed=seed, num_gpu_blocks_override=24,
                                      max_model_len=64)).write(tmp_path / d)
    for name in ("requests.csv", "steps.csv", "summary.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert (tmp_path / "a" / "requests.csv").read_bytes() != (tmp_path / "c" / "requests.csv").read_bytes()
    assert (tmp_path / "a" / "steps.csv").read_bytes() != (tmp_path / "c" / "steps.csv").read_bytes()


# ------------------------------------------------------------------ arrival timing


def test_an_arrival_exactly_at_a_step_start_is_scheduled_in_that_step(tmp_path):
    path = write_requests(tmp_path / "reqs.jsonl", [
        {"id": "a", "arrival_time": 0.0, "prompt_token_ids": [1, 2, 3, 4], "max_tokens": 5},
        {"id": "b", "arrival_time": 2.0, "prompt_token_ids": [9, 8, 7], "max_tokens": 1},
        {"id": "c", "arrival_time": 2.5, "prompt_token_ids": [6, 5], "max_tokens": 1},
    ])
    trace = []
    res = kvsim.simulate(scenario({"requests_file": path}), trace=trace.append)
    assert res.steps.start_time_s.tolist()[:4] == [0.0, 1.0, 2.0, 3.0]
    assert trace[2]["scheduled"] == {"a": 1, "b": 3}     # b arrived at 2.0, the step's start
    assert trace[3]["scheduled"] == {"a": 1, "c": 2}     # c (2.5) waits for the next step
    rows = by_id(res)
    assert (rows["b"].scheduled_time_s, rows["c"].scheduled_time_s) == (2.0, 3.0)


def test_closed_loop_keeps_at_most_concurrency_requests_in_flight():
    wl = {"num_requests": 8, "arrival": {"type": "closed_loop", "concurrency": 2},
          "prompt_len": {"type": "uniform", "low": 3, "high": 12},
          "output_len": {"type": "uniform", "low": 1, "high": 6}}
    res = kvsim.simulate(scenario(wl))
    req = res.requests
    assert len(req) == 8 and (req.status == "completed").all()
    times = sorted(set(req.arrival_time_s) | set(req.finish_time_s))
    in_flight = [((req.arrival_time_s <= t) & (req.finish_time_s > t)).sum() for t in times]
    assert max(in_flight) == 2
    # Each release happens when an earlier request finishes.
    assert set(req.arrival_time_s[2:]) <= set(req.finish_time_s)
    assert (res.steps.num_running + res.steps.num_waiting).max() <= 2


def test_a_closed_loop_release_is_visible_to_the_step_starting_at_its_arrival():
    wl = fixed(4, prompt=5, output=3, arrival={"type": "closed_loop", "concurrency": 2})
    res = kvsim.simulate(scenario(wl))
    late = res.requests[res.requests.request_id.isin(["r2", "r3"])]
    assert late.arrival_time_s.tolist() == [3.0, 3.0]
    assert late.scheduled_time_s.tolist() == [3.0, 3.0]


def test_session_turns_are_released_think_time_after_the_previous_turn_finishes():
    wl = fixed(3, prompt=6, output=4, sessions={"turns": 3, "think_time_s": 0.5})
    sc = scenario(wl)
    res = kvsim.simulate(sc)
    specs = list(build_workload(sc["workload"], rng=np.random.default_rng(sc["seed"])).requests())
    assert [(s.request_id, s.after_request_id) for s in specs] == \
        [("r0", None), ("r1", "r0"), ("r2", "r1")]
    rows = by_id(res)
    assert [rows[r].finish_time_s for r in ("r0", "r1", "r2")] == [4.0, 9.0, 14.0]
    assert rows["r1"].arrival_time_s == rows["r0"].finish_time_s + 0.5
    assert rows["r2"].arrival_time_s == rows["r1"].finish_time_s + 0.5
    # Each turn quotes the previous one: prompts 6, 16, 26; hits 0, 8 and 16 tokens
    # (the previous turn's full computed blocks; its last sampled token was never computed).
    assert [rows[r].num_prompt_tokens for r in ("r0", "r1", "r2")] == [6, 16, 26]
    assert [rows[r].num_cached_tokens for r in ("r0", "r1", "r2")] == [0, 8, 16]


def test_a_turn_whose_dependency_finished_before_it_was_read_is_released(tmp_path):
    path = write_requests(tmp_path / "reqs.jsonl", [
        {"id": "first", "arrival_time": 0.0, "prompt_token_ids": [1, 2, 3], "max_tokens": 2},
        {"id": "other", "arrival_time": 5.0, "prompt_token_ids": [7, 8], "max_tokens": 1},
        {"id": "quote", "arrival_time": 5.0, "prompt_token_ids": [1, 2, 3, 9], "max_tokens": 1,
         "after_request_id": "first", "think_time_s": 0.5},
    ])
    res = kvsim.simulate(scenario({"requests_file": path}))
    assert sorted(res.requests.request_id) == ["first", "other", "quote"]
    assert (res.requests.status == "completed").all()


def test_the_next_turn_of_a_failed_first_turn_is_still_accounted_for():
    wl = fixed(2, prompt=130, output=2, sessions={"turns": 2, "think_time_s": 0.1})
    res = kvsim.simulate(scenario(wl))
    assert res.requests.status.tolist() == ["failed", "failed"]


def test_parallel_samples_fan_out_into_n_requests_that_share_prompt_blocks():
    res = kvsim.simulate(scenario(fixed(1, prompt=9, output=3, n=3)))
    req = res.requests
    assert req.request_id.tolist() == ["r0#0", "r0#1", "r0#2"]
    # The first child fills two blocks; the others hit them in the same step (TV5).
    assert req.num_cached_tokens.tolist() == [0, 8, 8]
    assert res.steps.num_prefill_tokens.tolist()[0] == 9 + 1 + 1
    assert res.summary["completed"] == 3


# ------------------------------------------------------------------------- the CLI


@pytest.fixture
def scenario_file(tmp_path) -> Path:
    path = tmp_path / "scen.yaml"
    wl = fixed(5, prompt=7, output=3, arrival={"type": "constant", "interval_s": 0.5})
    path.write_text(yaml.safe_dump(scenario(wl)))
    return path


def test_cli_run_writes_the_three_files_and_a_trace_line_per_step(scenario_file, tmp_path, capsys):
    out, trace = tmp_path / "out", tmp_path / "trace.jsonl"
    assert kvsim_main(["run", str(scenario_file), "--out", str(out), "--trace", str(trace)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["bench_serve.json", "metrics.csv", "requests.csv",
                                                     "steps.csv", "summary.json"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] == 5
    lines = trace.read_text().splitlines()
    steps = (out / "steps.csv").read_text().splitlines()
    assert len(lines) == len(steps) - 1 > 0
    records = [json.loads(line) for line in lines]
    assert all(set(rec) == TRACE_KEYS for rec in records)
    assert [rec["step"] for rec in records] == list(range(len(records)))
    assert records[0]["scheduled"] == {"r0": 7}


def test_cli_set_overrides_a_value(scenario_file, tmp_path, capsys):
    out = tmp_path / "out"
    assert kvsim_main(["run", str(scenario_file), "--out", str(out),
                       "--set", "workload.num_requests=2", "--set", "engine.block_size=8"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] == 2
    assert (out / "requests.csv").read_text().count("\n") == 3


@pytest.mark.parametrize("override, words", [
    ("engine.blok_size=8", "engine.blok_size: unknown key"),
    ("nosuch.key=1", "nosuch.key: unknown section 'nosuch'"),
    ("engine.block_size", "--set 'engine.block_size': expected KEY=VALUE"),
    ("engine.block_size=-1", "engine.block_size: got -1"),
])
def test_cli_bad_set_gives_a_one_line_error_and_exit_2(scenario_file, capsys, override, words):
    assert kvsim_main(["run", str(scenario_file), "--set", override]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "\n" not in err and err.startswith("kvsim run: error: ") and words in err, err
    assert captured.out == ""
