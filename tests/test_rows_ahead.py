"""steps.csv's rows made text during the run by forked children (kvsim.metrics.tables.RowsAhead):
the same bytes as the file made after it, whatever the children do."""

import os
import signal

import pytest
from forking import BASE, needs_fork, one_thread  # noqa: F401  (one_thread: autouse)

from kvsim.metrics import tables
from kvsim.scenario.loader import load_scenario
from kvsim.scenario.result import steps_csv_ahead
from kvsim.scenario.simulate import simulate

pytestmark = needs_fork


@pytest.fixture
def make_ahead(request):
    """RowsAhead objects closed after the test, whatever happens in it."""
    def make(names, rows):
        ahead = tables.RowsAhead(names, rows=rows)
        request.addfinalizer(ahead.close)
        return ahead
    return make


def scenario(**engine):
    return load_scenario({**BASE, "engine": {**BASE["engine"], **engine}})


def files(result, out, ahead=None):
    result.write(out, steps_ahead=ahead)
    return (out / "steps.csv").read_bytes()


@pytest.mark.parametrize("engine", [{}, {"async_scheduling": True}, {"num_gpu_blocks_override": 60},
                                    {"scheduler": "continuous", "max_num_batched_tokens": 2048, "max_model_len": 2048}])
def test_rows_made_during_the_run_are_the_file_made_after_it(tmp_path, make_ahead, engine):
    sc = scenario(**engine)
    plain = simulate(sc)
    ahead = make_ahead(steps_csv_ahead(sc).names, 37)   # parts cut across runs
    watched = simulate(sc, watch_steps=ahead.watch)
    assert len(ahead.parts) >= 3 and ahead.covered == 37 * len(ahead.parts)
    assert files(watched, tmp_path / "ahead", ahead) == files(plain, tmp_path / "plain")
    assert watched.summary == plain.summary             # watching changes nothing


def test_a_child_that_dies_costs_only_time(tmp_path, make_ahead):
    sc = scenario()
    plain = simulate(sc)
    ahead = make_ahead(steps_csv_ahead(sc).names, 50)
    watched = simulate(sc, watch_steps=ahead.watch)
    os.kill(ahead.parts[1][0], signal.SIGKILL)           # (it may have finished: then it is fine too)
    ahead.parts[1] = (ahead.parts[1][0], tmp_path / "no-such-part", *ahead.parts[1][2:])
    assert files(watched, tmp_path / "ahead", ahead) == files(plain, tmp_path / "plain")


def test_close_ends_the_children_and_removes_the_parts(tmp_path, make_ahead):
    sc = scenario()
    ahead = make_ahead(steps_csv_ahead(sc).names, 40)
    simulate(sc, watch_steps=ahead.watch)
    pids, folder = [p[0] for p in ahead.parts], ahead._dir
    assert pids and folder.is_dir()
    ahead.close()
    assert not folder.exists() and ahead.parts == []
    for pid in pids:
        with pytest.raises(ChildProcessError):           # reaped: no zombie left
            os.waitpid(pid, os.WNOHANG)


def test_another_table_ignores_the_parts(tmp_path, make_ahead):
    sc = scenario()
    ahead = make_ahead(["step", "start_time_s"], 40)
    result = simulate(sc, watch_steps=ahead.watch)
    assert ahead.parts
    plain = tmp_path / "plain.csv"
    tables.write_csv(result.steps, plain)
    tables.write_csv(result.steps, tmp_path / "ahead.csv", ahead=ahead)   # other columns: made whole
    assert (tmp_path / "ahead.csv").read_bytes() == plain.read_bytes()
    assert ahead.parts == [] and ahead._dir is None


def test_no_child_where_forking_is_unsafe(monkeypatch, make_ahead):
    monkeypatch.setattr(tables.threading, "active_count", lambda: 2)     # another thread runs
    sc = scenario()
    ahead = make_ahead(steps_csv_ahead(sc).names, 40)
    simulate(sc, watch_steps=ahead.watch)
    assert ahead.parts == []


def test_a_fleet_or_streaming_run_has_no_rows_ahead():
    assert steps_csv_ahead(load_scenario({**BASE, "metrics": {"streaming": True}})) is None
    assert steps_csv_ahead(load_scenario({**BASE, "cluster": {"replicas": 2}})) is None


def test_kvsim_run_makes_them_ahead_and_writes_the_same_files(tmp_path, monkeypatch, capsys):
    import yaml

    from kvsim.cli import main
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(BASE))
    forks = []
    fork = tables.RowsAhead._fork
    monkeypatch.setattr(tables.RowsAhead, "_fork", lambda self, *a: forks.append(1) or fork(self, *a))
    monkeypatch.setattr(tables, "ROWS_AHEAD", 45)
    assert main(["run", str(path), "--out", str(tmp_path / "a"), "--json"]) == 0
    assert forks
    simulate(load_scenario(str(path))).write(tmp_path / "b")
    assert (tmp_path / "a" / "steps.csv").read_bytes() == (tmp_path / "b" / "steps.csv").read_bytes()


def _engine_log(sc):
    """The step log of one simulated engine (simulate keeps only its tables)."""
    import numpy as np

    from kvsim.sim.run import run_engine
    from kvsim.workload import build_workload
    workload = build_workload(sc.workload, rng=np.random.default_rng(sc.seed), base_dir=sc.base_dir,
                              max_prompt_len=sc.sched_config.max_model_len - 1)
    return run_engine(workload.requests(), sc.sched_config, scheduler=sc.scheduler,
                      cost_model=sc.cost_model).steps


LOGS = {}


@pytest.mark.parametrize("engine", [{}, {"max_num_batched_tokens": 64}, {"async_scheduling": True}])
def test_a_range_of_the_log_is_those_rows_of_the_whole(engine):
    # A child makes only its rows (StepLog.columns_between): the same as the whole
    # table's rows there, for ranges that start and end inside runs, chunk runs
    # (a budget of 64 chunks the prompts), or past the end.
    import numpy as np
    from hypothesis import given, settings
    from hypothesis import strategies as st
    key = tuple(sorted(engine.items()))
    log = LOGS.setdefault(key, _engine_log(scenario(**engine)))
    whole, n = log.columns, len(log)
    assert log._runs and log._rows["step"]            # both kinds of record

    @settings(max_examples=150, deadline=None)
    @given(lo=st.integers(0, n + 3), size=st.integers(0, 400))
    def check(lo, size):
        part = log.columns_between(lo, lo + size)
        for name, values in whole.items():
            assert np.array_equal(part[name], values[lo:lo + size]), (name, lo, size)

    check()


def test_no_folder_for_the_parts_makes_them_all_at_the_end(tmp_path, monkeypatch, make_ahead):
    # (a temporary folder that cannot be made: the run goes on, the file is the same)
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tables.tempfile, "mkdtemp", refuse)
    sc = scenario()
    plain = simulate(sc)
    ahead = make_ahead(steps_csv_ahead(sc).names, 40)
    watched = simulate(sc, watch_steps=ahead.watch)
    assert ahead.parts == []
    assert files(watched, tmp_path / "ahead", ahead) == files(plain, tmp_path / "plain")


def test_the_parts_of_a_killed_run_are_removed_by_the_next(tmp_path, monkeypatch, make_ahead):
    # A run killed by SIGKILL cannot remove its part folder; the next run that makes
    # parts removes those of processes that are gone, and no other.
    monkeypatch.setattr(tables.tempfile, "tempdir", str(tmp_path))
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)                                   # a pid that no longer runs
    gone = tmp_path / f"kvsim-rows-{pid}-abc"
    alive = tmp_path / f"kvsim-rows-{os.getppid()}-def"
    other = tmp_path / "kvsim-rows-xyz"                  # no pid in the name: not ours to judge
    for folder in (gone, alive, other):
        folder.mkdir()
        (folder / "part0").write_text("1,2\n")
    sc = scenario()
    ahead = make_ahead(steps_csv_ahead(sc).names, 40)
    simulate(sc, watch_steps=ahead.watch)
    assert ahead.parts and ahead._dir.name.startswith(f"kvsim-rows-{os.getpid()}-")
    assert not gone.exists() and alive.exists() and other.exists()
