"""``kvsim bench``: the harness runs, its report has every column, and the
met / not-met column follows the numbers.

The end-to-end test runs W1 and W4 cut to their first 100 requests (each in
fresh child processes, as the real benchmark does); the judging tests feed
fake numbers to the report renderer.
"""

from __future__ import annotations

import argparse
import math

import pytest

from kvsim import bench
from kvsim.bench import REPORT_COLUMNS, TARGETS, WORKLOADS, Measurement, judge, render_report

HEADER = "| " + " | ".join(REPORT_COLUMNS) + " |"
MACHINE = {"cpu": "Test CPU", "cores": 2, "python": "3.11", "numpy": "2.4", "loadavg": (0.5, 0.5, 0.5)}


def bench_args(*workloads, **over) -> argparse.Namespace:
    args = dict(workloads=list(workloads), reps=1, heavy_reps=1, quick=False, no_ratio=False, profile=False,
                requests=None, workers=None, out="unused.md")
    args.update(over)
    return argparse.Namespace(**args)


def fake_run(sim_s: float, wall_s: float, rss_mib: float, steps: int = 1000, requests: int = 100,
             cpu_share: float = 0.5) -> dict:
    return {"sim_s": sim_s, "sim_cpu_s": cpu_share * sim_s, "process_wall_s": wall_s,
            "process_cpu_s": cpu_share * wall_s, "peak_rss_mib": rss_mib, "num_requests": requests,
            "num_steps": steps, "requests_per_s": requests / sim_s, "steps_per_s": steps / sim_s,
            "us_per_step": 1e6 * sim_s / steps, "fast_step_share": 50.0, "summary": {}}


def report(measurements, **over) -> str:
    kw = dict(machine=MACHINE, load_end=(0.5, 0.5, 0.5), command="kvsim bench", reps=1, quick=False,
              requests=None, commit="abc1234", profile=None, started="now")
    kw.update(over)
    return render_report(measurements, **kw)


def target_row(text: str, workload: str, target_text: str) -> str:
    return next(line for line in text.splitlines()
                if line.startswith(f"| {workload} | {target_text}"))


# ---------------------------------------------------------------- judging


def test_judge_value_below_limit_is_met():
    assert judge(0.99, 1.0) == "met"


def test_judge_value_at_limit_is_not_met_and_says_how_far_off():
    assert judge(1.0, 1.0) == "NOT met (1.00x the target)"
    assert judge(41.9, 1.0) == "NOT met (41.90x the target)"


def test_judge_missing_value_is_not_applicable():
    assert judge(None, 1.0) == "n/a (not measured)"
    assert judge(math.nan, 1.0) == "n/a (not measured)"


def test_targets_are_the_issues():
    assert {(t.workload, t.metric, t.limit) for t in TARGETS} == {
        ("W1", "sim_s", 1.0), ("W1", "process_wall_s", 3.0),
        ("W1", "sim_cpu_s", 1.0), ("W1", "process_cpu_s", 3.0),
        ("W3", "process_wall_s", 30.0), ("W3", "cpu_per_worker_s", 30.0),
        ("W4", "peak_rss_mib", 1024.0), ("W5", "sim_cpu_vs_ref", 20.0)}


def test_report_marks_each_target_from_the_fake_numbers():
    w1 = Measurement(WORKLOADS["W1"], reps=[fake_run(0.5, 4.5, 300), fake_run(0.7, 3.5, 300),
                                            fake_run(0.6, 4.0, 300)])
    w4 = Measurement(WORKLOADS["W4"], reps=[fake_run(100.0, 110.0, 2048.0)])
    w3 = Measurement(WORKLOADS["W3"], reps=[{"process_wall_s": 29.0, "process_cpu_s": 62.0,
                                             "cpu_per_worker_s": 31.0, "peak_rss_mib": 200.0,
                                             "num_requests": 200_000, "requests_per_s": 6896.0,
                                             "points_sim_s_sum": 55.0, "num_points": 100,
                                             "workers": 2}])
    text = report([w1, w3, w4])
    assert target_row(text, "W1", "simulated in under 1 s").endswith("| 0.600 s | met |")
    assert target_row(text, "W1", "whole `kvsim run` process").endswith(
        "| 4.00 s | NOT met (1.33x the target) |")
    # CPU time is half the wall time in the fake runs: 0.30 s and 2.00 s.
    assert target_row(text, "W1", "simulation under 1 s of CPU time").endswith("| 0.300 s | met |")
    assert target_row(text, "W1", "whole process under 3 s of CPU time").endswith("| 2.00 s | met |")
    assert target_row(text, "W3", "100-point sweep").endswith("| 29.00 s | met |")
    assert target_row(text, "W3", "sweep CPU time / workers").endswith(
        "| 31.00 s | NOT met (1.03x the target) |")
    assert target_row(text, "W4", "peak memory").endswith("| 2,048 MiB | NOT met (2.00x the target) |")


def test_w5_is_judged_on_its_cpu_time_over_the_w1_run_before_it():
    w5 = Measurement(WORKLOADS["W5"], reps=[{**fake_run(40.0, 50.0, 3000), "ref_sim_cpu_s": 1.1,
                                             "sim_cpu_vs_ref": 20.0 / 1.1},
                                            {**fake_run(46.0, 50.0, 3000), "ref_sim_cpu_s": 1.0,
                                             "sim_cpu_vs_ref": 23.0}])
    text = report([w5])
    assert target_row(text, "W5", "simulated in at most 20x W1's time").endswith(
        "| 20.59 x | NOT met (1.03x the target) |")
    assert "| CPU time inside simulate() / the reference's (W5: W1's) (x) | 20.59 | 18.18 | 23.00 |" in text


def test_report_workload_table_has_every_column_and_the_spread():
    w1 = Measurement(WORKLOADS["W1"], reps=[fake_run(0.5, 2.0, 300), fake_run(0.9, 2.5, 310),
                                            fake_run(0.6, 2.2, 305)])
    text = report([w1])
    assert HEADER in text
    row = next(line for line in text.splitlines() if line.startswith("| time inside simulate() (s)"))
    assert row == "| time inside simulate() (s) | 0.600 | 0.500 | 0.900 | < 1 s | met |"


def test_report_says_not_met_when_the_step_path_summary_differs():
    w1 = Measurement(WORKLOADS["W1"], reps=[fake_run(0.5, 2.0, 300)],
                     ratio={"prefix": 2000, "requests": 2000, "fast_sim_s": 0.1, "step_sim_s": 1.5,
                            "fast_cpu_s": 0.1, "step_cpu_s": 1.2, "same_summary": False,
                            "step_steps": 10})
    text = report([w1])
    assert "| same summary from both paths | NO | — | — | identical | NOT met |" in text
    assert ("(first 2,000 requests; 1.20 s / 0.100 s; wall: 1.50 s / 0.100 s = 15.0x) | 12.0x |"
            in text)


def test_report_flags_a_loaded_machine_as_pessimistic():
    w1 = Measurement(WORKLOADS["W1"], reps=[fake_run(0.5, 2.0, 300)])
    assert "pessimistic" not in report([w1])
    assert "pessimistic" in report([w1], machine={**MACHINE, "loadavg": (3.2, 3.0, 2.9)})


def test_scaled_down_report_judges_no_target():
    w1 = Measurement(WORKLOADS["W1"], reps=[fake_run(5.0, 9.0, 300)])
    text = report([w1], requests=100)
    assert "NOT met" not in text
    assert target_row(text, "W1", "simulated in under 1 s").endswith("| n/a (scaled-down run) |")


def test_same_summary_treats_nan_as_equal_and_any_other_difference_as_different():
    assert bench.same_summary({"a": 1, "b": math.nan}, {"a": 1, "b": math.nan})
    assert not bench.same_summary({"a": 1.0}, {"a": 1.0 + 1e-12})
    assert not bench.same_summary({"a": 1}, {"a": 1, "b": 2})


def test_unknown_workload_is_a_user_error():
    with pytest.raises(ValueError, match="W9.*allowed: W1, W2, W3, W4, W5"):
        bench.bench_command(bench_args("W9"), log=lambda *_: None)


# ---------------------------------------------------------------- end to end


@pytest.mark.slow
def test_tiny_w1_and_w4_write_a_full_report(tmp_path):
    out = tmp_path / "performance.md"
    lines: list[str] = []
    status = bench.bench_command(bench_args("W1", "W4", requests=100, out=str(out)), log=lines.append)
    assert status == 0
    text = out.read_text()
    for section in ("## Machine", "## Targets", "## W1:", "## W4:", "## Peer comparison", "## Command"):
        assert section in text
    assert text.count(HEADER) == 2
    for metric in ("time inside simulate() (s)", "CPU time inside simulate() (s)",
                   "whole process wall time (s)", "whole process CPU time (user + system) (s)",
                   "simulated requests per wall second", "engine steps per wall second",
                   "peak memory (RSS of the process; W3: its largest process) (MiB)", "step-by-step path / fast path"):
        assert text.count(f"| {metric}") == 2, metric
    # Both paths give the same summary on these runs (the fast path's promise).
    assert text.count("| same summary from both paths | yes |") == 2
    assert "| simulated requests | 100 | 100 | 100 |" in text
    assert "kvsim bench W1 W4 --reps 1 --requests 100 --out" in text


@pytest.mark.parametrize("path", ["fast", "step"])
def test_the_child_runner_records_what_simulate_reports_without_patching_it(tmp_path, path):
    import json
    from pathlib import Path

    import pandas as pd

    import kvsim
    from kvsim.bench.child import run_child

    scenario = str(Path(__file__).resolve().parent.parent / "scenarios" / "quickstart.yaml")
    record_file, out = tmp_path / "rec.json", tmp_path / "out"
    assert run_child([str(record_file), path, scenario, "--out", str(out),
                      "--set", "workload.num_requests=20"]) == 0
    rec = json.loads(record_file.read_text())
    alone = kvsim.simulate(scenario, overrides=["workload.num_requests=20"], fast_path=path == "fast")
    assert (rec["num_steps"], rec["num_fast_steps"]) == (alone.stats.num_steps, alone.stats.num_run_steps)
    assert rec["num_steps"] == len(pd.read_csv(out / "steps.csv"))
    assert rec["num_requests"] == 20 and rec["summary"]["completed"] == 20
    assert (rec["num_fast_steps"] > 0) == (path == "fast")   # the step path skips nothing
    assert bench.same_summary(rec["summary"], dict(alone.summary))
    assert json.loads((out / "summary.json").read_text())["completed"] == 20   # kvsim run's files


def test_bench_scenarios_folder_is_an_option_and_a_missing_one_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"^--scenarios .*nowhere: no w1.yaml there; give the folder"):
        bench.bench_command(bench_args("W1", scenarios=str(tmp_path / "nowhere")), log=lambda *_: None)


@pytest.mark.slow
def test_tiny_w5_runs_a_fleet_after_each_w1_and_reports_the_ratio(tmp_path):
    out = tmp_path / "performance.md"
    lines: list[str] = []
    assert bench.bench_command(bench_args("W5", requests=100, out=str(out)), log=lines.append) == 0
    text = out.read_text()
    assert "## W5:" in text and "| same summary from both paths | yes |" in text
    assert any("x W1's" in line for line in lines)
    assert "| CPU time inside simulate() of the reference workload, run just before (s) |" in text
    assert target_row(text, "W5", "simulated in at most 20x W1's time").endswith("| n/a (scaled-down run) |")
