"""``kvsim calibrate report``: write ``reports/calibration.md`` and its figures.

Reads the shipped profiles (``kvsim/cost/profiles/*.json``: coefficients,
held-out errors and held-out points, all computed by the fit), optionally
refits the published ones first (``--refit``), then checks whole steps
against Splitwise and the Sarathi-Serve points (``kvsim/cost/validation.py``)
and replays real vLLM serving runs (``replay.py``). The published tables are
read from ``root``, the ``--data`` folder (``kvsim.cost.published.data_root``).
It sits with the reports, above the scenario layer, because the replay runs
``kvsim.simulate``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pandas as pd

from kvsim.cost.fitted import PROFILE_DIR, dump_profile
from kvsim.cost.validation import (SARATHI_PROFILE, error_summary, sarathi_predictions,
                                   splitwise_predictions)

LINEAR_PARTS = ("op:qkv_proj", "op:o_proj", "op:mlp_gate_up", "op:mlp_down")
SUMMARY_PARTS = ("layer_linear_ops", *LINEAR_PARTS, "prefill_attention", "decode_attention",
                 "allreduce", "overhead", "layer_step")


def refit_published(names: list[str] | None = None, out_dir: Path = PROFILE_DIR, *,
                    root: Path) -> list[Path]:
    """Fit the shipped profiles again from the published tables under ``root``; the paths written."""
    from kvsim.cost.published import PUBLISHED, build_published_profile
    from kvsim.cost.published_runs import RUNS, fit_run_profile
    from kvsim.specs.catalog import load_gpu, load_model
    written = []
    for spec in PUBLISHED:
        if names and spec.name not in names:
            continue
        profile = build_published_profile(spec, load_model, load_gpu, root=root)
        path = out_dir / f"{spec.name}.json"
        path.write_text(dump_profile(profile))
        written.append(path)
    # the serving-replay profiles (vLLM kernel tables of the replayed GPUs)
    for run in RUNS:
        if names and run.profile_name not in names:
            continue
        path = out_dir / f"{run.profile_name}.json"
        path.write_text(dump_profile(fit_run_profile(run, root=root)))
        written.append(path)
    return written


def load_profiles(profile_dir: Path = PROFILE_DIR, names: list[str] | None = None) -> list[dict]:
    profiles = []
    for path in sorted(profile_dir.glob("*.json")):
        if names and path.stem not in names:
            continue
        profiles.append(json.loads(path.read_text()))
    return profiles


def _fmt(v) -> str:
    return "–" if v is None or (isinstance(v, float) and np.isnan(v)) else f"{v:.1f}"


def _err_cell(err: dict | None, which: str) -> str:
    if not err:
        return "–"
    return f"{_fmt(err[which + '_median_ape'])} / {_fmt(err[which + '_p90_ape'])}"


def _decade_axes(ax, lo: float, hi: float) -> None:
    """Log-scale look on linear axes of log10 values (matplotlib's log axes are slow)."""
    ticks = np.arange(np.floor(lo), np.ceil(hi) + 1)
    labels = [f"{10 ** t:g}" for t in ticks]
    ax.set_xticks(ticks, labels)
    ax.set_yticks(ticks, labels)
    ax.set_xlim(lo - 0.1, hi + 0.1)
    ax.set_ylim(lo - 0.1, hi + 0.1)
    ax.plot([lo, hi], [lo, hi], color="black", lw=0.8)
    for f in (1.1, 1 / 1.1):
        ax.plot([lo, hi], [lo + np.log10(f), hi + np.log10(f)], color="grey", lw=0.5, ls="--")


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_profile(profile: dict, path: Path) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 4.2))
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.12, top=0.88, wspace=0.2)
    parts = [p for p in profile["heldout"] if profile["heldout"][p]["measured_s"]]
    colors = plt.cm.tab20(np.linspace(0, 1, max(len(parts), 2)))
    vals = []
    for ax, which in zip(axes, ("fitted", "roofline")):
        for color, part in zip(colors, parts):
            h = profile["heldout"][part]
            m = np.log10(np.asarray(h["measured_s"]) * 1e3)
            p = np.log10(np.maximum(np.asarray(h[f"{which}_s"]) * 1e3, 1e-4))
            ax.scatter(m, p, s=9, color=color, label=part, alpha=0.8)
            vals += [m, p]
        ax.set_title(which, fontsize=9)
        ax.set_xlabel("measured (ms)")
    lo, hi = (float(np.min(np.concatenate(vals))), float(np.max(np.concatenate(vals))))
    for ax in axes:
        _decade_axes(ax, lo, hi)
    axes[0].set_ylabel("predicted (ms)")
    axes[1].legend(fontsize=6, loc="upper left", ncol=2)
    fig.suptitle(f"{profile['name']}: held-out rows (dashed: +-10%)", fontsize=10)
    fig.savefig(path, dpi=72)
    plt.close(fig)


def plot_splitwise(df: pd.DataFrame, path: Path) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 4.2))
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.12, top=0.9, wspace=0.2)
    for ax, phase in zip(axes, ("prompt", "decode")):
        d = df[df["phase"] == phase]
        m = np.log10(d["measured_ms"].to_numpy())
        vals = [m]
        for which, marker in (("fitted", "o"), ("roofline", "x")):
            p = np.log10(d[f"{which}_ms"].to_numpy())
            vals.append(p)
            ax.scatter(m, p, s=12, marker=marker, label=which)
        _decade_axes(ax, float(np.min(np.concatenate(vals))), float(np.max(np.concatenate(vals))))
        ax.set_title(f"Splitwise Llama-2-70B: {phase} step", fontsize=9)
        ax.set_xlabel("measured (ms)")
        ax.set_ylabel("predicted (ms)")
        ax.legend(fontsize=8)
    fig.savefig(path, dpi=72)
    plt.close(fig)


def _model_columns(att: pd.DataFrame) -> pd.DataFrame:
    """Long (phase, model, measured, predicted) rows -> one row per point with both models."""
    fitted = att[att["model"] == "fitted"].reset_index(drop=True)
    roof = att[att["model"] == "roofline"].reset_index(drop=True)
    return pd.DataFrame({"phase": fitted["phase"], "measured_ms": fitted["measured_ms"],
                         "fitted_ms": fitted["predicted_ms"], "roofline_ms": roof["predicted_ms"]})


def write_report(out: Path, *, root: Path, profile_dir: Path = PROFILE_DIR, figures: bool = True,
                 names: list[str] | None = None, replay: bool = True) -> Path:
    """Write the report to ``out`` (figures in ``out``'s folder/figures); ``root``: published tables."""
    from kvsim.specs.catalog import load_gpu, load_model

    started = time.perf_counter()
    fig_dir = out.parent / "figures"
    if figures:
        fig_dir.mkdir(parents=True, exist_ok=True)
    profiles = load_profiles(profile_dir, names)
    lines = [
        "# Cost-model calibration",
        "",
        "Generated by `kvsim calibrate report` (add `--refit` to refit the published profiles "
        "from `../shared/data/profiles/` first). Errors are absolute percentage errors "
        "(APE, %) on rows **held out** of the fit (a seeded 20% of the token counts / "
        "configurations), as `median / p90`; *roofline* is the uncalibrated roofline model "
        "(default efficiencies) on the same rows. Methods: `docs/cost_models.md`.",
        "",
        "## Held-out error per profile",
        "",
        "`layer_linear_ops` is one layer's projections, MLP, norms, rope and residual adds "
        "summed at held-out token counts; `qkv`/`o`/`gate_up`/`down` are the single GEMMs. "
        "Attention comes from Vidur's A100 table (fitted once, rescaled to other GPUs), except "
        "for the `rtx-*` profiles, fitted to LLMServingSim's vLLM 0.19 tables of those GPUs "
        "(which fuse the residual adds into the norms, so they have no layer sum).",
        "",
        "| profile | layer linear ops fitted | roofline | qkv | o | gate_up | down | prefill attn "
        "fitted | roofline | decode attn fitted | roofline | all-reduce fitted | CPU overhead fitted |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in profiles:
        e = p.get("errors", {})
        cells = [p["name"], _err_cell(e.get("layer_linear_ops"), "fitted"),
                 _err_cell(e.get("layer_linear_ops"), "roofline")]
        cells += [_fmt(e[k]["fitted_median_ape"]) if k in e else "–" for k in LINEAR_PARTS]
        for part in ("prefill_attention", "decode_attention"):
            cells += [_err_cell(e.get(part), "fitted"), _err_cell(e.get(part), "roofline")]
        cells += [_err_cell(e.get("allreduce"), "fitted"), _err_cell(e.get("overhead"), "fitted")]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "Targets: median <= 5% for the linear-op models and <= 10% for attention. Where a "
        "single GEMM misses 5% (the H100 tables especially), the cause is cuBLAS switching "
        "kernels between token counts (steps of +20-40% from one count to the next, e.g. "
        "992 -> 1,056 tokens); the wave-quantised compute term (tile x SM waves, fitted) "
        "captures part of it, and over a whole layer the errors mostly average out (the one "
        "layer above 5%, A100 Llama-2-7B TP2 at 5.7%, has GEMMs that switch kernels at small "
        "token counts: 56 µs at 1 token, 104 µs at 96, which one tile shape cannot follow). Decode "
        "attention cannot go much below ~8.5%: the engine contract makes a decode step "
        "depend on contexts only through their sum, while FlashAttention's time at small "
        "batches is set by the longest sequence (flat 15-30 µs up to 4k tokens).",
        "",
    ]
    if figures:
        lines += ["### Predicted vs measured (held-out rows)", ""]
        for p in profiles:
            fig = fig_dir / f"calibration_{p['name']}.png"
            plot_profile(p, fig)
            lines.append(f"![{p['name']}](figures/{fig.name})")
        lines.append("")
    lines += ["<details><summary>Every part of every profile</summary>", ""]
    for p in profiles:
        lines += [f"#### {p['name']}", "", p.get("description") or "", "",
                  "| part | n train | n test | fitted median / p90 | roofline median / p90 |",
                  "|---|---|---|---|---|"]
        for part, err in p.get("errors", {}).items():
            lines.append(f"| {part} | {err['n_train']} | {err['n_test']} | "
                         f"{_err_cell(err, 'fitted')} | {_err_cell(err, 'roofline')} |")
        lines += ["", "Sources: " + "; ".join(f"`{s['file']}` ({s['rows']}, {s['n_rows']} rows)"
                                            for s in p.get("sources", [])), ""]
    lines += ["</details>", ""]

    # ---- Splitwise
    sw = splitwise_predictions(load_model, load_gpu, root=root)
    summary = error_summary(sw, ["hardware", "tp", "phase"])
    lines += [
        "## Whole steps: Splitwise (Llama-2-70B, A100 / H100, TP 2/4/8)",
        "",
        "Prompt (one prefill step of `batch x prompt` tokens) and decode (one step of `batch` "
        "sequences at the mean generation context) times against `splitwise/perf_model.csv` "
        "medians. The fitted model uses the matching `<gpu>_llama-2-70b_tp<N>` profile.",
        "",
        "| hardware | TP | phase | n | fitted median / p90 | roofline median / p90 |",
        "|---|---|---|---|---|---|",
    ]
    for r in summary.itertuples():
        lines.append(f"| {r.hardware} | {r.tp} | {r.phase} | {int(r.n)} | "
                     f"{_fmt(r.fitted_median_ape)} / {_fmt(r.fitted_p90_ape)} | "
                     f"{_fmt(r.roofline_median_ape)} / {_fmt(r.roofline_p90_ape)} |")
    dec = sw[(sw["phase"] == "decode") & (sw["batch_size"] == 1) & (sw["token_size"] == 128)
             & (sw["prompt_size"] == 512)]
    lines += [
        "",
        "Why decode is worse at higher TP: Splitwise's measured decode step hardly shrinks "
        "with TP (batch 1, 512-token prompt: "
        + ", ".join(f"{r.hardware} TP{r.tp} {r.measured_ms:.0f} ms (fitted {r.fitted_ms:.0f})"
                    for r in dec.itertuples())
        + "), while the per-GPU kernel work the profiles measure falls as 1/TP. The missing "
        "20-30 ms per step is engine time outside the kernels that the operator tables "
        "cannot see: eager-mode launch gaps (~1,500 kernels per step) and the host side of "
        "the all-reduces. The engine and its version are not recorded upstream.",
        "",
    ]
    if figures:
        plot_splitwise(sw, fig_dir / "calibration_splitwise.png")
        lines += ["![splitwise](figures/calibration_splitwise.png)", ""]

    # ---- Sarathi
    sar = sarathi_predictions(load_model, load_gpu)
    lines += [
        "## Published end-to-end points: Sarathi-Serve (Yi-34B, TP2, A100-80GB PCIe + NVLink)",
        "",
        f"Profile `{SARATHI_PROFILE}` (Yi-34B is not in Vidur's tables: CodeLlama-34B's TP2 "
        "coefficients per FLOP and per byte, Vidur's pairwise-NVLink all-reduce and "
        "CodeLlama-34B TP2 CPU overheads); the roofline uses `a100-80gb-pcie` with the "
        "NVLink bridge (300 GB/s).",
        "",
        "| point | measured ms | fitted ms | fitted error | roofline ms | roofline error |",
        "|---|---|---|---|---|---|",
    ]
    for r in sar.itertuples():
        lines.append(f"| {r.point} | {r.measured_ms:g} | {r.fitted_ms:.1f} | "
                     f"{r.fitted_err_pct:+.1f}% | {r.roofline_ms:.1f} | {r.roofline_err_pct:+.1f}% |")
    lines += [
        "",
        "Where it is worse, and why: *decode batch 128* (189 ms measured) is four times the "
        "batch-1 step although the weights read, which dominate a short-context decode, are "
        "the same; the extra ~140 ms (~1.1 ms per sequence) is per-sequence CPU work of that "
        "vLLM-era engine (sampling and input preparation in Python, Ray workers), which "
        "Vidur's CPU-overhead table for CodeLlama-34B TP2 puts at only ~6 ms at batch 128. "
        "*Decode batch 1* misses ~13 ms the same way (Vidur's `ray_comm_time` of ~6 ms per "
        "step at TP2 is not counted in the overhead: modern vLLM has no Ray hop). Short "
        "prefills (128 tokens) are under-predicted for the same reason; long prefills, "
        "which are GPU-bound, are within a few percent.",
        "",
    ]
    # ---- cross-checks of what the shipped profiles extrapolate
    from kvsim.cost.validation import h100_attention_check, nccl_allreduce_check
    att = h100_attention_check(load_model, load_gpu, root=root)
    att_sum = error_summary(_model_columns(att), ["phase"])
    ar = error_summary(nccl_allreduce_check(load_gpu, root=root), ["gpu", "tp"])
    lines += [
        "## Cross-checks of extrapolated parts",
        "",
        "**H100 attention.** The H100 profiles' attention is the A100 fit rescaled by peak "
        "FLOP/s and HBM bandwidth. The only H100 attention timings published "
        "(`hf_layerwise_v0`, FlashAttention-2 on contiguous K/V inside Transformers, per rank "
        "of Llama-3.1-70B at TP4) are a different kernel from vLLM's (no split-KV decode; "
        "MORE.md: treat as rough), and the rescaled coefficients miss them widely, so H100 "
        "attention is an extrapolation whose error is not pinned down by these data:",
        "",
        "| phase | n | fitted median / p90 APE | roofline median / p90 APE |",
        "|---|---|---|---|",
    ]
    for r in att_sum.itertuples():
        lines.append(f"| {r.phase} | {int(r.n)} | {_fmt(r.fitted_median_ape)} / {_fmt(r.fitted_p90_ape)} | "
                     f"{_fmt(r.roofline_median_ape)} / {_fmt(r.roofline_p90_ape)} |")
    lines += [
        "",
        "**All-reduce.** The H100 profiles' all-reduce (fitted to Vidur's DGX NCCL table) and "
        "the roofline's ring formula against apex_plus NCCL all-reduce timings (fp16, >= 64 KiB, "
        "one node) on H100 and H200 (the H200 rows use the H100 profiles: same NVLink 4). "
        "Small messages are where both miss (NCCL's 9-20 µs latency vs 16-39 µs in Vidur's "
        "table and 25 µs in the catalog).",
        "",
        "| GPU | TP | n | fitted median / p90 APE | roofline median / p90 APE |",
        "|---|---|---|---|---|",
    ]
    for r in ar.itertuples():
        lines.append(f"| {r.gpu} | {r.tp} | {int(r.n)} | {_fmt(r.fitted_median_ape)} / {_fmt(r.fitted_p90_ape)} | "
                     f"{_fmt(r.roofline_median_ape)} / {_fmt(r.roofline_p90_ape)} |")
    lines.append("")

    if replay:
        import tempfile

        from kvsim.reports.replay import markdown, run_all
        with tempfile.TemporaryDirectory() as tmp:
            summary = run_all(Path(tmp), profile_dir, refit=False, root=root)
        lines += [markdown(summary), "",
                  "The profiles (`rtx-4090_llama-3.1-8b_tp1`, `rtx-pro-6000_llama-3.1-8b_tp1`) are "
                  "fitted to kernel tables only, never to these runs. In a step that mixes a "
                  "prefill chunk with decodes, vLLM runs one varlen attention kernel for all of "
                  "them and the decodes lose the split-KV decode kernel: the mixed steps of the "
                  "same tables cost ~1.5x the sum of their pure prefill and pure decode parts. "
                  "These profiles therefore carry a separate `mixed_decode_attention` fit "
                  "(held-out median APE ~12% on mixed steps, `mixed_attention` in the profile's "
                  "errors; it was 35% with pure-decode coefficients). The Vidur-based profiles "
                  "have no mixed-step data and charge mixed decodes like pure ones.", ""]
    from kvsim.calibrate_serve.report import engine_time_section
    lines += [*engine_time_section(root, replay=replay), ""]
    lines += [
        "## Measurement harness",
        "",
        "`python -m calibration.harness` times GEMMs, copies, attention and whole layers on "
        "the user's GPU and `kvsim calibrate fit` turns the CSV into a profile "
        "(`calibration/README.md`). No GPU was lent to this task, so there are no H200 "
        "measurements here; the CPU path (tiny shapes, Triton interpreter) is exercised by "
        "`tests/test_harness.py`.",
        "",
        "",
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    return out
