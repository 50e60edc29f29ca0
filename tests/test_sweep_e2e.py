"""``kvsim sweep`` end to end with the real loader and simulator on a tiny scenario."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

import kvsim.cli
from kvsim.scenario.outputs import strict_summary
from kvsim.scenario.sweep import SweepError, expand_sweep, run_sweep

TINY = {
    "name": "tiny",
    "seed": 0,
    "model": "llama-3.1-8b",
    "hardware": {"gpu": "h100-sxm", "tp": 1},
    "engine": {"scheduler": "chunked", "block_size": 16, "max_num_batched_tokens": 512, "max_num_seqs": 32},
    "cost_model": {"type": "roofline"},
    "workload": {
        "num_requests": 8,
        "arrival": {"type": "poisson", "rate": 8.0},
        "prompt_len": {"type": "lognormal", "median": 200, "sigma": 0.5, "min": 16, "max": 1024},
        "output_len": {"type": "lognormal", "median": 20, "sigma": 0.5, "min": 4, "max": 64},
        "prefix": {"shared_prompt_tokens": 64, "num_groups": 2},
    },
    "sweep": {"grid": {"engine.max_num_batched_tokens": [128, 512],
                       "engine.enable_prefix_caching": [True, False]}},
}


def test_sweep_of_a_real_scenario_writes_every_summary_metric_per_point(tmp_path):
    outcome = run_sweep(TINY, tmp_path, workers=2, progress=False)
    df = pd.read_csv(tmp_path / "results.csv")
    assert (outcome.num_done, outcome.num_failed) == (4, 0)
    assert df[["engine.max_num_batched_tokens", "engine.enable_prefix_caching"]].values.tolist() == [
        [128, True], [128, False], [512, True], [512, False]]
    assert df["completed"].tolist() == [8, 8, 8, 8]
    assert df["status"].tolist() == ["ok"] * 4
    for key in ("duration", "mean_ttft_ms", "p99_itl_ms", "prefix_cache_hit_rate", "num_gpu_blocks"):
        assert key in df.columns
    # prefix caching off never hits the cache; on, the shared 64-token prefixes do
    assert df["prefix_cache_hit_rate"].tolist()[1::2] == [0.0, 0.0]
    assert (df["prefix_cache_hit_rate"].iloc[0::2] > 0).all()


def test_a_sweep_point_equals_the_same_scenario_run_alone(tmp_path):
    point = expand_sweep(TINY)[2]
    run_sweep(TINY, tmp_path, workers=1, progress=False, keep_points=True)
    alone = kvsim.simulate(kvsim.load_scenario(point.scenario))
    kept = json.loads((tmp_path / "points" / point.point_id / "summary.json").read_text())
    # summary.json is strict JSON: NaN metrics (no SLO -> no goodput) are null, with a reason
    assert kept == strict_summary(alone.summary)
    for name in ("requests.csv", "steps.csv", "scenario.yaml"):
        assert (tmp_path / "points" / point.point_id / name).is_file()


def test_a_key_the_scenario_schema_lacks_is_refused_before_anything_runs(tmp_path):
    bad = {**TINY, "sweep": {"grid": {"engine.max_num_batched_token": [128]}}}
    with pytest.raises(SweepError, match=r"^sweep.grid.engine.max_num_batched_token: engine has no key "
                                         r"'max_num_batched_token'; allowed: .*max_num_batched_tokens"):
        run_sweep(bad, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_value_the_loader_refuses_is_reported_with_the_point(tmp_path):
    bad = {**TINY, "sweep": {"grid": {"engine.block_size": [16, 0]}}}
    with pytest.raises(SweepError, match=r"^sweep point \w+ \(engine.block_size=0\): engine.block_size"):
        run_sweep(bad, tmp_path / "out")


def test_kvsim_sweep_command_runs_and_resumes(tmp_path, capsys):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({**TINY, "sweep": {"grid": {"engine.block_size": [16, 32]}}}))
    out = tmp_path / "out"
    assert kvsim.cli.main(["sweep", str(path), "--out", str(out), "--workers", "1"]) == 0
    assert "sweep: 2 points: 2 ok, 0 failed, 0 already done" in capsys.readouterr().out
    assert kvsim.cli.main(["sweep", str(path), "--out", str(out), "--workers", "1"]) == 0
    assert "sweep: 2 points: 0 ok, 0 failed, 2 already done; ran 0" in capsys.readouterr().out
