"""Files made by a forked child while the process writes others (kvsim.scenario.outputs.FilesApart):
``kvsim run``'s metrics.csv and bench_serve.json. The same files, renamed only at ``join``, whatever
the child does."""

import os
import signal
import time

import pytest
from forking import BASE, needs_fork, one_thread  # noqa: F401  (one_thread: autouse)

from kvsim.metrics import tables
from kvsim.scenario.loader import load_scenario
from kvsim.scenario.outputs import FilesApart, OutputError, commit_files, temporary_name, write_files
from kvsim.scenario.simulate import simulate

pytestmark = needs_fork


@pytest.fixture
def apart(request):
    """FilesApart objects closed after the test, whatever happens in it."""
    def make(job, targets):
        files = FilesApart(job, targets)
        request.addfinalizer(files.close)
        return files
    return make


def _job(folder, parent, *, die_after=None, fail=False):
    """Writes a.txt and b.txt (``die_after``: the child kills itself after staging that
    one; ``fail``: b.txt cannot be written, here and in the child)."""
    def job(staged):
        where = "child" if os.getpid() != parent else "here"
        for name in ("a.txt", "b.txt"):
            def write(path, name=name):
                if fail and name == "b.txt":
                    raise OSError(28, "No space left on device")
                path.write_text(f"{name} of the job\n")
            write_files({folder / name: write}, staged=staged)
            if die_after == name and where == "child":
                os.kill(os.getpid(), signal.SIGKILL)
        return [where, 1]
    return job


def _leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_the_child_stages_and_join_renames(tmp_path, apart):
    files = apart(_job(tmp_path, os.getpid()), [tmp_path / "a.txt", tmp_path / "b.txt"])
    assert files._pid is not None                       # a child runs the job
    assert files.join() == ["child", 1]                 # (JSON: a list)
    assert (tmp_path / "a.txt").read_text() == "a.txt of the job\n"
    assert (tmp_path / "b.txt").read_text() == "b.txt of the job\n"
    assert _leftovers(tmp_path) == []


def test_nothing_is_renamed_before_join(tmp_path, apart):
    (tmp_path / "a.txt").write_text("old\n")
    files = apart(_job(tmp_path, os.getpid()), [tmp_path / "a.txt", tmp_path / "b.txt"])
    time.sleep(0.3)                                     # (the child is done by now, or nearly)
    assert (tmp_path / "a.txt").read_text() == "old\n" and not (tmp_path / "b.txt").exists()
    files.join()
    assert (tmp_path / "a.txt").read_text() == "a.txt of the job\n"


def test_a_killed_child_is_made_here(tmp_path, apart):
    files = apart(_job(tmp_path, os.getpid(), die_after="a.txt"), [tmp_path / "a.txt", tmp_path / "b.txt"])
    assert files.join() == ["here", 1]                  # the job ran again in this process
    assert (tmp_path / "a.txt").read_text() == "a.txt of the job\n"
    assert (tmp_path / "b.txt").read_text() == "b.txt of the job\n"
    assert _leftovers(tmp_path) == []                   # the child's staged a.txt is gone


def test_an_error_in_the_child_is_raised_here_with_no_file_left(tmp_path, apart):
    files = apart(_job(tmp_path, os.getpid(), fail=True), [tmp_path / "a.txt", tmp_path / "b.txt"])
    with pytest.raises(OutputError, match=r"cannot write .*b\.txt: No space left on device"):
        files.join()
    assert _leftovers(tmp_path) == [] and not (tmp_path / "b.txt").exists()


def test_close_ends_a_child_not_joined_and_renames_nothing(tmp_path):
    files = FilesApart(_job(tmp_path, os.getpid(), die_after=None), [tmp_path / "a.txt", tmp_path / "b.txt"])
    pid = files._pid
    files.close()
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)                     # reaped
    assert not (tmp_path / "a.txt").exists() and not (tmp_path / "b.txt").exists()
    assert _leftovers(tmp_path) == []
    files.close()                                       # twice: nothing more


def test_no_child_where_forking_is_unsafe(tmp_path, monkeypatch, apart):
    monkeypatch.setattr(tables.threading, "active_count", lambda: 2)     # another thread runs
    files = apart(_job(tmp_path, os.getpid()), [tmp_path / "a.txt"])
    assert files._pid is None
    assert files.join() == ["here", 1]
    assert (tmp_path / "b.txt").read_text() == "b.txt of the job\n"


def test_no_child_on_one_core(tmp_path, monkeypatch, apart):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    files = apart(_job(tmp_path, os.getpid()), [tmp_path / "a.txt"])
    assert files._pid is None and files.join() == ["here", 1]


def test_staged_files_keep_their_temporary_names_until_committed(tmp_path):
    staged = []
    write_files({tmp_path / "x.csv": lambda p: p.write_text("x\n")}, staged=staged)
    assert staged == [(temporary_name(tmp_path / "x.csv"), tmp_path / "x.csv")]
    assert not (tmp_path / "x.csv").exists() and staged[0][0].exists()
    commit_files(staged)
    assert (tmp_path / "x.csv").read_text() == "x\n" and not staged[0][0].exists()


@pytest.fixture
def forked(monkeypatch):
    """Whether each FilesApart made runs a child (True) or will run its job here."""
    from kvsim.scenario import outputs

    seen = []
    init = outputs.FilesApart.__init__

    def spy(self, *a, **k):
        init(self, *a, **k)
        seen.append(self._pid is not None)
    monkeypatch.setattr(outputs.FilesApart, "__init__", spy)
    return seen


def test_kvsim_run_writes_the_files_of_one_process(tmp_path, forked):
    """The CLI's metrics.csv and bench_serve.json come from a child: the same bytes as
    the result's files written one after the other in one process."""
    import yaml

    from kvsim.cli import main
    from kvsim.vllm_outputs import write_vllm_outputs

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(BASE))
    assert main(["run", str(path), "--out", str(tmp_path / "a"), "--json"]) == 0
    assert forked == [True]
    result = simulate(load_scenario(str(path)))
    result.write(tmp_path / "b")
    write_vllm_outputs(result, tmp_path / "b")
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "b").iterdir()) and len(names) == 5
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_a_streaming_run_forks_no_child(tmp_path, forked, capsys):
    """metrics: {streaming: true} keeps no tables, so metrics.csv and bench_serve.json are not
    made: no child is forked to make nothing, and the run says why they are missing."""
    import copy

    import yaml

    from kvsim.cli import main

    data = copy.deepcopy(BASE)
    data.setdefault("metrics", {})["streaming"] = True
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["run", str(path), "--out", str(tmp_path / "a")]) == 0
    assert forked == [False]
    assert "metrics.csv and bench_serve.json need the per-request" in capsys.readouterr().err
    assert not (tmp_path / "a" / "metrics.csv").exists()
    assert _leftovers(tmp_path / "a") == []


def test_apart_false_runs_the_job_here(tmp_path, apart):
    files = FilesApart(_job(tmp_path, os.getpid()), [tmp_path / "a.txt"], apart=False)
    assert files._pid is None and files.join() == ["here", 1]
    assert (tmp_path / "a.txt").read_text() == "a.txt of the job\n"
