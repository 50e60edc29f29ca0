"""The shortcuts taken for speed outside the engine give exactly what the plain way gives.

Each test compares a fast path of the run's surroundings (loading, tables,
writing) with the straightforward code it replaced, value for value or byte
for byte.
"""

from __future__ import annotations

import pytest
import yaml

from kvsim.specs import catalog


@pytest.mark.parametrize("kind", ["gpus", "models"])
def test_catalogs_read_with_libyaml_equal_the_pure_python_parse(kind):
    catalog._catalog.cache_clear()
    entries, aliases = catalog._catalog(kind)
    text = (catalog.DATA_DIR / f"{kind}.yaml").read_text(encoding="utf-8")
    plain = yaml.safe_load(text)
    assert entries == plain[kind] and aliases == dict(plain.get("aliases") or {})
    # Same types too (an int read as a float, a date as a string, would compare equal or not show).
    assert repr(entries) == repr(plain[kind])


def test_a_scenario_without_vllm_command_lines_does_not_import_their_tables():
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    code = ("import sys, kvsim; kvsim.load_scenario('scenarios/quickstart.yaml'); "
            "print('kvsim.scenario.vllm_args' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(root)})
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------- write_csv


def _column(draw, st, num_rows):
    import numpy as np
    kind = draw(st.sampled_from(["counter", "few", "float", "clock", "text"]))
    if kind == "counter":      # integers that rarely repeat: the %d path
        return np.array(draw(st.lists(st.integers(-10**12, 10**12), min_size=num_rows, max_size=num_rows)),
                        dtype=np.int64)
    if kind == "few":
        return np.array(draw(st.lists(st.integers(0, 3), min_size=num_rows, max_size=num_rows)), dtype=np.int64)
    if kind == "clock":
        return np.cumsum(np.array(draw(st.lists(st.floats(0.001, 10.0), min_size=num_rows,
                                                    max_size=num_rows)), dtype=float))
    if kind == "float":
        values = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, 0.5]))
        return np.array(draw(st.lists(values, min_size=num_rows, max_size=num_rows)), dtype=float)
    texts = st.one_of(st.none(), st.text(alphabet='ab,"\n x%', max_size=4))
    return draw(st.lists(texts, min_size=num_rows, max_size=num_rows))


def test_write_csv_writes_the_bytes_of_to_csv_for_any_mix_of_columns(tmp_path):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    import pandas as pd

    from kvsim.metrics.tables import write_csv

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.data())
    def check(data):
        num_rows = data.draw(st.integers(0, 40))
        num_cols = data.draw(st.integers(1, 9))
        table = {f"c{i},{'%' if i % 2 else ''}": _column(data.draw, st, num_rows) for i in range(num_cols)}
        frame = pd.DataFrame(table)
        write_csv(frame, tmp_path / "fast.csv")
        frame.to_csv(tmp_path / "pandas.csv", index=False)
        assert (tmp_path / "fast.csv").read_bytes() == (tmp_path / "pandas.csv").read_bytes()

    check()


def test_a_wide_table_of_counters_takes_the_format_path_and_matches_to_csv(tmp_path):
    import numpy as np
    import pandas as pd

    from kvsim.metrics import tables

    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"time_s": np.arange(200) * 1.0,
                          **{f"vllm:c{i}": np.cumsum(rng.integers(0, 1000, 200)) for i in range(30)},
                          "usage": rng.random(200)})
    arrays = [frame[c].to_numpy() for c in frame.columns]
    assert sum(a.dtype.kind == "i" and not tables._few_distinct(a) for a in arrays) * 2 >= len(arrays)
    tables.write_csv(frame, tmp_path / "fast.csv")
    frame.to_csv(tmp_path / "pandas.csv", index=False)
    assert (tmp_path / "fast.csv").read_bytes() == (tmp_path / "pandas.csv").read_bytes()
