"""An engine moves its clock in place past a step or a decode run when no event
comes first (``kvsim.sim.frontend.advance_in_place``), and the results are
those of waiting for the step's end as a SimPy event, value for value."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import simpy

import kvsim
from kvsim.fleet import separate
from kvsim.sim import engine as engine_module
from kvsim.sim.frontend import AtTime, advance_in_place

ROOT = Path(__file__).resolve().parent.parent


def test_the_clock_moves_only_when_no_event_is_due_by_then():
    env = simpy.Environment(initial_time=1.0)
    assert advance_in_place(env, 2.5) and env.now == 2.5          # nothing queued
    AtTime(env, 4.0)
    assert advance_in_place(env, 3.0) and env.now == 3.0          # the event is later
    assert not advance_in_place(env, 4.0) and env.now == 3.0      # a tie waits (SimPy's order)
    assert not advance_in_place(env, 5.0) and env.now == 3.0      # the event comes first
    AtTime(env, 3.5, urgent=True)
    assert not advance_in_place(env, 3.75) and env.now == 3.0


# (scenario, overrides): one engine with every kind of input and timing, and fleets
# in a shared queue (a router reads the replicas' state) and apart (round robin).
CASES = {
    "chunked-prefix": ("quickstart", ["workload.num_requests=120"]),
    "sessions-offload": ("kv_offload", ["workload.num_requests=80"]),
    "async-spec-stream": ("engine_time", ["workload.num_requests=80"]),
    "parallel-samples": ("sharing", ["workload.num_requests=60"]),
    "continuous": ("quickstart", ["workload.num_requests=120", "engine.scheduler=continuous",
                    "engine.max_num_batched_tokens=8192"]),
    "static": ("static_vs_continuous", []),
    "radix": ("radix_vs_hash", ["workload.num_requests=80", "engine.prefix_cache=radix"]),
    "closed-loop": ("quickstart", ["workload.num_requests=100",
                                   "workload.arrival={type: closed_loop, concurrency: 6}"]),
    "fleet-least-loaded": ("fleet_routing", ["workload.num_requests=240", "cluster.router=least_loaded"]),
    # Fed in windows of 7 requests (kvsim/fleet/separate.py): a replica's clock stops
    # at the window's last arrival until the next window's are in.
    "fleet-apart": ("fleet_routing", ["workload.num_requests=240", "cluster.router=round_robin"]),
    "fleet-pd": ("fleet_pd", ["workload.num_requests=80"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_moving_the_clock_in_place_gives_the_results_of_waiting_for_each_event(case, monkeypatch):
    name, overrides = CASES[case]
    path = ROOT / "scenarios" / f"{name}.yaml"
    monkeypatch.setattr(separate, "WINDOW", 7)
    fast = kvsim.simulate(kvsim.load_scenario(path, overrides=overrides))
    with monkeypatch.context() as m:
        m.setattr(engine_module, "advance_in_place", lambda env, at: False)
        plain = kvsim.simulate(kvsim.load_scenario(path, overrides=overrides))
    pd.testing.assert_frame_equal(fast.requests, plain.requests)
    pd.testing.assert_frame_equal(fast.steps, plain.steps)
    assert np.array_equal(fast.itl_s, plain.itl_s)
    assert fast.summary == plain.summary
    assert len(fast.steps) > 0
