"""The executor sweeps and plans share (kvsim/scenario/executor.py): tasks, follow-ups, crashes."""

from __future__ import annotations

import os
import time

import pytest

from kvsim.scenario.executor import (ExecutorError, Task, check_options, crash_record, execute,
                                     run_task)


def square(scenario, point_dir=None):
    return {"value": scenario["x"] ** 2, "pid": os.getpid()}


def dies_on_three(scenario, point_dir=None):
    if scenario["x"] == 3:
        os._exit(9)
    time.sleep(0.05)
    return {"value": scenario["x"], "pid": os.getpid()}


def run(tasks, fn, workers, follow=None):
    done = []

    def on_done(task, record):
        done.append((task.key, record))
        return follow(task, record) if follow else None

    execute(tasks, fn, on_done, workers=workers)
    return done


@pytest.mark.parametrize("workers", [1, 2])
def test_every_task_and_every_follow_up_runs_once(workers):
    # on_done answers each task k < 4 with a follow-up k + 10: the plan's "next probe"
    follow = lambda task, record: [Task(task.key + 10, {"x": task.key + 10})] if task.key < 4 else []
    done = run([Task(k, {"x": k}) for k in range(4)], square, workers, follow)
    assert sorted(k for k, _ in done) == [0, 1, 2, 3, 10, 11, 12, 13]
    assert all(r["summary"]["value"] == k * k and r["error"] == "" for k, r in done)


def test_one_worker_runs_in_this_process_and_more_run_in_child_processes():
    assert {r["summary"]["pid"] for _, r in run([Task(k, {"x": k}) for k in range(3)], square, 1)} == {os.getpid()}
    pids = {r["summary"]["pid"] for _, r in run([Task(k, {"x": k}) for k in range(6)], square, 2)}
    assert os.getpid() not in pids and 1 <= len(pids) <= 2


def test_a_dead_worker_fails_only_the_task_it_was_running():
    done = dict(run([Task(k, {"x": k}) for k in range(8)], dies_on_three, 2))
    assert sorted(done) == list(range(8))
    assert done[3] == {**crash_record("worker process died (exit status 9) while this point was running"),
                       "wall_time_s": done[3]["wall_time_s"]}
    assert all(done[k]["summary"] == {"value": k, "pid": done[k]["summary"]["pid"]} for k in done if k != 3)


def test_a_raising_task_is_a_record_with_the_error_and_its_traceback():
    record = run_task(lambda scenario, point_dir: 1 / scenario["x"], {"x": 0}, None)
    assert record["summary"] is None and record["error"] == "ZeroDivisionError: division by zero"
    assert "ZeroDivisionError" in record["traceback"] and record["wall_time_s"] >= 0


def test_a_runner_that_returns_no_mapping_is_an_error_record():
    record = run_task(lambda scenario, point_dir: [1, 2], {}, None)
    assert record["error"] == "TypeError: run_point returned list, expected a dict of summary metrics"


def test_an_error_in_on_done_stops_the_pool_and_kills_its_workers():
    pids = []

    def on_done(task, record):
        pids.append(record["summary"]["pid"])
        raise RuntimeError("the driver failed")

    with pytest.raises(RuntimeError, match="the driver failed"):
        execute([Task(k, {"x": k}) for k in range(6)], square, on_done, workers=2)
    for pid in pids:     # reaped: the pool joined every worker before re-raising
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


@pytest.mark.parametrize("kwargs, message", [
    ({"executor": "dask"}, "--executor: 'dask' is not an executor; allowed: local, ray"),
    ({"workers": 0}, "--workers: expected an integer >= 1, got 0"),
    ({"address": "ray://x:10001"}, "--address: 'ray://x:10001' is only used with --executor ray"),
])
def test_bad_options_name_the_option(kwargs, message):
    options = {"executor": "local", "workers": None, "address": None, **kwargs}
    with pytest.raises(ExecutorError, match=message):
        check_options(**options)


def dies_on_even(scenario, point_dir=None):
    if scenario["x"] % 2 == 0:
        os._exit(3)
    time.sleep(0.01)
    return {"value": scenario["x"], "pid": os.getpid()}


def test_every_task_gets_exactly_one_record_however_often_workers_die():
    # Half the tasks kill their worker at once, so the driver often writes the next
    # task to a worker that is already dead: that task must run elsewhere, and the
    # dead worker's running task must still get its crash record.
    done = run([Task(k, {"x": k}) for k in range(40)], dies_on_even, 3)
    assert sorted(k for k, _ in done) == list(range(40))
    assert all((r["summary"] is None) == (k % 2 == 0) for k, r in done)
