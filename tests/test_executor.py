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


def tables(scenario, point_dir=None):
    import numpy as np
    import pandas as pd
    n = scenario["x"]
    big = np.arange(n * 1000, dtype=float)
    return {"big": big, "empty": np.zeros(0), "fortran": np.asfortranarray(np.ones((3, 4)) * n),
            "strided": big[::7], "frame": pd.DataFrame({"a": np.arange(50.0) * n, "b": [str(n)] * 50}),
            "blob": bytearray(b"x" * n), "n": n}


@pytest.mark.parametrize("raw, background", [(True, False), (True, True), (False, False)])
def test_a_record_of_arrays_comes_back_whole_and_writable(monkeypatch, raw, background):
    # Records go back pickled with their arrays out of band (protocol 5): the same
    # values, dtypes and layouts, every array writable (a fleet's tables are changed later).
    # raw=False: one message per buffer, as where the pipe has no descriptor (Windows);
    # the workers are forked after the patch, so both ends take that path.
    # background: every record's buffers read on a thread (_Transfer), as large ones are.
    import numpy as np

    from kvsim.scenario import executor
    Transfer = executor._Transfer
    monkeypatch.setattr(executor, "BACKGROUND_BYTES", 0 if background else 1 << 62)
    transfers = []
    monkeypatch.setattr(executor, "_Transfer", lambda *a: transfers.append(1) or Transfer(*a))
    if not raw:
        import multiprocessing
        if multiprocessing.get_start_method() != "fork":
            pytest.skip("the patch reaches the workers only when they are forked")
        monkeypatch.setattr(executor, "_RAW_BUFFERS", False)
    elif not executor._RAW_BUFFERS:
        pytest.skip("no raw descriptor path on this platform")
    done = dict(run([Task(key=k, scenario={"x": x}) for k, x in enumerate([3, 0, 120])], tables, 2))
    for k, x in enumerate([3, 0, 120]):
        got, want = done[k]["summary"], tables({"x": x})
        for name in ("big", "empty", "fortran", "strided"):
            assert got[name].tobytes() == want[name].tobytes() and got[name].dtype == want[name].dtype
            assert got[name].shape == want[name].shape and got[name].flags.writeable
        assert got["fortran"].flags.f_contiguous
        assert got["frame"].equals(want["frame"]) and got["blob"] == want["blob"] and got["n"] == x
        got["big"][:1] = -1.0                          # writable: no error
    assert len(transfers) == (3 if background else 0)


def unpicklable(scenario, point_dir=None):
    return {"value": lambda: None}


def test_a_record_that_does_not_pickle_comes_back_as_an_error_and_the_worker_goes_on():
    done = dict(run([Task(key=0, scenario={"x": 1}), Task(key=1, scenario={"x": 2})],
                    unpicklable, 2))
    for k in (0, 1):
        assert done[k]["summary"] is None
        assert done[k]["error"].startswith("the result could not be sent back: ")


def test_a_worker_that_dies_inside_a_result_buffer_reads_as_a_closed_pipe():
    # The driver reads a record's buffers raw from the pipe, their sizes from the
    # head; a pipe that closes inside one is an EOFError, which _collect takes
    # for a dead worker (its task fails as a crash, the others re-run).
    import multiprocessing

    import numpy as np

    from kvsim.scenario import executor
    driver, worker = multiprocessing.Pipe()
    head, buffers = executor._pickled((7, {"big": np.arange(1000.0)}))
    worker.send((head, [b.nbytes for b in buffers]))
    if executor._RAW_BUFFERS:
        os.write(worker.fileno(), b"x" * 10)          # 10 of its 8,000 bytes
    else:
        worker.send_bytes(b"x" * 10)
    worker.close()
    with pytest.raises(EOFError):
        executor._recv_pickled(driver)


def sends_half_then_dies(scenario, point_dir=None):
    return {"big": __import__("numpy").arange(200_000.0), "x": scenario["x"]}


def test_a_worker_that_dies_while_its_record_comes_in_on_a_thread_fails_only_that_task(monkeypatch):
    # A large record's buffers are read on a thread while the driver waits on the
    # others; a worker killed half way through sending one (the patch reaches the
    # forked workers) fails the task it was sending, and the rest run elsewhere.
    import multiprocessing

    from kvsim.scenario import executor
    if multiprocessing.get_start_method() != "fork" or not executor._RAW_BUFFERS:
        pytest.skip("the patch reaches the workers only when they are forked, on the raw path")
    send = executor._send_pickled

    def send_half_for_three(conn, message):
        head, buffers = message
        if executor.pickle.loads(head, buffers=buffers)[1]["summary"]["x"] != 3:
            return send(conn, message)
        conn.send((head, [b.nbytes for b in buffers]))
        os.write(conn.fileno(), bytes(buffers[0][:1000]))
        os._exit(7)

    monkeypatch.setattr(executor, "_send_pickled", send_half_for_three)
    monkeypatch.setattr(executor, "BACKGROUND_BYTES", 1000)
    Transfer, transfers = executor._Transfer, []
    monkeypatch.setattr(executor, "_Transfer", lambda *a: transfers.append(1) or Transfer(*a))
    done = dict(run([Task(k, {"x": k}) for k in range(6)], sends_half_then_dies, 2))
    assert len(transfers) == 6                         # each record, the cut one too, on a thread
    assert sorted(done) == list(range(6))
    assert done[3]["summary"] is None and "exit status 7" in done[3]["error"]
    for k in (0, 1, 2, 4, 5):
        assert done[k]["summary"]["x"] == k and done[k]["summary"]["big"][-1] == 199_999.0
