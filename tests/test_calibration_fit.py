"""Fitting: NNLS, the roofline hinge, profile fits from calibration CSVs, and the calibrate CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvsim.cli import main as kvsim_main
from kvsim.cost.attention_work import decode_attention_work, prefill_attention_work
from kvsim.cost.features import rank_shapes
from kvsim.cost.fit import fit_profile, heldout_by_key
from kvsim.cost.nnls import fit_roofline_op, nnls
from kvsim.specs import load_gpu, load_model

SHARED_PROFILES = Path(__file__).resolve().parents[2] / "shared" / "data" / "profiles"
MODEL = load_model("llama-3.1-8b")
GPU = load_gpu("h100-sxm")


def test_nnls_solves_an_unconstrained_problem_exactly():
    a = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    x_true = np.array([3.0, 0.5])
    assert nnls(a, a @ x_true) == pytest.approx(x_true, rel=1e-10)


def test_nnls_clamps_a_negative_coefficient_to_zero():
    a = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    b = np.array([3.0, 2.0, 1.0])               # the free fit has a negative slope
    x = nnls(a, b)
    assert x[1] == 0.0 and x[0] == pytest.approx(2.0)


def test_hinge_fit_recovers_a_roofline_op():
    tokens = np.arange(1, 4097, 16, dtype=float)
    flops, nbytes = 2 * tokens * 4096 * 14336, 4096 * 14336 * 2 + tokens * (4096 + 14336) * 2
    t = np.maximum(1.5e-15 * flops, 4e-13 * nbytes) + 5e-6
    x = fit_roofline_op(flops, nbytes, t)
    assert x[:3] == pytest.approx([1.5e-15, 4e-13, 5e-6], rel=1e-6)


def test_heldout_by_key_holds_out_whole_token_counts():
    keys = np.repeat(np.arange(50), 3)
    mask = heldout_by_key(keys)
    held = set(keys[mask])
    assert len(held) == 10 and all(mask[keys == k].all() for k in held)


def synthetic_rows() -> pd.DataFrame:
    """Rows generated from known coefficients: the fit must get them back."""
    shapes = rank_shapes(MODEL, 1)
    rows = []
    ops = {o.name: o for o in shapes.ops}
    for name in ("qkv_proj", "mlp_down"):
        for n in range(1, 4097, 32):
            t = max(1.2e-15 * ops[name].flops(n), 3.5e-13 * ops[name].bytes(n)) + 4e-6
            rows.append({"kind": "op", "op": name, "num_tokens": n, "time_s": t})
    for n in range(8, 2049, 64):
        t = max(1e-7, 5e-13 * ops["residual_add"].bytes(n)) + 1e-6
        rows.append({"kind": "op", "op": "residual_add", "num_tokens": n, "time_s": t})
    for c in (64, 256, 1024, 2048):
        for p in (0, 512, 4096):
            f, b = prefill_attention_work(shapes, c, p)
            rows.append({"kind": "prefill_attention", "prefill_chunk": c, "prefill_context": p,
                         "time_s": max(2e-15 * f, 1e-12 * b) + 1e-5})
    for n in (1, 8, 32, 128):
        for k in (128, 1024, 8192):
            f, b = decode_attention_work(shapes, n, n * k)
            rows.append({"kind": "decode_attention", "num_decode": n, "decode_context": k,
                         "time_s": max(2e-5, 4e-13 * b) + 3e-6 + 1e-8 * n})
    return pd.DataFrame(rows)


def test_fit_profile_recovers_known_coefficients():
    profile = fit_profile(synthetic_rows(), model=MODEL, gpu=GPU)
    qkv = profile["ops"]["qkv_proj"]
    assert qkv["sec_per_flop"] == pytest.approx(1.2e-15, rel=1e-3)
    assert qkv["sec_per_byte"] == pytest.approx(3.5e-13, rel=1e-3)
    assert profile["ops"]["residual_add"]["sec_per_byte"] == pytest.approx(5e-13, rel=1e-3)
    dec = profile["decode_attention"]
    assert dec["sec_per_byte"] == pytest.approx(4e-13, rel=1e-2)
    for part, err in profile["errors"].items():
        assert err["fitted_median_ape"] < 0.5, part


def test_fit_profile_reports_errors_on_held_out_rows_only():
    profile = fit_profile(synthetic_rows(), model=MODEL, gpu=GPU)
    err = profile["errors"]["op:qkv_proj"]
    assert err["n_test"] + err["n_train"] == 128
    assert 0.15 * 128 < err["n_test"] < 0.25 * 128


def test_fit_without_attention_rows_is_an_error():
    rows = synthetic_rows()
    with pytest.raises(ValueError, match="no rows of kind decode_attention"):
        fit_profile(rows[rows["kind"] != "decode_attention"], model=MODEL, gpu=GPU)


def test_fit_rejects_unknown_kinds_and_ops():
    rows = synthetic_rows()
    bad = pd.concat([rows, pd.DataFrame([{"kind": "gemm", "time_s": 1.0}])])
    with pytest.raises(ValueError, match="unknown kind"):
        fit_profile(bad, model=MODEL, gpu=GPU)
    bad = pd.concat([rows, pd.DataFrame([{"kind": "op", "op": "conv", "num_tokens": 1, "time_s": 1.0}])])
    with pytest.raises(ValueError, match="conv"):
        fit_profile(bad, model=MODEL, gpu=GPU)


def test_calibrate_fit_cli_writes_a_profile_the_factory_loads(tmp_path):
    data = tmp_path / "m.csv"
    synthetic_rows().to_csv(data, index=False)
    out = tmp_path / "p.json"
    assert kvsim_main(["calibrate", "fit", "--data", str(data), "--gpu", "h100-sxm",
                       "--model", "llama-3.1-8b", "--out", str(out)]) == 0
    profile = json.loads(out.read_text())
    assert (profile["gpu"], profile["model"], profile["tp"]) == ("h100-sxm", "llama-3.1-8b", 1)
    from kvsim.cost import BatchShape, build_cost_model
    from kvsim.cost.fitted import fitted_cost_model
    cm = build_cost_model({"type": "fitted", "profile": str(out)}, model=MODEL, gpu=GPU)
    # The loaded ops time a call as the formula the rows were generated from
    # (synthetic_rows: max(1.2e-15 s/FLOP, 3.5e-13 s/byte) + 4 us for qkv_proj).
    qkv = {o.name: o for o in rank_shapes(MODEL, 1).ops}["qkv_proj"]
    for n in (1, 512, 4096):
        expected = max(1.2e-15 * qkv.flops(n), 3.5e-13 * qkv.bytes(n)) + 4e-6
        assert cm.ops["qkv_proj"].time(qkv.flops(n), qkv.bytes(n)) == pytest.approx(expected, rel=1e-3)
    # and the factory's model is the profile's, step for step
    batch = BatchShape.from_lists([512, 1, 1], [0, 700, 3000])
    assert cm.step_time(batch) == fitted_cost_model(profile, MODEL, GPU).step_time(batch)


def test_calibrate_fit_cli_names_a_missing_column(tmp_path, capsys):
    data = tmp_path / "m.csv"
    pd.DataFrame({"kind": ["op"], "seconds": [1.0]}).to_csv(data, index=False)
    assert kvsim_main(["calibrate", "fit", "--data", str(data), "--gpu", "h100-sxm",
                       "--model", "llama-3.1-8b", "--out", str(tmp_path / "p.json")]) == 2
    assert "'time_s'" in capsys.readouterr().err


def test_calibrate_report_on_one_profile(tmp_path):
    out = tmp_path / "calibration.md"
    assert kvsim_main(["calibrate", "report", "--profiles", "a100-80gb-sxm_llama-2-70b_tp2",
                       "--data", str(SHARED_PROFILES), "--no-figures", "--no-replay",
                       "--out", str(out)]) == 0
    text = out.read_text()
    assert "| a100-80gb-sxm_llama-2-70b_tp2 |" in text
    assert "Splitwise" in text and "decode batch 128" in text


def test_published_profile_refit_matches_the_shipped_one():
    from kvsim.cost.fitted import load_profile
    from kvsim.cost.published import PUBLISHED, build_published_profile
    spec = next(p for p in PUBLISHED if p.name == "a100-80gb-sxm_llama-2-7b_tp1")
    fresh = json.loads(json.dumps(build_published_profile(spec, load_model, load_gpu,
                                                          root=SHARED_PROFILES)))
    shipped = load_profile(spec.name)
    assert fresh["ops"] == shipped["ops"]
    assert fresh["errors"] == shipped["errors"]


def test_data_root_is_the_option_then_the_environment_then_the_checkout_default(tmp_path, monkeypatch):
    from kvsim.cost.published import DATA_ROOT_ENV, DEFAULT_DATA_ROOT, data_root
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    given, env = tmp_path / "given", tmp_path / "env"
    given.mkdir()
    env.mkdir()
    assert data_root(given) == given
    monkeypatch.setenv(DATA_ROOT_ENV, str(env))
    assert data_root(given) == given and data_root() == env
    monkeypatch.delenv(DATA_ROOT_ENV)
    (tmp_path / "repo").mkdir()
    (tmp_path / "shared" / "data" / "profiles").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "repo")       # the default is seen from the repository root
    assert data_root() == DEFAULT_DATA_ROOT == Path("../shared/data/profiles")


def test_calibrate_report_without_the_published_tables_is_one_line_naming_the_folder(tmp_path, capsys):
    missing = tmp_path / "nowhere"
    assert kvsim_main(["calibrate", "report", "--data", str(missing), "--no-figures",
                       "--out", str(tmp_path / "c.md")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"kvsim calibrate: error: published data: --data -> {missing} is not a folder; "
                   f"give the folder of published tables (vidur/, splitwise/, llmservingsim/, "
                   f"apex_plus/) with --data DIR or $KVSIM_PROFILE_DATA")
    assert not (tmp_path / "c.md").exists()
