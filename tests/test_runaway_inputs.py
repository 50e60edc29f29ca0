"""Inputs that used to run away or pass silently: bounded, refused, or explained in one line."""

from __future__ import annotations

import numpy as np
import pytest

import kvsim
from kvsim.kv.hashing import fresh_block_hashes
from kvsim.scenario.schema import ScenarioError
from kvsim.workload import build_workload


def scenario(**workload) -> dict:
    return {"model": "llama-3.1-8b",
            "engine": {"num_gpu_blocks_override": 256, "block_size": 16, "max_model_len": 1024,
                       "max_num_batched_tokens": 1024},
            "cost_model": {"type": "constant", "step_time_s": 0.01},
            "workload": {"num_requests": 6, "arrival": {"type": "poisson", "rate": 10.0},
                         "prompt_len": {"type": "fixed", "value": 100},
                         "output_len": {"type": "fixed", "value": 4}, **workload}}


def specs(config: dict, **kwargs):
    return list(build_workload(config, rng=np.random.default_rng(0), **kwargs).requests())


# --- prompts the engine refuses are not spelled out -----------------------------------

def test_a_prompt_over_the_limit_takes_no_memory():
    (spec,) = specs({"num_requests": 1, "prompt_len": {"type": "fixed", "value": 2_000_000_000}},
                    max_prompt_len=1023)
    prompt = spec.prompt_token_ids
    assert len(prompt) == 2_000_000_000 and prompt.strides == (0,) and spec.fresh_prompt_start is None


def test_the_limit_changes_no_request_that_can_run():
    config = {"num_requests": 40, "prompt_len": {"type": "uniform", "low": 1, "high": 3000},
              "prefix": {"shared_prompt_tokens": 64, "num_groups": 2},
              "sessions": {"turns": 3}}
    free, bounded = specs(config), specs(config, max_prompt_len=1023)
    assert [len(s.prompt_token_ids) for s in free] == [len(s.prompt_token_ids) for s in bounded]
    runnable = [(a, b) for a, b in zip(free, bounded) if len(a.prompt_token_ids) <= 1023]
    assert 0 < len(runnable) < len(free)
    for a, b in runnable:
        assert np.array_equal(a.prompt_token_ids, b.prompt_token_ids)
        assert (a.fresh_prompt_start, a.after_request_id) == (b.fresh_prompt_start, b.after_request_id)


def test_later_turns_of_a_refused_turn_are_not_spelled_out_either():
    config = {"num_requests": 3, "sessions": {"turns": 3},
              "prompt_len": {"type": "fixed", "value": 600}, "output_len": {"type": "fixed", "value": 10}}
    turns = specs(config, max_prompt_len=1023)
    assert [len(s.prompt_token_ids) for s in turns] == [600, 1210, 1820]
    assert [s.prompt_token_ids.strides for s in turns] == [(8,), (0,), (0,)]


def test_a_system_prompt_no_request_can_run_with_is_not_spelled_out():
    config = {"num_requests": 2, "prefix": {"shared_prompt_tokens": 3_000_000_000}}
    assert all(s.prompt_token_ids.strides == (0,) for s in specs(config, max_prompt_len=1023))


def test_huge_prompts_fail_on_arrival_with_their_true_length():
    result = kvsim.simulate(scenario(prompt_len={"type": "fixed", "value": 2_000_000_000}, num_requests=3))
    assert result.summary["failed"] == 3 and result.summary["completed"] == 0
    assert set(result.requests["fail_reason"]) == {"prompt of 2000000000 tokens >= max_model_len 1024"}


def test_a_refused_prompt_of_fresh_ids_is_named_by_a_range():
    keys = fresh_block_hashes(0, 2_000_000_000, -1, 2_000_000_000, 16)
    assert isinstance(keys, range) and len(keys) == 125_000_000


# --- closed loops ---------------------------------------------------------------------

def test_a_closed_loop_with_more_clients_than_requests_has_one_per_request():
    w = build_workload({"num_requests": 50, "arrival": {"type": "closed_loop", "concurrency": 10**9}},
                       rng=np.random.default_rng(0))
    assert w.concurrency == 50


def test_capping_the_clients_changes_nothing():
    big = kvsim.simulate(scenario(arrival={"type": "closed_loop", "concurrency": 10**9}))
    exact = kvsim.simulate(scenario(arrival={"type": "closed_loop", "concurrency": 6}))
    assert big.summary == exact.summary


# --- infinite times -------------------------------------------------------------------

def test_a_time_scale_that_overflows_is_refused(tmp_path):
    (tmp_path / "t.csv").write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,2\n5,10,2\n")
    with pytest.raises(ValueError, match=r"^workload.trace.time_scale = 1e\+308: the trace spans 5 s, "
                                         r"which scaled overflows to an infinite time"):
        build_workload({"trace": {"format": "vidur", "path": "t.csv", "time_scale": 1e308}},
                       rng=np.random.default_rng(0), base_dir=tmp_path)


def test_an_arrival_rate_whose_gaps_are_infinite_is_refused():
    with pytest.raises(ValueError, match=r"^workload.arrival: .* overflow to infinity"):
        specs({"num_requests": 3, "arrival": {"type": "poisson", "rate": 1e-320}})


# --- the engine as vLLM configures it -------------------------------------------------

def with_tp(tp: int, model="llama-3.1-8b") -> dict:
    d = scenario()
    d["model"], d["hardware"] = model, {"gpu": "h100-sxm", "tp": tp}
    return d


def test_tp_must_divide_the_attention_heads():
    with pytest.raises(ScenarioError) as info:
        kvsim.load_scenario(with_tp(3))
    assert str(info.value) == (
        "hardware.tp: got 3; model llama-3.1-8b has 32 attention heads, which tp must divide (vLLM "
        "refuses: heads must be divisible by tensor parallel size); allowed: 1, 2, 4, 8, 16, 32")


def test_tp_must_shard_or_replicate_the_kv_heads_evenly():
    model = {"name": "odd", "num_layers": 2, "hidden_size": 768, "num_attention_heads": 12,
             "num_kv_heads": 3, "head_dim": 64, "intermediate_size": 1024, "vocab_size": 1000,
             "gated_mlp": True, "tie_word_embeddings": False, "max_position_embeddings": 4096}
    with pytest.raises(ScenarioError, match=r"^hardware.tp: got 2; model odd has 3 KV heads"):
        kvsim.load_scenario(with_tp(2, model))
    assert kvsim.load_scenario(with_tp(6, model)).tp == 6      # replicated: 6 = 2 x 3


def test_tp_that_replicates_kv_heads_is_allowed():
    assert kvsim.load_scenario(with_tp(16)).tp == 16            # 8 KV heads, each on 2 GPUs


def test_an_inline_model_with_missing_fields_names_them():
    d = scenario()
    d["model"] = {"name": "tiny", "num_layers": 2}
    with pytest.raises(ScenarioError, match=r"^model: model tiny: missing field\(s\) hidden_size, "
                                            r"num_attention_heads, .*max_position_embeddings"):
        kvsim.load_scenario(d)


def test_a_max_model_len_capped_by_a_tiny_cache_is_a_note():
    d = scenario()
    del d["engine"]["max_model_len"]
    d["engine"]["num_gpu_blocks_override"] = 2
    (note,) = kvsim.load_scenario(d).notes
    assert note.startswith("engine.max_model_len: not set, and engine.num_gpu_blocks_override = 2 "
                           "holds only 16 tokens, less than the model's 131072; capped at 16")


def test_an_explicit_max_model_len_needs_no_note():
    assert kvsim.load_scenario(scenario()).notes == ()


# --- binary files named ---------------------------------------------------------------

def test_a_binary_trace_names_its_key_and_file(tmp_path):
    (tmp_path / "t.csv").write_bytes(bytes(range(128, 256)) * 4)
    with pytest.raises(ValueError, match=r"^workload.trace.path = '.*t.csv': not a UTF-8 text file"):
        build_workload({"trace": {"format": "azure", "path": "t.csv"}}, rng=np.random.default_rng(0),
                       base_dir=tmp_path)


def test_a_binary_length_file_names_its_key_and_file(tmp_path):
    (tmp_path / "l.csv").write_bytes(bytes(range(128, 256)) * 4)
    with pytest.raises(ValueError, match=r"^workload.prompt_len.file = '.*l.csv': not a UTF-8 text file"):
        build_workload({"prompt_len": {"type": "empirical", "file": "l.csv", "column": "x"}},
                       rng=np.random.default_rng(0), base_dir=tmp_path)
