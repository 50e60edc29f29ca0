"""kvsim's radix cache against SGLang's own code (differential test).

Three parts:

* the recorded part always runs: tests/golden/sglang_radix/cases.json.gz holds
  seeded random operation scripts and, after every operation, the state SGLang
  0.4.6.post5's ``RadixCache`` and slot allocators reached (tree with keys,
  slots, lock counts and access times in child order; evictable and protected
  sizes; the free list). kvsim must reach the same state, operation by operation.
  tests/sglang_oracle/record.py re-records it.
* tree_05.json.gz does the same for SGLang 0.5.23's tree alone (insert, match,
  lock, evict) under each of its eviction policies: 0.5.x's request-level
  glue (``checkpoint``, ``release_kv_cache``) needs too much of the scheduler
  to drive, so it is checked by its vectors in test_radix.py.
* the live part drives SGLang's code on scripts hypothesis invents. It runs when
  ``KVSIM_SGLANG_SRC`` names SGLang's wheel (or source folder) and
  ``KVSIM_SGLANG_PYTHON`` (default: this interpreter) has torch and triton;
  otherwise it is skipped. kvsim never ships or imports SGLang's code.
"""

from __future__ import annotations

import functools
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sglang_oracle.scripts import make_script, make_tree_script, replay, replay_tree

HERE = Path(__file__).parent
GOLDEN = HERE / "golden" / "sglang_radix" / "cases.json.gz"
GOLDEN_TREE = HERE / "golden" / "sglang_radix" / "tree_05.json.gz"
DRIVER = HERE / "sglang_oracle" / "driver.py"


@functools.lru_cache(maxsize=2)
def _golden(path: Path = GOLDEN) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def first_difference(case: dict, expected: list[dict], run=replay) -> str | None:
    """The first operation after which kvsim's state differs from SGLang's."""
    got = json.loads(json.dumps(run(case)))
    for i, (g, e) in enumerate(zip(got, expected)):
        for key in e:
            if g[key] != e[key]:
                return f"op {i} {case['ops'][i]}: {key} is {g[key]}, SGLang has {e[key]}"
    if len(got) != len(expected):
        return f"{len(got)} snapshots, SGLang gave {len(expected)}"
    return None


def test_golden_file_covers_paged_and_token_caches_and_clock_ties():
    cases = _golden()["cases"]
    assert len(cases) >= 100
    assert {c["page_size"] for c in cases} == {1, 2, 4}
    assert {c["clock"] for c in cases} == {"counter", "step"}
    ops = [o["op"] for c in cases for o in c["ops"]]
    for name in ("admit", "cache", "decode", "finish", "retract", "evict", "free_group_end"):
        assert name in ops


@pytest.mark.parametrize("index", range(len(_golden()["cases"])))
def test_recorded_sglang_script(index):
    case = _golden()["cases"][index]
    assert first_difference(case, case["expected"]) is None


def test_tree_golden_file_covers_every_eviction_policy_and_paging():
    cases = _golden(GOLDEN_TREE)["cases"]
    assert {c["policy"] for c in cases} == {"lru", "lfu", "fifo", "mru", "filo"}
    assert {c["page_size"] for c in cases} == {1, 4}
    assert "0.5." in _golden(GOLDEN_TREE)["sglang"]


@pytest.mark.parametrize("index", range(len(_golden(GOLDEN_TREE)["cases"])))
def test_recorded_sglang_05_tree_script(index):
    case = _golden(GOLDEN_TREE)["cases"][index]
    assert first_difference(case, case["expected"], replay_tree) is None


# ------------------------------------------------------------------ live part


def _driver_command(var: str = "KVSIM_SGLANG_SRC") -> list[str] | None:
    src = os.environ.get(var)
    if not src or not Path(src).exists():
        return None
    python = os.environ.get("KVSIM_SGLANG_PYTHON", sys.executable)
    probe = subprocess.run([python, "-c", "import torch, triton"], capture_output=True)
    if probe.returncode:
        return None
    return [python, str(DRIVER), "--src", src, "--lines"]


def _driver(var: str):
    cmd = _driver_command(var)
    if cmd is None:
        pytest.skip(f"set {var} (SGLang wheel) and KVSIM_SGLANG_PYTHON (python with torch)")
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def run(case: dict) -> list[dict]:
        proc.stdin.write(json.dumps(case) + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("SGLang driver died")
        return json.loads(line)
    return proc, run


@pytest.fixture(scope="module")
def sglang():
    proc, run = _driver("KVSIM_SGLANG_SRC")
    yield run
    proc.stdin.close()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def sglang05():
    proc, run = _driver("KVSIM_SGLANG05_SRC")
    yield run
    proc.stdin.close()
    proc.wait(timeout=30)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.large_base_example,
                                                                 HealthCheck.too_slow])
@given(data=st.data(), page_size=st.sampled_from([1, 1, 2, 4]), size=st.integers(12, 64),
       clock=st.sampled_from(["counter", "step"]))
def test_live_sglang_agrees(sglang, data, page_size, size, clock):
    size = max(size, 4 * page_size)
    case = make_script(lambda n: data.draw(st.integers(0, n - 1)), size=size,
                       page_size=page_size, clock=clock, num_ops=50)
    assert first_difference(case, sglang(case)) is None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(data=st.data(), page_size=st.sampled_from([1, 2, 4]),
       policy=st.sampled_from(["lru", "lfu", "fifo", "mru", "filo"]))
def test_live_sglang_05_tree_agrees(sglang05, data, page_size, policy):
    case = make_tree_script(lambda n: data.draw(st.integers(0, n - 1)), page_size=page_size,
                            policy=policy, num_ops=40)
    assert first_difference(case, sglang05(case), replay_tree) is None
