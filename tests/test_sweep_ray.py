"""``--executor ray``: the same sweep on a local Ray (one CPU, a few points)."""

from __future__ import annotations

import os
import sys

import pandas as pd
import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (the `ray` extra: pip install 'kvsim[ray]')")

from kvsim.scenario.sweep import expand_sweep, run_sweep  # noqa: E402

# Ray workers import functions by module name; this test module is not importable
# there, so ship its functions by value (the way a user's __main__ script goes).
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def fake_run(point_scenario, point_dir=None):
    block_size = point_scenario["engine"]["block_size"]
    if block_size == 13:
        raise RuntimeError("block size 13 is cursed")
    return {"completed": block_size * 10 + point_scenario["seed"], "pid": os.getpid()}


# One Ray start takes 10-20 s on a busy 2-core machine, so this is a single test;
# resume and streaming are executor-independent and tested in test_sweep.py.
@pytest.mark.slow
def test_ray_executor_runs_every_point_in_ray_workers_and_records_failures(tmp_path):
    sc = {"name": "t", "seed": 3, "engine": {"block_size": 16},
          "sweep": {"grid": {"engine.block_size": [8, 13, 16]}}}
    outcome = run_sweep(sc, tmp_path, executor="ray", workers=1, run_point=fake_run, progress=False)
    assert not ray.is_initialized()  # the sweep shuts down the Ray it started
    df = pd.read_csv(tmp_path / "results.csv")
    assert df["point_id"].tolist() == [p.point_id for p in expand_sweep(sc)]
    assert df["status"].tolist() == ["ok", "failed", "ok"]
    assert df["completed"].tolist()[::2] == [83, 163]
    assert df["error"].iloc[1] == "RuntimeError: block size 13 is cursed"
    assert os.getpid() not in set(df["pid"].dropna())
    assert (outcome.num_done, outcome.num_failed, outcome.exit_status) == (2, 1, 1)


@pytest.mark.slow
def test_plan_runs_its_probes_on_the_same_ray_executor():
    from test_plan import tiny_plan

    from kvsim.plan import parse_plan, run_plan
    local = run_plan(parse_plan(tiny_plan(gpus=["l4"])), workers=1)
    on_ray = run_plan(parse_plan(tiny_plan(gpus=["l4"])), executor="ray", workers=1)
    assert not ray.is_initialized()
    assert on_ray == local
