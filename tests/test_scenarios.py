"""Every scenario in scenarios/ loads and runs (shortened), so a broken one fails CI."""

from pathlib import Path

import pytest

import kvsim
from kvsim.scenario.sweep import expand_sweep

SCENARIOS = sorted((Path(__file__).resolve().parent.parent / "scenarios").glob("*.yaml"))


def _shorten(sc) -> list[str]:
    wl = sc.raw["workload"]
    if "trace" in wl:
        return ["workload.trace.max_requests=3"]
    if "bench" in wl:
        return ["workload.bench.num_prompts=4"]
    return ["workload.num_requests=4"]


def test_there_are_scenarios():
    names = {p.stem for p in SCENARIOS}
    assert {"quickstart", "static_vs_continuous", "paged_vs_contiguous", "chunk_size_itl",
            "prefix_caching", "kv_pressure", "sharing", "schedulers_azure"} <= names


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_scenario_loads_and_runs_shortened(path):
    sc = kvsim.load_scenario(path)
    result = kvsim.simulate(kvsim.load_scenario(path, overrides=_shorten(sc)))
    assert result.summary["completed"] + result.summary["failed"] >= 1
    assert result.summary["completed"] >= 1


@pytest.mark.parametrize("path", [p for p in SCENARIOS if "sweep:" in p.read_text()],
                         ids=lambda p: p.stem)
def test_every_sweep_point_loads(path):
    import yaml
    data = yaml.safe_load(path.read_text())
    points = expand_sweep(data)
    assert len(points) >= 2
    for point in points:
        kvsim.load_scenario({**point.scenario, "base_dir": str(path.parent)})
