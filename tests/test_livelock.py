"""A livelock of the real vLLM scheduler ends in kvsim: the request it spins on fails.

Differential seed 8667 (``tests/golden/oracle/make_cases.py`` ``differential``:
priority policy, chunked prefill with a 48-token threshold, caching off,
``max_num_seqs`` 2, ``scheduler_reserve_full_isl: false``, 71 usable blocks of
4 tokens) makes vLLM 0.33 loop forever: from step 41 on, r22 and r23 take
turns, each admitted with the blocks of one chunk, then preempted by the other
for its next chunk, so neither ever samples a token (the oracle stopped at
5,000,000 steps; its first 300 steps are in tests/data/). kvsim follows vLLM
step for step until ``LIVELOCK_STEPS`` steps in a row have sampled nothing,
then fails the request the next step preempts, and the others run to the end.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pandas as pd
import pytest

import kvsim
import kvsim.sim.engine as engine
from test_oracle_traces import first_difference, scenario_for

HERE = Path(__file__).parent
VLLM_HEAD = HERE / "data" / "livelock_differential_8667_vllm_head.jsonl"


class TooLong(Exception):
    pass


@pytest.fixture(scope="module")
def case(tmp_path_factory) -> Path:
    spec = importlib.util.spec_from_file_location("golden_make_cases_livelock",
                                                  HERE / "golden" / "oracle" / "make_cases.py")
    make_cases = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = make_cases          # @dataclass looks its module up there
    spec.loader.exec_module(make_cases)
    out = tmp_path_factory.mktemp("livelock")
    make_cases.write_case(make_cases.differential(8667), str(out))
    return out / "differential_8667"


def run(case: Path, fast_path: bool, steps: list[dict], max_steps: int = 50_000):
    """Simulate the case, its step rows into ``steps``; TooLong past ``max_steps`` steps."""
    def trace(step: dict) -> None:
        steps.append(step)
        if len(steps) >= max_steps:
            raise TooLong(len(steps))

    return kvsim.simulate(scenario_for(case), trace=trace, fast_path=fast_path)


@pytest.mark.parametrize("fast_path", [True, False], ids=["skip-ahead", "step-by-step"])
def test_kvsim_follows_vllm_into_the_livelock(case, monkeypatch, fast_path):
    # Without the breaker the run never ends; its first 300 steps are vLLM's
    # (the cycle starts at step 41: one runs a chunk, the other is preempted).
    monkeypatch.setattr(engine, "LIVELOCK_STEPS", 10**9)
    expected = [json.loads(line) for line in VLLM_HEAD.read_text().splitlines()]
    steps: list[dict] = []
    with pytest.raises(TooLong):
        run(case, fast_path, steps, max_steps=20_000)
    assert first_difference(expected, steps[:len(expected)]) is None
    tail = steps[-4:]                # every other step preempts one of the two; nothing ends
    assert not any(s["finished"] for s in tail) and sum(bool(s["preempted"]) for s in tail) == 2


@pytest.mark.parametrize("limit", [2_000, 5_000])
def test_the_livelocked_request_fails_and_the_others_finish(case, monkeypatch, limit):
    monkeypatch.setattr(engine, "LIVELOCK_STEPS", limit)
    results = {}
    for fast_path in (True, False):
        steps: list[dict] = []
        requests = run(case, fast_path, steps).requests
        failed = requests[requests["fail_reason"].astype(str) != ""]
        assert list(failed["request_id"]) == ["r23"]
        reason = failed["fail_reason"].iloc[0]
        assert reason.startswith(f"livelock: no request generated a token in {limit + 1:,} steps")
        assert "scheduler_reserve_full_isl" in reason
        assert (requests["status"].astype(str) != "failed").sum() == 54   # the others all finish
        # r23 is last preempted in the step the limit is reached, and never runs again.
        last = max(i for i, s in enumerate(steps) if "r23" in s["preempted"])
        assert last > limit and all("r23" not in s["scheduled"] for s in steps[last:])
        results[fast_path] = (requests, steps)
    pd.testing.assert_frame_equal(results[True][0], results[False][0])   # fast path = step path
    assert results[True][1] == results[False][1]


def test_both_paths_count_the_same_steps_without_output(monkeypatch):
    # A lone long prompt is chunked in a chunk run on the fast path (no decode
    # samples meanwhile), one step at a time on the step path; where the fast
    # path's runs end, both paths have counted the same steps without a token.
    seen = {}
    finish = engine.Engine._finish

    def record(self, finished):                    # after each step or run is counted
        seen[self.fast_path].append((self.env.now, self._steps_without_output))
        finish(self, finished)

    monkeypatch.setattr(engine.Engine, "_finish", record)
    sc = {"name": "lone-prompts", "model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm"},
          "engine": {"max_num_batched_tokens": 64, "max_model_len": 4096},
          "cost_model": {"type": "constant", "step_time_s": 1.0},
          "workload": {"num_requests": 6, "arrival": {"type": "poisson", "rate": 0.05},
                       "prompt_len": {"type": "uniform", "low": 1500, "high": 3000},
                       "output_len": {"type": "fixed", "value": 3}}}
    for fast_path in (True, False):
        seen[fast_path] = []
        kvsim.simulate(sc, fast_path=fast_path)
    fast, step = dict(seen[True]), dict(seen[False])
    assert max(fast.values()) > 20                  # long stretches without a token were counted
    assert len(fast) < len(step)                    # (the fast path took runs)
    assert all(step[t] == n for t, n in fast.items())
