"""MoE under tensor, data and expert parallelism: layout rules, weights per GPU, step cost."""

import pytest

from kvsim.cost.base import BatchShape
from kvsim.cost.features import moe_dispatch_bytes_per_token, rank_shapes
from kvsim.cost.roofline import roofline_cost_model
from kvsim.specs import kv_capacity, load_gpu, load_model
from kvsim.specs.gpu import GIB
from kvsim.specs.parallel import ParallelConfig

DSV3 = load_model("deepseek-v3")
MIXTRAL = load_model("mixtral-8x7b")
QWEN_MOE = load_model("qwen3-30b-a3b")


# ------------------------------------------------------------------ layout (vLLM's rules)
def test_ep_size_is_tp_times_dp_with_expert_parallel():
    # vLLM FusedMoEParallelConfig.make: ep_size = flattened tp x dp, expert TP 1.
    p = ParallelConfig(2, 4, enable_expert_parallel=True)
    assert p.expert_parallel_size == 8 and p.moe_tensor_parallel_size == 1


def test_without_expert_parallel_the_experts_are_split_tp_x_dp_ways():
    p = ParallelConfig(2, 4)
    assert p.expert_parallel_size == 1 and p.moe_tensor_parallel_size == 8


def test_expert_parallel_on_one_gpu_is_no_expert_parallel():
    assert not ParallelConfig(1, 1, enable_expert_parallel=True).use_ep


def test_busiest_gpu_holds_the_remainder_expert():
    # determine_expert_map: 8 // 3 = 2 each, the first 8 % 3 ranks one more.
    assert ParallelConfig(1, 3, enable_expert_parallel=True).local_experts(8) == 3


def test_sequence_parallel_moe_needs_ep_tp_and_dp():
    assert ParallelConfig(2, 2, True).sequence_parallel_moe
    assert not ParallelConfig(2, 1, True).sequence_parallel_moe
    assert not ParallelConfig(2, 2, True, "pplx").sequence_parallel_moe


# ------------------------------------------------------------------ bad layouts
@pytest.mark.parametrize("parallel,model,match", [
    (ParallelConfig(3), MIXTRAL, r"tensor_parallel_size 3 does not divide mixtral-8x7b's "
                                 r"num_attention_heads \(32\)"),
    (ParallelConfig(1, 2, True), load_model("llama-3.1-8b"),
     "enable_expert_parallel: llama-3.1-8b has no experts"),
    (ParallelConfig(4, 4, True), MIXTRAL, r"expert-parallel size 16 .* exceeds mixtral-8x7b's "
                                          r"num_experts \(8\)"),
    (ParallelConfig(16), load_model("yi-34b"), "does not divide yi-34b's num_attention_heads"),
])
def test_layouts_vllm_refuses_are_one_line_errors(parallel, model, match):
    with pytest.raises(ValueError, match=match) as err:
        parallel.check(model)
    assert "\n" not in str(err.value)


def test_kv_heads_must_divide_tp_or_be_divided_by_it():
    tiny = load_model({"base": "qwen3-30b-a3b", "num_attention_heads": 24, "num_kv_heads": 6})
    with pytest.raises(ValueError, match="num_kv_heads \\(6\\) do not divide one another"):
        ParallelConfig(4).check(tiny)
    ParallelConfig(12).check(tiny)            # 12 % 6 == 0: two replicas per KV head


def test_bad_all2all_backend_names_the_allowed_ones():
    with pytest.raises(ValueError, match="all2all_backend 'nccl' .* allowed: allgather_reducescatter"):
        ParallelConfig(all2all_backend="nccl")


def test_capacity_refuses_a_tp_that_does_not_divide_the_heads():
    with pytest.raises(ValueError, match="tensor_parallel_size 3"):
        kv_capacity(MIXTRAL, load_gpu("h100-sxm"), tp=3)


# ------------------------------------------------------------------ weights per GPU
def test_ep_and_tp_hold_the_same_expert_bytes_when_the_experts_divide():
    tp8 = DSV3.weight_bytes_by_part(8)["experts"]
    ep8 = DSV3.weight_bytes_by_part(8, expert_parallel=True)["experts"]
    assert ep8 == pytest.approx(tp8)


def test_dp_with_ep_replicates_attention_and_splits_the_experts():
    # DeepSeek-V3 on 8 GPUs, DP 8 + EP: every GPU has all of attention (tp=1), 32 experts.
    dp8 = DSV3.weight_bytes_by_part(1, dp=8, expert_parallel=True)
    tp1 = DSV3.weight_bytes_by_part(1)
    assert dp8["attention"] == tp1["attention"] and dp8["embeddings"] == tp1["embeddings"]
    assert dp8["experts"] == pytest.approx(tp1["experts"] / 8)


def test_uneven_ep_sizes_the_busiest_gpu():
    w = MIXTRAL.weight_bytes_by_part(1, dp=3, expert_parallel=True)["experts"]
    per_expert = MIXTRAL.num_moe_layers * 3 * 4096 * 14336 * 2
    assert w == 3 * per_expert


def test_capacity_shows_experts_per_gpu_under_ep():
    cap = kv_capacity(DSV3, load_gpu("h200"), tp=1, dp=8, enable_expert_parallel=True,
                      block_size=64)
    assert cap.expert_parallel_size == 8 and cap.num_local_experts == 32
    assert cap.weight_bytes / GIB == pytest.approx(
        DSV3.weight_bytes(1, dp=8, expert_parallel=True) / GIB)


# ------------------------------------------------------------------ cost
def test_a_tp_only_parallel_config_costs_exactly_as_no_config():
    a = rank_shapes(QWEN_MOE, 2)
    b = rank_shapes(QWEN_MOE, 2, parallel=ParallelConfig(2))
    assert a.ops == b.ops


def test_tp_plus_ep_on_one_dp_rank_costs_as_tp_when_the_experts_divide():
    gpu = load_gpu("h100-sxm")
    batch = BatchShape.from_lists([512, 1, 1, 1], [0, 900, 2000, 30])
    tp = roofline_cost_model(QWEN_MOE, gpu, 2).step_time(batch)
    ep = roofline_cost_model(QWEN_MOE, gpu, 2, parallel=ParallelConfig(2, 1, True)).step_time(batch)
    assert ep == pytest.approx(tp, rel=1e-12)


def test_dp_adds_a_dispatch_and_a_combine_per_moe_layer():
    shapes = rank_shapes(QWEN_MOE, 1, parallel=ParallelConfig(1, 4, True))
    (op,) = [o for o in shapes.ops if o.name == "moe_all2all"]
    assert op.calls == 2 * 48
    # gather backend: every GPU receives the other 3 ranks' tokens, hidden x bf16 each
    assert op.act_bytes_per_token == 3 * 2048 * 2


def test_dp_tokens_meet_in_the_experts():
    # 4 DP ranks: this GPU runs 1/4 of the expert work of 4 x n tokens = n tokens' worth,
    # and the experts touched are those 4 n tokens pick.
    one = {o.name: o for o in rank_shapes(QWEN_MOE, 1).ops}["mlp_down"]
    dp4 = {o.name: o for o in rank_shapes(QWEN_MOE, 1, parallel=ParallelConfig(1, 4, True)).ops}
    assert dp4["mlp_down"].flops_per_token == pytest.approx(one.flops_per_token)
    n = 3
    touched_one_rank = 128 * (1 - (1 - 8 / 128) ** (4 * n))
    assert dp4["mlp_down"].bytes(n) - dp4["mlp_down"].bytes(0) == pytest.approx(
        touched_one_rank * 768 * 2048 * 2 / 4 + n * dp4["mlp_down"].act_bytes_per_token)


def test_all_to_all_sends_a_token_to_each_rank_holding_one_of_its_experts():
    # 8 experts over 4 ranks (2 each), top-2: P(a given rank holds neither) = C(6,2)/C(8,2).
    model = load_model({"base": "mixtral-8x7b"})
    p = ParallelConfig(1, 4, True, "deepep_low_latency")
    hit = 1 - 15 / 28
    assert moe_dispatch_bytes_per_token(model, p) == pytest.approx(3 * hit * 4096 * 2)


def test_ep_beyond_the_nvlink_domain_uses_the_network():
    gpu = load_gpu("h100-sxm")                      # 8 GPUs per NVLink domain, 50 GB/s NIC
    batch = BatchShape.from_lists([1] * 64, [1000] * 64)

    def comm(dp):
        cm = roofline_cost_model(DSV3, gpu, 1, parallel=ParallelConfig(1, dp, True))
        return cm.breakdown(batch)["moe_all2all"], cm.ops["moe_all2all"]
    (t8, c8), (t16, c16) = comm(8), comm(16)
    assert c16.sec_per_byte == pytest.approx(9 * c8.sec_per_byte)   # 450 -> 50 GB/s
    assert c16.const_s == c8.const_s
    assert t16 / 15 > 4 * t8 / 7                    # per byte moved, latency included


def test_mla_decode_runs_in_the_latent_space():
    # vLLM forward_mqa: per (query, key), heads x (kv_lora + rope) for QK^T and x kv_lora for PV.
    shapes = rank_shapes(DSV3, 8)
    assert shapes.decode_flops_per_pair == 2.0 * 16 * (2 * 512 + 64)
    assert shapes.attn_flops_per_pair == 2.0 * 16 * (192 + 128)    # prefill: forward_mha


def test_mla_prefill_up_projects_the_cached_context():
    from kvsim.cost.attention_work import prefill_attention_work
    shapes = rank_shapes(DSV3, 8)
    f0, b0 = prefill_attention_work(shapes, 512, 0)
    f1, b1 = prefill_attention_work(shapes, 512, 1000)
    per_ctx = 2.0 * 512 * 16 * (128 + 128)
    assert f1 - f0 == pytest.approx(1000 * (512 * shapes.attn_flops_per_pair + per_ctx))
    assert b1 - b0 == pytest.approx(1000 * (shapes.kv_bytes_per_token_layer + 2 * 16 * 256 * 2))


def test_plain_attention_models_have_no_mla_terms():
    shapes = rank_shapes(load_model("llama-3.1-8b"), 1)
    assert shapes.decode_flops_per_pair == shapes.attn_flops_per_pair
    assert shapes.prefill_context_flops_per_token == 0.0


def test_fp8_checkpoints_run_their_gemms_at_the_fp8_peak():
    gpu = load_gpu("h200")
    batch = BatchShape.from_lists([8192], [0])
    bf16 = roofline_cost_model(load_model("llama-3.1-405b"), gpu, 8).breakdown(batch)
    fp8 = roofline_cost_model(load_model("llama-3.1-405b-fp8"), gpu, 8).breakdown(batch)
    assert fp8["mlp_gate_up"] == pytest.approx(bf16["mlp_gate_up"] / 2, rel=0.02)
    assert fp8["prefill_attention"] == pytest.approx(bf16["prefill_attention"])
