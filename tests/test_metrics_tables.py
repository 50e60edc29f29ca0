"""The CSV writer of the run tables writes what ``DataFrame.to_csv(index=False)`` writes."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.metrics.tables import column_text, write_csv

NAN = float("nan")


def pandas_and_ours(tmp_path, frame):
    frame.to_csv(tmp_path / "pandas.csv", index=False)
    write_csv(frame, tmp_path / "ours.csv")
    return (tmp_path / "pandas.csv").read_bytes(), (tmp_path / "ours.csv").read_bytes()


def test_numbers_are_written_as_pandas_writes_them(tmp_path):
    rng = np.random.default_rng(0)
    n = 500
    frame = pd.DataFrame({
        "clock": np.cumsum(rng.random(n)),                         # never repeats
        "duration": rng.choice([0.0091, 1e-05, 2.5, 1e16, 123456789.125], n),  # repeats
        "usage": 1.0 - rng.integers(0, 40, n) / 37.0,
        "step": np.arange(n),                                      # wide integer range
        "batch": rng.integers(-3, 30, n),                          # narrow range, negatives
        "big": rng.integers(0, 2**62, n),
        "flag": rng.random(n) < 0.5,
    })
    ours, theirs = pandas_and_ours(tmp_path, frame)
    assert ours == theirs


def test_missing_values_signed_zero_and_infinities(tmp_path):
    values = [0.0, -0.0, NAN, float("inf"), -float("inf"), 1.5] * 10
    frame = pd.DataFrame({"x": values, "y": values[::-1], "n": range(60)})
    ours, theirs = pandas_and_ours(tmp_path, frame)
    assert ours == theirs
    assert column_text([NAN, -0.0, 0.0]) == ["", "-0.0", "0.0"]


def test_strings_are_quoted_only_when_they_must_be(tmp_path):
    frame = pd.DataFrame({
        "request_id": ["r0", "a,b", 'say "hi"', "two\nlines", "cr\rhere", "", "r6"],
        "fail_reason": ["", None, NAN, "prompt too long", "x", "y", "z"],
        "status": pd.array(["completed", None, "failed", "completed", "failed", "a", "b"],
                           dtype="string"),
        "priority": [0, 1, 2, 3, 4, 5, 6],
    })
    ours, theirs = pandas_and_ours(tmp_path, frame)
    assert ours == theirs                  # a lone "\r" is quoted as this Python's csv does
    ids = ["r0", "a,b", 'say "hi"', "two\nlines", "", "r6"]
    write_csv({"request_id": ids}, tmp_path / "ids.csv")
    assert pd.read_csv(tmp_path / "ids.csv", keep_default_na=False)["request_id"].tolist() == ids


_CELL = st.one_of(st.sampled_from(["r0", "a,b", 'q"', "x\ny", "", "replica-1"]),
                  st.integers(-3, 3), st.sampled_from([1.0, 0.5, NAN, None, True, False]),
                  st.text(max_size=3))


@settings(max_examples=80, deadline=None)
@given(st.lists(_CELL, min_size=1, max_size=60), st.integers(1, 40))
def test_a_column_of_objects_is_written_as_pandas_writes_it(tmp_path_factory, cells, repeat):
    # Few distinct strings (a fleet's replica column) are quoted once each and
    # looked up; 1, 1.0 and True keep their own texts. Repeated, the same column
    # goes either way (many distinct strings in its first 1,024: one by one).
    tmp_path = tmp_path_factory.mktemp("objects")
    for column in (cells, cells * repeat, cells + [f"id{i}" for i in range(100)] + cells):
        frame = pd.DataFrame({"x": pd.Series(column, dtype=object), "n": range(len(column))})
        ours, theirs = pandas_and_ours(tmp_path, frame)
        assert ours == theirs


def test_a_one_column_table_quotes_its_empty_fields(tmp_path):
    ours, theirs = pandas_and_ours(tmp_path, pd.DataFrame({"a": ["x", "", None, NAN]}))
    assert ours == theirs == b'a\nx\n""\n""\n""\n'
    ours, theirs = pandas_and_ours(tmp_path, pd.DataFrame({"": [1.5, NAN]}))
    assert ours == theirs


def test_an_empty_table_has_its_header_only(tmp_path):
    frame = pd.DataFrame({"step": np.zeros(0, dtype=np.int64), "start_time_s": np.zeros(0)})
    ours, theirs = pandas_and_ours(tmp_path, frame)
    assert ours == theirs == b"step,start_time_s\n"


def test_a_mapping_of_columns_is_written_like_its_data_frame(tmp_path):
    columns = {"a": np.arange(40), "b": np.linspace(0, 1, 40), "c": [f"r{i}" for i in range(40)]}
    write_csv(columns, tmp_path / "ours.csv")
    pd.DataFrame(columns).to_csv(tmp_path / "pandas.csv", index=False)
    assert (tmp_path / "ours.csv").read_bytes() == (tmp_path / "pandas.csv").read_bytes()


def test_columns_of_different_lengths_are_an_error(tmp_path):
    with pytest.raises(ValueError, match="different lengths"):
        write_csv({"a": [1, 2], "b": [1]}, tmp_path / "x.csv")


@pytest.mark.parametrize("rows_per_chunk", [1, 7, 64])
def test_rows_written_in_chunks_are_the_same_bytes(tmp_path, monkeypatch, rows_per_chunk):
    """A long table is made text a chunk of rows at a time; a chunk's choices (a
    value table for repeats, -0.0 in one chunk only, a clock that repeats in one
    chunk only) never change a cell's text."""
    import kvsim.metrics.tables as tables
    rng = np.random.default_rng(1)
    n = 300
    clock = np.cumsum(rng.random(n))
    clock[150:160] = clock[150]                                   # repeats in one chunk
    zeros = np.zeros(n)
    zeros[200] = -0.0                                             # a signed zero in one chunk
    frame = pd.DataFrame({
        "clock": clock, "zeros": zeros,
        "usage": np.where(rng.random(n) < 0.1, NAN, rng.integers(0, 5, n) / 3.0),
        "step": np.arange(n), "batch": rng.integers(0, 4, n), "big": rng.integers(0, 2**62, n),
        "replica": pd.array(rng.choice(["p-0", "p,1", None], n), dtype="string"),
    })
    monkeypatch.setattr(tables, "_ROWS_PER_CHUNK", rows_per_chunk)
    ours, theirs = pandas_and_ours(tmp_path, frame)
    assert ours == theirs
    wide = pd.DataFrame({f"c{i}": rng.integers(0, 2**40, n) for i in range(6)})   # the "%d" rows
    ours, theirs = pandas_and_ours(tmp_path, wide)
    assert ours == theirs


def test_a_wide_table_is_made_text_a_few_cells_at_a_time(tmp_path, monkeypatch):
    """A table of many columns (metrics.csv: one per histogram bucket) goes in
    chunks of at most _CELLS_PER_CHUNK cells, not _ROWS_PER_CHUNK rows, and
    its bytes are pandas'."""
    import kvsim.metrics.tables as tables
    rng = np.random.default_rng(5)
    n, width = 300, 40
    wide = pd.DataFrame({f"c{i}": rng.integers(0, 2**40, n) if i % 3 else rng.random(n)
                         for i in range(width)})
    chunks = []
    rows_text = tables._rows_text
    monkeypatch.setattr(tables, "_rows_text",
                        lambda arrays: chunks.append(len(arrays[0])) or rows_text(arrays))
    monkeypatch.setattr(tables, "_CELLS_PER_CHUNK", 1000)
    ours, theirs = pandas_and_ours(tmp_path, wide)
    assert ours == theirs
    assert sum(chunks) == n and max(chunks) == 1000 // width and len(chunks) > 1


def _mixed_table(n, seed=2):
    rng = np.random.default_rng(seed)
    clock = np.cumsum(rng.random(n))
    return pd.DataFrame({
        "clock": clock, "usage": np.where(rng.random(n) < 0.1, NAN, rng.integers(0, 5, n) / 3.0),
        "step": np.arange(n), "batch": rng.integers(0, 4, n), "big": rng.integers(0, 2**62, n),
        "zeros": np.where(rng.random(n) < 0.05, -0.0, 0.0),
        "replica": pd.array(rng.choice(["p-0", "p,1", None], n), dtype="string"),
    })


@pytest.mark.parametrize("workers", [2, 3, 7])
def test_rows_made_text_in_several_processes_are_the_same_bytes(tmp_path, monkeypatch, workers):
    """Forked children make parts of the rows text; the file is pandas' (and the
    one-process file) byte for byte, with no part file left beside it."""
    import kvsim.metrics.tables as tables
    monkeypatch.setattr(tables, "_ROWS_PER_CHUNK", 37)             # parts cut across chunks
    frame = _mixed_table(1000)
    frame.to_csv(tmp_path / "pandas.csv", index=False)
    write_csv(frame, tmp_path / "ours.csv", workers=workers)
    assert (tmp_path / "ours.csv").read_bytes() == (tmp_path / "pandas.csv").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ours.csv", "pandas.csv"]


def test_a_failed_child_costs_only_time(tmp_path):
    """A child that cannot write its part (a folder where its part file goes)
    exits with an error; this process makes that part itself."""
    frame = _mixed_table(500)
    (tmp_path / "ours.csv.part1").mkdir()
    write_csv(frame, tmp_path / "ours.csv", workers=3)
    frame.to_csv(tmp_path / "pandas.csv", index=False)
    assert (tmp_path / "ours.csv").read_bytes() == (tmp_path / "pandas.csv").read_bytes()
    assert not (tmp_path / "ours.csv.part2").exists()


def test_processes_only_for_long_tables_and_never_in_a_daemonic_process(monkeypatch):
    import multiprocessing
    import os
    import sys

    import kvsim.metrics.tables as tables
    long = 100 * tables._MIN_ROWS_PER_WORKER
    assert tables._row_workers(2 * tables._MIN_ROWS_PER_WORKER - 1) == 1
    cores = len(os.sched_getaffinity(0)) if sys.platform == "linux" else 1
    assert tables._row_workers(long) == cores
    monkeypatch.setattr(multiprocessing.current_process(), "daemon", True)    # a sweep's worker
    assert tables._row_workers(long) == 1
