"""The pending vLLM 0.33 golden cases (pending/, make_cases.py --pending) are sound.

kvsim does not implement their knobs yet (issue #17, phase 2), so
tests/test_oracle_traces.py does not run them; these tests check that the
fixtures regenerate byte for byte, that every trace finishes every request
once, and that each case exercises its knob: its trace differs from the
baseline trace the real scheduler wrote without the knob.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
PENDING = HERE / "pending"


def _load_make_cases():
    spec = importlib.util.spec_from_file_location("golden_make_cases_pending", HERE / "make_cases.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # @dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


make_cases = _load_make_cases()
NAMES = [c.name for c in make_cases.pending_cases()]


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def test_pending_folders_are_exactly_the_pending_cases():
    assert sorted(p.parent.name for p in PENDING.glob("*/config.json")) == sorted(NAMES)
    assert not set(NAMES) & {c.name for c in make_cases.all_cases()}


def test_make_cases_rewrites_the_pending_inputs_byte_for_byte(tmp_path):
    for case in make_cases.pending_cases():
        make_cases.write_case(case, str(tmp_path))
        for name in ("workload.jsonl", "config.json"):
            assert (tmp_path / case.name / name).read_bytes() == (PENDING / case.name / name).read_bytes()


@pytest.mark.parametrize("name", NAMES)
def test_every_request_finishes_once_with_and_without_the_knob(name):
    ids = sorted(r["id"] for r in lines(PENDING / name / "workload.jsonl"))
    for trace in ("expected.jsonl", "baseline.jsonl"):
        assert sorted(rid for s in lines(PENDING / name / trace) for rid in s["finished"]) == ids


@pytest.mark.parametrize("name", NAMES)
def test_the_knob_changes_the_trace(name):
    config = json.loads((PENDING / name / "config.json").read_text())
    assert config["_knobs"] and set(config["_knobs"]) <= set(config["extra_scheduler_config"])
    assert lines(PENDING / name / "expected.jsonl") != lines(PENDING / name / "baseline.jsonl")


def test_max_num_scheduled_tokens_caps_every_step():
    steps = lines(PENDING / "max_num_scheduled_tokens_cap" / "expected.jsonl")
    assert max(sum(s["scheduled"].values()) for s in steps) == 160


def test_max_num_active_seqs_caps_the_running_requests():
    steps = lines(PENDING / "max_num_active_seqs_cap" / "expected.jsonl")
    assert max(s["num_running"] for s in steps) == 3
