"""The pending golden cases (pending/, make_cases.py --pending) are what make_cases writes.

A pending case is one for a vLLM knob kvsim does not implement yet, so
tests/test_oracle_traces.py does not run it. There are none now: issue #17
moved its six up (their knob checks are in test_golden_oracle_fixtures.py).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

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


def test_pending_folders_are_exactly_the_pending_cases():
    assert sorted(p.parent.name for p in PENDING.glob("*/config.json")) == sorted(NAMES)
    assert not set(NAMES) & {c.name for c in make_cases.all_cases()}


def test_make_cases_rewrites_the_pending_inputs_byte_for_byte(tmp_path):
    for case in make_cases.pending_cases():
        make_cases.write_case(case, str(tmp_path))
        for name in ("workload.jsonl", "config.json"):
            assert (tmp_path / case.name / name).read_bytes() == (PENDING / case.name / name).read_bytes()
