"""The per-replica load and hit-rate figure draws the numbers its table functions compute."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import kvsim
from kvsim import plots_fleet
from tests.test_fleet_outputs import scenario


def steps_table():
    return pd.DataFrame({
        "replica": ["a", "a", "a", "b", "b"],
        "start_time_s": [0.0, 1.0, 2.0, 0.5, 1.5],
        "duration_s": [1.0, 1.0, 1.0, 1.0, 1.0],
        "num_running": [2, 3, 1, 4, 0],
        "num_waiting": [1, 0, 0, 1, 0],
    })


def requests_table():
    return pd.DataFrame({
        "replica": ["a", "b", "a", "a", "b", "b"],
        "scheduled_time_s": [0.2, 0.6, 1.1, 2.5, 2.9, np.nan],
        "num_prompt_tokens": [100, 200, 100, 400, 100, 50],
        "num_cached_tokens": [0, 100, 50, 300, 100, 0],
    })


def test_load_is_the_gauge_after_the_last_step_that_ended():
    load = plots_fleet.replica_load(steps_table(), np.array([0.0, 1.0, 1.5, 2.5, 3.0, 9.0]))
    a = load[load["replica"] == "a"]["load"].tolist()
    b = load[load["replica"] == "b"]["load"].tolist()
    assert a == [0, 3, 3, 3, 1, 1]          # ends 1 (3), 2 (3), 3 (1)
    assert b == [0, 0, 5, 0, 0, 0]          # ends 1.5 (5), 2.5 (0)


def test_hit_rate_counts_requests_in_the_window_they_were_first_scheduled():
    hits = plots_fleet.replica_hit_rate(requests_table(), window_s=1.0)
    assert hits["replica"].tolist() == ["a", "a", "a", "b", "b"]
    assert hits["window_start_s"].tolist() == [0.0, 1.0, 2.0, 0.0, 2.0]
    assert hits["prompt_tokens"].tolist() == [100, 100, 400, 200, 100]
    assert hits["hit_rate"].tolist() == [0.0, 0.5, 0.75, 0.5, 1.0]
    with pytest.raises(ValueError, match="window_s"):
        plots_fleet.replica_hit_rate(requests_table(), window_s=0)


def test_the_figure_draws_those_tables_replica_by_replica():
    fig = plots_fleet.replica_timeline(steps_table(), requests_table(), window_s=1.0, samples=7)
    ax_load, ax_hit = fig.axes[:2]
    times = np.linspace(0.0, 3.0, 7)
    load = plots_fleet.replica_load(steps_table(), times)
    for line, name in zip(ax_load.lines, ["a", "b"]):
        assert line.get_label() == name
        np.testing.assert_array_equal(line.get_xdata(), times)
        np.testing.assert_array_equal(line.get_ydata(), load[load["replica"] == name]["load"])
    a_hit = ax_hit.lines[0]
    np.testing.assert_array_equal(a_hit.get_xdata(), [0.5, 1.5, 2.5])
    np.testing.assert_array_equal(a_hit.get_ydata(), [0.0, 50.0, 75.0])
    assert "per replica" in fig.get_suptitle()


def test_a_missing_column_names_the_plot_and_the_file():
    with pytest.raises(ValueError, match=r"replica-timeline.*replica.*steps.csv"):
        plots_fleet.replica_timeline(steps_table().drop(columns=["replica"]), requests_table())


def test_round_robin_hit_rates_are_alike_and_a_prefix_router_raises_them():
    base = scenario(cluster={"replicas": 3, "router": "round_robin"})
    base["workload"] |= {"num_requests": 90, "prefix": {"shared_prompt_tokens": 512, "num_groups": 6}}
    rr = kvsim.simulate(base)
    pa = kvsim.simulate(base | {"cluster": {"replicas": 3, "router": "prefix_aware"}})
    w = 10.0
    rr_rate = plots_fleet.replica_hit_rate(rr.requests, w)
    pa_rate = plots_fleet.replica_hit_rate(pa.requests, w)
    overall = lambda t: t["cached_tokens"].sum() / t["prompt_tokens"].sum()   # noqa: E731
    assert overall(rr_rate) == pytest.approx(rr.summary["prefix_cache_hit_rate"])
    assert overall(pa_rate) > overall(rr_rate)


def test_nice_window_is_round():
    assert plots_fleet.nice_window(30.0) == 1.0
    assert plots_fleet.nice_window(100.0) == 5.0
    assert plots_fleet.nice_window(0.0) == 1.0
