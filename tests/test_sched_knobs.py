"""vLLM 0.33 scheduler knobs and the API server's queue limits (issue #17).

The step rules of ``max_num_scheduled_tokens``, ``max_num_active_seqs``,
``long_prefill_token_threshold_adaptive`` and ``prefill_schedule_interval``
are checked against the real scheduler by the golden cases
(tests/test_oracle_traces.py); here:

* without its knobs, kvsim writes each knob case's baseline trace too;
* a decode run leaves the scheduler exactly as its steps taken one by one
  do, with every knob (hypothesis), so the fast path cannot drift;
* ``max_num_queued_reqs`` / ``max_num_queued_tokens`` refuse requests with
  HTTP 503 as ``AsyncLLM.check_admission`` does, with exact counts;
* a request that can never run fails before its blocks are hashed;
* the values vLLM refuses are refused in one line naming the key.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvsim
from kvsim.scenario.schema import ScenarioError
from kvsim.sched.chunked import ChunkedScheduler
from kvsim.sched.config import SchedulerConfig
from kvsim.sched.request import Request
from kvsim.sim.admission import BACKLOG_FULL, QUEUE_FULL
from kvsim.sim.run import run_engine
from kvsim.workload.request import RequestSpec
from test_oracle_traces import GOLDEN, first_difference, scenario_for

KNOB_CASES = sorted(p.parent.name for p in GOLDEN.glob("*/baseline.jsonl"))


# ----------------------------------------------------- golden baselines

def test_every_knob_case_has_a_baseline():
    assert len(KNOB_CASES) >= 8


@pytest.mark.parametrize("name", KNOB_CASES)
def test_without_its_knobs_kvsim_writes_the_baseline_trace(name):
    case = GOLDEN / name
    config = json.loads((case / "config.json").read_text())
    sc = scenario_for(case)
    for knob in config["_knobs"]:
        del sc["engine"][knob]
    steps: list[dict] = []
    kvsim.simulate(sc, trace=steps.append)
    baseline = [json.loads(line) for line in (case / "baseline.jsonl").read_text().splitlines() if line]
    assert first_difference(baseline, steps) is None


# ------------------------------------------ decode runs = their steps

def spec(rid: str, prompt: list[int], max_tokens: int, priority: int = 0,
         outputs: list[int] | None = None) -> RequestSpec:
    return RequestSpec(request_id=rid, arrival_time_s=0.0, priority=priority, max_tokens=max_tokens,
                       prompt_token_ids=np.asarray(prompt, dtype=np.int64),
                       output_token_ids=None if outputs is None else np.asarray(outputs, dtype=np.int64))


def state(s: ChunkedScheduler) -> dict:
    """Everything a later step of the scheduler reads."""
    reqs = list(s.running) + list(s.waiting)
    return {
        "running": [r.request_id for r in s.running],
        "waiting": [r.request_id for r in s.waiting],
        "requests": {r.request_id: (r.num_computed_tokens, r.num_output_tokens, r.status.value,
                                    r.num_preemptions, r.num_cached_tokens) for r in reqs},
        "blocks": {rid: list(b) for rid, b in s.kv.req_to_blocks.items()},
        "cached": dict(s.kv.num_cached_block),
        "free_queue": s.kv.free_queue(),
        "block_hash": list(s.kv.pool.block_hash),
        "cadence": (s.cadence.num_executed_steps, s.cadence.last_prefill_step, s.cadence.capacity_bound,
                    sorted(r.request_id for r in s.cadence.chunks)),
    }


knob_settings = st.fixed_dictionaries({
    "num_gpu_blocks": st.sampled_from([10, 14, 20, 40]),
    "max_num_batched_tokens": st.sampled_from([8, 13, 24]),
    "max_num_scheduled_tokens": st.sampled_from([None, 5, 11]),
    "max_num_seqs": st.sampled_from([3, 6]),
    "max_num_active_seqs": st.sampled_from([None, 1, 2]),
    "long_prefill_token_threshold": st.sampled_from([0, 3, 6]),
    "long_prefill_token_threshold_adaptive": st.booleans(),
    "prefill_schedule_interval": st.sampled_from([1, 2, 3, 5]),
    "policy": st.sampled_from(["fcfs", "priority"]),
    "enable_prefix_caching": st.booleans(),
})
PREFIXES = [list(range(1, 14)), list(range(100, 109))]
# A request that answers ANSWER, and prompts that quote it: while it decodes,
# it caches the very blocks a waiting quote would hit.
QUESTION, ANSWER = [60, 61, 62], list(range(300, 330))
request_lists = st.lists(
    st.tuples(st.integers(0, 12),                                # arrival step
              st.integers(0, 4),                                 # prefix: none, 0, 1, answer, quote
              st.lists(st.integers(1, 4), min_size=0, max_size=10),   # own tokens (few values)
              st.integers(1, 14),                                # max_tokens
              st.integers(0, 2)),                                # priority
    min_size=1, max_size=9)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(knobs=knob_settings, requests=request_lists, cut=st.integers(0, 3))
def test_a_decode_run_leaves_the_scheduler_as_its_steps_do(knobs, requests, cut):
    """Wherever the scheduler offers a decode run or a chunk run (even right
    after an arrival), applying its first k steps at once gives the state k
    single steps give."""
    if knobs["max_num_active_seqs"] is not None:
        knobs["max_num_active_seqs"] = min(knobs["max_num_active_seqs"], knobs["max_num_seqs"])
    config = SchedulerConfig(block_size=4, max_model_len=36, **knobs)
    sched = ChunkedScheduler(config)
    pending = []
    for i, (at, kind, own, max_tokens, prio) in enumerate(requests):
        outputs = None
        if kind == 3:
            prompt, outputs = QUESTION, ANSWER
        elif kind == 4:
            prompt = QUESTION + ANSWER[:4 * len(own) + max_tokens % 4] + own
        else:
            prompt = ([] if kind == 0 else PREFIXES[kind - 1]) + own or [7]
        prompt = prompt[:30]
        req = Request(spec(f"r{i}", prompt, max_tokens, prio, outputs), i, block_size=4,
                      max_model_len=36, hash_blocks=config.enable_prefix_caching)
        if -(-req.final_num_tokens // 4) <= config.num_gpu_blocks - 1:
            pending.append((at, i, req))
    pending.sort(key=lambda e: (e[0], e[1]))
    now, runs = 0.0, 0
    for step in range(400):
        while pending and pending[0][0] <= step:
            sched.add_request(pending.pop(0)[2])
        if not sched.has_requests():
            if not pending:
                break
            continue
        run = sched.plan_decode_run()
        if run is not None:
            k = max(1, run.max_steps - cut)
            twin = copy.deepcopy(sched)
            sched.apply_decode_run(run, k, [now + j + 1 for j in range(k)])
            for j in range(k):
                plan = twin.schedule()
                expected = [(r.request_id, 1) for r in run.requests]
                if run.chunk:                     # a chunk run: the last request prefills
                    expected[-1] = (run.requests[-1].request_id, run.chunk_tokens(j + 1))
                assert [(r.request_id, n) for r, n, _ in plan.scheduled] == expected, \
                    f"step {j + 1} of a run of {k}"
                twin.update_from_output(plan, now + j + 1)
            assert state(sched) == state(twin)
            now += k
            runs += 1
            continue
        plan = sched.schedule()
        now += 1
        sched.update_from_output(plan, now)
        if plan.is_empty and not sched.running and len(sched.waiting):
            sched.pop_unschedulable()


# ------------------------------------------------------- queue limits

def limited(max_num_queued_reqs=None, max_num_queued_tokens=None, **engine) -> SchedulerConfig:
    settings = {"num_gpu_blocks": 200, "block_size": 16, "max_model_len": 1024,
                "max_num_batched_tokens": 2048, **engine}
    return SchedulerConfig(max_num_queued_reqs=max_num_queued_reqs,
                           max_num_queued_tokens=max_num_queued_tokens, **settings)


def at(rid: str, t: float, prompt_len: int, max_tokens: int = 4, n: int = 1) -> RequestSpec:
    return RequestSpec(request_id=rid, arrival_time_s=t, max_tokens=max_tokens, n=n,
                       prompt_token_ids=np.arange(prompt_len, dtype=np.int64) + 1000 * len(rid))


def outcome(engine) -> dict[str, tuple[str, float]]:
    return {r.request_id: (r.fail_reason or r.status.value, r.finish_time) for r in engine.done}


def test_max_num_queued_reqs_refuses_past_the_unfinished_count():
    # 1 s steps. a, b, c arrive together: a and b are unfinished, c is refused.
    # a and b finish at t=4 (prefill + 3 decodes); d (t=3.5) is refused, e (t=4.5) runs
    # from t=5 (after the step that reports a and b).
    specs = [at("a", 0.0, 20), at("b", 0.0, 20), at("c", 0.0, 20), at("d", 3.5, 20), at("e", 4.5, 20)]
    engine = run_engine(specs, limited(max_num_queued_reqs=2))
    assert outcome(engine) == {"a": ("finished", 4.0), "b": ("finished", 4.0), "c": (QUEUE_FULL, 0.0),
                               "d": (QUEUE_FULL, 3.5), "e": ("finished", 9.0)}


def test_n_samples_count_n_and_are_refused_together():
    specs = [at("a", 0.0, 20, n=2), at("b", 0.0, 20, n=2), at("c", 0.0, 20)]
    engine = run_engine(specs, limited(max_num_queued_reqs=3))
    got = outcome(engine)
    assert got["b#0"] == got["b#1"] == (QUEUE_FULL, 0.0)
    assert got["a#0"][0] == got["a#1"][0] == got["c"][0] == "finished"


def test_max_num_queued_tokens_counts_prompts_until_their_first_token():
    # a (60) and b (50): 60 < 100 when b arrives, so b is taken; then 110 >= 100.
    # Their first tokens come at t=1; from then on the backlog is empty again.
    specs = [at("a", 0.0, 60), at("b", 0.0, 50), at("c", 0.5, 10), at("d", 1.5, 10)]
    engine = run_engine(specs, limited(max_num_queued_tokens=100))
    got = outcome(engine)
    assert got["c"] == (BACKLOG_FULL, 0.5)
    assert got["a"][0] == got["b"][0] == got["d"][0] == "finished"


def test_chunk_progress_does_not_shrink_the_backlog():
    # A 300-token prompt in 64-token chunks keeps counting 300 until its first token (t=5).
    specs = [at("a", 0.0, 300)] + [at(f"x{i}", 0.5 + i, 5) for i in range(6)]
    engine = run_engine(specs, limited(max_num_queued_tokens=300, max_num_batched_tokens=64))
    got = outcome(engine)
    assert [got[f"x{i}"][0] == BACKLOG_FULL for i in range(6)] == [True] * 5 + [False]


def test_queue_limits_are_read_from_the_scenario():
    sc = {"name": "q", "model": "llama-3.1-8b",
          "engine": {"num_gpu_blocks_override": 400, "max_model_len": 2048,
                     "max_num_queued_reqs": 4},
          "cost_model": {"type": "constant", "step_time_s": 0.5},
          "workload": {"num_requests": 30, "arrival": {"type": "poisson", "rate": 40.0},
                       "prompt_len": {"type": "fixed", "value": 50},
                       "output_len": {"type": "fixed", "value": 20}}}
    result = kvsim.simulate(sc)
    failed = result.requests[result.requests["status"] == "failed"]
    assert len(failed) > 0 and set(failed["fail_reason"]) == {QUEUE_FULL}
    assert result.summary["completed"] + result.summary["failed"] == 30


# ------------------------------------------- nothing read before the check

def test_a_request_that_can_never_run_fails_before_its_blocks_are_hashed(monkeypatch):
    import kvsim.sched.request as request_module

    def no_hashing(*args, **kwargs):
        raise AssertionError("hashed a request that fails on arrival")

    monkeypatch.setattr(request_module, "block_hashes", no_hashing)
    # 2e9 token ids that take no memory, and not marked fresh: only their count is read.
    huge = np.broadcast_to(np.zeros(1, dtype=np.int64), (2_000_000_000,))
    specs = [RequestSpec(request_id="big", arrival_time_s=0.0, prompt_token_ids=huge, max_tokens=5)]
    engine = run_engine(specs, limited())
    assert outcome(engine) == {"big": ("prompt of 2000000000 tokens >= max_model_len 1024", 0.0)}


# ------------------------------------------------ refused in one line

BASE = {"name": "k", "model": "llama-3.1-8b",
        "engine": {"num_gpu_blocks_override": 400, "max_model_len": 2048, "max_num_seqs": 64},
        "workload": {"num_requests": 2}}


@pytest.mark.parametrize("engine, needles", [
    ({"max_num_active_seqs": 65}, ("engine.max_num_active_seqs", "got 65", "max_num_seqs (64)")),
    ({"max_num_active_seqs": 0}, ("engine.max_num_active_seqs", "got 0", "greater than or equal to 1")),
    ({"max_num_scheduled_tokens": 0}, ("engine.max_num_scheduled_tokens", "got 0", "greater than or equal to 1")),
    ({"prefill_schedule_interval": 0}, ("engine.prefill_schedule_interval", "got 0", "greater than or equal to 1")),
    ({"max_num_queued_reqs": -1}, ("engine.max_num_queued_reqs", "got -1", "greater than or equal to 0")),
    ({"max_num_queued_tokens": "1K"}, ("engine.max_num_queued_tokens", "'1K'")),
    ({"long_prefill_token_threshold_adaptive": "yes"}, ("engine.long_prefill_token_threshold_adaptive",)),
    ({"long_prefill_token_threshold": 4096}, ("engine.long_prefill_token_threshold", "got 4096",
                                              "max_model_len (2048)")),
    ({"scheduler": "continuous", "prefill_schedule_interval": 4},
     ("engine.prefill_schedule_interval", "got 4", "only the chunked", "continuous")),
    ({"scheduler": "static", "max_num_active_seqs": 4}, ("engine.max_num_active_seqs", "static")),
    ({"max_num_batched_tokens": 32}, ("engine.max_num_seqs", "got 64", "max_num_batched_tokens (32)")),
])
def test_values_vllm_refuses_are_one_line_naming_the_key(engine, needles):
    sc = copy.deepcopy(BASE)
    sc["engine"].update(engine)
    with pytest.raises(ScenarioError) as err:
        kvsim.simulate(sc)
    message = str(err.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, (needle, message)


def test_the_queue_limits_apply_to_every_scheduler():
    for scheduler in ("continuous", "static"):
        sc = copy.deepcopy(BASE)
        sc["engine"].update(scheduler=scheduler, max_num_queued_reqs=1, max_num_batched_tokens=2048)
        sc["workload"] = {"num_requests": 5, "arrival": {"type": "poisson", "rate": 1000.0},
                          "prompt_len": {"type": "fixed", "value": 20},
                          "output_len": {"type": "fixed", "value": 20}}
        result = kvsim.simulate(sc)
        assert result.summary["failed"] >= 1, scheduler


# ------------------------------------------- the cadence with a KV connector

def connector_run(specs, connector, fast_path=True, **cfg):
    from dataclasses import replace

    from test_connector import CONFIG
    steps: list[dict] = []
    engine = run_engine(specs, replace(CONFIG, **cfg), connector=connector, trace=steps.append,
                        fast_path=fast_path)
    return engine, steps


def test_a_request_the_connector_skipped_does_not_lift_the_hold():
    # Interval 3. X and C arrive while A decodes; the step at t=6 admits X (a
    # prefill) and skips C (the connector cannot tell yet). vLLM counts C in
    # deferred_waiting, so that step drained what it could: the hold is not
    # lifted, and C waits for the release step at t=9 (not t=7).
    from helpers import spec as hspec
    from test_connector import Scripted
    class UnknownUntil(Scripted):
        def finished_transfers(self, now):
            unknown = set(self.unknown) if now < 7.0 else set()
            done = super().finished_transfers(now)
            self.unknown = unknown              # C is answered from the step at t=7 on
            return done

    specs = [hspec("A", range(1, 9), max_tokens=30), hspec("X", range(11, 19), max_tokens=5, arrival=5.5),
             hspec("C", range(21, 29), max_tokens=5, arrival=5.5)]
    _, steps = connector_run(specs, UnknownUntil(unknown={"C"}), prefill_schedule_interval=3)
    assert [s["start_time"] for s in steps if "X" in s["prefix_hit_tokens"]] == [6.0]
    assert [s["start_time"] for s in steps if "C" in s["prefix_hit_tokens"]] == [9.0]


def test_a_held_step_still_starts_an_asynchronous_load():
    # vLLM: an async KV load schedules no prefill work, so a held step starts it.
    from helpers import spec as hspec
    from test_connector import Scripted
    specs = [hspec("A", range(1, 9), max_tokens=30), hspec("R", range(100, 140), max_tokens=3, arrival=1.5)]
    connector = Scripted(hits={"R": 32}, load_s=0.25)
    _, steps = connector_run(specs, connector, prefill_schedule_interval=6)
    assert connector.allocated["R"][1] == 32                 # the load started at t=2, a held step
    assert [s["start_time"] for s in steps if "R" in s["scheduled"]][0] == 6.0   # its prefill waits


def test_the_fast_path_agrees_with_a_connector_and_a_prefill_cadence():
    from helpers import spec as hspec
    from test_connector import Scripted

    def sc(fast):
        specs = [hspec(f"r{i}", range(1000 * i, 1000 * i + 20 + (i * 7) % 30), max_tokens=5 + i % 29,
                       arrival=(i // 8) * 20.0 + (i % 8) * 0.125) for i in range(40)]
        connector = Scripted(hits={f"r{i}": 24 for i in range(0, 40, 3)}, load_s=3.25,
                             unknown={f"r{i}" for i in range(1, 40, 7)})
        engine, steps = connector_run(specs, connector, fast_path=fast, prefill_schedule_interval=4)
        return steps, sorted((r.request_id, r.finish_time, tuple(r.token_times)) for r in engine.done), engine

    fast_steps, fast_done, fast = sc(True)
    slow_steps, slow_done, _ = sc(False)
    assert fast_steps == slow_steps and fast_done == slow_done
    assert fast.num_run_steps > 0
