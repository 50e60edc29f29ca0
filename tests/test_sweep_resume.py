"""A sweep that is killed, interrupted or rerun under other settings loses nothing and relabels nothing.

The killing tests run a real sweep driver in a child process (tests/sweep_drivers.py:
slow fake points that leave their worker's pid behind), kill or signal it, then
look at its workers and rerun in this process. Every wait is bounded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

import sweep_drivers
from kvsim.scenario.results_log import OutLock, code_version
from kvsim.scenario.sweep import SweepError, expand_sweep, read_results_log, run_sweep

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
WAIT_S = 60.0


def wait_until(condition, what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.05)


def start_driver(out: Path, n: int, sleep_s: float, workers: int = 2) -> subprocess.Popen:
    """The driver in its own session: a signal to its process group is what Ctrl-C sends."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS)])}
    return subprocess.Popen([sys.executable, "-m", "sweep_drivers", str(out), str(n), str(sleep_s),
                             str(workers)], env=env, cwd=TESTS, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def kill_group(driver: subprocess.Popen) -> None:
    """Leave nothing behind, whatever the test found: the driver's whole session."""
    try:
        os.killpg(driver.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    driver.wait(timeout=WAIT_S)


def logged(out: Path) -> int:
    path = out / "results.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def worker_pids(out: Path) -> set[int]:
    folder = out / "pids"
    return {int(p.name) for p in folder.iterdir()} if folder.exists() else set()


def rerun(out: Path, n: int, notes: list[str], **kw):
    return run_sweep(sweep_drivers.scenario(n, **kw), out, workers=1, progress=False,
                     run_point=sweep_drivers.quick_run, log=notes.append)


# --- the driver dies or is stopped ------------------------------------------------------------

def test_workers_die_with_a_killed_driver_and_the_next_sweep_takes_its_lock_over(tmp_path):
    driver = start_driver(tmp_path, n=12, sleep_s=0.4)
    try:
        wait_until(lambda: logged(tmp_path) >= 2 and len(worker_pids(tmp_path)) >= 2, "two points")
        workers = worker_pids(tmp_path)
        driver.kill()                                   # SIGKILL: no cleanup of any kind
        driver.wait(timeout=WAIT_S)
        wait_until(lambda: not any(sweep_drivers.alive(p) for p in workers), "the workers to die")
    finally:
        kill_group(driver)
    done_before = {pid for pid, r in read_results_log(tmp_path).items() if r["status"] == "ok"}
    assert 2 <= len(done_before) < 12
    notes: list[str] = []
    outcome = rerun(tmp_path, 12, notes)
    assert notes[0] == (f"--out {tmp_path}: taking over from process {driver.pid}, which ended "
                        f"without releasing it (killed?); what it finished is kept")
    assert outcome.num_skipped == len(done_before) and outcome.num_done == 12 - len(done_before)
    assert pd.read_csv(tmp_path / "results.csv")["status"].tolist() == ["ok"] * 12


@pytest.mark.parametrize("signum, to_group", [(signal.SIGINT, True), (signal.SIGINT, False),
                                               (signal.SIGTERM, False)],
                         ids=["ctrl-c-to-the-group", "sigint-to-the-driver", "sigterm-to-the-driver"])
def test_an_interrupted_sweep_stops_its_workers_keeps_finished_points_and_resumes(tmp_path, signum,
                                                                                   to_group):
    driver = start_driver(tmp_path, n=12, sleep_s=0.4)
    try:
        wait_until(lambda: logged(tmp_path) >= 2 and len(worker_pids(tmp_path)) >= 2, "two points")
        if to_group:       # a terminal's Ctrl-C: the driver and its workers all get SIGINT
            os.killpg(driver.pid, signum)
        else:
            driver.send_signal(signum)
        stdout, stderr = driver.communicate(timeout=WAIT_S)
    finally:
        kill_group(driver)
    assert driver.returncode == 130 and stdout == f"interrupted {int(signum)}\n", stderr
    assert "Traceback" not in stderr
    wait_until(lambda: not any(sweep_drivers.alive(p) for p in worker_pids(tmp_path)), "the workers to stop")
    kept = read_results_log(tmp_path)
    assert len(kept) >= 2 and all(r["status"] == "ok" for r in kept.values())
    assert len(pd.read_csv(tmp_path / "results.csv")) == len(kept)     # rebuilt on the way out
    assert (tmp_path / ".lock").read_text() == ""                      # released, not abandoned
    notes: list[str] = []
    outcome = rerun(tmp_path, 12, notes)
    assert notes == [] and (outcome.num_skipped, outcome.num_done) == (len(kept), 12 - len(kept))


def test_kvsim_sweep_on_sigterm_exits_143_with_one_line_and_a_rerun_resumes(tmp_path):
    scenario = yaml.safe_load((REPO / "scenarios" / "quickstart.yaml").read_text())
    scenario["workload"]["num_requests"] = 600
    scenario["sweep"] = {"grid": {"engine.max_num_batched_tokens": [256, 512, 1024, 2048, 4096, 8192]}}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scenario))
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cli = subprocess.Popen([sys.executable, "-m", "kvsim", "sweep", str(path), "--out", str(out),
                            "--workers", "2"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    try:
        wait_until(lambda: logged(out) >= 1, "a finished point")
        cli.send_signal(signal.SIGTERM)
        stdout, stderr = cli.communicate(timeout=WAIT_S)
    finally:
        cli.kill()
    kept = read_results_log(out)
    if len(kept) == 6:
        pytest.skip("the sweep finished before the signal arrived (a very fast machine)")
    assert cli.returncode == 143, stderr
    assert stderr.strip().splitlines() == [
        f"kvsim sweep: stopped by SIGTERM; the workers are stopped and every finished point is in "
        f"{out / 'results.jsonl'}; rerun the same command to resume"]
    calls: list[dict] = []
    outcome = run_sweep(scenario, out, workers=1, progress=False, base_dir=REPO / "scenarios",
                        run_point=_RecordingRun(calls), log=lambda _: None)
    assert outcome.num_skipped == len(kept) and len(calls) == 6 - len(kept)


class _RecordingRun:
    def __init__(self, calls):
        self.calls = calls

    def __call__(self, point_scenario, point_dir=None):
        self.calls.append(point_scenario)
        return {"completed": 1}


def test_a_lock_held_by_a_live_process_refuses_and_names_it(tmp_path):
    with OutLock(tmp_path, what="sweep"):
        with pytest.raises(SweepError, match=r"another sweep in this process is writing there now"):
            rerun(tmp_path, 2, [])
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    holder = subprocess.Popen([sys.executable, "-c",
                               "import sys, time; from kvsim.scenario.results_log import OutLock\n"
                               f"with OutLock({str(tmp_path)!r}):\n"
                               "    print('held', flush=True); time.sleep(60)"],
                              env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(SweepError, match=rf"^--out {tmp_path}: another sweep \(process "
                                             rf"{holder.pid}\) is writing there now$"):
            rerun(tmp_path, 2, [])
    finally:
        holder.kill()
        holder.wait(timeout=WAIT_S)


# --- identity of every record -----------------------------------------------------------------

def test_a_deleted_sweep_json_and_another_seed_refuse_instead_of_relabelling_old_rows(tmp_path):
    rerun(tmp_path, 3, [])
    (tmp_path / "sweep.json").unlink()
    with pytest.raises(SweepError, match=r"holds a sweep of a different base scenario"):
        rerun(tmp_path, 3, [], seed=8)
    rows = pd.read_csv(tmp_path / "results.csv")
    assert rows["seed"].tolist() == [7, 7, 7] and rows["seed_seen"].tolist() == [7, 7, 7]


def test_a_damaged_sweep_json_still_refuses_another_base_scenario(tmp_path):
    rerun(tmp_path, 3, [])
    (tmp_path / "sweep.json").write_text("{not json")
    with pytest.raises(SweepError, match=r"holds a sweep of a different base scenario"):
        rerun(tmp_path, 3, [], seed=8)


def test_records_without_an_identity_or_of_other_code_run_again(tmp_path):
    rerun(tmp_path, 3, [])
    lines = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    lines[0].pop("base_fingerprint")               # written by an older kvsim
    lines[1]["code_version"] = "kvsim 0.0.1+abcdef"  # other code
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    notes: list[str] = []
    outcome = rerun(tmp_path, 3, notes)
    assert (outcome.num_done, outcome.num_skipped) == (2, 1)
    assert notes == [f"1 recorded point(s) in {tmp_path} came from other kvsim code; running them again",
                     f"1 recorded point(s) in {tmp_path} carry no identity that matches their point "
                     f"(an older kvsim, or a damaged log); running them again"]
    latest = read_results_log(tmp_path)
    assert {r["code_version"] for r in latest.values()} == {code_version()}


def test_a_record_whose_values_are_not_its_points_runs_again(tmp_path):
    rerun(tmp_path, 2, [])
    path = tmp_path / "results.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    lines[0]["seed"] = 99                            # hand-edited or damaged
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    outcome = rerun(tmp_path, 2, [])
    assert (outcome.num_done, outcome.num_skipped) == (1, 1)
    assert read_results_log(tmp_path)[expand_sweep(sweep_drivers.scenario(2))[0].point_id]["seed"] == 7


def test_code_version_names_the_package_and_is_stable():
    import kvsim
    assert code_version() == code_version()
    assert code_version().startswith(f"kvsim {kvsim.__version__}+") and len(code_version().split("+")[1]) == 12
