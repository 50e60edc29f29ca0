"""The collector is paused over a whole ``simulate()``, and a finished run leaves no cycles.

kvsim/sim/gc_pause.py pauses automatic collection while a run builds its
objects. That only pays if the collector never has to trace them afterwards:
``Engine.close`` and ``Fleet._close`` drop the run's back references (the
engine's suspended process, its callbacks into the front end, a fleet's front
end, a prefill connector's engine), so the engine and all it holds are freed
by reference counting. These tests collect with ``DEBUG_SAVEALL`` after a run
and look at what only the collector could have freed.
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

import kvsim
from kvsim.scenario.loader import load_scenario

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"


def _load(name: str, *overrides: str):
    return load_scenario(SCENARIOS / f"{name}.yaml", overrides=list(overrides))


def _cyclic_garbage(run) -> list:
    """The objects that ``run()`` leaves for the collector: in reference cycles, or held by one."""
    run()                                  # first: the lazy imports (a class is a cycle)
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        run()
        gc.collect()
        return list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was_enabled:
            gc.enable()


def _kvsim_objects(garbage: list) -> list[str]:
    return sorted({type(o).__qualname__ for o in garbage
                   if type(o).__module__.startswith("kvsim")})


CASES = {
    "one engine": ("quickstart", "workload.num_requests=120"),
    "one engine, preempting": ("kv_pressure",),
    "fleet, stateless router (replicas run apart)": ("fleet_routing", "workload.num_requests=200"),
    "fleet, router that reads replica state (one environment)":
        ("fleet_routing", "workload.num_requests=200", "cluster.router=least_loaded"),
    "prefill/decode fleet": ("fleet_pd", "workload.num_requests=80"),
    # The radix tree's parent <-> child links: Scheduler.close unlinks them (kv/radix.py).
    "one engine, radix cache": ("radix_vs_hash", "workload.num_requests=200", "sweep=null"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_finished_run_is_freed_by_reference_counting(case):
    sc = _load(*CASES[case])
    garbage = _cyclic_garbage(lambda: kvsim.simulate(sc))
    # What remains is SimPy's own: an Environment with its bound event classes, and a
    # finished process with the event it last waited on (a few dozen objects per replica).
    assert _kvsim_objects(garbage) == []
    assert len(garbage) < 20 * 8


def test_without_closing_the_engine_the_run_stays_in_a_cycle(monkeypatch):
    # The check above can fail: an engine that keeps its process and callbacks
    # leaves itself, its requests and its records to the collector.
    from kvsim.sim.engine import Engine
    monkeypatch.setattr(Engine, "close", lambda self: None)
    garbage = _cyclic_garbage(lambda: kvsim.simulate(_load(*CASES["one engine"])))
    assert {"Engine", "Frontend", "Request"} <= set(_kvsim_objects(garbage))


def test_without_closing_the_radix_tree_it_stays_in_a_cycle(monkeypatch):
    # The radix case above can fail: a tree whose nodes keep their parents is a
    # cycle of TreeNodes (and of the scheduler's requests' nodes) for the collector.
    from kvsim.kv.radix import RadixCache
    monkeypatch.setattr(RadixCache, "close", lambda self: None)
    garbage = _cyclic_garbage(lambda: kvsim.simulate(_load(*CASES["one engine, radix cache"])))
    assert "TreeNode" in _kvsim_objects(garbage)


def test_no_collection_traces_the_run():
    # A collection may start only as the pause ends, when the engine is already freed.
    num_requests = 500
    sc = _load("quickstart", f"workload.num_requests={num_requests}")
    kvsim.simulate(sc)
    traced: list[int] = []

    def on_collect(phase: str, info: dict) -> None:
        if phase == "start":       # the objects this collection is about to trace
            traced.append(sum(len(gc.get_objects(g)) for g in range(info["generation"] + 1)))

    gc.collect()
    gc.callbacks.append(on_collect)
    try:
        result = kvsim.simulate(sc)
    finally:
        gc.callbacks.remove(on_collect)
    # The run builds a Request per request (and more); a collection that traced the
    # run's objects would see at least that many. Measured: [150] here, and
    # [1929, 703, 707] with the pause ending before the tables were built.
    assert sum(traced) < num_requests, traced
    assert len(result.requests) == num_requests


@pytest.mark.parametrize("enabled", [True, False])
def test_simulate_restores_the_callers_setting(enabled):
    sc = _load(*CASES["one engine"])
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        kvsim.simulate(sc)
        assert gc.isenabled() is enabled
        with pytest.raises(Exception):
            kvsim.simulate(sc, trace=_raise)      # an error inside the run
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


def _raise(_record: dict) -> None:
    raise RuntimeError("stop")


def test_kvsim_run_keeps_the_collector_off_and_restores_it(tmp_path, monkeypatch, capsys):
    # `kvsim run` runs with the collector off from its first import on (kvsim/cli.py
    # COLLECTOR_OFF); a call of main() from Python gets its own setting back.
    from kvsim import cli
    from kvsim.scenario import cli as run_cli

    seen = []
    real_run = run_cli._run

    def spy(args):
        seen.append(gc.isenabled())
        return real_run(args)

    monkeypatch.setattr(run_cli, "_run", spy)
    was = gc.isenabled()
    try:
        gc.enable()
        code = cli.main(["run", str(SCENARIOS / "quickstart.yaml"), "--set", "workload.num_requests=20",
                         "--out", str(tmp_path / "out")])
        assert code == 0 and seen == [False]
        assert gc.isenabled()
        seen.clear()
        code = cli.main(["run", str(tmp_path / "missing.yaml")])     # an error: still restored
        assert code == 2 and seen == [False]
        assert gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
