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


def _run_frontend(specs, finish_after: float = 1.0):
    """A front end whose target finishes every request ``finish_after`` s after it is sent."""
    import simpy

    from kvsim.sim.frontend import AtTime, Frontend

    env = simpy.Environment()
    sent: dict[str, float] = {}

    def submit(s, at, _index):
        sent[s.request_id] = at
        AtTime(env, at + finish_after).callbacks.append(
            lambda _e, rid=s.request_id, t=at + finish_after: frontend.on_done(rid, t))

    frontend = Frontend(env, specs, submit)
    frontend.start()
    env.run()
    frontend.check_all_sent()
    return frontend, sent


def test_the_front_end_remembers_finish_times_only_of_requests_that_may_be_followed():
    # W5 (10 million single-turn requests): one remembered finish per request was ~1 GiB.
    specs = [spec(f"r{i}", range(1, 5), arrival=float(i), may_be_followed=False) for i in range(50)]
    frontend, sent = _run_frontend(specs)
    assert len(sent) == 50 and frontend._finished_at == {}


def test_a_turn_read_after_the_one_it_follows_finished_is_released_think_time_after_that_finish():
    # "b" is read at t=5, long after "a" (sent at 0) finished at 1: released at 1 + 0.5.
    specs = [spec("a", range(1, 5), arrival=0.0),                     # may_be_followed: True (default)
             spec("x", range(11, 15), arrival=5.0, may_be_followed=False),
             spec("b", range(21, 25), arrival=5.0, after_request_id="a", think_time_s=0.5,
                  may_be_followed=False)]
    frontend, sent = _run_frontend(specs)
    assert sent == {"a": 0.0, "x": 5.0, "b": 5.0}     # due in the past: sent at once, at now
    assert frontend._finished_at == {"a": 1.0}


def test_synthetic_sessions_mark_every_turn_but_the_last_as_followed():
    import numpy as np

    from kvsim.workload import build_workload
    workload = build_workload({"num_requests": 7, "sessions": {"turns": 3, "think_time_s": 1.0},
                               "prompt_len": {"type": "fixed", "value": 4},
                               "output_len": {"type": "fixed", "value": 2}},
                              rng=np.random.default_rng(0))
    got = [(s.request_id, s.after_request_id, s.may_be_followed) for s in workload.requests()]
    assert got == [("r0", None, True), ("r1", "r0", True), ("r2", "r1", False),
                   ("r3", None, True), ("r4", "r3", True), ("r5", "r4", False),
                   ("r6", None, False)]
