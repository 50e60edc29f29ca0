"""Scenario sweeps (kvsim/scenario/sweep.py): expansion, validation, streaming, resume, CLI.

These use a cheap fake point runner (module-level so it pickles into the
process pool); the end-to-end test with the real simulator lives in
tests/test_sweep_e2e.py.
"""

from __future__ import annotations

import functools
import io
import json
import math
import os
import time

import pandas as pd
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict

from kvsim.scenario.sweep import (
    ProgressBar, SweepError, SweepOutcome, auto_progress, expand_sweep, run_sweep,
    schema_path_error, validate_sweep,
)


def scenario(sweep=None, **sections):
    base = {"name": "t", "seed": 7, "engine": {"block_size": 16, "max_num_batched_tokens": 512},
            "workload": {"arrival": {"type": "poisson", "rate": 1.0}}}
    base.update(sections)
    if sweep is not None:
        base["sweep"] = sweep
    return base


# Points whose engine.block_size is in CURSED fail; tests that run inline
# (workers=1) may change it between runs.
CURSED = {13}
CALLS: list[dict] = []


def fake_run(point_scenario, point_dir=None):
    CALLS.append(point_scenario)
    engine = point_scenario["engine"]
    if engine["block_size"] in CURSED:
        raise RuntimeError(f"block size {engine['block_size']} is cursed")
    return {"completed": engine["block_size"] * 10 + point_scenario["seed"],
            "mean_ttft_ms": engine["max_num_batched_tokens"] / 4}


def pid_run(point_scenario, point_dir=None):
    time.sleep(0.05)
    return {"pid": os.getpid()}


def crashing_run(point_scenario, point_dir=None):
    if point_scenario["engine"]["block_size"] == 0:
        os._exit(3)  # the worker dies, as with a segfault or an OOM kill
    time.sleep(0.5)  # long enough that the pool notices the crash while these are in flight
    return {"completed": 1}


def writing_run(point_scenario, point_dir=None):
    if point_dir is not None:
        with open(os.path.join(point_dir, "summary.json"), "w") as f:
            json.dump({"completed": 1}, f)
    return {"completed": 1}


@pytest.fixture(autouse=True)
def _reset_fake_state():
    CALLS.clear()
    yield
    CALLS.clear()


def run(sc, out, **kw):
    kw.setdefault("workers", 1)
    kw.setdefault("progress", False)
    return run_sweep(sc, out, run_point=kw.pop("run_point", fake_run), **kw)


# --- expansion ---------------------------------------------------------------

def test_grid_is_the_cartesian_product_with_the_last_key_varying_fastest():
    points = expand_sweep(scenario({"grid": {"engine.block_size": [16, 32],
                                             "engine.max_num_batched_tokens": [256, 512, 1024]}}))
    assert [p.params for p in points] == [
        {"engine.block_size": b, "engine.max_num_batched_tokens": t}
        for b in (16, 32) for t in (256, 512, 1024)]
    assert [p.index for p in points] == list(range(6))


def test_zip_lists_advance_together():
    points = expand_sweep(scenario({"zip": {"workload.arrival.rate": [1, 2, 4],
                                            "engine.block_size": [8, 16, 32]}}))
    assert [p.params for p in points] == [
        {"workload.arrival.rate": 1, "engine.block_size": 8},
        {"workload.arrival.rate": 2, "engine.block_size": 16},
        {"workload.arrival.rate": 4, "engine.block_size": 32}]


def test_zip_and_grid_combine_with_the_zip_tuple_outermost():
    points = expand_sweep(scenario({"zip": {"workload.arrival.rate": [1, 2]},
                                    "grid": {"engine.block_size": [16, 32, 64]}}))
    assert [(p.params["workload.arrival.rate"], p.params["engine.block_size"]) for p in points] == [
        (1, 16), (1, 32), (1, 64), (2, 16), (2, 32), (2, 64)]


def test_repeat_is_innermost_with_seeds_base_plus_repeat_index():
    points = expand_sweep(scenario({"grid": {"engine.block_size": [16, 32]}, "repeat": 3}))
    assert [(p.params["engine.block_size"], p.repeat, p.seed, p.scenario["seed"]) for p in points] == [
        (16, 0, 7, 7), (16, 1, 8, 8), (16, 2, 9, 9), (32, 0, 7, 7), (32, 1, 8, 8), (32, 2, 9, 9)]


def test_point_scenario_has_the_swept_values_set_and_no_sweep_section():
    base = scenario({"grid": {"workload.arrival.rate": [2.5]}})
    (point,) = expand_sweep(base)
    assert point.scenario == {"name": "t", "seed": 7,
                              "engine": {"block_size": 16, "max_num_batched_tokens": 512},
                              "workload": {"arrival": {"type": "poisson", "rate": 2.5}}}
    assert base["workload"]["arrival"]["rate"] == 1.0  # the input is not modified


def test_point_ids_are_stable_and_do_not_depend_on_key_order():
    forward = expand_sweep(scenario({"grid": {"engine.block_size": [16, 32],
                                              "workload.arrival.rate": [1, 2]}, "repeat": 2}))
    again = expand_sweep(scenario({"grid": {"engine.block_size": [16, 32],
                                            "workload.arrival.rate": [1, 2]}, "repeat": 2}))
    backward = expand_sweep(scenario({"grid": {"workload.arrival.rate": [1, 2],
                                               "engine.block_size": [16, 32]}, "repeat": 2}))
    assert [p.point_id for p in forward] == [p.point_id for p in again]
    by_values = lambda pts: {(p.params["engine.block_size"], p.params["workload.arrival.rate"], p.repeat):
                             p.point_id for p in pts}
    assert by_values(forward) == by_values(backward)
    assert len({p.point_id for p in forward}) == 8


def test_point_id_of_an_extended_sweep_keeps_the_old_ids():
    small = expand_sweep(scenario({"grid": {"engine.block_size": [16, 32]}}))
    large = expand_sweep(scenario({"grid": {"engine.block_size": [8, 16, 32, 64]}}))
    assert {p.point_id for p in small} <= {p.point_id for p in large}


def test_scenario_without_sweep_section_is_one_point():
    (point,) = expand_sweep(scenario())
    assert point.params == {} and point.repeat == 0 and point.seed == 7


def test_a_missing_top_level_section_starts_empty():
    (point,) = expand_sweep(scenario({"grid": {"slo.ttft_ms": [200]}}))
    assert point.scenario["slo"] == {"ttft_ms": 200}


def test_a_swept_value_may_be_a_whole_mapping():
    points = expand_sweep(scenario({"grid": {"workload.arrival": [{"type": "poisson", "rate": 1},
                                                                  {"type": "gamma", "rate": 1, "cv": 2}]}}))
    assert points[1].scenario["workload"]["arrival"] == {"type": "gamma", "rate": 1, "cv": 2}


@settings(max_examples=40, deadline=None)
@given(grid_sizes=st.lists(st.integers(1, 4), max_size=3), zip_len=st.integers(0, 3),
       repeat=st.integers(1, 3))
def test_point_count_is_zip_length_times_grid_product_times_repeat_with_unique_ids(grid_sizes, zip_len, repeat):
    grid = {f"engine.g{i}": list(range(n)) for i, n in enumerate(grid_sizes)}
    zipped = {"workload.z": list(range(zip_len))} if zip_len else {}
    points = expand_sweep(scenario({"grid": grid, "zip": zipped, "repeat": repeat}))
    expected = max(zip_len, 1) * math.prod(grid_sizes) * repeat
    assert len(points) == expected
    assert len({p.point_id for p in points}) == expected
    assert [p.seed for p in points] == [7 + i % repeat for i in range(expected)]


# --- bad input -----------------------------------------------------------------

@pytest.mark.parametrize("sweep, message", [
    ({"grid": {"engine.block_size": []}}, "sweep.grid.engine.block_size: empty list"),
    ({"zip": {"engine.block_size": []}}, "sweep.zip.engine.block_size: empty list"),
    ({"grid": {"engine.block_size": 16}}, "sweep.grid.engine.block_size: expected a non-empty list of values, got 16"),
    ({"grid": [1, 2]}, "sweep.grid: expected a mapping of dotted.path: [values]"),
    ({"grid": {"engine.block_size": [16]}, "seeds": 3}, "sweep.seeds: unknown key; allowed: grid, zip, repeat"),
    ({"repeat": 0}, "sweep.repeat: expected an integer >= 1, got 0"),
    ({"repeat": "3"}, "sweep.repeat: expected an integer >= 1, got '3'"),
    ({"grid": {"engine.block_size": [16, 16]}}, "sweep.grid.engine.block_size: value 16 appears twice"),
    ({"grid": {"seed": [1, 2]}}, "sweep.grid.seed: the seed is swept by `repeat: N`"),
    ({"grid": {"engine..block_size": [1]}}, "sweep.grid.engine..block_size: 'engine..block_size' is not a dotted path"),
    ({"zip": {"engine.block_size": [16]}, "grid": {"engine.block_size": [32]}},
     "sweep.grid.engine.block_size: also swept as sweep.zip.engine.block_size"),
    ({"grid": {"workload.arrival": [{}], "workload.arrival.rate": [1]}},
     "sweep.grid.workload.arrival.rate: overlaps sweep.grid.workload.arrival"),
])
def test_malformed_sweep_section_is_an_error_naming_the_key(sweep, message):
    with pytest.raises(SweepError) as err:
        expand_sweep(scenario(sweep))
    assert message in str(err.value)


def test_zip_lists_of_different_lengths_are_an_error_naming_the_keys():
    with pytest.raises(SweepError, match=r"sweep.zip: lists must all have the same length; "
                                         r"got workload.arrival.rate: 3, engine.block_size: 2"):
        expand_sweep(scenario({"zip": {"workload.arrival.rate": [1, 2, 3], "engine.block_size": [8, 16]}}))


def test_a_key_under_a_missing_parent_is_an_error_naming_the_key():
    with pytest.raises(SweepError, match=r"sweep.grid.engine.scheduler.policy: engine.scheduler is not in "
                                         r"the scenario; the parent of a swept key must exist "
                                         r"\(keys of engine: block_size, max_num_batched_tokens\)"):
        expand_sweep(scenario({"grid": {"engine.scheduler.policy": ["fcfs"]}}))


def test_an_unknown_section_is_an_error_listing_the_sections():
    with pytest.raises(SweepError, match=r"sweep.grid.engin.block_size: engin is not a scenario section; "
                                         r"allowed: (\w+, )*engine, "):
        expand_sweep(scenario({"grid": {"engin.block_size": [16]}}))


def test_a_key_under_a_plain_value_is_an_error():
    with pytest.raises(SweepError, match=r"sweep.grid.model.num_layers: model is 'llama-3-8b', not a mapping"):
        expand_sweep(scenario({"grid": {"model.num_layers": [2]}}, model="llama-3-8b"))


class _Engine(BaseModel):
    model_config = ConfigDict(extra="forbid")
    block_size: int = 16
    max_num_batched_tokens: int = 2048


class _Poisson(BaseModel):
    type: str = "poisson"
    rate: float = 1.0


class _Gamma(BaseModel):
    type: str = "gamma"
    rate: float = 1.0
    cv: float = 1.0


class _Workload(BaseModel):
    arrival: _Poisson | _Gamma = _Poisson()
    extra_args: dict = {}


class _Scenario(BaseModel):
    name: str = "x"
    seed: int = 0
    engine: _Engine = _Engine()
    workload: _Workload = _Workload()


@pytest.mark.parametrize("path", ["engine.block_size", "workload.arrival.cv", "workload.arrival.rate",
                                  "workload.extra_args.anything.below", "seed"])
def test_schema_check_accepts_keys_the_schema_has(path):
    assert schema_path_error(_Scenario, path) is None


def test_schema_check_names_the_missing_key_and_what_is_allowed():
    assert schema_path_error(_Scenario, "engine.blok_size") == (
        "engine has no key 'blok_size'; allowed: block_size, max_num_batched_tokens")
    assert schema_path_error(_Scenario, "workload.arrival.shape") == (
        "workload.arrival has no key 'shape'; allowed: cv, rate, type")


def test_validate_sweep_reports_a_schema_miss_with_its_sweep_path():
    with pytest.raises(SweepError, match=r"^sweep.zip.engine.blok_size: engine has no key 'blok_size'"):
        validate_sweep(scenario({"zip": {"engine.blok_size": [16]}}), check_point=None, schema_model=_Scenario)


def strict_loader(point_scenario):
    if point_scenario["engine"]["block_size"] <= 0:
        raise ValueError(f"engine.block_size: {point_scenario['engine']['block_size']} is not allowed; "
                         f"expected an integer >= 1")


def test_loader_error_is_reported_with_the_point_parameters():
    sc = scenario({"grid": {"engine.block_size": [16, 0], "engine.max_num_batched_tokens": [64]}})
    bad = expand_sweep(sc)[1]
    with pytest.raises(SweepError) as err:
        validate_sweep(sc, check_point=strict_loader, schema_model=None)
    assert str(err.value) == (f"sweep point {bad.point_id} (engine.block_size=0, engine.max_num_batched_tokens=64): "
                              f"engine.block_size: 0 is not allowed; expected an integer >= 1")


def test_nothing_runs_when_a_point_is_invalid(tmp_path):
    with pytest.raises(SweepError, match="engine.block_size=0"):
        run(scenario({"grid": {"engine.block_size": [16, 0]}}), tmp_path / "out", check_point=strict_loader)
    assert CALLS == []
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kwargs, message", [
    ({"executor": "dask"}, "--executor: 'dask' is not an executor; allowed: local, ray"),
    ({"workers": 0}, "--workers: expected an integer >= 1, got 0"),
    ({"address": "ray://x:10001"}, "--address: 'ray://x:10001' is only used with --executor ray"),
])
def test_bad_run_options_are_errors_naming_the_option(tmp_path, kwargs, message):
    with pytest.raises(SweepError, match=message):
        run(scenario({"grid": {"engine.block_size": [16]}}), tmp_path, **kwargs)


def test_ray_executor_without_ray_installed_is_an_error_before_anything_runs(tmp_path, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "ray", None)  # makes `import ray` fail
    with pytest.raises(SweepError, match=r"--executor ray: ray is not installed .*pip install 'kvsim\[ray\]'"):
        run(scenario({"grid": {"engine.block_size": [16]}}), tmp_path / "out", executor="ray")
    assert CALLS == [] and not (tmp_path / "out").exists()


# --- running, streaming, resume ---------------------------------------------------

def test_results_csv_has_one_row_per_point_in_sweep_order(tmp_path):
    sc = scenario({"grid": {"engine.block_size": [16, 32], "engine.max_num_batched_tokens": [256, 512]}})
    outcome = run(sc, tmp_path)
    df = pd.read_csv(tmp_path / "results.csv", keep_default_na=False)
    assert list(df.columns) == ["point_id", "repeat", "seed", "engine.block_size",
                                "engine.max_num_batched_tokens", "completed", "mean_ttft_ms",
                                "status", "error", "wall_time_s"]
    assert df["point_id"].tolist() == [p.point_id for p in expand_sweep(sc)]
    assert df[["engine.block_size", "engine.max_num_batched_tokens", "completed", "mean_ttft_ms"]]\
        .values.tolist() == [[16, 256, 167, 64.0], [16, 512, 167, 128.0], [32, 256, 327, 64.0],
                             [32, 512, 327, 128.0]]
    assert df["status"].tolist() == ["ok"] * 4 and df["error"].tolist() == [""] * 4
    assert (df["wall_time_s"] >= 0).all()
    assert (outcome.num_points, outcome.num_done, outcome.num_failed, outcome.num_skipped) == (4, 4, 0, 0)
    assert outcome.exit_status == 0


def test_a_failing_point_records_its_error_and_the_sweep_goes_on(tmp_path):
    outcome = run(scenario({"grid": {"engine.block_size": [8, 13, 16]}}), tmp_path)
    df = pd.read_csv(tmp_path / "results.csv")
    assert df["status"].tolist() == ["ok", "failed", "ok"]
    assert df["error"].fillna("").tolist() == ["", "RuntimeError: block size 13 is cursed", ""]
    assert df["completed"].isna().tolist() == [False, True, False]
    assert (outcome.num_done, outcome.num_failed, outcome.exit_status) == (2, 1, 1)
    log = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert "raise RuntimeError" in log[1]["traceback"]


def test_exit_status_is_the_number_of_failed_points_capped_at_100():
    outcome = lambda failed: SweepOutcome(200, 0, failed, 0, 1.0, 1, None)
    assert [outcome(n).exit_status for n in (0, 1, 7, 100, 150)] == [0, 1, 7, 100, 100]


def test_rows_stream_to_the_log_as_each_point_finishes(tmp_path):
    lines_seen = []

    def progress(done, failed, total):
        path = tmp_path / "results.jsonl"
        lines_seen.append((done, len(path.read_text().splitlines()) if path.exists() else 0))

    run(scenario({"grid": {"engine.block_size": [8, 16, 32]}}), tmp_path, progress=progress)
    assert lines_seen == [(0, 0), (1, 1), (2, 2), (3, 3)]


def test_rerun_skips_points_that_finished_ok(tmp_path):
    sc = scenario({"grid": {"engine.block_size": [8, 16]}})
    run(sc, tmp_path)
    CALLS.clear()
    outcome = run(sc, tmp_path)
    assert CALLS == []
    assert (outcome.num_done, outcome.num_failed, outcome.num_skipped) == (0, 0, 2)
    assert len(pd.read_csv(tmp_path / "results.csv")) == 2


def test_rerun_retries_failed_points_only(tmp_path, monkeypatch):
    sc = scenario({"grid": {"engine.block_size": [8, 13, 16]}})
    run(sc, tmp_path)
    monkeypatch.setattr(f"{__name__}.CURSED", set())  # the cure; runs inline, so it applies
    CALLS.clear()
    outcome = run(sc, tmp_path)
    assert [c["engine"]["block_size"] for c in CALLS] == [13]
    assert (outcome.num_done, outcome.num_failed, outcome.num_skipped) == (1, 0, 2)
    df = pd.read_csv(tmp_path / "results.csv")
    assert df["status"].tolist() == ["ok", "ok", "ok"]
    assert df["completed"].tolist() == [87, 137, 167]


def test_an_extended_sweep_runs_only_the_new_points(tmp_path):
    run(scenario({"grid": {"engine.block_size": [8, 16]}}), tmp_path)
    CALLS.clear()
    outcome = run(scenario({"grid": {"engine.block_size": [8, 16, 32]}}), tmp_path)
    assert [c["engine"]["block_size"] for c in CALLS] == [32]
    assert pd.read_csv(tmp_path / "results.csv")["engine.block_size"].tolist() == [8, 16, 32]
    assert outcome.num_skipped == 2


def test_a_torn_last_line_is_ignored_and_that_point_runs_again(tmp_path):
    sc = scenario({"grid": {"engine.block_size": [8, 16]}})
    run(sc, tmp_path)
    log = tmp_path / "results.jsonl"
    first, second = log.read_text().splitlines()
    log.write_text(first + "\n" + second[: len(second) // 2])  # killed mid-write
    CALLS.clear()
    outcome = run(sc, tmp_path)
    assert [c["engine"]["block_size"] for c in CALLS] == [16]
    assert outcome.num_skipped == 1
    assert pd.read_csv(tmp_path / "results.csv")["status"].tolist() == ["ok", "ok"]


def test_rerun_with_a_different_base_scenario_is_refused(tmp_path):
    run(scenario({"grid": {"engine.block_size": [8]}}), tmp_path)
    changed = scenario({"grid": {"engine.block_size": [8]}}, seed=8)
    with pytest.raises(SweepError, match=r"--out .*: holds a sweep of a different base scenario"):
        run(changed, tmp_path)


def test_points_run_in_worker_processes_with_the_local_executor(tmp_path):
    outcome = run(scenario({"grid": {"engine.block_size": [1, 2, 3, 4]}}), tmp_path,
                  workers=2, run_point=pid_run)
    df = pd.read_csv(tmp_path / "results.csv")
    assert outcome.num_done == 4
    assert os.getpid() not in set(df["pid"])


def test_a_dying_worker_fails_the_points_in_flight_and_the_rest_still_run(tmp_path):
    sc = scenario({"grid": {"engine.block_size": [0, 1, 2, 3, 4, 5]}})
    outcome = run(sc, tmp_path, workers=2, run_point=crashing_run)
    df = pd.read_csv(tmp_path / "results.csv", keep_default_na=False)
    assert len(df) == 6
    assert df["status"].iloc[0] == "failed"
    assert "worker process died" in df["error"].iloc[0]
    assert df["status"].iloc[4:].tolist() == ["ok", "ok"]  # submitted after the crash, to a fresh pool
    assert outcome.num_failed == (df["status"] == "failed").sum() >= 1


def test_keep_points_writes_each_point_folder_with_its_scenario(tmp_path):
    sc = scenario({"grid": {"engine.block_size": [8, 16]}})
    run(sc, tmp_path, keep_points=True, run_point=writing_run)
    for point in expand_sweep(sc):
        folder = tmp_path / "points" / point.point_id
        assert yaml.safe_load((folder / "scenario.yaml").read_text()) == point.scenario
        assert json.loads((folder / "summary.json").read_text()) == {"completed": 1}


def test_points_folder_is_only_written_when_asked(tmp_path):
    run(scenario({"grid": {"engine.block_size": [8]}}), tmp_path, run_point=writing_run)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "results.csv", "results.jsonl", "sweep.json"]


def colliding_run(point_scenario, point_dir=None):
    return {"status": "fine", "completed": 3}


def test_summary_keys_that_collide_with_row_columns_get_a_prefix(tmp_path):
    run(scenario({"grid": {"engine.block_size": [8]}}), tmp_path, run_point=colliding_run)
    df = pd.read_csv(tmp_path / "results.csv")
    assert df[["summary_status", "completed", "status"]].values.tolist() == [["fine", 3, "ok"]]


# --- progress -------------------------------------------------------------------

class _Tty(io.StringIO):
    def __init__(self, tty):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


def test_progress_bar_only_on_a_terminal():
    assert isinstance(auto_progress(_Tty(True)), ProgressBar)
    assert auto_progress(_Tty(False)) is None


def test_progress_bar_shows_done_total_failures_rate_and_eta():
    stream, now = _Tty(True), [100.0]
    bar = ProgressBar(stream, width=10, clock=lambda: now[0])
    bar(0, 0, 100)
    now[0] = 110.0
    bar(25, 1, 100)
    now[0] = 140.0
    bar(100, 1, 100)
    assert stream.getvalue().split("\r")[1:] == [
        "sweep [..........] 0/100 points, 0.0 points/s, ETA ?",
        "sweep [##........] 25/100 points, 1 failed, 2.5 points/s, ETA 30s",
        "sweep [##########] 100/100 points, 1 failed, 2.5 points/s, ETA 0s\n"]


def test_progress_bar_redraws_at_most_every_interval_but_always_the_last():
    stream, now = _Tty(True), [0.0]
    bar = ProgressBar(stream, min_interval_s=1.0, clock=lambda: now[0])
    for done in range(5):
        now[0] = done * 0.25
        bar(done, 0, 4)
    assert stream.getvalue().count("\r") == 2  # the first and the last


# --- CLI ---------------------------------------------------------------------------

@pytest.fixture
def cli(monkeypatch):
    """kvsim.cli.main with the fake runner (the real simulator: tests/test_sweep_e2e.py)."""
    import kvsim.cli
    from kvsim.scenario import sweep_cli
    monkeypatch.setattr(sweep_cli, "run_sweep",
                        functools.partial(run_sweep, run_point=fake_run, progress=False))
    return kvsim.cli.main


def write_yaml(path, data):
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_cli_exit_status_is_the_number_of_failed_points(cli, tmp_path, capsys):
    path = write_yaml(tmp_path / "s.yaml", scenario({"grid": {"engine.block_size": [8, 13, 16]}}))
    assert cli(["sweep", path, "--out", str(tmp_path / "out"), "--workers", "1"]) == 1
    out, err = capsys.readouterr()
    assert out.startswith("sweep: 3 points: 2 ok, 1 failed, 0 already done; ran 3 in ")
    assert "1 point(s) failed" in err


def test_cli_bad_sweep_key_exits_2_naming_the_key(cli, tmp_path, capsys):
    path = write_yaml(tmp_path / "s.yaml", scenario({"grid": {"engine.block_size": []}}))
    assert cli(["sweep", path, "--out", str(tmp_path / "out")]) == 2
    assert "kvsim sweep: error: sweep.grid.engine.block_size: empty list" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_cli_set_overrides_the_base_scenario(cli, tmp_path):
    path = write_yaml(tmp_path / "s.yaml", scenario({"grid": {"engine.block_size": [8]}}))
    assert cli(["sweep", path, "--out", str(tmp_path / "out"), "--workers", "1",
                "--set", "engine.max_num_batched_tokens=100", "--set", "sweep.repeat=2"]) == 0
    df = pd.read_csv(tmp_path / "out" / "results.csv")
    assert df[["seed", "completed", "mean_ttft_ms"]].values.tolist() == [[7, 87, 25.0], [8, 88, 25.0]]


def test_cli_set_without_equals_is_an_error(cli, tmp_path, capsys):
    path = write_yaml(tmp_path / "s.yaml", scenario())
    assert cli(["sweep", path, "--out", str(tmp_path / "out"), "--set", "engine.block_size"]) == 2
    assert "--set 'engine.block_size': expected KEY=VALUE" in capsys.readouterr().err


def test_cli_missing_scenario_file_exits_2(cli, tmp_path, capsys):
    assert cli(["sweep", str(tmp_path / "nope.yaml"), "--out", str(tmp_path / "out")]) == 2
    assert "nope.yaml' does not exist" in capsys.readouterr().err
