"""kvsim's chunked scheduler against golden traces of the real vLLM 0.33 scheduler.

Each folder in tests/golden/oracle/ holds a requests file, the engine config and
the trace ``vllm_oracle.py`` recorded (see that folder's README). kvsim runs
the same requests with ``num_gpu_blocks_override`` and the constant cost model
(1 s per step) and must write the same trace, step by step.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import kvsim

GOLDEN = Path(__file__).parent / "golden" / "oracle"
CASES = sorted(p.parent.name for p in GOLDEN.glob("*/expected.jsonl"))

ENGINE_KEYS = ("block_size", "max_num_batched_tokens", "max_num_seqs", "enable_prefix_caching",
               "enable_chunked_prefill", "long_prefill_token_threshold", "max_model_len", "policy")


def scenario_for(case: Path) -> dict:
    config = json.loads((case / "config.json").read_text())
    engine = {k: config[k] for k in ENGINE_KEYS if k in config}
    engine["num_gpu_blocks_override"] = config.get("num_gpu_blocks", 64)
    engine["scheduler"] = "chunked"
    for key, value in (config.get("extra_scheduler_config") or {}).items():
        engine[key] = value
    return {
        "name": case.name, "model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm"},
        "engine": engine, "cost_model": {"type": "constant", "step_time_s": 1.0},
        "workload": {"requests_file": str(case / "workload.jsonl")},
    }


def run_trace(case: Path, fast_path: bool = True) -> list[dict]:
    steps: list[dict] = []
    kvsim.simulate(scenario_for(case), trace=steps.append, fast_path=fast_path)
    return steps


def first_difference(expected: list[dict], actual: list[dict]) -> str | None:
    for exp, act in zip(expected, actual):
        for key, want in exp.items():
            got = act.get(key)
            if key in ("preempted", "finished"):
                want, got = sorted(want), sorted(got or [])
            if key == "scheduled" and list(want.items()) != list((got or {}).items()):
                return f"step {exp['step']}: scheduled {got} != {want}"
            if want != got:
                return f"step {exp['step']}: {key} {got!r} != {want!r}"
    if len(expected) != len(actual):
        return f"{len(actual)} steps, the oracle took {len(expected)}"
    return None


def test_every_case_folder_holds_a_golden_trace():
    # Each folder of tests/golden/oracle/ with a config is a case, and every
    # case has the real scheduler's trace (a case without one would be skipped).
    folders = sorted(p.parent.name for p in GOLDEN.glob("*/config.json"))
    assert folders == CASES
    assert len(CASES) >= 39


@pytest.mark.parametrize("fast_path", [True, False], ids=["skip-ahead", "step-by-step"])
@pytest.mark.parametrize("name", CASES)
def test_chunked_scheduler_matches_vllm_step_by_step(name, fast_path):
    case = GOLDEN / name
    expected = [json.loads(line) for line in (case / "expected.jsonl").read_text().splitlines() if line]
    actual = run_trace(case, fast_path)
    assert first_difference(expected, actual) is None
