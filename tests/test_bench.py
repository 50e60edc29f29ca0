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
                no_attribution=False, compare=None, requests=None, workers=None, out="unused.md")
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
    assert {(t.workload, t.metric, t.limit, t.relative_to) for t in TARGETS} == {
        ("W1", "sim_s", 0.5, None), ("W1", "process_wall_s", 1.5, None),
        ("W1", "sim_cpu_s", 0.5, None), ("W1", "process_cpu_s", 1.5, None),
        ("W3", "process_wall_s", 30.0, None), ("W3", "cpu_per_worker_s", 30.0, None),
        ("W4", "peak_rss_mib", 1024.0, None), ("W5", "peak_rss_mib", 1024.0, None),
        ("W6", "sim_cpu_s", 1.5, "W1"), ("W7", "sim_cpu_s", 20.0, "W1"), ("W7", "sim_s", 10.0, None)}


def test_w5_is_opt_in_and_the_others_are_the_default_set():
    from kvsim.bench.workloads import DEFAULT_WORKLOADS
    assert DEFAULT_WORKLOADS == ("W1", "W2", "W3", "W4", "W6", "W7")
    assert "W5" in WORKLOADS


def test_report_marks_each_target_from_the_fake_numbers():
    w1 = Measurement(WORKLOADS["W1"], reps=[fake_run(0.25, 2.0, 300), fake_run(0.35, 1.5, 300),
                                            fake_run(0.3, 1.6, 300)])
    w4 = Measurement(WORKLOADS["W4"], reps=[fake_run(100.0, 110.0, 2048.0)])
    w6 = Measurement(WORKLOADS["W6"], reps=[fake_run(0.6, 2.0, 300)])
    w3 = Measurement(WORKLOADS["W3"], reps=[{"process_wall_s": 29.0, "process_cpu_s": 62.0,
                                             "cpu_per_worker_s": 31.0, "peak_rss_mib": 200.0,
                                             "num_requests": 200_000, "requests_per_s": 6896.0,
                                             "points_sim_s_sum": 55.0, "num_points": 100,
                                             "workers": 2}])
    text = report([w1, w3, w4, w6])
    assert target_row(text, "W1", "simulated in 0.5 s").endswith("| 0.300 s | met |")
    assert target_row(text, "W1", "whole `kvsim run` process").endswith(
        "| 1.60 s | NOT met (1.07x the target) |")
    # CPU time is half the wall time in the fake runs: 0.15 s and 0.80 s.
    assert target_row(text, "W1", "simulation in 0.5 s of CPU time").endswith("| 0.150 s | met |")
    assert target_row(text, "W1", "whole process in 1.5 s of CPU time").endswith("| 0.80 s | met |")
    # W6 / W1 in CPU time: 0.30 s / 0.15 s.
    assert target_row(text, "W6", "`continuous` within 1.5x").endswith(
        "| 2.00x (0.300 s / 0.150 s); 1.71-2.40x from the repetitions' extremes "
        "| NOT met (1.33x the target) |")
    assert target_row(text, "W5", "10 million").endswith("| not run | not run |")
    assert target_row(text, "W3", "100-point sweep").endswith("| 29.00 s | met |")
    assert target_row(text, "W3", "sweep CPU time / workers").endswith(
        "| 31.00 s | NOT met (1.03x the target) |")
    assert target_row(text, "W4", "peak memory").endswith("| 2,048 MiB | NOT met (2.00x the target) |")


def test_a_relative_target_shows_the_range_its_repetitions_allow():
    # The median ratio is judged; the extremes say how near the limit it is
    # (fastest W7 over slowest W1, and the reverse). CPU time is half the fake wall time.
    w1 = Measurement(WORKLOADS["W1"], reps=[fake_run(3.40, 5.0, 200), fake_run(3.64, 5.0, 200),
                                            fake_run(3.54, 5.0, 200)])
    w7 = Measurement(WORKLOADS["W7"], reps=[fake_run(72.0, 80.0, 1300), fake_run(71.8, 80.0, 1300)])
    row = target_row(report([w1, w7]), "W7", "fleet within 20x")
    assert row.endswith("| 20.31x (35.950 s / 1.770 s); 19.73-21.18x from the repetitions' extremes "
                        "| NOT met (1.02x the target) |"), row
    one = Measurement(WORKLOADS["W7"], reps=[fake_run(72.0, 80.0, 1300)])
    single = target_row(report([Measurement(WORKLOADS["W1"], reps=[fake_run(3.6, 5.0, 200)]), one]),
                        "W7", "fleet within 20x")
    assert "extremes" not in single                       # one repetition each: no range


def test_relative_target_without_its_reference_is_not_measured():
    w6 = Measurement(WORKLOADS["W6"], reps=[fake_run(0.6, 2.0, 300)])
    assert target_row(report([w6]), "W6", "`continuous`").endswith(
        "| — (W1 not run) | n/a (not measured) |")


def test_report_workload_table_has_every_column_and_the_spread():
    w1 = Measurement(WORKLOADS["W1"], reps=[fake_run(0.3, 2.0, 300), fake_run(0.9, 2.5, 310),
                                            fake_run(0.4, 2.2, 305)])
    text = report([w1])
    assert HEADER in text
    row = next(line for line in text.splitlines() if line.startswith("| time inside simulate() (s)"))
    assert row == "| time inside simulate() (s) | 0.400 | 0.300 | 0.900 | < 0.5 s | met |"


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
    assert target_row(text, "W1", "simulated in 0.5 s").endswith("| n/a (scaled-down run) |")


def test_same_summary_treats_nan_as_equal_and_any_other_difference_as_different():
    assert bench.same_summary({"a": 1, "b": math.nan}, {"a": 1, "b": math.nan})
    assert not bench.same_summary({"a": 1.0}, {"a": 1.0 + 1e-12})
    assert not bench.same_summary({"a": 1}, {"a": 1, "b": 2})


def test_unknown_workload_is_a_user_error():
    with pytest.raises(ValueError, match="W9.*allowed: W1, W2, W3, W4, W5, W6, W7"):
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
    stats = alone.stats
    assert (rec["num_steps"], rec["num_fast_steps"], rec["num_runs"], rec["num_arrived"]) == (
        stats.num_steps, stats.num_run_steps, stats.num_runs, stats.num_arrived)
    assert rec["num_steps"] == len(pd.read_csv(out / "steps.csv"))
    assert rec["num_requests"] == 20 and rec["summary"]["completed"] == 20
    assert (rec["num_fast_steps"] > 0) == (path == "fast")   # the step path skips nothing
    assert bench.same_summary(rec["summary"], dict(alone.summary))
    assert json.loads((out / "summary.json").read_text())["completed"] == 20   # kvsim run's files
    # The phases, in order, on one increasing clock.
    names = [name for name, _ in rec["stamps"]]
    assert names == ["start", "imports", "load scenario", "simulate()", "write summary.json",
                     "write requests.csv", "write steps.csv",
                     "wait for metrics.csv and bench_serve.json", "format the summary"]
    assert [name for name, _ in rec["apart_s"]] == ["metrics.csv", "bench_serve.json"]
    times = [t for _, t in rec["stamps"]]
    assert times == sorted(times)


@pytest.mark.parametrize("streaming", [False, True])
def test_the_child_writes_the_files_of_kvsim_run_byte_for_byte(tmp_path, streaming):
    from pathlib import Path

    from kvsim.bench.child import run_child
    from kvsim.cli import main as cli_main

    scenario = str(Path(__file__).resolve().parent.parent / "scenarios" / "quickstart.yaml")
    sets = ["workload.num_requests=30", f"metrics.streaming={str(streaming).lower()}"]
    assert run_child([str(tmp_path / "rec.json"), "fast", scenario, "--out", str(tmp_path / "child"),
                      *(x for s in sets for x in ("--set", s))]) == 0
    assert cli_main(["run", scenario, "--out", str(tmp_path / "run"),
                     *(x for s in sets for x in ("--set", s))]) == 0
    child = sorted(p.name for p in (tmp_path / "child").iterdir())
    run = sorted(p.name for p in (tmp_path / "run").iterdir())
    assert child == run == sorted(["summary.json", "requests.csv", "steps.csv"]
                                  + ([] if streaming else ["metrics.csv", "bench_serve.json"]))
    for name in run:
        assert (tmp_path / "child" / name).read_bytes() == (tmp_path / "run" / name).read_bytes(), name


def test_process_phases_run_from_the_fork_to_the_end():
    from kvsim.bench.measure import process_phases

    phases = process_phases(10.0, [("start", 10.25), ("imports", 11.0), ("simulate()", 13.5)], 13.75)
    assert phases == [("interpreter start", 0.25), ("imports", 0.75), ("simulate()", 2.5), ("exit", 0.25)]


def test_events_are_arrivals_finishes_single_steps_and_decode_runs():
    from kvsim.bench.measure import num_events

    rec = {"num_arrived": 100, "num_requests": 98, "num_steps": 5000, "num_fast_steps": 4600, "num_runs": 150}
    assert num_events(rec) == 100 + 98 + 400 + 150


IMPORTTIME_LOG = """\
import time: self [us] | cumulative | imported package
import time:       100 |        100 |   encodings.aliases
import time:       200 |        300 | encodings
import time:       300 |        300 | kvsim.bench.child
import time:        50 |         50 |       decimal
import time:       400 |        450 |     pandas.core
import time:        20 |         20 |     pytz
import time:      1000 |       1470 |   pandas
import time:      2000 |       2000 |   numpy
import time:        10 |         10 |   json
import time:       500 |       3990 | kvsim.scenario.loader
import time:         5 |          5 | csv
"""


def test_import_time_is_charged_to_the_package_that_pulled_it_in():
    from kvsim.bench.imports import import_time_by_owner

    assert import_time_by_owner(IMPORTTIME_LOG, after="kvsim.bench.child") == pytest.approx(
        {"numpy": 2000e-6, "pandas": 1470e-6, "kvsim": 500e-6, "stdlib": 15e-6}, abs=1e-12)
    everything = import_time_by_owner(IMPORTTIME_LOG)
    assert everything["stdlib"] == pytest.approx(315e-6) and everything["kvsim"] == pytest.approx(800e-6)


def test_attribution_charges_builtins_and_libraries_to_their_kvsim_caller(tmp_path):
    import cProfile

    import numpy as np

    from kvsim.bench.attribution import attribute, component_of
    from kvsim.metrics.tables import write_csv

    assert component_of("/x/kvsim/sched/chunked.py") == "scheduler"
    assert component_of("/x/kvsim/kv/block_pool.py") == "KV manager"
    assert component_of("/x/kvsim/sim/steplog.py") == "metrics"
    assert component_of("/x/kvsim/sim/engine.py") == "engine loop (sim/, SimPy)"
    assert component_of("/x/kvsim/metrics/tables.py") == "output writing"
    assert component_of("/x/kvsim/metrics/summary.py") == "metrics"
    assert component_of("/x/kvsim/scenario/result.py") == "metrics"        # requests_frame, itl_seconds
    assert component_of("/x/kvsim/scenario/cluster.py") == "metrics"       # collect_fleet
    assert component_of("/x/kvsim/fleet/runner.py") == "fleet (routing, dispatch)"
    assert component_of("/x/kvsim/scenario/loader.py") == "scenario loading (YAML, validation, specs)"
    assert component_of("/usr/lib/python3.11/json/encoder.py") is None
    # 50,000 rows: the few calls without a kvsim caller stay a small share even
    # when a loaded machine stretches them.
    table = {"a": np.arange(50_000) % 7, "b": np.linspace(0.0, 1.0, 50_000)}
    profiler = cProfile.Profile()
    profiler.enable()
    write_csv(table, tmp_path / "t.csv")          # numpy, repr, str.join: all on write_csv's behalf
    profiler.disable()
    got = attribute(profiler)
    import pstats
    assert got["total_s"] == pytest.approx(pstats.Stats(profiler).total_tt, rel=1e-9)
    assert set(got["components"]) <= {"output writing", "unattributed"}
    # Only the profiler's own disable() call has no kvsim caller (its share
    # grows on a loaded machine: a bound, not a timing).
    assert got["components"]["output writing"] / got["total_s"] > 0.9
    # The functions charged: tables.py's own, each with its exact number of calls.
    calls = {f["function"].split(" ")[0]: f["calls"] for f in got["top"]}
    assert all("(kvsim/metrics/tables.py:" in f["function"] for f in got["top"])
    assert calls["write_csv"] == 1 and calls["column_text"] == 2


def test_bench_scenarios_folder_is_an_option_and_a_missing_one_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"^--scenarios .*nowhere: no w1.yaml there; give the folder"):
        bench.bench_command(bench_args("W1", scenarios=str(tmp_path / "nowhere")), log=lambda *_: None)


# ---------------------------------------------------------------- --compare


def fake_compare_run(sim_cpu: float, summary: dict | None = None) -> dict:
    return {"sim_cpu_s": sim_cpu, "sim_s": 2 * sim_cpu, "write_cpu_s": 0.5, "process_cpu_s": 1 + sim_cpu,
            "process_wall_s": 2 + sim_cpu, "peak_rss_mib": 100.0, "summary": summary or {"a": 1}}


def test_compare_report_gives_the_median_of_the_pairs_ratios():
    from kvsim.bench.compare import render_compare

    runs = {"A": [fake_compare_run(x) for x in (1.0, 2.0, 4.0)],
            "B": [fake_compare_run(x) for x in (2.0, 2.0, 5.0)]}
    ir = {"A": {"simulate": 5e9, "baseline": 3e9, "engine": 2e9},
          "B": {"simulate": 7e9, "baseline": 3e9, "engine": 4e9}}
    text = render_compare("this", "ref", "W1", runs, ir, ir_requests=2000, requests=None, valgrind=True)
    # pairs: 1/2, 2/2, 4/5 -> median 0.8
    assert "| CPU time in simulate() (s) | 2.000 | 1.000 | 2.000 | 2.000 | 0.800 |" in text
    assert "| A | 5.000 G | 3.000 G | 2.000 G |" in text
    assert "| A / B | 0.714 | 1.000 | 0.500 |" in text
    assert "A / B, engine instructions: 0.500" in text
    assert "Same summary from both versions: yes." in text
    runs["B"][1] = fake_compare_run(2.0, {"a": 2})
    assert "Same summary from both versions: NO." in render_compare(
        "this", "ref", "W1", runs, None, ir_requests=None, requests=None, valgrind=False)


def test_compare_ref_is_a_worktree_or_a_commit_and_anything_else_is_named(tmp_path):
    from kvsim.bench.compare import resolve_ref, this_tree

    repo = this_tree()
    with pytest.raises(ValueError, match=r"^--compare no-such-ref: neither a folder nor a git commit"):
        resolve_ref("no-such-ref", tmp_path, repo=repo)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"the folder has no kvsim/ package"):
        resolve_ref(str(tmp_path / "empty"), tmp_path, repo=repo)
    folder, name = resolve_ref(str(repo), tmp_path, repo=repo)
    assert folder == repo
    import subprocess
    exported, name = resolve_ref("HEAD", tmp_path, repo=repo)
    committed = subprocess.run(["git", "-C", str(repo), "show", "HEAD:kvsim/bench/compare.py"],
                               capture_output=True, check=True).stdout
    assert (exported / "kvsim" / "bench" / "compare.py").read_bytes() == committed   # HEAD's, not the tree's
    assert name.startswith("HEAD (git ") and exported.is_relative_to(tmp_path)


@pytest.mark.slow
def test_compare_compiles_a_tree_even_where_bytecode_is_not_written(tmp_path, monkeypatch):
    # Else each run of a fresh REF export counts compiling every module it imports.
    from kvsim.bench.compare import byte_compile
    (tmp_path / "kvsim").mkdir()
    (tmp_path / "kvsim" / "mod.py").write_text("X = 1\n")
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    byte_compile(tmp_path)
    assert [p.name for p in (tmp_path / "kvsim" / "__pycache__").iterdir()][0].startswith("mod.")


def test_compare_of_this_tree_with_itself_runs_both_and_finds_the_same_summary(tmp_path):
    from kvsim.bench.compare import compare, this_tree

    lines: list[str] = []
    text = compare(str(this_tree()), pairs=1, requests=20, ir_requests=None,
                   scenarios=this_tree() / "scenarios" / "bench", log=lines.append)
    assert "Same summary from both versions: yes." in text
    assert sum("pair 1/1" in line for line in lines) == 2


def test_the_report_gives_the_host_speed_at_start_and_end():
    from kvsim.bench.render import reference_loop_ms
    ms = reference_loop_ms(repeats=1)
    assert 0 < ms < 10_000
    text = report([], machine={**MACHINE, "reference_loop_ms": 31.25}, reference_end_ms=35.5)
    assert "took 31.2 ms of CPU at the start, 35.5 ms at the end" in text
    assert "Host speed" not in report([])                  # a machine record without it: no line
