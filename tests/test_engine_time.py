"""Engine time outside the GPU: overhead terms, CUDA graphs, presets, their knobs and errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kvsim.cost import BatchShape, build_cost_model, step_time_function
from kvsim.cost.base import decode_run_function
from kvsim.cost.overhead import CudaGraphs, EngineOverhead, EngineTiming, default_capture_sizes
from kvsim.cost.presets import PRESETS, EngineKnobs
from kvsim.scenario import load_scenario
from kvsim.scenario.schema import ScenarioError
from kvsim.specs import load_gpu, load_model

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "profiles"
LLAMA8, H100 = load_model("llama-3.1-8b"), load_gpu("h100-sxm")
KNOBS = EngineKnobs(max_num_seqs=256, max_num_batched_tokens=2048)


def model(preset=None, knobs=KNOBS, kind="roofline", tp=1, m=LLAMA8, **extra):
    config = {"type": kind, **extra}
    if preset:
        config["engine_preset"] = preset
    return build_cost_model(config, model=m, gpu=H100, tp=tp, engine=knobs)


def decodes(n, ctx=1000):
    return [1] * n, [ctx] * n


# ------------------------------------------------------------ CUDA graph sizes

def test_default_capture_sizes_are_the_ones_vllm_resolved_for_the_rtx4090_run():
    # vLLM 0.19, max_num_seqs 256, max_num_batched_tokens 2048: its resolved config
    meta = json.loads((SHARED / "llmservingsim/vllm_serving_bench/RTX4090/Llama-3.1-8B/meta.json")
                      .read_text())
    want = tuple(meta["resolved_config"]["compilation_config"]["cudagraph_capture_sizes"])
    assert default_capture_sizes(256, 2048) == want


def test_default_capture_sizes_follow_max_num_seqs_and_the_token_budget():
    assert default_capture_sizes(4, 8192) == (1, 2, 4, 8)                 # 2 x max_num_seqs
    assert default_capture_sizes(256, 100) == (1, 2, 4) + tuple(range(8, 97, 8)) + (100,)
    assert default_capture_sizes(1024, 8192)[-1] == 512
    assert default_capture_sizes(1024, 8192, data_center_blackwell=True)[-1] == 1024
    assert 100 in default_capture_sizes(100, 8192)                        # max_num_seqs itself


def test_a_step_is_padded_to_the_next_capture_size_and_eager_above_the_largest():
    graphs = CudaGraphs("full_and_piecewise", (1, 2, 4, 8, 16))
    assert [graphs.padded_size(n) for n in (1, 3, 5, 8, 9, 16, 17)] == [1, 4, 8, 8, 16, 16, 17]
    assert (graphs.decode_graph, graphs.mixed_graph) == ("full", "piecewise")
    assert CudaGraphs("full_decode_only", (1,)).mixed_graph == "none"
    assert CudaGraphs("none", (1, 2)).max_capture_size == 0


def test_padded_decode_runs_the_linear_ops_of_the_capture_size():
    cm = model("vllm-v1")
    five = cm.breakdown(BatchShape.from_lists(*decodes(5)))
    eight = cm.breakdown(BatchShape.from_lists(*decodes(8)))
    assert five["mlp_down"] == eight["mlp_down"] and five["allreduce"] == eight["allreduce"]
    assert five["lm_head"] < eight["lm_head"]          # logits are computed outside the graph
    assert five["decode_attention"] < eight["decode_attention"]


def test_enforce_eager_pads_nothing_and_waits_for_the_launches():
    graphs = model("vllm-v1", engine_overhead={"step_s": 0.0, "per_request_s": 0.0,
                                               "eager_launch_s_per_layer": 1e-3})
    eager = model("vllm-v1", knobs=EngineKnobs(256, 2048, enforce_eager=True),
                  engine_overhead={"step_s": 0.0, "per_request_s": 0.0,
                                   "eager_launch_s_per_layer": 1e-3})
    step = BatchShape.from_lists(*decodes(5))
    assert eager.step_time(step) == pytest.approx(32 * 1e-3)    # launch-bound: 32 layers x 1 ms
    assert graphs.step_time(step) < 0.01                        # a full graph: no launches
    assert eager.breakdown(step)["mlp_down"] < graphs.breakdown(step)["mlp_down"]  # 5 tokens, not 8


def test_user_capture_sizes_replace_the_defaults():
    cm = model("vllm-v1", knobs=EngineKnobs(256, 2048, cudagraph_capture_sizes=(32, 4, 4, 4096)))
    assert cm.engine.cudagraphs.capture_sizes == (4, 32)        # deduplicated, <= the budget


# ------------------------------------------------------------ overhead terms

def test_cpu_terms_add_per_step_request_prefill_sampled_token_and_tp_hop():
    terms = {"step_s": 1e-3, "per_request_s": 1e-4, "per_prefill_request_s": 1e-2,
             "per_sampled_token_s": 1e-5, "tp_hop_s": 5e-3, "eager_launch_s_per_layer": 0.0}
    cm = model("sarathi-serve-2024", knobs=None, tp=2, engine_overhead=terms)
    step = BatchShape.from_lists([512, 1, 1], [0, 100, 100], num_sampled=2)
    parts = cm.breakdown(step)
    assert parts["overhead"] == pytest.approx(1e-3 + 5e-3 + 3e-4 + 1e-2 + 2e-5, rel=1e-12)
    assert cm.step_time(step) == pytest.approx(sum(parts.values()), rel=1e-12)
    tp1 = model("sarathi-serve-2024", knobs=None, tp=1, engine_overhead=terms)
    assert tp1.breakdown(step)["overhead"] == pytest.approx(parts["overhead"] - 5e-3, rel=1e-12)


def test_gpu_scale_multiplies_the_kernels_not_the_cpu():
    base = model("sarathi-serve-2024", knobs=None)
    slow = model("sarathi-serve-2024", knobs=None, gpu_scale=2.0)
    step = BatchShape.from_lists([2048], [0])
    cpu = base.breakdown(step)["overhead"]
    assert slow.step_time(step) - cpu == pytest.approx(2 * (base.step_time(step) - cpu), rel=1e-12)


def test_without_a_preset_the_gpu_models_own_overhead_is_kept():
    cm = model()
    assert cm.engine is None
    step = BatchShape.from_lists(*decodes(3))
    assert cm.breakdown(step)["overhead"] == pytest.approx(1e-3 + 3 * 20e-6, rel=1e-12)


ENGINE_MAKERS = {
    "vllm-v1": lambda: model("vllm-v1"),
    "vllm-v1-eager-launch-bound": lambda: model(
        "vllm-v1", knobs=EngineKnobs(8, 2048), engine_overhead={"eager_launch_s_per_layer": 2e-4}),
    "vllm-v0.6-tp2-fitted": lambda: build_cost_model(
        {"type": "fitted", "profile": "a100-80gb-sxm_llama-2-70b_tp2", "engine_preset": "vllm-v0.6"},
        model=load_model("llama-2-70b"), gpu=load_gpu("a100-80gb-sxm"), tp=2,
        engine=EngineKnobs(64, 4096)),
    "sarathi-serve-2024": lambda: model("sarathi-serve-2024", gpu_scale=1.3),
    "sglang-0.4": lambda: model("sglang-0.4"),
}


@pytest.mark.parametrize("make", ENGINE_MAKERS.values(), ids=ENGINE_MAKERS.keys())
@pytest.mark.parametrize("num_seqs", [1, 5, 9, 200, 300])
def test_decode_runs_add_up_the_step_path_clock_bit_for_bit_with_engine_time(make, num_seqs):
    cm = make()
    run, step = decode_run_function(cm), step_time_function(cm)
    start, ctx = 10.0, 500 * num_seqs
    until = start + 30.5 * step([1] * num_seqs, [ctx] + [0] * (num_seqs - 1), num_seqs)
    times, durations = run(num_seqs, ctx, start, 1000, until)
    t, want = start, []
    while t < until:
        d = step([1] * num_seqs, [ctx + num_seqs * len(want)] + [0] * (num_seqs - 1), num_seqs)
        t += d
        want.append(d)
    assert list(durations) == want
    for n in (1, 40):                    # the scalar loop and the numpy path of decode_step_times
        sums = ctx + num_seqs * np.arange(n)
        got = cm.decode_step_times(num_seqs, sums)
        assert got.tolist() == [step([1] * num_seqs, [int(s)] + [0] * (num_seqs - 1), num_seqs)
                                for s in sums]


@pytest.mark.parametrize("make", ENGINE_MAKERS.values(), ids=ENGINE_MAKERS.keys())
def test_step_time_from_lists_equals_step_time_with_engine_time(make):
    cm = make()
    rng = np.random.default_rng(3)
    for _ in range(100):
        n = int(rng.integers(0, 40))
        new = [int(rng.integers(2, 3000)) if rng.random() < 0.2 else 1 for _ in range(n)]
        ctx = rng.integers(0, 9000, size=n).tolist()
        sampled = int(rng.integers(0, n + 1))
        batch = BatchShape.from_lists(new, ctx, sampled)
        assert cm.step_time_from_lists(new, ctx, sampled) == cm.step_time(batch)
        assert cm.step_time(batch) == pytest.approx(sum(cm.breakdown(batch).values()), rel=1e-9)


# ------------------------------------------------------------ presets and bad input

def test_every_preset_names_its_sources_and_builds():
    for name, preset in PRESETS.items():
        assert preset.sources and preset.engine
        cm = model(name)
        assert cm.engine.preset == name and cm.step_time(BatchShape.from_lists([100, 1], [0, 9])) > 0


@pytest.mark.parametrize("extra, knobs, fragment", [
    ({"engine_preset": "vllm-v9"}, KNOBS, "cost_model.engine_preset: 'vllm-v9' is not an engine "
                                          "preset; allowed: sarathi-serve-2024"),
    ({"engine_preset": "vllm-v1"}, EngineKnobs(256, 2048, True, (1, 2)),
     "engine.cudagraph_capture_sizes: given with engine.enforce_eager: true"),
    ({}, EngineKnobs(256, 2048, enforce_eager=True), "engine.enforce_eager: CUDA graphs are "
                                                     "modelled by an engine preset"),
    ({"engine_preset": "sarathi-serve-2024"}, EngineKnobs(256, 2048, None, (8,)),
     "engine.cudagraph_capture_sizes: the sarathi-serve-2024 engine has no CUDA graphs"),
    ({"engine_preset": "sarathi-serve-2024"}, EngineKnobs(256, 2048, enforce_eager=False),
     "engine.enforce_eager: the sarathi-serve-2024 engine has no CUDA graphs"),
    ({"engine_preset": "vllm-v1"}, EngineKnobs(256, 64, None, (128, 256)),
     "engine.cudagraph_capture_sizes: [128, 256] has no size <= max_num_batched_tokens (64)"),
    ({"engine_preset": "vllm-v1", "engine_overhead": {"step": 1}}, KNOBS,
     "cost_model.engine_overhead.step: unknown engine-overhead term; allowed: step_s"),
    ({"engine_preset": "vllm-v1", "engine_overhead": {"step_s": -1}}, KNOBS,
     "cost_model.engine_overhead.step_s: -1 is not a non-negative number"),
    ({"engine_overhead": {"step_s": 1}}, KNOBS, "cost_model.engine_overhead: needs "
                                                "cost_model.engine_preset"),
    ({"engine_preset": "vllm-v1", "gpu_scale": 0}, KNOBS, "cost_model.gpu_scale: 0 is not"),
    ({"engine_preset": "vllm-v1", "step_overhead_s": 0.1}, KNOBS,
     "cost_model.step_overhead_s: with an engine_preset"),
])
def test_bad_engine_settings_name_the_key(extra, knobs, fragment):
    with pytest.raises(ValueError) as err:
        model(knobs=knobs, **extra)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_an_engine_fit_file_of_the_wrong_shape_is_refused(tmp_path):
    bad = tmp_path / "fit.json"
    bad.write_text(json.dumps({"step_s": 1}))
    with pytest.raises(ValueError, match="is not a kvsim-engine-overhead/1 file"):
        model("vllm-v1", engine_overhead=str(bad))
    with pytest.raises(ValueError, match="neither a mapping of terms nor an existing JSON file"):
        model("vllm-v1", engine_overhead=str(tmp_path / "missing.json"))


def test_an_engine_fit_file_sets_terms_scale_and_preset(tmp_path):
    fit = tmp_path / "fit.json"
    fit.write_text(json.dumps({"format": "kvsim-engine-overhead/1", "engine_preset": "vllm-v1",
                               "engine_overhead": {"step_s": 0.004}, "gpu_scale": 1.1}))
    cm = model(engine_overhead=str(fit))
    assert (cm.engine.preset, cm.engine.overhead.step_s, cm.engine.gpu_scale) == \
        ("vllm-v1", 0.004, 1.1)
    with pytest.raises(ValueError, match="was fitted on 'vllm-v1'"):
        model("sglang-0.4", engine_overhead=str(fit))


def scenario(engine=None, cost=None):
    return {"model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm"},
            "engine": {"max_num_seqs": 64, "max_num_batched_tokens": 4096, **(engine or {})},
            "cost_model": cost or {"type": "roofline", "engine_preset": "vllm-v1"},
            "workload": {"num_requests": 4, "prompt_len": {"type": "fixed", "value": 64},
                         "output_len": {"type": "fixed", "value": 4}}}


def test_scenario_engine_knobs_reach_the_cost_model():
    sc = load_scenario(scenario({"cudagraph_capture_sizes": [8, 1, 64]}))
    assert sc.cost_model.engine.cudagraphs.capture_sizes == (1, 8, 64)
    assert load_scenario(scenario()).cost_model.engine.cudagraphs.max_capture_size == 128
    eager = load_scenario(scenario({"enforce_eager": True}))
    assert eager.cost_model.engine.cudagraphs.max_capture_size == 0


@pytest.mark.parametrize("engine, cost, fragment", [
    ({"cudagraph_capture_sizes": [0]}, None, "engine.cudagraph_capture_sizes.0: got 0"),
    ({"cudagraph_capture_sizes": []}, None, "engine.cudagraph_capture_sizes: got []"),
    ({"enforce_eager": True, "cudagraph_capture_sizes": [8]}, None,
     "engine.cudagraph_capture_sizes: given with engine.enforce_eager: true"),
    ({}, {"type": "roofline", "engine_preset": "x"},
     "cost_model.engine_preset: 'x'"),
    ({"enforce_eager": False}, {"type": "roofline"}, "engine.enforce_eager: CUDA graphs"),
])
def test_bad_engine_knobs_in_a_scenario_are_one_line_errors(engine, cost, fragment):
    with pytest.raises(ScenarioError) as err:
        load_scenario(scenario(engine, cost))
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_a_scenario_with_an_engine_preset_runs_the_same_on_both_paths():
    import kvsim
    sc = scenario({"max_num_seqs": 16}, {"type": "roofline", "engine_preset": "vllm-v1"})
    sc["workload"] = {"num_requests": 40, "prompt_len": {"type": "fixed", "value": 300},
                      "output_len": {"type": "fixed", "value": 50},
                      "arrival": {"type": "poisson", "rate": 20.0}}
    fast, slow = kvsim.simulate(sc), kvsim.simulate(sc, fast_path=False)
    assert fast.requests.equals(slow.requests)
    assert fast.summary["completed"] == 40


# ------------------------------------------------------------ where the preset numbers come from

VIDUR_A100 = SHARED / "vidur" / "cpu_overheads" / "a100.csv"


def test_vidur_cpu_table_fit_gives_the_preset_numbers_and_predicts_held_out_batches():
    from kvsim.cost.overhead_fit import (fit_to_vidur_cpu_table, read_vidur_cpu_table,
                                         vidur_cpu_measured, vidur_cpu_prediction)
    df = read_vidur_cpu_table(VIDUR_A100)
    codellama = "codellama/CodeLlama-34b-Instruct-hf"
    fit = fit_to_vidur_cpu_table(df, codellama, 2)
    v06 = PRESETS["vllm-v0.6"].overhead
    for term in ("step_s", "per_request_s", "per_sampled_token_s", "tp_hop_s",
                 "eager_launch_s_per_layer"):
        assert getattr(fit, term) == pytest.approx(getattr(v06, term), rel=1e-4), term
    # fitted on batch sizes <= 64, the larger ones are predicted within 10%
    train = fit_to_vidur_cpu_table(df, codellama, 2, batch_sizes=range(0, 65))
    rows = df[(df.model_name == codellama) & (df.batch_size > 64)]
    loop = df[df.tensor_parallel_degree == 1]["ray_comm_time_mean"].mean() * 1e-3
    ape = np.abs(vidur_cpu_prediction(train, rows) / vidur_cpu_measured(rows, loop) - 1)
    assert np.median(ape) < 0.10


def test_the_sarathi_preset_is_the_fit_to_the_training_points_only():
    import dataclasses

    from kvsim.cost.engine_points import ISSUE_POINTS, TRAIN_POINTS
    from kvsim.cost.overhead_fit import fit_to_steps
    assert not {p.label for p in ISSUE_POINTS} & {p.label for p in TRAIN_POINTS}
    gpu = dataclasses.replace(load_gpu("a100-80gb-pcie"), interconnect_bandwidth_gbps=300.0)
    gpu_model = build_cost_model({"type": "fitted", "profile": "a100-80gb-pcie_yi-34b_tp2"},
                                 model=load_model("yi-34b"), gpu=gpu, tp=2)
    preset = PRESETS["sarathi-serve-2024"].overhead
    start = EngineTiming(overhead=preset.updated({"step_s": 0.0, "per_request_s": 0.0}), tp=2)
    fit = fit_to_steps(gpu_model, start, TRAIN_POINTS, ("step_s", "per_request_s"), loss="l1")
    assert fit.overhead.step_s == pytest.approx(preset.step_s, rel=1e-4)
    assert fit.overhead.per_request_s == pytest.approx(preset.per_request_s, rel=1e-4)


def test_fit_to_steps_recovers_known_terms_exactly():
    from kvsim.cost.engine_points import StepPoint
    from kvsim.cost.overhead_fit import fit_to_steps
    gpu_model = model()
    truth = EngineTiming(EngineOverhead(step_s=2e-3, per_request_s=3e-4, per_sampled_token_s=1e-5))
    true_model = gpu_model.with_engine(truth)
    points = [StepPoint(str(b), (1,) * b, (500,) * b, 0.0, "synthetic") for b in (1, 4, 16, 64)]
    points += [StepPoint("p", (700,), (0,), 0.0, "synthetic", num_sampled=0)]
    points = [dataclasses_replace(p, measured_s=true_model.step_time_from_lists(
        list(p.num_new_tokens), list(p.num_context_tokens), p.sampled)) for p in points]
    fit = fit_to_steps(gpu_model, EngineTiming(), points,
                       ("step_s", "per_request_s", "per_sampled_token_s"))
    for term in ("step_s", "per_request_s"):
        assert getattr(fit.overhead, term) == pytest.approx(getattr(truth.overhead, term), rel=1e-6)
    with pytest.raises(ValueError, match="step_s and tp_hop_s are the same column"):
        fit_to_steps(gpu_model, EngineTiming(), points, ("step_s", "tp_hop_s"))


def dataclasses_replace(obj, **kw):
    import dataclasses
    return dataclasses.replace(obj, **kw)


def test_the_engine_time_modules_stay_in_the_cost_layer():
    # kvsim/cost may not import the scheduler, simulator, scenario or the serve calibration
    # (kvsim/calibrate_serve sits above the simulator; only cost/cli.py registers its command).
    import ast
    cost = Path(__file__).resolve().parents[1] / "kvsim" / "cost"
    banned = ("kvsim.sched", "kvsim.sim", "kvsim.scenario", "kvsim.calibrate_serve", "calibration")
    mine = ("__init__.py", "overhead.py", "presets.py", "overhead_fit.py", "engine_points.py",
            "step_model.py")
    for path in (cost / name for name in mine):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert not name.startswith(banned), f"{path.name} imports {name}"


# ------------------------------------------------------------ the published steps, end to end

STEPS_SCENARIO = Path(__file__).resolve().parents[1] / "scenarios" / "sarathi_yi34b_steps.yaml"


@pytest.mark.parametrize("num_requests, label", [(128, "decode batch 128"), (1, "decode batch 1")])
def test_kvsim_run_gives_sarathis_decode_steps_the_reports_time_on_both_paths(num_requests, label):
    """scenarios/sarathi_yi34b_steps.yaml: the decode batches reports/calibration.md checks
    (Engine time, Sarathi-Serve Yi-34B TP2) come out of the whole simulator at the time the
    report gives, and their CPU part is the preset's terms summed by hand."""
    import kvsim
    from kvsim.cost.engine_points import ISSUE_POINTS
    from kvsim.cost.overhead_fit import step_time
    from kvsim.scenario.yamlio import load_yaml
    sc = load_yaml(STEPS_SCENARIO.read_text(), where=str(STEPS_SCENARIO))
    sc["workload"]["num_requests"] = num_requests
    fast, slow = kvsim.simulate(sc), kvsim.simulate(sc, fast_path=False)
    assert fast.steps.equals(slow.steps) and fast.requests.equals(slow.requests)
    dec = fast.steps[fast.steps["num_prefill_tokens"] == 0]
    assert list(dec["num_decode_tokens"]) == [num_requests] * 3      # 4 outputs: 1 + 3 decodes
    # The middle decode reads 1,021 cached tokens, the point's context (engine_points.py).
    point = next(p for p in ISSUE_POINTS if p.label == label)
    loaded = kvsim.load_scenario(sc)
    assert dec["duration_s"].iloc[1] == pytest.approx(step_time(loaded.cost_model, point), rel=1e-9)
    # Hand-worked CPU part (presets.py, sarathi-serve-2024; eager, so the 60 layers' launches,
    # 1.85 ms, hide behind the kernels): step_s + tp_hop_s + B x (per_request_s + per_sampled_token_s).
    cpu_ms = 6.97253 + 5.79608 + num_requests * (1.22538 + 0.0223587)
    zero = {k: 0.0 for k in EngineOverhead.field_names()}
    sc["cost_model"] = {**sc["cost_model"], "engine_overhead": zero}
    bare = kvsim.simulate(sc).steps
    kernels = bare[bare["num_prefill_tokens"] == 0]["duration_s"].iloc[1]
    assert (dec["duration_s"].iloc[1] - kernels) * 1e3 == pytest.approx(cpu_ms, rel=1e-9)
