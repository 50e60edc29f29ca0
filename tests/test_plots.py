"""Every plot renders headless to PNG and SVG, is labelled, and names missing columns."""

import io
import json

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from kvsim import plots, plots_serving
from kvsim.cli import main
from kvsim.metrics.schema import STEP_COLUMNS


def sweep_results() -> pd.DataFrame:
    rows = []
    for scheduler in ("continuous", "chunked"):
        for budget in (512, 2048, 8192):
            for rate in (1.0, 4.0, 16.0):
                slow = 1 + (scheduler == "continuous")
                rows.append({
                    "engine.scheduler": scheduler,
                    "engine.max_num_batched_tokens": budget,
                    "workload.arrival.rate": rate,
                    "median_itl_ms": 10 + budget / 1000 * slow,
                    "p99_itl_ms": 20 + budget / 200 * slow,
                    "median_ttft_ms": 100 + 1e5 / budget + rate ** 3,
                    "p99_ttft_ms": 300 + 3e5 / budget + 10 * rate ** 3,
                    "median_tpot_ms": 12 + rate * slow,
                    "p99_tpot_ms": 25 + 2 * rate * slow,
                    "mean_tpot_ms": 13 + rate * slow,
                    "output_throughput": 100 * rate / slow,
                    "total_token_throughput": 500 * rate / slow,
                })
    return pd.DataFrame(rows)


def run_steps(n: int = 200) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    duration = rng.uniform(0.01, 0.05, n)
    prefill = np.where(rng.random(n) < 0.2, rng.integers(100, 2048, n), 0)
    decode = rng.integers(0, 64, n)
    return pd.DataFrame({
        "step": np.arange(n), "start_time_s": np.cumsum(duration) - duration,
        "duration_s": duration, "num_prefill_tokens": prefill, "num_decode_tokens": decode,
        "num_scheduled_reqs": decode + (prefill > 0), "num_running": decode,
        "num_waiting": rng.integers(0, 30, n), "num_preempted": (rng.random(n) < 0.05) * 2,
        "num_finished": 0, "num_free_blocks": rng.integers(0, 100, n),
        "kv_cache_usage": rng.uniform(0, 1, n),
    }, columns=STEP_COLUMNS)


def memory_table() -> pd.DataFrame:
    gib = 2**30
    return pd.DataFrame({
        "system": ["contiguous", "paged"],
        "used_bytes": [10 * gib, 30 * gib],
        "reserved_unused_bytes": [25 * gib, 0],
        "internal_fragmentation_bytes": [0, gib // 4],
        "external_fragmentation_bytes": [5 * gib, 0],
        "free_bytes": [0, 9.75 * gib],
    })


FIGURES = {
    "tradeoff": lambda: plots.tradeoff(sweep_results().query("`workload.arrival.rate` == 4"),
                                       "engine.max_num_batched_tokens", title="chat-8b"),
    "latency-throughput": lambda: plots.latency_throughput(
        sweep_results().query("`engine.max_num_batched_tokens` == 2048"), title="chat-8b"),
    "kv-timeline": lambda: plots.kv_timeline(run_steps(), "chat-8b"),
    "batch-timeline": lambda: plots.batch_timeline(run_steps(), "chat-8b", token_budget=2048),
    "memory-waste": lambda: plots.memory_waste(memory_table(), "chat-8b"),
    "throughput-interactivity": lambda: plots_serving.throughput_interactivity(
        sweep_results().query("`engine.max_num_batched_tokens` == 2048"), group="engine.scheduler",
        title="chat-8b"),
    "cost": lambda: plots_serving.cost_per_million_tokens(
        sweep_results().query("`engine.max_num_batched_tokens` == 2048"), gpu_hour_usd=2.0,
        title="chat-8b"),
}


@pytest.mark.parametrize("kind", plots.KINDS)
@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_plot_renders_headless_to_a_non_empty_file(kind, suffix, tmp_path):
    fig = FIGURES[kind]()
    path = tmp_path / f"{kind}{suffix}"
    fig.savefig(path, dpi=50)
    assert path.stat().st_size > 1000
    head = path.read_bytes()[:200]
    assert head.startswith(b"\x89PNG") if suffix == ".png" else b"<svg" in path.read_bytes()[:2000]


@pytest.mark.parametrize("kind", plots.KINDS)
def test_plot_has_labelled_axes_and_a_title_naming_the_scenario(kind):
    fig = FIGURES[kind]()
    assert isinstance(fig, Figure)
    assert "chat-8b" in fig.get_suptitle()
    for ax in fig.axes:
        assert ax.get_ylabel(), ax
        assert ax.has_data(), ax
    assert any(ax.get_xlabel() for ax in fig.axes)


@pytest.mark.parametrize("kind", plots.KINDS)
def test_plot_y_axis_names_its_unit(kind):
    fig = FIGURES[kind]()
    units = ("(ms)", "(%)", "(GiB)", "Tokens", "Requests", "Preemptions", "($)")
    for ax in fig.axes:
        assert any(u in ax.get_ylabel() for u in units), ax.get_ylabel()


def test_tradeoff_draws_p50_and_p99_of_itl_and_ttft_against_the_knob():
    fig = FIGURES["tradeoff"]()
    ax_itl, ax_ttft = fig.axes
    assert ax_itl.get_xlabel() == "max_num_batched_tokens"
    assert ax_itl.get_ylabel() == "Inter-token latency (ms)"
    assert ax_ttft.get_ylabel() == "Time to first token (ms)"
    # two schedulers vary in these rows -> p50 and p99 lines for each
    labels = [line.get_label() for line in ax_itl.get_lines()]
    assert labels == ["scheduler=chunked p50", "scheduler=chunked p99",
                      "scheduler=continuous p50", "scheduler=continuous p99"]
    xs, ys = ax_itl.get_lines()[1].get_data()
    assert list(xs) == [512, 2048, 8192]
    assert list(ys) == [20 + 512 / 200, 20 + 2048 / 200, 20 + 8192 / 200]


def test_latency_throughput_draws_one_pair_of_lines_per_policy():
    fig = FIGURES["latency-throughput"]()
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    assert labels == ["chunked p50", "chunked p99", "continuous p50", "continuous p99"]
    assert fig.axes[0].get_xlabel() == "Request rate (req/s)"


def test_latency_throughput_switches_ttft_to_log_scale_past_a_knee():
    results = sweep_results().query("`engine.max_num_batched_tokens` == 2048").copy()
    assert plots.latency_throughput(results).axes[0].get_yscale() == "linear"
    results.loc[results["workload.arrival.rate"] == 16.0, "p99_ttft_ms"] = 1e6
    assert plots.latency_throughput(results).axes[0].get_yscale() == "log"


def test_batch_timeline_stacks_prefill_on_decode():
    steps = run_steps(3).assign(num_prefill_tokens=[0, 100, 0], num_decode_tokens=[5, 5, 5])
    ax = plots.batch_timeline(steps).axes[0]
    prefill_band = ax.collections[1].get_paths()[0].vertices
    assert prefill_band[:, 1].max() == 105


def test_kv_timeline_counts_preemptions():
    steps = run_steps(10).assign(num_preempted=[0, 1, 0, 0, 3, 0, 0, 0, 0, 0])
    fig = plots.kv_timeline(steps)
    assert fig.axes[2].get_title() == "4 preemptions in total"


def test_memory_waste_reports_waste_share_of_the_bytes_not_free():
    ax = plots.memory_waste(memory_table()).axes[0]
    assert [t.get_text() for t in ax.texts] == ["75% waste", "1% waste"]
    assert ax.get_ylabel() == "KV memory (GiB)"


@pytest.mark.parametrize("call, message", [
    (lambda: plots.tradeoff(sweep_results().drop(columns="p99_itl_ms"),
                            "engine.max_num_batched_tokens"),
     "plot 'tradeoff' needs column(s) p99_itl_ms in results.csv; present: engine.scheduler"),
    (lambda: plots.tradeoff(sweep_results(), "engine.block_size"),
     "plot 'tradeoff' needs column(s) engine.block_size in results.csv"),
    (lambda: plots.latency_throughput(sweep_results().drop(columns=["median_tpot_ms",
                                                                    "p99_tpot_ms"])),
     "plot 'latency-throughput' needs column(s) median_tpot_ms, p99_tpot_ms in results.csv"),
    (lambda: plots.kv_timeline(run_steps().drop(columns="kv_cache_usage")),
     "plot 'kv-timeline' needs column(s) kv_cache_usage in steps.csv"),
    (lambda: plots.batch_timeline(run_steps().drop(columns="num_prefill_tokens")),
     "plot 'batch-timeline' needs column(s) num_prefill_tokens in steps.csv"),
    (lambda: plots.memory_waste(memory_table().drop(columns="external_fragmentation_bytes")),
     "plot 'memory-waste' needs column(s) external_fragmentation_bytes"),
])
def test_missing_columns_are_named(call, message):
    with pytest.raises(ValueError) as err:
        call()
    assert str(err.value).startswith(message)


def test_empty_table_is_an_error():
    with pytest.raises(ValueError, match="steps.csv has no rows"):
        plots.kv_timeline(run_steps().iloc[:0])


# --- kvsim plot -------------------------------------------------------------------


CLI_DPI = 120       # what `kvsim plot` saves at


def pixels(source) -> np.ndarray:
    """RGBA pixels of a PNG file, or of a figure saved as `kvsim plot` saves it."""
    from matplotlib.image import imread
    if isinstance(source, Figure):
        buf = io.BytesIO()
        source.savefig(buf, format="png", dpi=CLI_DPI)
        buf.seek(0)
        return imread(buf, format="png")
    return imread(source)


def assert_draws(path, figure, other_figure) -> None:
    """The PNG at ``path`` is ``figure`` pixel for pixel, at the figure's size, and
    ``other_figure`` (the same plot of other data) looks different."""
    image = pixels(path)
    width, height = figure.get_size_inches() * CLI_DPI
    assert image.shape == (round(height), round(width), 4)
    assert np.array_equal(image, pixels(figure))
    assert not np.array_equal(image, pixels(other_figure))


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    run_steps().to_csv(d / "steps.csv", index=False)
    (d / "summary.json").write_text(json.dumps({"scenario": "chat-8b", "completed": 3}))
    return d


def test_cli_draws_a_run_plot_next_to_the_run(run_dir, capsys):
    assert main(["plot", "kv-timeline", "--run", str(run_dir)]) == 0
    out = run_dir / "kv-timeline.png"
    assert capsys.readouterr().out.strip() == str(out)
    steps = pd.read_csv(run_dir / "steps.csv")
    # the run's own steps, titled with the scenario of its summary.json
    assert_draws(out, plots.kv_timeline(steps, "chat-8b"),
                 plots.kv_timeline(steps.assign(kv_cache_usage=steps["kv_cache_usage"][::-1].to_numpy()),
                                   "chat-8b"))


def test_cli_writes_svg_when_asked(run_dir, tmp_path):
    out = tmp_path / "figs" / "batch.svg"
    assert main(["plot", "batch-timeline", "--run", str(run_dir), "--out", str(out)]) == 0
    assert b"<svg" in out.read_bytes()[:2000]


def test_cli_infers_the_swept_column_for_tradeoff(tmp_path):
    results = tmp_path / "results.csv"
    sweep_results().query("`workload.arrival.rate` == 4 and `engine.scheduler` == 'chunked'") \
        .to_csv(results, index=False)
    assert main(["plot", "tradeoff", "--results", str(results), "--title", "w1"]) == 0
    table = pd.read_csv(results)
    # the only swept column that varies is the x axis (not the arrival rate, fixed here)
    assert_draws(tmp_path / "tradeoff.png", plots.tradeoff(table, "engine.max_num_batched_tokens", title="w1"),
                 plots.tradeoff(table.assign(p99_itl_ms=table["p99_itl_ms"] * 2),
                                "engine.max_num_batched_tokens", title="w1"))


def test_cli_asks_for_x_when_several_parameters_vary(tmp_path, capsys):
    results = tmp_path / "results.csv"
    sweep_results().to_csv(results, index=False)
    assert main(["plot", "tradeoff", "--results", str(results)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvsim plot: error: plot 'tradeoff': several swept parameters vary")
    assert len(err.splitlines()) == 1


def test_cli_latency_throughput_and_memory_waste(tmp_path):
    results = tmp_path / "results.csv"
    sweep_results().query("`engine.max_num_batched_tokens` == 2048").to_csv(results, index=False)
    assert main(["plot", "latency-throughput", "--results", str(results)]) == 0
    memory = tmp_path / "memory.csv"
    memory_table().to_csv(memory, index=False)
    assert main(["plot", "memory-waste", "--results", str(memory),
                 "--out", str(tmp_path / "m.png")]) == 0
    table = pd.read_csv(memory)
    title = tmp_path.name          # no scenario column: the folder's name
    assert_draws(tmp_path / "m.png", plots.memory_waste(table, title),
                 plots.memory_waste(table.iloc[::-1].reset_index(drop=True), title))
    sweep = pd.read_csv(results)
    assert_draws(tmp_path / "latency-throughput.png",
                 plots.latency_throughput(sweep, "workload.arrival.rate", "engine.scheduler", title=title),
                 plots.latency_throughput(sweep.assign(p99_ttft_ms=sweep["p99_ttft_ms"] * 3),
                                          "workload.arrival.rate", "engine.scheduler", title=title))


@pytest.mark.parametrize("argv, message", [
    (["plot", "tradeoff", "--run", "RUN"], "reads a sweep's results.csv: pass --results"),
    (["plot", "kv-timeline", "--results", "RUN/steps.csv"], "reads a run folder: pass --run"),
    (["plot", "kv-timeline", "--run", "RUN", "--out", "x.pdf"], "must end in .png or .svg"),
    (["plot", "kv-timeline", "--run", "NOWHERE"], "steps.csv: no such file"),
])
def test_cli_bad_input_exits_2_with_one_line(argv, message, run_dir, capsys):
    argv = [a.replace("RUN", str(run_dir)) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err
    assert len(err.splitlines()) == 1


def test_cli_missing_column_exits_2(run_dir, capsys):
    run_steps().drop(columns="num_waiting").to_csv(run_dir / "steps.csv", index=False)
    assert main(["plot", "kv-timeline", "--run", str(run_dir)]) == 2
    assert "needs column(s) num_waiting in steps.csv" in capsys.readouterr().err


def test_tradeoff_averages_repeats_and_skips_failed_points():
    base = sweep_results().query("`workload.arrival.rate` == 4 and `engine.scheduler` == 'chunked'")
    again = base.assign(p99_itl_ms=base["p99_itl_ms"] + 10, seed=1)
    failed = base.iloc[:1].assign(p99_itl_ms=np.nan, seed=2, status="failed")
    results = pd.concat([base.assign(seed=0), again, failed], ignore_index=True)
    ax_itl = plots.tradeoff(results, "engine.max_num_batched_tokens").axes[0]
    xs, ys = ax_itl.get_lines()[1].get_data()
    assert list(xs) == [512, 2048, 8192]
    assert list(ys) == pytest.approx([25 + 512 / 200, 25 + 2048 / 200, 25 + 8192 / 200])


def test_batch_timeline_averages_groups_of_steps_for_long_runs():
    steps = run_steps(10).assign(num_prefill_tokens=[0, 100] * 5, num_decode_tokens=[4] * 10)
    ax = plots.batch_timeline(steps, max_bins=5).axes[0]
    prefill_band = ax.collections[1].get_paths()[0].vertices
    assert prefill_band[:, 1].max() == 54   # 4 decode + mean(0, 100) prefill
    assert ax.get_ylabel() == "Tokens per step (mean of 2 steps)"
    assert ax.get_xlim() == (0.0, 10.0)


def test_cli_steps_selects_a_range_of_steps(run_dir, tmp_path):
    out = tmp_path / "zoom.png"
    assert main(["plot", "batch-timeline", "--run", str(run_dir), "--steps", "50:80",
                 "--out", str(out)]) == 0
    steps = pd.read_csv(run_dir / "steps.csv")
    # steps 50..79 (END excluded), not the whole run
    assert_draws(out, plots.batch_timeline(steps.iloc[50:80], "chat-8b"),
                 plots.batch_timeline(steps, "chat-8b"))


@pytest.mark.parametrize("spec, message", [
    ("50", "expected START:END with integers"),
    ("a:b", "expected START:END with integers"),
    ("5000:", "no step in that range (steps.csv has steps 0..199)"),
])
def test_cli_bad_steps_range_exits_2(spec, message, run_dir, capsys):
    assert main(["plot", "kv-timeline", "--run", str(run_dir), "--steps", spec]) == 2
    assert message in capsys.readouterr().err


def test_cli_titles_a_sweep_plot_with_its_scenario_column(tmp_path, monkeypatch):
    results = tmp_path / "results.csv"
    sweep_results().query("`engine.max_num_batched_tokens` == 2048") \
        .assign(scenario="rate-sweep").to_csv(results, index=False)
    titles = []
    monkeypatch.setattr(plots, "latency_throughput",
                        lambda *a, **k: titles.append(k["title"]) or Figure())
    assert main(["plot", "latency-throughput", "--results", str(results)]) == 0
    assert titles == ["rate-sweep"]


def test_memory_waste_plots_the_allocators_own_usage_records():
    import dataclasses

    from kvsim.kv.contiguous import ContiguousAllocator, paged_usage

    contiguous = ContiguousAllocator(capacity_tokens=8192, bytes_per_token=128 * 1024)
    for i, used in enumerate([300, 900, 150]):
        contiguous.allocate(i, 2048)
        contiguous.set_used(i, used)
    contiguous.free(1)
    rows = [dataclasses.asdict(contiguous.usage(next_request_tokens=4096)) | {"system": "contiguous"},
            dataclasses.asdict(paged_usage([300, 150], block_size=16, bytes_per_token=128 * 1024,
                                           total_blocks=512)) | {"system": "paged"}]
    ax = plots.memory_waste(pd.DataFrame(rows), "teaching").axes[0]
    # contiguous: 450 tokens used, 3646 reserved, both 2048-token gaps too small
    # for a 4096-token request -> (3646 + 4096) / 8192 = 94.5 % waste.
    # paged: 29 blocks = 464 slots hold 450 tokens -> 14 / 464 = 3.0 %.
    assert [t.get_text() for t in ax.texts] == ["95% waste", "3% waste"]
    assert ax.get_ylabel() == "KV memory (GiB)"


# --- serving trade-offs: what the lines show --------------------------------------------

def serving_table():
    # Four points of one policy on 2 GPUs: (median TPOT ms, total tok/s of the point).
    return pd.DataFrame({"engine.max_num_seqs": [8, 32, 128, 512],
                         "median_tpot_ms": [10.0, 20.0, 50.0, 40.0],
                         "mean_tpot_ms": [11.0, 22.0, 55.0, 44.0],
                         "total_token_throughput": [1000.0, 3000.0, 4000.0, 5000.0],
                         "output_throughput": [100.0, 300.0, 400.0, 500.0]})


def test_throughput_interactivity_plots_tokens_per_gpu_against_tokens_per_user():
    fig = plots_serving.throughput_interactivity(serving_table(), gpus=2)
    points, front = fig.axes[0].lines
    # 1000 / TPOT ms per user, sorted by it; throughput / 2 GPUs.
    assert points.get_xydata().tolist() == [[20.0, 2000.0], [25.0, 2500.0], [50.0, 1500.0], [100.0, 500.0]]
    # (20, 2000) is beaten by (25, 2500) on both axes: off the frontier.
    assert front.get_xydata().tolist() == [[25.0, 2500.0], [50.0, 1500.0], [100.0, 500.0]]


def test_gpus_per_point_can_come_from_a_column_and_output_tokens_only():
    table = serving_table().assign(**{"hardware.tp": [1, 1, 2, 4]})
    fig = plots_serving.throughput_interactivity(table, gpus="hardware.tp", tokens="output", stat="mean")
    # By tokens/s per user (1000 / mean TPOT): rows 2, 3, 1, 0; output tok/s / their GPUs.
    assert fig.axes[0].lines[0].get_xydata()[:, 1].tolist() == [200.0, 125.0, 300.0, 100.0]


def test_cost_per_million_tokens_is_gpu_price_over_tokens_per_hour():
    fig = plots_serving.cost_per_million_tokens(serving_table(), gpu_hour_usd=3.6, gpus=2)
    line = fig.axes[0].lines[0]
    # $3.6 per GPU-hour at 2000 tok/s per GPU: 3.6 / (2000 x 3600) x 10^6 = $0.5 per million.
    assert line.get_xdata().tolist() == [20.0, 25.0, 50.0, 100.0]
    assert line.get_ydata() == pytest.approx([0.5, 0.4, 2 / 3, 2.0])


def test_latency_throughput_draws_the_slo_limits():
    fig = plots.latency_throughput(sweep_results().query("`engine.max_num_batched_tokens` == 2048"),
                                   slo={"ttft_ms": 2000, "tpot_ms": 30})
    ttft_slo = [ln for ln in fig.axes[0].lines if ln.get_label() == "SLO 2000 ms"]
    tpot_slo = [ln for ln in fig.axes[1].lines if ln.get_label() == "SLO 30 ms"]
    assert [list(ln.get_ydata()) for ln in ttft_slo + tpot_slo] == [[2000, 2000], [30, 30]]


def test_cli_serving_plots(tmp_path, capsys):
    results = tmp_path / "results.csv"
    serving_table().to_csv(results, index=False)
    assert main(["plot", "throughput-interactivity", "--results", str(results), "--gpus", "2"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "throughput-interactivity.png")
    assert main(["plot", "cost", "--results", str(results)]) == 2
    assert "needs --gpu-hour-usd" in capsys.readouterr().err
    assert main(["plot", "cost", "--results", str(results), "--gpu-hour-usd", "2.5"]) == 0
    assert (tmp_path / "cost.png").stat().st_size > 1000
    assert main(["plot", "latency-throughput", "--results", str(results), "--slo", "ttft:x"]) == 2
