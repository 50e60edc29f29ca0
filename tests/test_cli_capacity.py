"""``kvsim capacity`` through ``kvsim.cli.main``: output and exit codes."""

import json

import pytest

from kvsim.cli import main


def run(capsys, *argv):
    code = main(["capacity", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_capacity_prints_kv_bytes_blocks_and_tokens(capsys):
    code, out, err = run(capsys, "--model", "llama-3.1-8b", "--gpu", "h100-sxm",
                         "--seq-len", "640")
    assert code == 0 and err == ""
    assert "llama-3.1-8b on h100-sxm" in out
    assert "131,072 B" in out             # KV bytes per token, bf16
    assert "14.96 GiB" in out             # weights
    assert "num_gpu_blocks" in out and "token capacity" in out
    assert "requests of 640 tokens" in out


def test_qwen3_kv_bytes_per_token(capsys):
    code, out, _ = run(capsys, "--model", "qwen3-1.7b", "--gpu", "l4")
    assert code == 0 and "114,688 B" in out


def test_fp8_and_tp_options_change_the_per_token_bytes(capsys):
    code, out, _ = run(capsys, "--model", "llama-3.1-8b", "--gpu", "h100", "--tp", "2",
                       "--kv-cache-dtype", "fp8")
    assert code == 0 and "32,768 B" in out


def test_override_is_reported(capsys):
    code, out, _ = run(capsys, "--model", "llama-3.1-8b", "--gpu", "h100-sxm",
                       "--num-gpu-blocks-override", "100", "--block-size", "32")
    assert code == 0
    assert "3,168 tokens" in out and "override" in out


def test_list_shows_every_catalog_name(capsys):
    from kvsim.specs.catalog import list_gpus, list_models
    code, out, _ = run(capsys, "--list")
    assert code == 0
    for name in list_gpus() + list_models():
        assert name in out


def test_model_and_gpu_from_files(capsys, tmp_path):
    gpu = tmp_path / "gpu.yaml"
    gpu.write_text("name: lab-gpu\nmemory_gib: 48\nhbm_bandwidth_gbps: 900\nbf16_tflops: 150\n"
                   "interconnect_bandwidth_gbps: 32\ninterconnect_latency_us: 30\n"
                   "pcie_bandwidth_gbps: 32\n")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"hidden_size": 2048, "intermediate_size": 6144,
                               "num_hidden_layers": 28, "num_attention_heads": 16,
                               "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
                               "tie_word_embeddings": True, "hidden_act": "silu",
                               "torch_dtype": "bfloat16"}))
    code, out, _ = run(capsys, "--model", str(cfg), "--gpu", str(gpu))
    assert code == 0 and "lab-gpu" in out and "114,688 B" in out


@pytest.mark.parametrize("argv,message", [
    (["--model", "llama-9", "--gpu", "h100"], "unknown model 'llama-9'; known: qwen3-1.7b"),
    (["--model", "llama-3.1-8b", "--gpu", "tpu-v9"], "unknown GPU 'tpu-v9'; known: a100-40gb"),
    (["--model", "llama-3.1-8b", "--gpu", "h100", "--tp", "0"], "--tp must be a positive"),
    (["--model", "llama-3.1-8b", "--gpu", "h100", "--block-size", "-16"],
     "--block-size must be a positive"),
    (["--model", "llama-3.1-8b", "--gpu", "h100", "--seq-len", "0"], "--seq-len must be"),
    (["--model", "llama-3.1-8b", "--gpu", "h100", "--gpu-memory-utilization", "0"],
     "gpu_memory_utilization must be in (0, 1]"),
    (["--model", "llama-3.1-70b", "--gpu", "h100-sxm"], "try --tp 2 or more"),
    (["--gpu", "h100"], "--model required"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("kvsim capacity: error: ")
    assert message in err


def test_unparsable_number_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["capacity", "--model", "llama-3.1-8b", "--gpu", "h100", "--tp", "two"])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err == "kvsim capacity: error: argument --tp/--tensor-parallel-size: invalid int value: 'two'\n"


def test_capacity_states_the_token_budget_it_assumes(capsys):
    # vllm serve's default for the GPU, as kvsim run uses (kv-semantics D4): 16384 on >= 160 GiB.
    code, out, _ = run(capsys, "--model", "llama-3.1-8b", "--gpu", "b200")
    assert code == 0
    assert "token budget (max_num_batched_tokens)" in out
    assert "16,384 tokens  vllm serve default for b200" in out


def test_capacity_budget_from_the_flag_says_so(capsys):
    code, out, _ = run(capsys, "--model", "llama-3.1-8b", "--gpu", "h100",
                       "--max-num-batched-tokens", "2048")
    assert code == 0 and "2,048 tokens  --max-num-batched-tokens" in out
    assert "activation peak (2048 tok, 1024 seqs)" in out


def test_capacity_of_a_hybrid_model_lists_its_kv_cache_groups(capsys):
    code, out, _ = run(capsys, "--model", "gemma-3-27b", "--gpu", "h200", "--seq-len", "32768")
    assert code == 0
    assert "KV-cache groups: 7 (vLLM's hybrid KV cache manager" in out
    assert "sliding_window   9 layers  window 1024" in out
    assert "full_attention  10 layers" in out and "2048 blocks at 32768 tokens" in out
    assert "tokens that fit at 32768 per request" in out


def test_capacity_with_the_hybrid_manager_off_has_one_group(capsys):
    code, out, _ = run(capsys, "--model", "gemma-3-27b", "--gpu", "h200",
                       "--disable-hybrid-kv-cache-manager")
    assert code == 0 and "KV-cache groups: 1 (hybrid KV cache manager off" in out


def test_capacity_of_an_moe_model_under_ep_shows_experts_per_gpu(capsys):
    code, out, _ = run(capsys, "--model", "deepseek-v3", "--gpu", "h200", "--dp", "8",
                       "--enable-expert-parallel", "--block-size", "64")
    assert code == 0
    assert "per GPU (tp=1, dp=8, ep=8)" in out
    assert "32 whole experts per GPU" in out


def test_capacity_of_an_moe_model_under_tp_splits_every_expert(capsys):
    code, out, _ = run(capsys, "--model", "qwen3-235b-a22b", "--gpu", "h200", "--tp", "4")
    assert code == 0 and "every expert, 1/4 of its width" in out


def test_capacity_refuses_a_tp_that_does_not_divide_the_heads_in_one_line(capsys):
    code, out, err = run(capsys, "--model", "mixtral-8x7b", "--gpu", "h100", "--tp", "3")
    assert code == 2 and err.count("\n") == 1
    assert "tensor_parallel_size 3 does not divide mixtral-8x7b's num_attention_heads (32)" in err
