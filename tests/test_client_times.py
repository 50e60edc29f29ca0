"""What the client sees: streamed messages, vLLM's stream_interval, and ITL per message."""

from __future__ import annotations

import pytest

import kvsim
from kvsim.sim.client import stream_interval_times


def one_request(**engine) -> dict:
    """One request, 10-token prompt, 7 output tokens, 1 s per step: tokens at t = 1..7."""
    return {"name": "client", "model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm"},
            "engine": {"num_gpu_blocks_override": 64, "max_model_len": 256, **engine},
            "cost_model": {"type": "constant", "step_time_s": 1.0},
            "workload": {"num_requests": 1, "arrival": {"type": "poisson", "rate": 1.0},
                         "prompt_len": {"type": "fixed", "value": 10},
                         "output_len": {"type": "fixed", "value": 7}}}


def test_stream_interval_one_sends_every_output():
    assert list(stream_interval_times([1.0, 2.0, 3.0], 1)) == [1.0, 2.0, 3.0]


def test_stream_interval_sends_the_first_then_every_kth_unsent_token_and_the_last():
    # vLLM OutputProcessor: first output; then when >= 3 tokens are unsent; then the finish.
    assert list(stream_interval_times([1, 2, 3, 4, 5, 6, 7], 3)) == [1, 4, 4, 4, 7, 7, 7]
    assert list(stream_interval_times([1, 2, 3, 4, 5], 2)) == [1, 3, 3, 5, 5]


def test_stream_interval_counts_tokens_not_outputs_when_a_step_makes_several():
    # Outputs of 1, 3, 2 and 1 tokens (speculative decoding), k = 4: the second output leaves
    # 3 tokens unsent (< 4) and waits; the third makes 5 unsent and goes.
    assert list(stream_interval_times([1, 2, 2, 2, 3, 3, 4], 4)) == [1, 3, 3, 3, 3, 3, 4]


def test_a_single_token_request_is_unchanged():
    assert list(stream_interval_times([5.0], 8)) == [5.0]


def test_stream_interval_keeps_ttft_tpot_and_e2el_and_counts_one_itl_per_message():
    base = kvsim.simulate(one_request())
    held = kvsim.simulate(one_request(stream_interval=3))
    for key in ("mean_ttft_ms", "mean_tpot_ms", "mean_e2el_ms"):
        assert held.summary[key] == base.summary[key]
    assert base.summary["mean_ttft_ms"] == 1000.0 and base.summary["mean_e2el_ms"] == 7000.0
    assert list(base.itl_s) == [1.0] * 6
    assert list(held.itl_s) == [3.0, 3.0]           # messages at t = 1, 4, 7
    assert held.summary["mean_itl_ms"] == 3000.0


def test_stream_interval_must_be_positive():
    with pytest.raises(kvsim.ScenarioError, match="engine.stream_interval"):
        kvsim.simulate(one_request(stream_interval=0))
