"""Random valid combinations of the engine knobs, on every scheduler, never crash or hang.

A hypothesis strategy draws a scheduler and then the knobs that scheduler
has (vLLM V1's chunked: budgets, cadence, queue limits, async scheduling,
speculative decoding, the radix cache; V0's continuous: swap, multi-step;
static, simple_chunking, orca), a model (dense or hybrid with a sliding
window), a tight cache and a small workload with shared prefixes and n > 1.
Now and then it adds a knob of another scheduler, or a combination kvsim
does not model. Each drawn scenario must:

* either be refused at load time with ``ScenarioError``, one line per
  problem, each starting with the YAML path at fault;
* or run to the end, on the fast path and on the step path, with
  - every arrived request completed, or failed with a reason;
  - a completed request having generated exactly what it was asked for
    (``max_tokens``, or up to ``max_model_len``);
  - at the end no request left in the scheduler and every KV block free
    (a prefix cache keeps blocks only as evictable cached ones);
  - the fast path's requests and steps tables equal to the step path's.

No hang: each run is guarded by an alarm (a generous bound on a run of a
few dozen requests, not a timing test: it only turns a hang into a failure).
"""

from __future__ import annotations

import copy
import re
import signal

import hypothesis.strategies as st
import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, event, example, given, settings

import kvsim
from kvsim.scenario.loader import load_scenario
from kvsim.scenario.simulate import collect_result
from kvsim.sched.errors import EngineError
from kvsim.sim.run import run_engine
from kvsim.workload import build_workload

HANG_S = 120
SECTION_PATH = re.compile(r"^(name|seed|model|hardware|engine|cost_model|workload|slo|metrics|cluster)"
                          r"([./\[][\w.\-\[\]]+)*( = |: )")
SPECS = [{"method": "ngram", "num_speculative_tokens": 2, "acceptance": {"rate": 0.6}},
         {"method": "eagle", "num_speculative_tokens": 3, "acceptance": {"per_position": [0.8, 0.5, 0.2]}}]

# Knobs per scheduler (None: leave the default).
COMMON = {
    "engine.block_size": [4, 16],
    "engine.num_gpu_blocks_override": [24, 40, 96],
    "engine.max_model_len": [64, 128],
    "engine.max_num_seqs": [2, 5, 16],
    "engine.enable_prefix_caching": [True, False],
    "engine.policy": ["fcfs", "priority"],
    "engine.max_num_queued_reqs": [None, 4],
    "engine.max_num_queued_tokens": [None, 300],
    "engine.stream_interval": [1, 3],
}
BY_SCHEDULER = {
    "chunked": {
        "engine.max_num_batched_tokens": [16, 48, 256],
        "engine.long_prefill_token_threshold": [0, 8],
        "engine.max_num_scheduled_tokens": [None, 12],
        "engine.max_num_active_seqs": [None, 1, 2],
        "engine.long_prefill_token_threshold_adaptive": [False, True],
        "engine.prefill_schedule_interval": [1, 3],
        "engine.watermark": [None, 0.05],
        "engine.async_scheduling": [False, True],
        "engine.speculative_config": [None, *SPECS],
        "engine.prefix_cache": ["hash", "hash", "radix"],
    },
    "continuous": {
        "engine.max_num_batched_tokens": [128, 256],
        "engine.enable_chunked_prefill": [False],
        "engine.preemption_mode": [None, "recompute", "swap"],
        "engine.swap_space": [4.0, 0.0001],
        "engine.num_scheduler_steps": [1, 4],
        "engine.watermark": [None, 0.05],
    },
    "static": {"engine.max_num_batched_tokens": [128, 256], "engine.enable_chunked_prefill": [False]},
    "simple_chunking": {"engine.max_num_batched_tokens": [16, 48]},
    "orca": {"engine.max_num_batched_tokens": [128, 256], "engine.enable_chunked_prefill": [False],
             "engine.orca_reservation": [None, "max", "pow2", "oracle"]},
}
OTHERS = sorted({k: v for knobs in BY_SCHEDULER.values() for k, v in knobs.items()}.items())


def set_path(d: dict, path: str, value) -> None:
    *parents, last = path.split(".")
    node = d
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value


@st.composite
def scenarios(draw) -> dict:
    scheduler = draw(st.sampled_from(["chunked"] * 4 + ["continuous"] * 2 + ["static", "simple_chunking", "orca"]))
    d = {"name": "knobs", "seed": draw(st.integers(0, 3)),
         "model": draw(st.sampled_from(["llama-3.2-1b", "gemma-3-1b"])),
         "hardware": {"gpu": "h100-sxm"}, "engine": {"scheduler": scheduler},
         "cost_model": {"type": "constant", "step_time_s": 0.01},
         "workload": {"num_requests": draw(st.integers(1, 14)),
                      "arrival": draw(st.sampled_from([{"type": "poisson", "rate": 30.0},
                                                       {"type": "all_at_once"},
                                                       {"type": "closed_loop", "concurrency": 3}])),
                      "prompt_len": {"type": "uniform", "low": 1, "high": 70},
                      "output_len": {"type": "uniform", "low": 1, "high": 20},
                      "prefix": {"shared_prompt_tokens": draw(st.sampled_from([0, 8, 20])), "num_groups": 2},
                      "n": draw(st.sampled_from([1, 1, 2]))}}
    if d["workload"]["prefix"]["shared_prompt_tokens"] == 0:
        del d["workload"]["prefix"]
    if d["model"] == "gemma-3-1b" and scheduler != "chunked":
        d["engine"]["disable_hybrid_kv_cache_manager"] = True     # one KV group, as vLLM without it
    for path, values in {**COMMON, **BY_SCHEDULER[scheduler]}.items():
        value = draw(st.sampled_from(values))
        if value is not None:
            set_path(d, path, copy.deepcopy(value))
    engine = d["engine"]
    if d["model"] == "gemma-3-1b":              # one block per KV-cache group and request
        engine["num_gpu_blocks_override"] *= 8
    if engine.get("prefix_cache") == "radix":
        engine["enable_prefix_caching"] = True
        engine["radix"] = draw(st.sampled_from([{"page_size": 1}, {"page_size": engine["block_size"]},
                                                {"page_size": engine["block_size"], "eviction_policy": "lfu"}]))
        if engine["radix"]["page_size"] == 1:
            engine.pop("watermark", None)
    # Mostly combinations kvsim runs; the refused ones come from the cross-knob draw below.
    if engine.get("speculative_config") is not None:
        engine.pop("async_scheduling", None)
        if engine.get("prefix_cache") == "radix":
            engine.pop("speculative_config")
    if d["model"] == "gemma-3-1b" and engine.get("prefix_cache") == "radix":
        engine.pop("prefix_cache"), engine.pop("radix")
    if engine.get("num_scheduler_steps", 1) > 1 and engine.get("preemption_mode") == "swap":
        engine.pop("preemption_mode")
    if draw(st.integers(0, 5)) == 0:          # now and then a knob of another scheduler
        path, values = draw(st.sampled_from(OTHERS))
        value = draw(st.sampled_from([v for v in values if v is not None]))
        set_path(d, path, copy.deepcopy(value))
    return d


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang(f"a run took over {HANG_S} s")


def run(sc, *, fast_path: bool):
    """``simulate``'s single-replica path, keeping the engine for its end state."""
    workload = build_workload(sc.workload, rng=np.random.default_rng(sc.seed), base_dir=sc.base_dir,
                              max_prompt_len=sc.sched_config.max_model_len - 1)
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(HANG_S)
    try:
        engine = run_engine(workload.requests(), sc.sched_config, scheduler=sc.scheduler,
                            cost_model=sc.cost_model, concurrency=workload.concurrency,
                            fast_path=fast_path)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return engine, collect_result(engine, sc)


def check_end_state(engine, sc) -> None:
    sched = engine.scheduler
    assert not sched.has_requests()
    assert sched.get_request_counts() == (0, 0)
    assert sched.num_free_blocks() == sched.num_usable_blocks, (sched.num_free_blocks(), sched.num_usable_blocks)
    assert sched.kv_cache_usage() == 0.0


# What the strategy found once: the radix cache under a prefill cadence (an
# IndexError in sched/cadence.py), kept as a fixed example.
RADIX_CADENCE = {
    "name": "knobs", "seed": 0, "model": "llama-3.2-1b", "hardware": {"gpu": "h100-sxm"},
    "engine": {"scheduler": "chunked", "block_size": 4, "num_gpu_blocks_override": 24, "max_model_len": 64,
               "max_num_seqs": 2, "max_num_batched_tokens": 16, "max_num_scheduled_tokens": 12,
               "prefill_schedule_interval": 3, "async_scheduling": True, "prefix_cache": "radix"},
    "cost_model": {"type": "constant", "step_time_s": 0.01},
    "workload": {"num_requests": 2, "arrival": {"type": "poisson", "rate": 30.0},
                 "prompt_len": {"type": "uniform", "low": 1, "high": 70},
                 "output_len": {"type": "uniform", "low": 1, "high": 20},
                 "prefix": {"shared_prompt_tokens": 8, "num_groups": 2}}}


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(d=scenarios())
@example(d=RADIX_CADENCE)
def test_any_knob_combination_is_refused_in_one_line_or_runs_clean(d):
    try:
        sc = load_scenario(copy.deepcopy(d))
    except kvsim.ScenarioError as exc:
        lines = str(exc).splitlines()
        assert lines
        for line in lines:
            assert SECTION_PATH.match(line), line
        event(f"refused: {lines[0][:70]}")
        return
    event(f"ran: {sc.scheduler}")
    try:
        step_engine, step = run(sc, fast_path=False)
    except EngineError as exc:
        # The engine stopping as vLLM would (swap space exhausted): both paths, the same words.
        with pytest.raises(EngineError) as fast_exc:
            run(sc, fast_path=True)
        assert str(fast_exc.value) == str(exc)
        return
    fast_engine, fast = run(sc, fast_path=True)

    specs = list(build_workload(sc.workload, rng=np.random.default_rng(sc.seed), base_dir=sc.base_dir,
                                max_prompt_len=sc.sched_config.max_model_len - 1).requests())
    arrived = sum(s.n for s in specs)
    req = step.requests
    assert len(req) == arrived
    assert set(req.status) <= {"completed", "failed"}
    assert (req.fail_reason[req.status == "failed"] != "").all()
    max_model_len = sc.sched_config.max_model_len
    max_tokens = {s.request_id: s.max_tokens for s in specs}
    for row in req[req.status == "completed"].itertuples():
        want = min(max_tokens[row.request_id.split("#")[0]], max_model_len - row.num_prompt_tokens)
        assert row.num_output_tokens == want, row
    for engine in (fast_engine, step_engine):
        check_end_state(engine, sc)

    pd.testing.assert_frame_equal(fast.requests, step.requests)
    pd.testing.assert_frame_equal(fast.steps, step.steps)
