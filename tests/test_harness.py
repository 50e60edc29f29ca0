"""The measurement harness on a CPU: Triton kernel correctness and measure -> fit -> simulate."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch", reason="the calibration harness needs torch (pip install kvsim[calibrate])")
# Triton's CPU interpreter: must be set before triton is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="the calibration harness needs triton (pip install kvsim[calibrate])")

import pandas as pd  # noqa: E402

from calibration import harness  # noqa: E402
from calibration.paged_attention import (make_paged_cache, paged_decode_attention,  # noqa: E402
                                         reference_decode_attention)


@pytest.mark.parametrize("num_heads, num_kv_heads", [(4, 4), (8, 2)])
def test_triton_paged_decode_attention_matches_torch_reference(num_heads, num_kv_heads):
    gen = torch.Generator().manual_seed(1)
    # partial last blocks, a one-token sequence, blocks scattered over the cache
    cache = make_paged_cache([1, 13, 16, 40], num_kv_heads, 16, 8, torch.float32, "cpu", gen)
    q = torch.randn(4, num_heads, 16, generator=gen)
    got = paged_decode_attention(q, *cache)
    want = reference_decode_attention(q, *cache)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)


def test_paged_decode_attention_reads_through_the_block_table():
    gen = torch.Generator().manual_seed(2)
    k, v, table, lens = make_paged_cache([16, 16], 2, 16, 8, torch.float32, "cpu", gen)
    q = torch.randn(2, 2, 16, generator=gen)
    swapped = table.flip(0).contiguous()          # sequence 0 now owns sequence 1's blocks
    a = paged_decode_attention(q, k, v, table, lens)
    b = paged_decode_attention(q.flip(0).contiguous(), k, v, swapped, lens)
    assert torch.allclose(a, b.flip(0), atol=1e-6)


def test_harness_measure_fit_simulate_on_cpu(tmp_path):
    out = tmp_path / "cpu.csv"
    assert harness.main(["--model", "llama-3.1-8b", "--device", "cpu", "--quick", "--reps", "1",
                         "--warmup", "0", "--out", str(out)]) == 0
    data = pd.read_csv(out)
    assert set(data["kind"]) == {"op", "copy", "prefill_attention", "decode_attention", "layer_step"}
    assert (data["time_s"] > 0).all()

    from kvsim.cli import main as kvsim_main
    profile = tmp_path / "cpu.json"
    assert kvsim_main(["calibrate", "fit", "--data", str(out), "--gpu", str(out.with_suffix(".gpu.yaml")),
                       "--model", str(out.with_suffix(".model.yaml")), "--out", str(profile)]) == 0

    import kvsim
    from kvsim.cost import BatchShape, build_cost_model
    from kvsim.specs import load_gpu, load_model
    scenario = {
        "name": "cpu-pipeline", "model": str(out.with_suffix(".model.yaml")),
        "hardware": {"gpu": str(out.with_suffix(".gpu.yaml")), "tp": 1},
        "engine": {"max_num_batched_tokens": 64, "max_num_seqs": 8, "block_size": 8,
                   "num_gpu_blocks_override": 200},
        "cost_model": {"type": "fitted", "profile": str(profile)},
        "workload": {"num_requests": 6, "arrival": {"type": "poisson", "rate": 50.0},
                     "prompt_len": {"type": "uniform", "low": 8, "high": 40},
                     "output_len": {"type": "uniform", "low": 2, "high": 6}},
    }
    result = kvsim.simulate(scenario)
    assert (result.requests["status"] == "completed").all()
    # the engine's first step is one prompt's prefill, costed by the fitted profile
    first = result.steps.iloc[0]
    cm = build_cost_model({"type": "fitted", "profile": str(profile)},
                          model=load_model(str(out.with_suffix(".model.yaml"))),
                          gpu=load_gpu(str(out.with_suffix(".gpu.yaml"))))
    expected = cm.step_time(BatchShape.from_lists([int(first["num_prefill_tokens"])], [0]))
    assert first["duration_s"] == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("chunk, context", [(8, 0), (5, 11)])
def test_harness_prefill_attention_is_bottom_right_causal(chunk, context):
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(chunk, 4, 16, generator=gen)
    kn, vn = torch.randn(chunk, 2, 16, generator=gen), torch.randn(chunk, 2, 16, generator=gen)
    kc, vc = torch.randn(context, 2, 16, generator=gen), torch.randn(context, 2, 16, generator=gen)
    got = harness.prefill_attention(torch, q, kn, vn, kc, vc)
    want = harness.reference_prefill_attention(torch, q, kn, vn, kc, vc)
    assert torch.allclose(got, want, atol=1e-5)
