"""Speculative decoding (``engine.speculative_config``) in the chunked scheduler.

Hand-worked with acceptance traces (block_size 4, 1 s per step): the drafts a
step schedules, the lookahead slots it reserves, the rollback of rejected
drafts, the budgets, what the client sees; then the acceptance models,
determinism, the drafter's cost, bad input, and vLLM's own trace of
``max_num_scheduled_tokens``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import Driver, spec
from test_fast_path import scenario

import kvsim
from kvsim.sched.spec_decode import AcceptanceModel, SpeculativeConfig


def r(a, b):
    return range(a, b + 1)


def spec_driver(method="eagle", k=2, trace=(2, 0, 1), **cfg):
    cfg.setdefault("num_gpu_blocks", 64)
    cfg.setdefault("enable_prefix_caching", True)
    sc = SpeculativeConfig(method, k, AcceptanceModel(trace=tuple(trace)))
    return Driver("chunked", speculative=sc, **cfg)


def test_each_step_verifies_k_drafts_reserves_lookahead_slots_and_rolls_rejections_back():
    d = spec_driver()
    d.add(spec("A", r(1, 6), max_tokens=10))
    a = d.reqs["A"]
    rows = []
    for _ in range(5):
        scheduled, plan, finished = d.step()
        rows.append((scheduled["A"], plan.scheduled_drafts.get("A", 0), a.num_computed_tokens,
                     a.num_output_tokens, len(d.blocks("A")) if not finished else "freed"))
    # (scheduled, drafts, computed after, outputs, blocks held): the prefill reserves
    # 6 + 2 lookahead slots; step 3 rejects both drafts but keeps its 4th block.
    assert rows == [(6, 0, 6, 1, 2), (3, 2, 9, 4, 3), (3, 2, 10, 5, 4), (3, 2, 12, 7, 4),
                    (3, 2, 15, 10, "freed")]
    assert list(a.token_times) == [1, 2, 2, 2, 3, 4, 4, 5, 5, 5]


def test_ngram_reserves_no_lookahead_slots():
    d = spec_driver("ngram")
    d.add(spec("A", r(1, 6), max_tokens=10))
    blocks = []
    for _ in range(4):
        d.step()
        blocks.append(len(d.blocks("A")))
    assert blocks == [2, 3, 3, 4]          # ceil(6/4), ceil(9/4), ceil(12/4), ceil(13/4)


def test_accepted_tokens_past_max_tokens_are_dropped():
    d = spec_driver(k=3, trace=(3,))
    d.add(spec("A", r(1, 4), max_tokens=3))
    d.step()
    scheduled, plan, finished = d.step()
    assert scheduled == {"A": 4} and finished == ["A"]
    assert d.reqs["A"].num_output_tokens == 3 and plan.num_generated_tokens == 2


def test_the_blocks_accepted_drafts_fill_are_cached_after_the_step():
    d = spec_driver(trace=(2,))
    d.add(spec("A", r(1, 6), max_tokens=10))
    d.step()
    d.step()                                   # computed 9: blocks 0 and 1 are full
    assert d.kv.num_cached_block["A"] == 2     # at schedule time only 7 tokens were known


def test_a_draft_models_extra_input_row_counts_against_max_num_batched_tokens():
    # Three decodes with 2 drafts each, 8 tokens per step. EAGLE: 3 + 3 + 2 (the last cut to
    # one draft). A draft model also takes an input row per request: 3 + 3, then the input
    # budget (8 - 4 - 4 = 0) is spent.
    # The prompts: a draft model's rows leave C one token (8 - 3 - 3 - 1 slot).
    for method, first, second in (("eagle", {"A": 2, "B": 2, "C": 2}, {"A": 3, "B": 3, "C": 2}),
                                  ("draft_model", {"A": 2, "B": 2, "C": 1}, {"A": 3, "B": 3})):
        d = spec_driver(method, trace=(2,), max_num_batched_tokens=8)
        d.add(spec("A", r(1, 2), max_tokens=20), spec("B", r(11, 12), max_tokens=20),
              spec("C", r(21, 22), max_tokens=20))
        assert d.step()[0] == first, method
        assert d.step()[0] == second, method


def test_preemption_drops_the_drafts():
    d = spec_driver(trace=(0,), num_gpu_blocks=5)
    d.add(spec("A", r(1, 6), max_tokens=20), spec("B", r(11, 12), max_tokens=20))
    d.step()
    assert d.sched._drafts.num_drafts(d.reqs["B"]) == 2
    for _ in range(8):
        scheduled, plan, _ = d.step()
        if plan.preempted:
            break
    victim = plan.preempted[0]
    assert d.sched._drafts.num_drafts(victim) == 0


def test_client_sees_each_steps_tokens_as_one_message(tmp_path):
    path = tmp_path / "acc.json"
    path.write_text("[2]")
    sc = {"name": "spec", "model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm"},
          "engine": {"num_gpu_blocks_override": 64, "max_model_len": 256,
                     "speculative_config": {"method": "eagle", "num_speculative_tokens": 2,
                                            "acceptance": {"trace": str(path)}}},
          "cost_model": {"type": "constant", "step_time_s": 1.0},
          "workload": {"num_requests": 1, "arrival": {"type": "poisson", "rate": 1.0},
                       "prompt_len": {"type": "fixed", "value": 10},
                       "output_len": {"type": "fixed", "value": 7}}}
    res = kvsim.simulate(sc)
    # Tokens 1 | 2-4 | 5-7 at t = 1, 2, 3 (vllm bench serve: one ITL per message).
    assert res.summary["mean_ttft_ms"] == 1000.0 and res.summary["mean_e2el_ms"] == 3000.0
    assert res.summary["mean_tpot_ms"] == pytest.approx(2000.0 / 6)
    assert list(res.itl_s) == [1.0, 1.0]
    assert list(res.steps["num_generated_tokens"]) == [1, 3, 3]
    assert list(res.steps["num_decode_tokens"]) == [0, 1, 1]
    assert res.stats.num_run_steps == 0               # no decode runs while drafting


# ----------------------------------------------------------- acceptance models

def test_a_constant_rate_is_per_position_rates_of_its_powers():
    assert AcceptanceModel.constant(0.5, 3).per_position == (0.5, 0.25, 0.125)


def test_draws_follow_the_per_position_rates_and_are_deterministic():
    from kvsim.sched.spec_decode import Drafts
    from kvsim.sched.request import Request

    def draws(seed):
        cfg = SpeculativeConfig("eagle", 3, AcceptanceModel((0.8, 0.5, 0.2), seed=seed))
        dr = Drafts(cfg)
        req = Request(spec("A", r(1, 4), max_tokens=8), 7, block_size=4, max_model_len=64)
        return [dr._accepted(req, 3) for _ in range(20_000)]

    got = np.array(draws(5))
    for i, p in enumerate((0.8, 0.5, 0.2)):
        assert abs((got > i).mean() - p) < 0.01       # P(at least i + 1 accepted)
    assert draws(5)[:50] == list(got[:50]) and draws(6)[:50] != list(got[:50])


def sc_spec(**over):
    return scenario(engine={"max_num_batched_tokens": 512, "max_model_len": 4096,
                            "speculative_config": {"method": "eagle", "num_speculative_tokens": 3,
                                                   "acceptance": {"rate": 0.7}, **over}})


def test_same_seed_same_run_and_the_draws_change_with_the_seed():
    a, b = kvsim.simulate(sc_spec()), kvsim.simulate(sc_spec())
    assert a.requests.equals(b.requests) and a.steps.equals(b.steps)
    c = kvsim.simulate({**sc_spec(), "seed": 4})
    assert not a.steps["num_generated_tokens"].equals(c.steps["num_generated_tokens"])


def test_speculation_makes_more_tokens_per_step_and_costs_the_drafter():
    base = kvsim.simulate(scenario())
    eagle = kvsim.simulate(sc_spec())
    ngram = kvsim.simulate(sc_spec(method="ngram"))
    tokens_per_step = lambda res: res.steps["num_generated_tokens"].sum() / len(res.steps)  # noqa
    assert tokens_per_step(eagle) > 1.5 * tokens_per_step(base)
    assert eagle.summary["median_tpot_ms"] < base.summary["median_tpot_ms"]
    # The same draws with and without the draft head's GPU time (n-gram drafts on the CPU).
    assert ngram.steps["duration_s"].mean() < eagle.steps["duration_s"].mean()


def test_draft_head_and_draft_model_costs():
    from kvsim.cost.spec_decode import draft_cost
    from kvsim.specs import load_gpu, load_model
    target, gpu = load_model("llama-3.1-8b"), load_gpu("h100-sxm")
    head = draft_cost(SpeculativeConfig("eagle", 3), target, gpu, 1, "auto", load_model)
    small = draft_cost(SpeculativeConfig("draft_model", 3, model="llama-3.2-1b"), target, gpu, 1,
                       "auto", load_model)
    assert draft_cost(SpeculativeConfig("ngram", 3), target, gpu, 1, "auto", load_model) is None
    one = head.step_time(32, 32 * 1000)
    assert one > 0 and head.step_time(32, 32 * 1000) == 3 * head.model.decode_step_times(
        32, np.array([32000.0]))[0]
    assert small.step_time(32, 32 * 1000) > one        # 16 layers beat one


@pytest.mark.parametrize("over, words", [
    ({"method": "medusa"}, ["engine.speculative_config.method", "eagle"]),
    ({"num_speculative_tokens": 0}, ["num_speculative_tokens"]),
    ({"acceptance": {"rate": 1.5}}, ["acceptance.rate", "[0, 1]"]),
    ({"acceptance": {"per_position": [0.5, 0.6, 0.1]}}, ["per_position", "increases"]),
    ({"acceptance": {"per_position": [0.5]}}, ["per_position", "3 probabilities"]),
    ({"acceptance": {"trace": "nope.json"}}, ["acceptance.trace"]),
    ({"method": "draft_model"}, ["speculative_config.model"]),
    ({"prompt_lookup_max": 4}, ["prompt_lookup_max", "unknown key"]),
])
def test_bad_speculative_config_is_one_line_naming_the_key(over, words):
    with pytest.raises(kvsim.ScenarioError) as exc:
        kvsim.load_scenario(sc_spec(**over))
    msg = str(exc.value)
    assert "\n" not in msg and all(w in msg for w in words), msg


def test_speculation_is_refused_where_kvsim_does_not_model_it():
    for engine, word in (({"async_scheduling": True}, "async_scheduling"),
                         ({"scheduler": "continuous"}, "chunked")):
        sc = sc_spec()
        sc["engine"] = {**sc["engine"], **engine}
        with pytest.raises(kvsim.ScenarioError, match=word):
            kvsim.load_scenario(sc)
    missing = sc_spec()
    del missing["engine"]["speculative_config"]["acceptance"]
    with pytest.raises(kvsim.ScenarioError, match="acceptance: missing"):
        kvsim.load_scenario(missing)


def test_speculation_runs_for_a_sliding_window_model_without_the_hybrid_manager():
    def run(spec_config):
        sc = sc_spec()
        sc["model"] = "gemma-3-4b"
        sc["engine"] = {**sc["engine"], "disable_hybrid_kv_cache_manager": True,
                        "speculative_config": spec_config}
        return kvsim.simulate(sc)
    eagle, base = run(sc_spec()["engine"]["speculative_config"]), run(None)
    assert eagle.summary["completed"] == base.summary["completed"] == len(base.requests)
    assert len(eagle.steps) < len(base.steps)          # several tokens per verification


# ------------------------------------------- max_num_scheduled_tokens (vLLM's trace)

def test_max_num_scheduled_tokens_matches_vllms_trace():
    from test_oracle_traces import first_difference, run_trace
    case = Path(__file__).parent / "golden/oracle/max_num_scheduled_tokens_cap"
    expected = [json.loads(x) for x in (case / "expected.jsonl").read_text().splitlines() if x]
    assert first_difference(expected, run_trace(case)) is None
