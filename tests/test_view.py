"""``kvsim view``: one self-contained HTML page, checked in a real headless browser.

The browser checks use Debian's ``chromium`` (``.ci/run`` installs it); they
skip, saying so, only where it is not installed.
"""

import re
import shutil
import subprocess

import numpy as np
import pandas as pd
import pytest
from matplotlib.image import imread

from kvsim.cli import main
from kvsim.scenario.simulate import simulate
from kvsim.view import render_view
from kvsim.vllm_outputs import write_vllm_outputs

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium not installed (apt-get install -y chromium; .ci/run installs it)")

SCENARIO = {"name": "view-run", "model": "llama-3.1-8b", "engine": {"max_model_len": 2048},
            "cost_model": {"type": "roofline"},
            "workload": {"num_requests": 60, "arrival": {"type": "poisson", "rate": 10.0},
                         "prompt_len": {"type": "uniform", "low": 50, "high": 500},
                         "output_len": {"type": "fixed", "value": 30},
                         "prefix": {"shared_prompt_tokens": 64, "num_groups": 2}}}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    result = simulate(SCENARIO)
    result.write(out)
    write_vllm_outputs(result, out)
    return out


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    rows = [{"point_id": i, "repeat": 0, "seed": 0, "scenario": "view-sweep",
             "engine.max_num_seqs": seqs, "completed": 100, "request_throughput": 1.0 + i,
             "request_goodput": [0.5, 2.0, 1.0][i], "total_token_throughput": 1000.0 * (i + 1),
             "output_throughput": 100.0 * (i + 1), "median_ttft_ms": 50.0 + i, "p99_ttft_ms": 90.0 + 10 * i,
             "median_itl_ms": 10.0 + i, "p99_itl_ms": 20.0 + 5 * i, "median_tpot_ms": 10.0 + 5 * i,
             "status": "ok", "error": "", "wall_time_s": 0.1}
            for i, seqs in enumerate((8, 64, 512))]
    pd.DataFrame(rows).to_csv(out / "results.csv", index=False)
    return out


@pytest.fixture(scope="module")
def plan_dir(tmp_path_factory):
    """A fleet plan's folder as kvsim/plan/output.py writes it (plan.csv, plan.png, runs/)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kvsim.plan.fleet import FLEET_COLUMNS

    out = tmp_path_factory.mktemp("plan")
    rows = [{c: None for c in FLEET_COLUMNS} | {"candidate": "h100-sxm tp1", "gpu": "h100-sxm", "tp": 1,
                                               "router": router, "status": "ok", "replicas": n,
                                               "num_gpus": n, "prefix_cache_hit_rate": hit,
                                               "binding": "p99_ttft_ms", "detail": "2100 > 2000"}
            for router, n, hit in (("round_robin", 6, 0.2), ("prefix_aware", 4, 0.7))]
    rows.append({c: None for c in FLEET_COLUMNS} | {"candidate": "l4 tp1", "router": "round_robin",
                                                   "status": "infeasible", "detail": "over 64 replicas"})
    pd.DataFrame(rows, columns=FLEET_COLUMNS).to_csv(out / "plan.csv", index=False)
    fig, ax = plt.subplots()
    ax.bar([0, 1], [6, 4], color=["tab:blue", "tab:orange"])
    fig.savefig(out / "plan.png")
    (out / "runs").mkdir()
    (out / "runs" / "h100-sxm_tp1_prefix_aware.yaml").write_text("name: x\n")
    return out


def browse(page_path, tmp_path, *args):
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
    done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                           "--no-first-run", "--disable-background-networking",
                           "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
                           *args, page_path.as_uri()], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_a_run_page_has_the_summary_and_every_figure_inline(run_dir):
    page = render_view(run_dir)
    assert "<h1>kvsim run: view-run</h1>" in page
    assert re.search(r'<td class="key">completed</td><td>60</td>', page)
    images = re.findall(r'<img alt="([^"]*)" src="data:image/png;base64,', page)
    assert images == ["view-run: KV cache and queues over time", "view-run: Prefill and decode tokens per step",
                      "view-run: prefix_cache_hits / prefix_cache_queries per scrape interval"]


def test_the_page_fetches_nothing(run_dir, sweep_dir):
    for folder in (run_dir, sweep_dir):
        page = render_view(folder)
        assert "default-src 'none'" in page
        assert not re.search(r"""(src|href)=["'](?!data:)""", page)
        assert "<link" not in page and "<script" not in page


def test_a_sweep_page_names_the_best_point_for_each_goal(sweep_dir):
    page = render_view(sweep_dir)
    section = page.split("<h2>Best points</h2>")[1].split("<h2>")[0]
    rows = [re.findall(r"<t[dh]>([^<]*)</t[dh]>", row) for row in re.findall(r"<tr>(.*?)</tr>", section)]
    assert rows == [["goal", "metric", "value", "engine.max_num_seqs"],
                    ["highest goodput", "request_goodput", "2", "64"],
                    ["highest total throughput", "total_token_throughput", "3,000", "512"],
                    ["lowest p99 TTFT", "p99_ttft_ms", "90", "8"], ["lowest p99 ITL", "p99_itl_ms", "20", "8"]]
    assert "Throughput per GPU against tokens/s per user" in page


def test_a_plan_page_shows_the_fewest_gpus_the_figure_and_the_runs(plan_dir):
    page = render_view(plan_dir)
    assert f"<h1>kvsim plan: {plan_dir.name}</h1>" in page
    assert "3 candidate x router rows, 2 meet the SLOs" in page
    section = page.split("<h2>Fewest GPUs</h2>")[1].split("<h2>")[0]
    rows = [re.findall(r"<t[dh]>([^<]*)</t[dh]>", row) for row in re.findall(r"<tr>(.*?)</tr>", section)]
    assert rows[1][:4] == ["h100-sxm tp1", "prefix_aware", "4", "4"] and len(rows) == 2
    assert re.findall(r'<img alt="([^"]*)" src="data:image/png;base64,', page) == ["plan.png"]
    assert "kvsim run " + str(plan_dir / "runs" / "h100-sxm_tp1_prefix_aware.yaml") in page
    assert not re.search(r"""(src|href)=["'](?!data:)""", page)


def test_kvsim_view_writes_index_html_and_prints_its_path(run_dir, capsys):
    assert main(["view", str(run_dir)]) == 0
    assert capsys.readouterr().out.strip() == str(run_dir / "index.html")


def test_a_folder_with_nothing_to_show_is_one_line(tmp_path, capsys):
    assert main(["view", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"kvsim view: error: {tmp_path}: neither a run folder") and "\n" not in err


@needs_chromium
@pytest.mark.parametrize("which", ["run", "sweep", "plan"])
def test_chromium_shows_the_tables_and_decodes_every_image(which, run_dir, sweep_dir, plan_dir, tmp_path):
    folder = {"run": run_dir, "sweep": sweep_dir, "plan": plan_dir}[which]
    page = tmp_path / "index.html"
    page.write_text(render_view(folder))
    dom = browse(page, tmp_path, "--dump-dom")
    assert dom.count("<table") >= (4 if which == "run" else 2)
    images = re.findall(r"<img [^>]*>", dom)
    assert images and all('data-loaded="1"' in img for img in images)   # each image's onload ran


@needs_chromium
def test_chromium_paints_the_figures(run_dir, tmp_path):
    page = tmp_path / "index.html"
    page.write_text(render_view(run_dir))
    shot = tmp_path / "shot.png"
    browse(page, tmp_path, f"--screenshot={shot}", "--window-size=1200,4000")
    pixels = (imread(shot)[..., :3] * 255).astype(int)
    # Matplotlib's tab:blue and tab:orange appear only inside the figures (the CSS is grey).
    for rgb in ((31, 119, 180), (255, 127, 14)):
        assert (np.abs(pixels - rgb).sum(axis=-1) < 30).sum() > 200, rgb
