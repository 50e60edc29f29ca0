"""Cost models: the engine contract, the roofline physics, the factory and fitted profiles."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kvsim.cost import BatchShape, ConstantCostModel, build_cost_model, step_time_function
from kvsim.cost.base import decode_run_function
from kvsim.cost.attention_work import decode_attention_work, prefill_attention_work
from kvsim.cost.features import rank_shapes
from kvsim.cost.fitted import PROFILE_DIR, load_profile
from kvsim.cost.decode_run_costs import _SCALAR_DECODE_RUN
from kvsim.specs import list_gpus, list_models, load_gpu, load_model

from kvsim.cost.published_runs import RTX4090  # an inline GPU spec

LLAMA70 = load_model("llama-2-70b")
A100 = load_gpu("a100-80gb-sxm")
H100 = load_gpu("h100-sxm")


def roofline(model=LLAMA70, gpu=A100, tp=2, kv="auto", **params):
    return build_cost_model({"type": "roofline", **params}, model=model, gpu=gpu, tp=tp,
                            kv_cache_dtype=kv)


def fitted(name="a100-80gb-sxm_llama-2-70b_tp2", model=LLAMA70, gpu=A100, tp=2):
    return build_cost_model({"type": "fitted", "profile": name}, model=model, gpu=gpu, tp=tp)


# ------------------------------------------------------------ engine contract

@pytest.mark.parametrize("make", [roofline, fitted, lambda: roofline(load_model("deepseek-v2-lite"), H100, 1, "fp8")],
                         ids=["roofline", "fitted", "roofline-mla-moe-fp8"])
@pytest.mark.parametrize("num_seqs", [1, 7, 64])
def test_decode_step_times_equal_step_time_on_all_decode_batch(make, num_seqs):
    cm = make()
    rng = np.random.default_rng(num_seqs)
    contexts = [rng.integers(1, 4000, size=num_seqs) for _ in range(5)]
    sums = np.array([c.sum() for c in contexts])
    fast = cm.decode_step_times(num_seqs, sums)
    for k, ctx in enumerate(contexts):
        slow = cm.step_time(BatchShape.from_lists([1] * num_seqs, ctx))
        assert fast[k] == slow                # bit for bit: the fast path relies on it


@pytest.mark.parametrize("make", [roofline, fitted, lambda: roofline(load_model("deepseek-v2-lite"), H100, 1, "fp8")],
                         ids=["roofline", "fitted", "roofline-mla-moe-fp8"])
@pytest.mark.parametrize("num_steps", [1, _SCALAR_DECODE_RUN, _SCALAR_DECODE_RUN + 1, 300])
def test_decode_step_times_of_short_and_long_runs_equal_step_time_exactly(make, num_steps):
    # short runs are costed in a Python loop, long ones with numpy: both exact
    cm = make()
    sums = 5000 + 9 * np.arange(num_steps, dtype=np.int64)
    fast = cm.decode_step_times(9, sums)
    assert fast.dtype == np.float64 and fast.shape == (num_steps,)
    np.testing.assert_array_equal(cm.decode_step_times(9, sums.tolist()), fast)  # a list will do
    for k in (0, num_steps // 2, num_steps - 1):
        assert fast[k] == cm.step_time_from_lists([1] * 9, [int(sums[k])] + [0] * 8, 9)


@pytest.mark.parametrize("make", [roofline, fitted, lambda: roofline(load_model("deepseek-v2-lite"), H100, 1, "fp8"),
                                  lambda: ConstantCostModel(0.25)],
                         ids=["roofline", "fitted", "roofline-mla-moe-fp8", "constant-fallback"])
@pytest.mark.parametrize("num_seqs", [1, 9, 64])
def test_decode_run_times_add_up_the_step_path_clock_bit_for_bit(make, num_seqs):
    # The fast path's run costing (the model's decode_run_times, or the
    # generic fallback over decode_step_times) against the step path: one
    # step_time_from_lists per step, the clock added up step by step.
    cm = make()
    run = decode_run_function(cm)
    start, ctx = 123.456, 777 * num_seqs
    one_step = step_time_function(cm)([1] * num_seqs, [ctx] + [0] * (num_seqs - 1), num_seqs)
    until = start + 40.5 * one_step
    times, durations = run(num_seqs, ctx, start, 1000, until)
    t, want_times, want_durations = start, [start], []
    while t < until:
        d = step_time_function(cm)([1] * num_seqs, [ctx + num_seqs * len(want_durations)]
                                   + [0] * (num_seqs - 1), num_seqs)
        t += d
        want_times.append(t)
        want_durations.append(d)
    assert times.typecode == durations.typecode == "d"             # array('d'): no float objects
    assert list(durations) == want_durations and list(times) == want_times   # exact, not approx
    assert times[-2] < until <= times[-1]                          # the last step starts before until
    # max_steps caps the run; a run that would start at or after until is empty
    assert run(num_seqs, ctx, start, 3, until) == (times[:4], durations[:3])
    assert tuple(map(list, run(num_seqs, ctx, start, 1000, start))) == ([start], [])


@pytest.mark.parametrize("make", [roofline, lambda: roofline(load_model("gemma-3-27b"), H100, 1)],
                         ids=["roofline", "sliding-window"])
def test_decode_runs_of_batches_asked_in_any_order_cost_as_on_a_fresh_model(make):
    """decode_run_times memoises each batch's terms: runs of several batch sizes,
    synchronous and overlapped, asked again and interleaved, cost what the first
    run of each on a model of its own costs."""
    cm = make()
    asks = [(n, overlap, cont) for n in (1, 5, 64) for overlap in (False, True) for cont in (False, True)]
    for n, overlap, cont in asks + asks[::-1]:
        got = cm.decode_run_times(n, 900 * n, 3.5, 30, 1e9, overlap_cpu=overlap, continuation=cont)
        assert got == make().decode_run_times(n, 900 * n, 3.5, 30, 1e9, overlap_cpu=overlap,
                                              continuation=cont)


def test_decode_cost_depends_on_contexts_only_through_their_sum():
    cm = fitted()
    a = cm.step_time(BatchShape.from_lists([1, 1, 1], [10, 20, 3000]))
    b = cm.step_time(BatchShape.from_lists([1, 1, 1], [1010, 1010, 1010]))
    assert a == pytest.approx(b, rel=1e-12)


def test_one_token_prefill_chunk_costs_like_a_decode():
    cm = roofline()
    assert cm.step_time(BatchShape.from_lists([1], [500], num_sampled=0)) == \
        cm.step_time(BatchShape.from_lists([1], [500], num_sampled=0))
    decode = cm.decode_step_times(1, np.array([500]))[0]
    assert cm.step_time(BatchShape.from_lists([1], [500])) == pytest.approx(decode, rel=1e-12)


def test_prefill_step_grows_with_chunk_and_decode_with_context():
    cm = roofline()
    times = [cm.step_time(BatchShape.from_lists([c], [0])) for c in (128, 512, 2048, 8192)]
    assert times == sorted(times) and times[-1] > 10 * times[0]
    dec = cm.decode_step_times(32, np.array([32 * 100, 32 * 4000, 32 * 32000]))
    assert dec[0] < dec[1] < dec[2]


def test_steps_that_sample_nothing_skip_the_lm_head():
    cm = roofline()
    with_head = cm.step_time(BatchShape.from_lists([512], [0], num_sampled=1))
    without = cm.step_time(BatchShape.from_lists([512], [0], num_sampled=0))
    assert without < with_head


def test_swap_bytes_cost_pcie_time():
    cm = roofline()
    base = cm.step_time(BatchShape.from_lists([1], [100]))
    swapped = cm.step_time(BatchShape.from_lists([1], [100], swap_bytes=32_000_000_000))
    assert swapped - base == pytest.approx(1.0, rel=1e-9)       # 32 GB over PCIe4 x16 (32 GB/s)


# ------------------------------------------------------------ roofline physics

def test_roofline_gemm_is_max_of_compute_and_memory_time():
    cm = roofline(tp=1, kernel_floor_s=0.0)
    op = next(o for o in cm.shapes.ops if o.name == "mlp_down")       # 28672 x 8192
    k, n = 28672, 8192
    for tokens in (1, 4096):
        flops = 2.0 * tokens * k * n
        nbytes = (k * n + tokens * (k + n)) * 2
        expected = max(flops / (312e12 * 0.75), nbytes / (2039e9 * 0.80))
        assert cm._op_time(op, tokens, tokens) == pytest.approx(80 * expected, rel=1e-12)


def test_roofline_allreduce_is_ring_formula():
    cm = roofline(tp=4)
    tokens = 1000
    nbytes = tokens * 8192 * 2
    per_call = 2 * 3 / 4 * nbytes / (300e9 * 0.65) + 25e-6
    assert cm._allreduce_time(tokens) == pytest.approx(2 * 80 * per_call, rel=1e-12)
    assert roofline(tp=1)._allreduce_time(tokens) == 0.0


def test_prefill_attention_counts_causal_pairs_and_cached_kv():
    shapes = rank_shapes(LLAMA70, 2)
    flops, nbytes = prefill_attention_work(shapes, 100, 300)
    pairs = 100 * 300 + 100 * 101 / 2
    assert flops == pytest.approx(pairs * 4 * 32 * 128)
    kv_token_layer = 2 * 4 * 128 * 2                    # K and V, 4 KV heads per rank, bf16
    assert nbytes == pytest.approx((300 + 200) * kv_token_layer + 100 * 2 * 32 * 128 * 2)


def test_fp8_kv_cache_halves_decode_attention_bytes():
    auto = rank_shapes(load_model("llama-3.1-8b"), 1, "auto")
    fp8 = rank_shapes(load_model("llama-3.1-8b"), 1, "fp8")
    _, b_auto = decode_attention_work(auto, 1, 10_000)
    _, b_fp8 = decode_attention_work(fp8, 1, 10_000)
    q = auto.q_bytes_per_token
    assert (b_fp8 - q) * 2 == pytest.approx(b_auto - q)


def test_mla_kv_bytes_are_the_latent_only():
    model = load_model("deepseek-v2-lite")
    shapes = rank_shapes(model, 1)
    assert shapes.kv_bytes_per_token_layer == (512 + 64) * 2


@pytest.mark.parametrize("gpu_name", list_gpus())
def test_roofline_works_for_every_catalog_pair(gpu_name):
    gpu = load_gpu(gpu_name)
    batch = BatchShape.from_lists([512, 1, 1], [0, 1000, 3000])
    for model_name in list_models():
        model = load_model(model_name)
        for kv in ("auto", "fp8"):
            for tp in (1, 2):
                t = roofline(model, gpu, tp, kv).step_time(batch)
                assert np.isfinite(t) and 0 < t < 1e3, (model_name, gpu_name, kv, tp)


def test_faster_gpu_is_faster_under_roofline():
    batch = BatchShape.from_lists([2048], [0])
    assert roofline(gpu=H100).step_time(batch) < roofline(gpu=A100).step_time(batch)


# ------------------------------------------------------------ factory

def test_constant_cost_model_from_config():
    cm = build_cost_model({"type": "constant", "step_time_s": 0.5}, model=LLAMA70, gpu=A100)
    assert cm == ConstantCostModel(0.5)


def test_roofline_parameters_override_defaults():
    slow = roofline(step_overhead_s=0.1)
    assert slow.step_time(BatchShape.from_lists([1], [10])) > 0.1


@pytest.mark.parametrize("config, fragment", [
    ({"type": "magic"}, "cost_model.type: 'magic'"),
    ({"type": "roofline", "memory_eff": 0.5}, "cost_model.memory_eff"),
    ({"type": "roofline", "memory_efficiency": 1.5}, "cost_model.memory_efficiency: 1.5"),
    ({"type": "roofline", "step_overhead_s": "fast"}, "cost_model.step_overhead_s"),
    ({"type": "constant", "step_time_s": 0}, "cost_model.step_time_s"),
    ({"type": "fitted"}, "cost_model.profile"),
    ({"type": "fitted", "profile": "no-such-profile"}, "cost_model.profile: 'no-such-profile'"),
    ({"type": "fitted", "profile": "x", "extra": 1}, "cost_model.extra"),
])
def test_bad_cost_model_config_names_the_key(config, fragment):
    with pytest.raises(ValueError, match=None) as err:
        build_cost_model(config, model=LLAMA70, gpu=A100, tp=2)
    assert fragment in str(err.value)


def test_fitted_profile_for_another_setup_is_an_error():
    with pytest.raises(ValueError, match="fitted for tp 2, but the scenario has tp 4"):
        fitted(tp=4)
    with pytest.raises(ValueError, match="fitted for gpu 'a100-80gb-sxm'"):
        fitted(gpu=H100)


# ------------------------------------------------------------ shipped profiles

REQUIRED_PROFILES = ["a100-80gb-sxm_llama-2-7b_tp1", "a100-80gb-sxm_llama-3-8b_tp1",
                     "a100-80gb-sxm_llama-2-70b_tp1", "a100-80gb-sxm_llama-2-70b_tp2",
                     "a100-80gb-sxm_llama-2-70b_tp4", "h100-sxm_llama-2-7b_tp1",
                     "h100-sxm_llama-2-70b_tp2"]


@pytest.mark.parametrize("name", REQUIRED_PROFILES)
def test_required_profiles_ship_and_build(name):
    profile = load_profile(name)
    model, gpu = load_model(profile["model"]), load_gpu(profile["gpu"])
    cm = build_cost_model({"type": "fitted", "profile": name}, model=model, gpu=gpu,
                          tp=profile["tp"])
    assert 0 < cm.step_time(BatchShape.from_lists([256, 1], [0, 500])) < 10


# Vidur's A100 Llama-2-7B TP2 GEMMs switch kernels at small token counts (56 µs at
# 1 token, 104 µs at 96) in a way one tile shape cannot follow; reports/calibration.md says so.
LAYER_TARGET_EXCEPTIONS = {"a100-80gb-sxm_llama-2-7b_tp2": 6.0}


def test_every_shipped_profile_meets_the_layer_and_attention_targets():
    for path in sorted(PROFILE_DIR.glob("*.json")):
        errors = load_profile(str(path))["errors"]
        target = LAYER_TARGET_EXCEPTIONS.get(path.stem, 5.0)
        if "layer_linear_ops" in errors:      # vLLM tables fuse the residual adds: no layer sum
            assert errors["layer_linear_ops"]["fitted_median_ape"] <= target, path.name
        assert errors["prefill_attention"]["fitted_median_ape"] <= 10.0, path.name
        assert errors["decode_attention"]["fitted_median_ape"] <= 10.0, path.name


def test_fitted_70b_prompt_step_is_near_splitwise():
    # splitwise/perf_model.csv: Llama-2-70B TP2 on A100, 512-token prompt: 196 ms (median of 5)
    t = fitted().step_time(BatchShape.from_lists([512], [0]))
    assert t == pytest.approx(0.196, rel=0.10)


def test_profile_path_may_be_given_instead_of_name(tmp_path):
    src = PROFILE_DIR / "a100-80gb-sxm_llama-2-70b_tp2.json"
    dst = tmp_path / "mine.json"
    dst.write_text(src.read_text())
    a = fitted(str(dst)).step_time(BatchShape.from_lists([100], [0]))
    b = fitted().step_time(BatchShape.from_lists([100], [0]))
    assert a == b


def test_inline_gpu_with_profile_gpu_name_is_accepted():
    gpu = dataclasses.replace(load_gpu("a100-80gb-pcie"), interconnect_bandwidth_gbps=300.0)
    cm = build_cost_model({"type": "fitted", "profile": "a100-80gb-pcie_yi-34b_tp2"},
                          model=load_model("yi-34b"), gpu=gpu, tp=2)
    profile = load_profile("a100-80gb-pcie_yi-34b_tp2")
    # The profile's coefficients time the step, not the inline GPU's datasheet: the
    # catalog GPU of the same name gives the same times ...
    catalog = build_cost_model({"type": "fitted", "profile": "a100-80gb-pcie_yi-34b_tp2"},
                               model=load_model("yi-34b"), gpu=load_gpu("a100-80gb-pcie"), tp=2)
    batch = BatchShape.from_lists([1024], [0])
    assert cm.step_time(batch) == catalog.step_time(batch)
    # ... and the all-reduce is the profile's line: sec_per_byte x ring bytes + const_s
    ar = profile["allreduce"]
    assert (cm.allreduce.sec_per_byte, cm.allreduce.const_s) == (ar["sec_per_byte"], ar["const_s"])
    # One 1024-token prefill is the linear ops, attention and overhead plus the TP2
    # all-reduces, two per layer (Megatron), each the profile's line on the ring bytes
    # 2 (tp - 1) / tp x tokens x hidden x 2 bytes (bf16).
    model = load_model("yi-34b")
    ring_bytes = 2 * (2 - 1) / 2 * 1024 * model.hidden_size * 2
    allreduce = 2 * model.num_layers * (ar["sec_per_byte"] * ring_bytes + ar["const_s"])
    parts = (cm._linear_time(1024, 1) + cm._prefill_attention_time_scalar([1024], [0])
             + cm._cpu_time(1, 1, 1))
    assert cm.step_time(batch) == pytest.approx(parts + allreduce, rel=1e-12)


@pytest.mark.parametrize("make", [roofline, fitted,
                                  lambda: roofline(load_model("deepseek-v2-lite"), H100, 1)],
                         ids=["roofline", "fitted", "moe"])
def test_scalar_hot_path_equals_the_array_formula(make):
    cm = make()
    for op in cm.shapes.ops:
        for tokens, sampled in ((1, 1), (37, 3), (2048, 0), (5000, 64)):
            assert cm._op_time_scalar(op, tokens, sampled) == pytest.approx(
                cm._op_time(op, tokens, sampled), rel=1e-12)


def _sampled_ops_first(cm):
    """The same model with the sampled ops (lm_head, sampler) moved to the front of the ops."""
    ops = sorted(cm.shapes.ops, key=lambda op: op.name not in ("lm_head", "sampler"))
    return dataclasses.replace(cm, shapes=dataclasses.replace(cm.shapes, ops=tuple(ops)))


@pytest.mark.parametrize("make", [roofline, fitted, lambda: roofline(load_model("deepseek-v2-lite"), H100, 1),
                                  lambda: _sampled_ops_first(roofline())],
                         ids=["roofline", "fitted", "moe", "sampled-ops-first"])
def test_memoised_linear_time_adds_the_ops_up_in_their_order_bit_for_bit(make):
    """``_linear_time`` memoises by parts (the token ops' sum, the sampled ops' times) only
    where that is the loop's own sum: the same float as adding every op in order."""
    cm = make()
    rng = np.random.default_rng(0)
    pairs = [(int(n), int(s)) for n, s in zip(rng.integers(0, 9000, 400), rng.integers(0, 300, 400))]
    pairs += [(n, s) for n in (0, 1, 2, 512, 8192) for s in (0, 1, 2, 256)]
    for n, s in pairs + pairs:                      # the second time from the memos
        plain = 0.0
        for op in cm.shapes.ops:
            plain += cm._op_time_scalar(op, n, s)
        assert cm._linear_time(n, s) == plain


@pytest.mark.parametrize("make", [roofline, fitted,
                                  lambda: fitted("rtx-4090_llama-3.1-8b_tp1", load_model("llama-3.1-8b"),
                                                 load_gpu(RTX4090), 1)],
                         ids=["roofline", "fitted", "fitted-wave"])
def test_scalar_attention_paths_equal_the_array_formulas(make):
    cm = make()
    chunks, contexts = [16, 300, 2048], [8000, 0, 512]
    assert cm._prefill_attention_time_scalar(chunks, contexts) == pytest.approx(
        cm._prefill_attention_time(np.array(chunks), np.array(contexts)), rel=1e-12)
    assert cm._decode_attention_time_scalar(17, 12345.0) == pytest.approx(
        float(cm._decode_attention_time(17, 12345.0)), rel=1e-12)


def test_mixed_step_decodes_use_the_mixed_coefficients_and_pure_decodes_do_not():
    model, gpu = load_model("llama-3.1-8b"), load_gpu(RTX4090)
    cm = fitted("rtx-4090_llama-3.1-8b_tp1", model, gpu, 1)
    assert cm.mixed_decode_attention is not None
    pure = cm._decode_attention_time_scalar(32, 32 * 2048.0)
    mixed = cm._decode_attention_time_scalar(32, 32 * 2048.0, mixed=True)
    assert mixed > pure
    step = cm.step_time(BatchShape.from_lists([256] + [1] * 32, [0] + [2048] * 32))
    parts = (cm._linear_time(288, 33) + cm._prefill_attention_time_scalar([256], [0]) + mixed
             + cm._cpu_time(33, 1, 33))
    assert step == pytest.approx(parts, rel=1e-12)
    # the fast path (all-decode steps) is untouched by the mixed coefficients
    assert cm.decode_step_times(32, np.array([32 * 2048]))[0] == pytest.approx(
        cm.step_time(BatchShape.from_lists([1] * 32, [2048] * 32)), rel=1e-12)


@pytest.mark.parametrize("make", [roofline, fitted,
                                  lambda: fitted("rtx-4090_llama-3.1-8b_tp1", load_model("llama-3.1-8b"),
                                                 load_gpu(RTX4090), 1),
                                  lambda: roofline(load_model("deepseek-v2-lite"), H100, 1)],
                         ids=["roofline", "fitted", "fitted-wave-mixed", "moe"])
def test_step_time_from_lists_equals_step_time_exactly(make):
    cm = make()
    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(0, 30))
        new = [int(rng.integers(0, 3000)) if rng.random() < 0.2 else 1 for _ in range(n)]
        ctx = rng.integers(0, 20000, size=n).tolist()
        sampled, swap = int(rng.integers(0, n + 1)), int(rng.integers(0, 2)) * 10**8
        batch = BatchShape.from_lists(new, ctx, sampled, swap)
        assert cm.step_time_from_lists(new, ctx, sampled, swap) == cm.step_time(batch)


def test_step_time_function_prefers_lists_and_falls_back_to_batch_shape():
    cm = roofline()
    assert step_time_function(cm) == cm.step_time_from_lists
    assert step_time_function(ConstantCostModel(0.5))([3, 1], [0, 9], 2, 0) == 0.5

    class OnlyStepTime:
        def step_time(self, batch):
            return float(batch.total_new_tokens * 10 + batch.num_sampled + batch.swap_bytes)

    assert step_time_function(OnlyStepTime())([3, 1], [0, 9], 2, 100) == 142.0
