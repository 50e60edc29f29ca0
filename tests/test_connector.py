"""The KV connector hooks of the chunked scheduler (sched/connector.py), with a scripted connector.

vLLM 0.33's scheduler: an external hit loaded synchronously is scheduled at
once and the step waits for it; loaded asynchronously, the request gets
blocks for its computed tokens, waits in WAITING_FOR_REMOTE_KVS, and is
scheduled after ``finished_recving``, its blocks cached then; a connector
that cannot tell yet is skipped; a finished request's blocks may be kept
until ``finished_sending``.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest
from helpers import spec

import kvsim
from kvsim.sched.config import SchedulerConfig
from kvsim.sched.request import RequestStatus
from kvsim.sim.run import run_engine

CONFIG = SchedulerConfig(num_gpu_blocks=41, block_size=4, max_model_len=128, max_num_batched_tokens=16)


class Scripted:
    """External hits, load times and sends, per request id."""

    def __init__(self, hits=None, load_s=0.0, sync=False, wait_s=0.0, send_s=None, unknown=()):
        self.hits = hits or {}                # id -> external tokens past the local hit
        self.load_s, self.sync, self.wait_s, self.send_s = load_s, sync, wait_s, send_s
        self.unknown = set(unknown)           # ids answered None once
        self.loads: dict[str, float] = {}     # id -> done time
        self.sends: dict[str, float] = {}
        self.pending_sync = []
        self.allocated = {}

    def bind(self, env, kv):
        self.env, self.kv = env, kv

    def get_num_new_matched_tokens(self, req, num_computed):
        if req.request_id in self.unknown:
            return None, False
        hit = min(self.hits.get(req.request_id, 0), req.num_tokens)
        return max(hit - num_computed, 0), not self.sync

    def update_state_after_alloc(self, req, block_ids, num_external):
        self.allocated[req.request_id] = (list(block_ids), num_external)
        if self.sync:
            self.pending_sync.append(req.request_id)
        else:
            self.loads[req.request_id] = self.env.now + self.load_s

    def step_wait_s(self, scheduled):
        wait = self.wait_s if self.pending_sync else 0.0
        self.pending_sync = []
        return wait

    def request_finished(self, req, block_ids):
        if self.send_s is None:
            return False
        self.sends[req.request_id] = self.env.now + self.send_s
        return True

    def finished_transfers(self, now):
        self.unknown.clear()                  # answered after one step
        recv = [r for r, t in self.loads.items() if t <= now]
        send = [r for r, t in self.sends.items() if t <= now]
        for r in recv:
            del self.loads[r]
        for r in send:
            del self.sends[r]
        return recv, send

    def next_transfer_done_time(self):
        return min([*self.loads.values(), *self.sends.values()], default=math.inf)


def run(specs, connector, **kw):
    trace = []
    engine = run_engine(specs, CONFIG, connector=connector, trace=trace.append, **kw)
    return engine, trace, {r.request_id: r for r in engine.done}


def test_an_asynchronous_load_holds_blocks_then_schedules_the_rest_after_it_arrives():
    c = Scripted(hits={"R": 32}, load_s=2.5)
    engine, trace, done = run([spec("R", range(1, 41), max_tokens=2)], c)
    # Step 0 at t=0 allocates blocks for the 32 loaded tokens and schedules nothing;
    # no empty step is recorded while the load runs; at t=2.5 R computes its last 8.
    assert c.allocated["R"] == ([1, 2, 3, 4, 5, 6, 7, 8], 32)
    assert [(s["start_time"], s["scheduled"]) for s in trace] == [(2.5, {"R": 8}), (3.5, {"R": 1})]
    assert trace[0]["prefix_hit_tokens"] == {"R": 32}
    assert done["R"].num_cached_tokens == 32
    assert done["R"].first_token_time == 3.5


def test_a_full_external_hit_recomputes_the_last_token():
    c = Scripted(hits={"R": 40}, load_s=1.0)
    _, trace, done = run([spec("R", range(1, 41), max_tokens=1)], c)
    assert [s["scheduled"] for s in trace] == [{"R": 1}]
    assert done["R"].num_cached_tokens == 39


def test_the_loaded_blocks_are_cached_when_the_kv_arrives_not_before():
    c = Scripted(hits={"R": 32}, load_s=5.0)
    # S arrives at 1.0 with the same first 32 tokens: while R's load runs its
    # blocks hold no hash, so S hits nothing locally; after the load S would hit.
    specs = [spec("R", range(1, 41), max_tokens=1), spec("S", range(1, 33), max_tokens=1, arrival=1.0)]
    _, trace, done = run(specs, c)
    assert done["S"].num_cached_tokens == 0
    later = [spec("R", range(1, 41), max_tokens=8), spec("S", range(1, 34), max_tokens=1, arrival=6.0)]
    _, _, done = run(later, Scripted(hits={"R": 32}, load_s=5.0))
    assert done["S"].num_cached_tokens == 32


def test_a_synchronous_load_is_scheduled_at_once_and_the_step_waits_for_it():
    c = Scripted(hits={"R": 32}, sync=True, wait_s=0.5)
    engine, trace, done = run([spec("R", range(1, 41), max_tokens=2)], c)
    assert [(s["start_time"], s["scheduled"]) for s in trace] == [(0.0, {"R": 8}), (1.5, {"R": 1})]
    assert list(engine.steps.columns["duration_s"]) == [1.5, 1.0]


def test_a_request_the_connector_cannot_answer_yet_is_skipped_not_blocking():
    c = Scripted(unknown={"A"})
    _, trace, _ = run([spec("A", range(1, 9), max_tokens=1), spec("B", range(11, 19), max_tokens=1)], c)
    assert trace[0]["scheduled"] == {"B": 8}
    assert trace[1]["scheduled"] == {"A": 8}


def test_blocks_kept_for_a_reader_are_freed_when_the_send_finishes():
    c = Scripted(send_s=3.0)
    engine, trace, _ = run([spec("P", range(1, 9), max_tokens=1)], c)
    assert trace[0]["finished"] == ["P"]
    assert trace[0]["num_free_blocks"] == 40 - 2          # still held: a reader pulls them
    assert engine.scheduler.num_free_blocks() == 40       # freed at t=4 when the send finished
    assert not c.sends


def test_the_step_path_and_the_decode_runs_agree_with_loads_in_flight():
    def sc(fast):
        steps = []
        c = Scripted(hits={f"r{i}": 24 for i in range(0, 40, 3)}, load_s=3.25)
        # Bursts with quiet gaps: decode runs would pass a load's completion.
        specs = [spec(f"r{i}", range(1000 * i, 1000 * i + 20 + (i * 7) % 30), max_tokens=5 + i % 29,
                      arrival=(i // 8) * 20.0 + (i % 8) * 0.125) for i in range(40)]
        engine = run_engine(specs, CONFIG, connector=c, trace=steps.append, fast_path=fast)
        return steps, sorted((r.request_id, r.finish_time, tuple(r.token_times)) for r in engine.done), engine
    fast_steps, fast_done, fast = sc(True)
    slow_steps, slow_done, _ = sc(False)
    assert fast_steps == slow_steps
    assert fast_done == slow_done
    assert fast.num_run_steps > 0


def test_a_decode_run_stops_at_the_step_that_sees_a_load_complete():
    # A and B decode for 40 steps; C's KV arrives at t=6.5 (mid-run): the step
    # ending at 7.0 takes it in, and C is scheduled in the next one.
    def sc(fast):
        steps = []
        specs = [spec("A", range(1, 9), max_tokens=40), spec("B", range(11, 19), max_tokens=40),
                 spec("C", range(21, 41), max_tokens=2, arrival=1.5)]
        engine = run_engine(specs, CONFIG, connector=Scripted(hits={"C": 16}, load_s=4.5),
                            trace=steps.append, fast_path=fast)
        return steps, engine
    fast_steps, fast = sc(True)
    slow_steps, _ = sc(False)
    assert fast_steps == slow_steps
    assert [s["start_time"] for s in fast_steps if "C" in s["scheduled"]][0] == 7.0
    assert fast.num_run_steps > 20


def test_only_the_chunked_scheduler_takes_a_connector():
    with pytest.raises(ValueError, match="engine.scheduler: 'continuous' takes no KV connector"):
        run_engine([spec("A", range(1, 9))], CONFIG, scheduler="continuous", connector=Scripted())


def test_async_scheduling_with_a_connector_is_refused_in_one_line():
    # It hung before: async finishing never freed a request whose blocks a send held.
    from dataclasses import replace
    with pytest.raises(ValueError) as exc:
        run_engine([spec("A", range(1, 9))], replace(CONFIG, async_scheduling=True),
                   connector=Scripted(send_s=0.02))
    assert str(exc.value) == ("engine.async_scheduling: not modelled with a KV connector (P/D "
                              "transfer, KV offloading); allowed: false")


def test_an_asynchronous_load_leaves_free_what_the_prefills_in_flight_still_need():
    # vLLM 0.33 Scheduler.schedule: an asynchronous load is admitted only if its
    # blocks fit in the free blocks less every in-flight prefill's remaining
    # need (_inflight_prefill_reserved_blocks, "to avoid deadlock").
    # 40 usable blocks of 4 tokens. A (120 tokens, 8 loaded) takes 2 blocks and
    # still needs 28 for its whole sequence; B (80 tokens, 64 loaded) needs 16
    # now but only 38 - 28 = 10 are not reserved: B waits. Admitted anyway, B
    # would leave 22 free, A could never start (its whole sequence needs 28:
    # scheduler_reserve_full_isl) and B queues behind A in the holding queue.
    c = Scripted(hits={"A": 8, "B": 64}, load_s=3.0)
    specs = [spec("A", range(1, 121), max_tokens=1), spec("B", range(1001, 1081), max_tokens=1)]
    _, trace, done = run(specs, c)
    assert c.allocated["A"] == ([1, 2], 8)
    # A's prompt in 7 chunks of 16 at t = 3..9 (it is in flight until its last
    # chunk is scheduled); B is refused at each of those steps, is admitted at
    # t=10 once A has finished and freed its blocks, loads until 13 and then
    # computes its last 16 tokens.
    assert [(s["start_time"], s["scheduled"]) for s in trace] == (
        [(float(t), {"A": 16}) for t in range(3, 10)] + [(13.0, {"B": 16})])
    assert done["A"].finish_time == 10.0 and done["B"].first_token_time == 14.0
    assert done["B"].num_cached_tokens == 64


def test_loaded_requests_that_block_each_other_fail_the_first_instead_of_hanging(monkeypatch):
    # The safety net behind that gate: with it switched off, A and B deadlock
    # as above (nothing runs, no transfer is pending). The engine fails the
    # holding queue's head with the reason; B then runs.
    from kvsim.sched.chunked import ChunkedScheduler
    monkeypatch.setattr(ChunkedScheduler, "_reserved_for_inflight_prefills", lambda self: 0)
    c = Scripted(hits={"A": 8, "B": 64}, load_s=3.0)
    specs = [spec("A", range(1, 121), max_tokens=1), spec("B", range(1001, 1081), max_tokens=1)]
    engine, trace, done = run(specs, c)
    # At 3.0 both loads are in and the step is empty (recorded, as any step
    # that schedules nothing); after it A is failed and B starts.
    assert done["A"].status is RequestStatus.FAILED and done["A"].finish_time == 4.0
    assert "does not fit beside the blocks the other loaded requests hold" in done["A"].fail_reason
    assert [(s["start_time"], s["scheduled"]) for s in trace] == [(3.0, {}), (4.0, {"B": 16})]
    assert done["B"].first_token_time == 5.0
    assert engine.scheduler.num_free_blocks() == 40
