"""Run outputs: checked before the simulation, written atomically, strict JSON (scenario/outputs.py)."""

from __future__ import annotations

import errno
import json
import math

import pytest

from kvsim.scenario import outputs
from kvsim.scenario.outputs import (OutputError, atomic_open, check_output_dir, check_output_file,
                                    strict_summary, summary_json, write_files)


def leftovers(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_an_existing_file_is_not_an_output_folder(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(OutputError, match=r"^--out .*/f: is a file, not a folder"):
        check_output_dir(tmp_path / "f")


def test_a_folder_under_a_file_cannot_be_created(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(OutputError, match=r"^--out .*/f/sub: cannot create the folder"):
        check_output_dir(tmp_path / "f" / "sub")


def test_a_folder_where_an_output_file_goes_is_refused(tmp_path):
    (tmp_path / "out" / "summary.json").mkdir(parents=True)
    with pytest.raises(OutputError, match=r"summary.json is a folder; the run writes a file there"):
        check_output_dir(tmp_path / "out", files=("summary.json",))


def test_an_unwritable_folder_is_found_before_the_run(tmp_path, monkeypatch):
    def refuse(self, data):
        raise PermissionError(errno.EACCES, "Permission denied", str(self))
    monkeypatch.setattr(outputs.Path, "write_bytes", refuse)
    with pytest.raises(OutputError, match=r"^--out .*: cannot write in .*: Permission denied$"):
        check_output_dir(tmp_path / "out")


def test_a_trace_path_that_is_a_folder_is_refused(tmp_path):
    with pytest.raises(OutputError, match=r"^--trace .*: is a folder; give a file path$"):
        check_output_file(tmp_path, option="--trace")


def test_a_trace_folder_is_created(tmp_path):
    assert check_output_file(tmp_path / "a" / "t.jsonl", option="--trace").parent.is_dir()


def test_files_are_renamed_into_place_only_when_all_are_written(tmp_path):
    (tmp_path / "a.txt").write_text("old a")
    (tmp_path / "b.txt").write_text("old b")

    def full_disk(path):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))
    with pytest.raises(OutputError) as info:
        write_files({tmp_path / "a.txt": lambda p: p.write_text("new a"), tmp_path / "b.txt": full_disk})
    assert str(info.value) == f"cannot write {tmp_path / 'b.txt'}: No space left on device"
    assert (tmp_path / "a.txt").read_text() == "old a" and (tmp_path / "b.txt").read_text() == "old b"
    assert leftovers(tmp_path) == []


def test_an_interrupted_write_leaves_the_old_files(tmp_path):
    (tmp_path / "a.txt").write_text("old")

    def interrupted(path):
        path.write_text("ha")
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        write_files({tmp_path / "a.txt": interrupted})
    assert (tmp_path / "a.txt").read_text() == "old" and leftovers(tmp_path) == []


def test_written_files_replace_the_old_ones(tmp_path):
    (tmp_path / "a.txt").write_text("old")
    write_files({tmp_path / "a.txt": lambda p: p.write_text("new")})
    assert (tmp_path / "a.txt").read_text() == "new" and leftovers(tmp_path) == []


def test_atomic_open_renames_at_the_end_and_discards_on_error(tmp_path):
    target = tmp_path / "t.jsonl"
    target.write_text("old\n")
    with pytest.raises(RuntimeError):
        with atomic_open(target) as f:
            f.write("half")
            raise RuntimeError("engine stopped")
    assert target.read_text() == "old\n" and leftovers(tmp_path) == []
    with atomic_open(target) as f:
        f.write("new\n")
        assert target.read_text() == "old\n"        # nothing under the final name yet
    assert target.read_text() == "new\n"


def test_a_full_disk_while_writing_the_trace_names_it(tmp_path):
    target = tmp_path / "t.jsonl"
    with pytest.raises(OutputError) as info:
        with atomic_open(target, option="--trace"):
            raise OSError(errno.ENOSPC, "No space left on device")
    assert str(info.value) == f"cannot write --trace {target}: No space left on device"
    assert not target.exists() and leftovers(tmp_path) == []


def test_strict_summary_has_no_nan_and_says_why():
    summary = {"completed": 0, "failed": 3, "duration": 2.0, "request_throughput": 0.0,
               "request_goodput": math.nan, "mean_ttft_ms": math.nan, "mean_itl_ms": math.nan,
               "kv_cache_usage_mean": math.nan, "num_gpu_blocks": 10}
    out = strict_summary(summary)
    assert out["mean_ttft_ms"] is None and out["request_throughput"] == 0.0
    assert out["null_reasons"] == {
        "request_goodput": "no SLO given (slo: ttft_ms, tpot_ms, e2el_ms), so no goodput",
        "mean_ttft_ms": "no request completed", "mean_itl_ms": "no request completed",
        "kv_cache_usage_mean": "no engine step ran"}
    json.loads(summary_json(summary), parse_constant=lambda c: pytest.fail(f"non-JSON {c}"))


def test_infinite_values_are_null_and_explained():
    out = strict_summary({"completed": 1, "duration": math.inf})
    assert out["duration"] is None and out["null_reasons"]["duration"].startswith("infinite")


def test_a_summary_of_finite_numbers_is_unchanged():
    summary = {"completed": 2, "duration": 1.5}
    assert strict_summary(summary) == summary and "null_reasons" not in strict_summary(summary)


def test_tpot_without_multi_token_outputs_is_explained():
    out = strict_summary({"completed": 4, "mean_tpot_ms": math.nan})
    assert out["null_reasons"]["mean_tpot_ms"] == "no completed request generated more than one token"
