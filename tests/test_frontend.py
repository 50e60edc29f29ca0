"""The front end: when each request reaches the engine (sim/frontend.py)."""

from __future__ import annotations

from helpers import spec

from kvsim.sched.config import SchedulerConfig
from kvsim.sim.run import run_engine

CONFIG = SchedulerConfig(num_gpu_blocks=64, block_size=4, max_model_len=64, max_num_batched_tokens=64)


def arrivals(engine) -> dict[str, float]:
    return {r.request_id: r.arrival_time for r in engine.done}


def test_a_closed_loop_client_waits_for_a_free_slot_and_for_the_send_time():
    # vllm bench serve --max-concurrency 2 with timed sends: a request goes out at
    # the later of its send time and the moment one of the 2 slots frees up.
    specs = [spec("a", range(1, 5), max_tokens=3, arrival=0.0),
             spec("b", range(11, 15), max_tokens=1, arrival=0.125),
             spec("c", range(21, 25), max_tokens=1, arrival=0.25),
             spec("d", range(31, 35), max_tokens=1, arrival=9.5)]
    engine = run_engine(specs, CONFIG, concurrency=2)
    got = arrivals(engine)
    done = {r.request_id: r.finish_time for r in engine.done}
    assert got["a"] == 0.0 and got["b"] == 0.125
    assert got["c"] == min(done["a"], done["b"])       # sent when the first slot freed, after 0.25
    assert got["c"] > 0.25
    assert got["d"] == 9.5                              # a slot is free long before its send time


def test_an_idle_engine_starts_its_step_exactly_at_an_arrival_time():
    # 13.8 and 53.26 are not binary fractions: now + delay could land an ulp away.
    specs = [spec("a", range(1, 5), max_tokens=1, arrival=13.8),
             spec("b", range(11, 15), max_tokens=1, arrival=53.26)]
    engine = run_engine(specs, CONFIG)
    starts = [float(t) for t in engine.steps.columns["start_time_s"]]
    assert 13.8 in starts and 53.26 in starts
    assert {r.request_id: r.scheduled_time for r in engine.done} == {"a": 13.8, "b": 53.26}
