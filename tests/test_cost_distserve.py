"""cost_model type distserve: DistServe's own step formulas and coefficients (kvsim/cost/distserve.py).

Expected values are worked by hand from the shipped JSON (copied unchanged from
LLMServe/DistServe simdistserve/estimators/profile_data/), with the formulas of
time_estimator.py get_prefill_time / get_decode_time, in the same order of operations.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.cost import build_cost_model
from kvsim.cost.distserve import DATA_DIR, DistServeCostModel, load_profile, max_num_tokens
from kvsim.scenario import load_scenario, simulate
from kvsim.scenario.schema import ScenarioError
from kvsim.specs import load_gpu as get_gpu, load_model as get_model

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "profiles" / "distserve"
# facebook/opt-13b, TP 1, profiler-a100-80g.distserve.json
PREFILL = (18.10254647486372, 0.1019122572698738, 7.122264314252114e-06)
SMALL = (19.934702624895458, 0.0006269356524350583, 0.03850697740828398)
LARGE = (7.1661889468253595, 0.0005798000403396046, 0.15831096191764046)


@pytest.fixture(scope="module")
def opt13b():
    return build_cost_model({"type": "distserve", "profile": "distserve"},
                            model=get_model("opt-13b"), gpu=get_gpu("a100-80gb-sxm"), tp=1)


def test_the_shipped_profiles_are_distserves_files_unchanged():
    for name in ("profiler-a100-80g.distserve.json", "profiler-a100-80g.vllm.json",
                 "max_num_tokens.csv", "LICENSE-distserve-Apache-2.0.txt"):
        shipped = (DATA_DIR / name).read_bytes()
        if SHARED.is_dir():
            assert shipped == (SHARED / name).read_bytes()
    entry = json.loads((DATA_DIR / "profiler-a100-80g.distserve.json").read_text())["facebook/opt-13b"]["1"]
    assert tuple(entry["prefill"]) == PREFILL and tuple(entry["decoding_smallbs"]) == SMALL
    assert tuple(entry["decoding_largebs"]) == LARGE and entry["decoding_large_small_bs_threshold"] == 95


def test_a_prefill_step_is_a_plus_b_sum_plus_c_sum_of_squares_plus_the_pipeline_constant(opt13b):
    # a + b * (100 + 200) + c * (100^2 + 200^2) + pp_const 1 = 50.03233687153846 ms
    assert opt13b.prefill_ms([100, 200]) == 50.03233687153846
    assert opt13b.step_time_from_lists([100, 200], [0, 0], 2) == 50.03233687153846 / 1000
    a, b, c = PREFILL
    assert opt13b.prefill_ms([100, 200]) == a + b * 300 + c * 50000 + 1.0


def test_a_decode_step_below_the_threshold_uses_the_small_batch_coefficients(opt13b):
    # two decodes with 100 and 300 tokens cached: sum(ctx + 1) = 402; a + b * 402 + c * 2
    assert opt13b.step_time_from_lists([1, 1], [100, 300], 2) == 20.26374471199092 / 1000


def test_a_decode_step_of_95_requests_uses_the_large_batch_coefficients(opt13b):
    # batch 95 = threshold: decoding_largebs; each context 10, sum(ctx + 1) = 1045
    assert opt13b.step_time_from_lists([1] * 95, [10] * 95, 95) == 22.81162137115609 / 1000


def test_a_mixed_step_adds_the_decodes_marginal_terms_to_the_prefill(opt13b):
    # prefill chunk of 50 + one decode with 99 cached: prefill(50) + b_small * 100 + c_small * 1
    assert opt13b.step_time_from_lists([50, 1], [0, 99], 2) == 24.317165541794825 / 1000


def test_the_ray_overhead_adds_two_ms_and_a_tenth_of_a_microsecond_per_context_token():
    ray = build_cost_model({"type": "distserve", "ray_overhead": True}, model=get_model("opt-13b"),
                           gpu=get_gpu("a100-80gb-sxm"), tp=1)
    a, b, c = SMALL
    assert ray.step_time_from_lists([1], [99], 1) == (a + b * 100 + c * 1 + (2.0 + 99 * 0.0001)) / 1000


def test_decode_step_times_match_the_step_path_bit_for_bit(opt13b):
    for bs in (1, 94, 95, 300):
        ctx = [7 + 3 * i for i in range(bs)]
        sums = [sum(ctx) + k * bs for k in range(5)]
        fast = opt13b.decode_step_times(bs, np.array(sums))
        slow = [opt13b.step_time_from_lists([1] * bs, [c + k for c in ctx], bs) for k in range(5)]
        assert fast.tolist() == slow


def test_the_tp_and_profile_pick_their_own_entry():
    vllm = build_cost_model({"type": "distserve", "profile": "vllm"}, model=get_model("opt-13b"),
                            gpu=get_gpu("a100-80gb-sxm"), tp=2)
    entry = load_profile("vllm")["facebook/opt-13b"]["2"]
    a, b, c = entry["prefill"]
    assert vllm.prefill_ms([1000]) == a + b * 1000 + c * 1000000 + 1.0
    assert isinstance(vllm, DistServeCostModel)


def test_max_num_tokens_is_distserves_memory_table():
    assert max_num_tokens("opt-13b", 1) == 66144 and max_num_tokens("opt-66b", 4) == 78496
    assert max_num_tokens("opt-13b", 3) is None


SCENARIO = {"model": "opt-13b", "hardware": {"gpu": "a100-80gb-sxm", "tp": 1},
            "engine": {"max_model_len": 2048, "max_num_batched_tokens": 4096},
            "cost_model": {"type": "distserve"},
            "workload": {"num_requests": 1, "arrival": {"type": "poisson", "rate": 1.0},
                         "prompt_len": {"type": "fixed", "value": 1000},
                         "output_len": {"type": "fixed", "value": 3}}}


def _scenario(tmp_path, **changes):
    import yaml
    data = json.loads(json.dumps(SCENARIO))
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if field:
            data[section][field] = value
        else:
            data[section] = value
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("change, message", [
    ({"model": "llama-3.1-8b"}, "cost_model.profile: DistServe profile 'distserve' has no model "
                                "'llama-3.1-8b'; allowed: opt-13b, opt-66b"),
    ({"hardware__tp": 8}, "cost_model.profile: DistServe profile 'distserve' has no opt-13b at "
                          "hardware.tp 8; allowed: 1, 2, 4"),
    ({"cost_model": {"type": "distserve", "profile": "sglang"}},
     "cost_model.profile: 'sglang' is not a DistServe profile; allowed: distserve, vllm"),
    ({"cost_model": {"type": "distserve", "tp": 2}}, "cost_model.tp: unknown key for type 'distserve'"),
    ({"hardware__gpu": "h100-sxm"}, "cost_model.type: 'distserve' profiles were measured on "
                                    "a100-80gb-sxm, but hardware.gpu is 'h100-sxm'"),
])
def test_what_the_profile_does_not_cover_is_refused_in_one_line(tmp_path, change, message):
    with pytest.raises(ScenarioError) as exc:
        load_scenario(_scenario(tmp_path, **change))
    assert str(exc.value).startswith(message) and "\n" not in str(exc.value)


def test_a_run_costs_its_prefill_and_decode_steps_with_the_formulas(tmp_path):
    r = simulate(load_scenario(_scenario(tmp_path)))
    steps = r.steps[r.steps["num_scheduled_reqs"] > 0]
    a, b, c = PREFILL
    assert steps["duration_s"].iloc[0] == (a + b * 1000 + c * 1000000 + 1.0) / 1000
    sa, sb, sc = SMALL
    # the two decodes: 1000 then 1001 tokens cached
    assert steps["duration_s"].iloc[1:].tolist() == [(sa + sb * 1001 + sc * 1) / 1000,
                                                     (sa + sb * 1002 + sc * 1) / 1000]


def test_a_pd_prefill_pool_at_tp_2_costs_its_steps_with_the_tp_2_entry(tmp_path):
    path = _scenario(tmp_path, cluster={"pools": [
        {"name": "prefill", "role": "prefill", "replicas": 1, "hardware": {"tp": 2}},
        {"name": "decode", "role": "decode", "replicas": 1}], "link": "nvlink-a100"})
    r = simulate(load_scenario(path))
    prefill = r.steps[(r.steps["replica"] == "prefill-0") & (r.steps["num_prefill_tokens"] > 0)]
    # facebook/opt-13b TP 2: 14.742973695171262 + 0.06857720739764 * 1000 + 2.4495727400243586e-06 * 1e6 + 1
    assert prefill["duration_s"].tolist() == [86.76975383283563 / 1000]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(2, 2048), min_size=1, max_size=8))
def test_distserves_kernels_prefill_faster_than_vllms_on_opt_13b(lens):
    # every prefill coefficient of the distserve profile is below the vllm one (OPT-13B, TP 1)
    kw = dict(model=get_model("opt-13b"), gpu=get_gpu("a100-80gb-sxm"), tp=1)
    fast = build_cost_model({"type": "distserve", "profile": "distserve"}, **kw)
    slow = build_cost_model({"type": "distserve", "profile": "vllm"}, **kw)
    assert fast.prefill_ms(lens) < slow.prefill_ms(lens)
