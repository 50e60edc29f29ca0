"""Bad scenarios fail before any simulation, with a message naming path, value and what is allowed.

A table of single mistakes checks the exact wording; a hypothesis fuzz test
mixes valid and broken values across every section and checks that each
scenario either raises ``kvsim.ScenarioError`` whose lines start with a YAML
path, or runs to completion with every arrived request completed or failed.
"""

from __future__ import annotations

import copy
import importlib
import re

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import kvsim
from kvsim.workload import build_workload

# The module (the package re-exports a function of the same name).
simulate_module = importlib.import_module("kvsim.scenario.simulate")


def base() -> dict:
    return {"name": "v", "seed": 0, "model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm"},
            "engine": {"num_gpu_blocks_override": 64, "block_size": 4, "max_model_len": 128,
                       "max_num_batched_tokens": 128},
            "cost_model": {"type": "constant", "step_time_s": 1.0},
            "workload": {"num_requests": 2, "prompt_len": {"type": "fixed", "value": 5},
                         "output_len": {"type": "fixed", "value": 2}}}


def set_path(d: dict, path: str, value) -> dict:
    *parents, last = path.split(".")
    node = d
    for key in parents:
        node = node.setdefault(key, {})
    if value is _DELETE:
        node.pop(last, None)
    else:
        node[last] = value
    return d


_DELETE = object()


@pytest.fixture
def no_simulation(monkeypatch):
    """Fail the test if a simulation starts: validation must come first."""
    def run_engine(*args, **kwargs):
        raise AssertionError("the simulation started before validation failed")
    monkeypatch.setattr(simulate_module, "run_engine", run_engine)


BAD = [
    # (id, [(path, value)], pieces the message must contain)
    ("unknown top-level key", [("foo", 1)], ["foo: unknown key"]),
    ("unknown engine key", [("engine.blok_size", 3)], ["engine.blok_size: unknown key"]),
    ("negative block size", [("engine.block_size", -1)],
     ["engine.block_size: got -1", "greater than or equal to 1"]),
    ("block size not a number", [("engine.block_size", "big")],
     ["engine.block_size: got 'big'", "valid integer"]),
    ("fractional block size", [("engine.block_size", 4.5)],
     ["engine.block_size: got 4.5", "valid integer"]),
    ("unknown scheduler", [("engine.scheduler", "fifo")],
     ["engine.scheduler: got 'fifo'", "'chunked', 'continuous', 'static', 'simple_chunking' or 'orca'"]),
    ("unknown gpu", [("hardware.gpu", "nope")], ["hardware.gpu: unknown GPU 'nope'", "h100-sxm"]),
    ("unknown model", [("model", "nope")], ["model: unknown model 'nope'", "llama-3.1-8b"]),
    ("unknown cost model", [("cost_model", {"type": "magic"})],
     ["cost_model.type: 'magic'", "allowed: constant, roofline, fitted"]),
    ("negative arrival rate", [("workload.arrival", {"type": "poisson", "rate": -1})],
     ["workload.arrival.rate = -1", "greater than 0"]),
    ("model does not fit the gpu",
     [("model", "llama-3.1-70b"), ("hardware.gpu", "l4"), ("engine.num_gpu_blocks_override", _DELETE)],
     ["model/hardware: llama-3.1-70b needs 131.4 GiB of weights", "l4 has 20.2 GiB"]),
    ("max_model_len larger than the cache", [("engine.max_model_len", 1000)],
     ["engine.max_model_len: got 1000", "63 usable blocks (252 tokens)"]),
    ("chunked with swap preemption", [("engine.preemption_mode", "swap")],
     ["engine.preemption_mode: got 'swap'", "allowed: recompute"]),
    ("unknown preemption mode", [("engine.preemption_mode", "magic")],
     ["engine.preemption_mode: got 'magic'", "'recompute' or 'swap'"]),
    ("continuous budget below max_model_len",
     [("engine.scheduler", "continuous"), ("engine.max_num_batched_tokens", 64)],
     ["engine.max_num_batched_tokens: got 64", ">= max_model_len (128)"]),
    ("engine is not a mapping", [("engine", [1, 2])], ["engine: got [1, 2]", "valid dictionary"]),
    ("zero tensor parallelism", [("hardware.tp", 0)], ["hardware.tp: got 0"]),
    ("cost step time zero", [("cost_model", {"type": "constant", "step_time_s": 0})],
     ["cost_model.step_time_s: 0 is not a positive number"]),
    ("unknown workload key", [("workload.arival", 1)],
     ["workload.arival: unknown key (allowed: arrival,"]),
]


@pytest.mark.parametrize("changes, pieces", [(c, p) for _, c, p in BAD], ids=[b[0] for b in BAD])
def test_bad_scenario_is_rejected_before_simulation_with_path_value_and_allowed(
        no_simulation, changes, pieces):
    d = base()
    for path, value in changes:
        set_path(d, path, value)
    with pytest.raises(kvsim.ScenarioError) as err:
        kvsim.simulate(d)
    msg = str(err.value)
    for piece in pieces:
        assert piece in msg, msg
    assert isinstance(err.value, ValueError)


def test_several_mistakes_give_one_line_each(no_simulation):
    d = set_path(set_path(base(), "engine.block_size", -1), "engine.max_num_seqs", 0)
    with pytest.raises(kvsim.ScenarioError) as err:
        kvsim.simulate(d)
    lines = str(err.value).splitlines()
    assert [line.split(":")[0] for line in lines] == ["engine.block_size", "engine.max_num_seqs"]


@pytest.mark.parametrize("path, value", [("engine.block_size", True), ("engine.block_size", "16"),
                                         ("engine.enable_prefix_caching", "yes"), ("seed", True)])
def test_wrong_types_are_errors_not_coerced(path, value):
    d = set_path(base(), path, value)
    with pytest.raises(kvsim.ScenarioError, match=re.escape(path)):
        kvsim.load_scenario(d)


def test_unknown_engine_key_lists_the_allowed_keys():
    with pytest.raises(kvsim.ScenarioError) as err:
        kvsim.load_scenario(set_path(base(), "engine.blok_size", 3))
    assert "block_size" in str(err.value).split("engine.blok_size", 1)[1]


def test_a_missing_requests_file_is_a_scenario_error_at_load_time(tmp_path):
    d = base()
    d["workload"] = {"requests_file": str(tmp_path / "missing.jsonl")}
    with pytest.raises(kvsim.ScenarioError, match="workload.requests_file"):
        kvsim.load_scenario(d)


# ---------------------------------------------------------------------- the fuzz test

# Values per path: valid ones and broken ones, mixed.
CHOICES = {
    "seed": [0, 7, -1, "x"],
    "name": ["fuzz", ""],
    "model": ["llama-3.1-8b", "qwen3-1.7b", "nope"],
    "hardware.gpu": ["h100-sxm", "a100-80gb-sxm", "l4", "nope"],
    "hardware.tp": [1, 2, 0],
    "engine.scheduler": ["chunked", "continuous", "static", "fifo"],
    "engine.block_size": [1, 2, 4, 16, 0, -1, 3.5],
    "engine.num_gpu_blocks_override": [2, 3, 8, 40, 1, _DELETE],
    "engine.max_model_len": [_DELETE, 2, 16, 64, 100_000, 1],
    "engine.max_num_seqs": [1, 4, 0],
    "engine.max_num_batched_tokens": [_DELETE, 8, 64, 4096, 0],
    "engine.enable_prefix_caching": [True, False],
    "engine.enable_chunked_prefill": [True, False],
    "engine.long_prefill_token_threshold": [0, 4, -3],
    "engine.policy": ["fcfs", "priority", "lifo"],
    "engine.preemption_mode": ["recompute", "swap", "magic"],
    "engine.watermark": [0.0, 0.05, 1.5],
    "engine.bogus": [1],
    "engine.debug": [True],                  # check every prefix hit against stored tokens
    "cost_model": [{"type": "constant", "step_time_s": 0.5}, {"type": "roofline"},
                   {"type": "magic"}, {"type": "constant", "step_time_s": -1}],
    "workload.num_requests": [0, 1, 5, 20, -2],
    "workload.arrival": [{"type": "poisson", "rate": 5.0}, {"type": "all_at_once"},
                         {"type": "closed_loop", "concurrency": 3},
                         {"type": "constant", "interval_s": 0.1},
                         {"type": "poisson", "rate": -1}, {"type": "burst"}],
    "workload.prompt_len": [{"type": "fixed", "value": 1}, {"type": "uniform", "low": 1, "high": 40},
                            {"type": "lognormal", "median": 20, "sigma": 1.0},
                            {"type": "fixed", "value": 0}],
    "workload.output_len": [{"type": "fixed", "value": 1}, {"type": "uniform", "low": 1, "high": 30},
                            {"type": "fixed", "value": "3"}],
    "workload.n": [1, 2, 0],
    "workload.prefix": [{"shared_prompt_tokens": 8, "num_groups": 2}, {"shared_prompt_tokens": -1}],
    "workload.sessions": [{"turns": 2, "think_time_s": 0.1}, {"turns": 0}],
    "slo": [{"ttft_ms": 100}, {"ttft_ms": -5}],
}
SECTION_PATH = re.compile(r"^(name|seed|model|hardware|engine|cost_model|workload|slo)"
                          r"([./][\w.\-]+)*( = |: )")


@st.composite
def scenarios(draw) -> dict:
    d = base()
    # A tight cache (11 usable blocks of 4) so valid runs preempt and fail requests too.
    d["engine"].update(num_gpu_blocks_override=12, max_model_len=32, max_num_batched_tokens=32)
    d["workload"].update(num_requests=8, arrival={"type": "poisson", "rate": 4.0},
                         prompt_len={"type": "uniform", "low": 1, "high": 40},
                         output_len={"type": "uniform", "low": 1, "high": 12})
    paths = draw(st.lists(st.sampled_from(sorted(CHOICES)), max_size=5, unique=True))
    for path in paths:
        set_path(d, path, copy.deepcopy(draw(st.sampled_from(CHOICES[path]))))
    return d


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(d=scenarios())
def test_any_scenario_fails_validation_clearly_or_accounts_for_every_request(d):
    try:
        res = kvsim.simulate(copy.deepcopy(d))
    except kvsim.ScenarioError as exc:
        lines = str(exc).splitlines()
        assert lines, "empty error message"
        for line in lines:
            assert SECTION_PATH.match(line), line
        return
    wl = build_workload(d["workload"], rng=np.random.default_rng(d.get("seed", 0)))
    specs = list(wl.requests())
    arrived = sum(s.n for s in specs)
    req = res.requests
    assert len(req) == arrived
    assert res.summary["completed"] + res.summary["failed"] == arrived
    assert set(req.status) <= {"completed", "failed"}
    assert (req.fail_reason[req.status == "failed"] != "").all()
    # A completed request generated exactly max_tokens, or up to max_model_len.
    max_model_len = kvsim.load_scenario(copy.deepcopy(d)).sched_config.max_model_len
    max_tokens = {s.request_id: s.max_tokens for s in specs}
    for row in req[req.status == "completed"].itertuples():
        want = min(max_tokens[row.request_id.split("#")[0]], max_model_len - row.num_prompt_tokens)
        assert row.num_output_tokens == want, row
