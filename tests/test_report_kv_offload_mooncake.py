"""``kvsim report kv_offload_mooncake`` on a small synthetic trace in the Mooncake
format (always runs; the real trace is in tests/test_reports.py when the data is there),
and the data root option: a missing trace is one line naming the folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvsim.reports import run_reports
from kvsim.reports.framework import ReportContext
from kvsim.reports.kv_offload_mooncake import TRACE, build, reuse_bound, trace_path, write_synthetic_trace

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
# A 1,024-block GPU cache (16k tokens) and max_model_len to match: each session's
# next turn comes after the 23 others' turns (~70k tokens), past the GPU cache.
SMALL_GPU = ("engine.num_gpu_blocks_override=1024", "engine.max_model_len=8192")


def test_the_synthetic_trace_has_the_conversation_shape(tmp_path: Path):
    path = write_synthetic_trace(tmp_path / TRACE, sessions=3, turns=2)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 6
    # Turn 2 of session s extends turn 1's hash_ids; every prompt starts with block 0.
    for s in range(3):
        assert rows[3 + s]["hash_ids"][:len(rows[s]["hash_ids"])] == rows[s]["hash_ids"]
    assert all(r["hash_ids"][0] == 0 for r in rows)
    assert all(512 * (len(r["hash_ids"]) - 1) < r["input_length"] <= 512 * len(r["hash_ids"]) for r in rows)


def test_the_reuse_bound_counts_leading_blocks_seen_before(tmp_path: Path):
    path = tmp_path / "t.jsonl"
    rows = [{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]},
            {"timestamp": 0, "input_length": 1500, "output_length": 5, "hash_ids": [0, 1, 2]},
            {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [9, 0]}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    b = reuse_bound(path, 3)
    # Row 2 hits block 0 and the 488 tokens of block 1 that row 1 had (its partial
    # tail): 1,000 tokens, 992 in whole 16-token blocks; row 3 none (its first block is new).
    assert b["hit_rate"] == 992 / 3100
    assert b["median_reuse_tokens"] == 1000.0          # both reuses 1,000 tokens later
    assert reuse_bound(path, 1)["hit_rate"] == 0.0
    # A prompt seen whole is hit short of its last token: 1,000 - 1 -> 992 (62 blocks).
    path.write_text("\n".join(json.dumps(r) for r in (rows[0], rows[0])) + "\n")
    assert reuse_bound(path, 2)["hit_rate"] == 992 / 2000


def test_the_report_runs_on_a_synthetic_trace(tmp_path: Path):
    trace = write_synthetic_trace(tmp_path / "data" / TRACE)
    ctx = ReportContext(out=tmp_path / "out", fast=True, scenarios=SCENARIOS, data=tmp_path / "data")
    assert trace_path(ctx.data) == trace.resolve()         # found under the data root
    rep = build(ctx, trace_path(ctx.data), max_requests=72, small_gib=4, big_gib=64, disk_gib=64,
                extra=SMALL_GPU)
    rows = {r["run"]: r for r in rep.numbers["rows"]}
    assert rows["GPU only"]["tier_hit_rate"] == 0.0
    # 64 GiB holds the whole run: the GPU and the tier together hit exactly what an
    # unbounded cache would (reuse_bound); 4 GiB (32k tokens) holds less than a round of turns.
    big, small = rows["CPU 64 GiB"], rows["CPU 4 GiB"]
    assert big["hit_rate"] == rep.numbers["bound"]["hit_rate"]
    assert big["gpu_hit_rate"] + big["tier_hit_rate"] == pytest.approx(big["hit_rate"], abs=1e-12)
    assert small["tier_hit_rate"] < big["tier_hit_rate"] / 5
    assert rows["CPU 4 GiB + disk"]["tier_hit_rate"] > small["tier_hit_rate"]
    assert big["gpu_hit_rate"] == rows["GPU only"]["gpu_hit_rate"]
    assert rep.numbers["ttft_gain"] > 0 and rep.numbers["throughput_gain"] > 0
    assert (ctx.out / "figures" / "kv_offload_mooncake.png").is_file()
    assert rep.verdict == "agrees"


def test_a_missing_trace_is_one_line_naming_the_data_root(tmp_path: Path):
    with pytest.raises(ValueError, match=r"no traces/mooncake_conversation_trace.jsonl under the data "
                                         r"root .*nowhere \(--data DIR"):
        run_reports(["kv_offload_mooncake"], tmp_path / "out", fast=True, scenarios=SCENARIOS,
                    data=tmp_path / "nowhere")
