"""kvsim's offload tier against vLLM's own CPUOffloadingManager (differential test).

The recorded part always runs: tests/golden/vllm_offload/cases.json.gz holds
seeded random scripts (stores, completions and failures, loads, touches,
request finishes, lookups) and, after each operation, the state vLLM 0.33's
manager reached: every chunk's ref count, the eviction order and the LRU
ranks themselves. kvsim's ``OffloadTier`` must reach the same state.
tests/vllm_offload_oracle/record.py re-records it. The live part runs
hypothesis scripts through vLLM when ``KVSIM_VLLM_PYTHON`` names a Python
with vLLM installed (the scheduler-side manager needs no GPU).
"""

from __future__ import annotations

import functools
import gzip
import json
import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vllm_offload_oracle.scripts import make_script, replay

HERE = Path(__file__).parent
GOLDEN = HERE / "golden" / "vllm_offload" / "cases.json.gz"
DRIVER = HERE / "vllm_offload_oracle" / "driver.py"


@functools.lru_cache(maxsize=1)
def _golden() -> dict:
    with gzip.open(GOLDEN, "rt") as f:
        return json.load(f)


def first_difference(case: dict, expected: list[dict]) -> str | None:
    got = json.loads(json.dumps(replay(case)))
    for i, (g, e) in enumerate(zip(got, expected)):
        for key in e:
            if g[key] != e[key]:
                return f"op {i} {case['ops'][i]}: {key} is {g[key]}, vLLM has {e[key]}"
    return None if len(got) == len(expected) else f"{len(got)} snapshots, vLLM gave {len(expected)}"


def test_golden_file_covers_every_operation():
    cases = _golden()["cases"]
    assert len(cases) >= 100
    ops = {o["op"] for c in cases for o in c["ops"]}
    assert ops == {"store", "complete", "load", "complete_load", "touch", "finish", "lookup"}
    results = [s["r"] for c in cases for o, s in zip(c["ops"], c["expected"]) if o["op"] == "store"]
    assert None in results                                   # failed stores are covered
    assert any(r and r["evicted"] for r in results)          # and evictions


@pytest.mark.parametrize("index", range(len(_golden()["cases"])))
def test_recorded_vllm_script(index):
    case = _golden()["cases"][index]
    assert first_difference(case, case["expected"]) is None


@pytest.fixture(scope="module")
def vllm():
    python = os.environ.get("KVSIM_VLLM_PYTHON")
    if not python or subprocess.run([python, "-c", "import vllm.v1.kv_offload.cpu.manager"],
                                    capture_output=True, cwd="/").returncode:
        pytest.skip("set KVSIM_VLLM_PYTHON to a Python with vLLM installed")
    proc = subprocess.Popen([python, str(DRIVER), "--lines"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd="/")

    def run(case):
        proc.stdin.write(json.dumps(case) + "\n")
        proc.stdin.flush()
        return json.loads(proc.stdout.readline())
    yield run
    proc.stdin.close()
    proc.wait(timeout=30)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.large_base_example, HealthCheck.too_slow])
@given(data=st.data(), num_chunks=st.integers(1, 12))
def test_live_vllm_agrees(vllm, data, num_chunks):
    case = make_script(lambda n: data.draw(st.integers(0, n - 1)), num_chunks=num_chunks, num_ops=60)
    assert first_difference(case, vllm(case)) is None
