"""`kvsim report --fast`: every known-result report runs and its key numbers hold.

The reports run once per session (module fixture) into a temporary folder; each
test then reads one report's simulated numbers. Full-size numbers are in the
committed reports/ (regenerated with `kvsim report`).
"""

import re
from pathlib import Path

import numpy as np
import pytest

from kvsim.reports import REPORTS, Check, Report, render, run_reports


SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
# The data root of the reports on real traces (kv_offload_mooncake); without it
# that report is left out here (tests/test_report_kv_offload_mooncake.py runs it
# on a synthetic trace either way).
DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
HAVE_DATA = (DATA / "traces" / "mooncake_conversation_trace.jsonl").is_file()
NAMES = [n for n in REPORTS if HAVE_DATA or n != "kv_offload_mooncake"]


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    out = tmp_path_factory.mktemp("reports")
    done = run_reports(NAMES, out, fast=True, scenarios=SCENARIOS, data=DATA)
    return out, {r.name: r for r in done}


def test_every_report_writes_markdown_with_verdict_figure_and_command(reports):
    out, done = reports
    assert set(done) == set(NAMES)
    for name, rep in done.items():
        text = (out / f"{name}.md").read_text()
        assert f"**Verdict: {rep.verdict}**" in text
        assert f"kvsim report {name}" in text
        figure = out / "figures" / f"{name}.png"
        assert figure.stat().st_size < 200_000         # small enough to commit
        from matplotlib.image import imread
        image = imread(figure)                          # a PNG, drawn: many colours, not a blank
        assert image.ndim == 3 and len(np.unique(image.reshape(-1, image.shape[2]), axis=0)) > 10
        assert f"](figures/{name}.png)" in text


def test_index_lists_every_report_with_its_verdict(reports):
    out, done = reports
    index = (out / "README.md").read_text()
    for name, rep in done.items():
        assert re.search(rf"\| \[{name}\]\({name}\.md\) \| .* \| {re.escape(rep.verdict)} \|", index)


def test_static_batch_uses_260_of_600_slot_steps(reports):
    n = reports[1]["static_vs_continuous"].numbers
    assert (n["used_slot_steps"], n["slot_steps"]) == (260, 600)


def test_static_returns_the_10_token_request_at_step_200_continuous_at_10(reports):
    finish = reports[1]["static_vs_continuous"].numbers["finish"]
    assert finish["static"] == {10: 200.0, 50: 200.0, 200: 200.0}
    assert finish["continuous"] == {10: 10.0, 50: 50.0, 200: 200.0}
    assert finish["chunked"][10] == 10.0


def test_continuous_has_lower_normalized_latency_than_static_at_every_rate(reports):
    curves = reports[1]["static_vs_continuous"].numbers["curves"]
    by = curves.pivot(index="rate", columns="scheduler", values="normalized_latency_s")
    assert (by["continuous"] < by["static"]).all()


def test_prefix_hit_shares_125_of_131_blocks_and_prefills_100_tokens(reports):
    n = reports[1]["prefix_caching"].numbers
    assert (n["full_blocks"], n["shared_blocks"], n["prefilled"]) == (131, 125, 100)


def test_prefix_caching_cuts_ttft_many_fold_and_costs_nothing_without_sharing(reports):
    n = reports[1]["prefix_caching"].numbers
    assert n["ttft_factor"] >= 3
    assert abs(n["no_prefix_throughput_change"]) <= 0.01


def test_decode_itl_rises_with_chunk_size(reports):
    df = reports[1]["chunk_size_itl"].numbers["table"]
    assert np.all(np.diff(df["max_itl_ms"]) > 0)
    assert np.all(np.diff(df["p99_itl_ms"]) > 0)


def test_long_prompt_ttft_falls_with_chunk_size(reports):
    df = reports[1]["chunk_size_itl"].numbers["table"]
    assert np.all(np.diff(df["mean_ttft_long_ms"]) < 0)


def test_preemptions_appear_only_past_kv_capacity(reports):
    n = reports[1]["kv_pressure"].numbers
    df = n["table"]
    assert (df.loc[df["concurrency"] <= n["fit"], "num_preemptions"] == 0).all()
    assert (df.loc[df["concurrency"] > n["fit"], "num_preemptions"] > 0).all()
    assert n["ttft_factor"] >= 3


def test_paged_holds_tokens_in_most_of_its_memory_and_fits_about_8x(reports):
    n = reports[1]["paged_vs_contiguous"].numbers
    assert n["share"]["paged"] > 0.95
    assert n["share"]["Max"] < n["share"]["Pow2"] < n["share"]["Oracle"] < n["share"]["paged"]
    assert 6 <= n["times"] <= 10


def test_sharing_savings_fall_in_the_stated_bands(reports):
    # The report's tolerance: the vLLM paper's Fig. 15 endpoints +- 5 points.
    from kvsim.reports.sharing import PAPER_SAVING, SHARING_TOLERANCE
    df = reports[1]["sharing"].numbers["table"].set_index(["mode", "width"])["saving"]
    (par_lo, par_hi), (beam_lo, _) = PAPER_SAVING["parallel"], PAPER_SAVING["beam"]
    assert abs(df["parallel", 2] - par_lo) <= SHARING_TOLERANCE
    assert abs(df["parallel", 6] - par_hi) <= SHARING_TOLERANCE
    assert abs(df["beam", 2] - beam_lo) <= SHARING_TOLERANCE
    # Beams share more as the beam grows, and always more than parallel samples.
    assert df["beam", 2] < df["beam", 4] < df["beam", 6]
    assert all(df["beam", w] > df["parallel", w] for w in (2, 4, 6))


def test_static_wastes_slots_and_continuous_has_worst_tail_itl_on_azure(reports):
    n = reports[1]["schedulers_azure"].numbers
    assert n["slot_utilization"] < 0.9
    p99 = n["table"].set_index("scheduler")["p99_itl_ms"]
    assert p99.idxmax() == "continuous"
    assert p99["chunked"] < p99["continuous"]


def test_quickstart_serves_every_request(reports):
    s = reports[1]["quickstart"].numbers["summary"]
    assert s["completed"] == 30 and s["failed"] == 0


def test_verdict_names_every_failed_check():
    rep = Report("x", "X", "claim", "src", [Check("a", "1", "1", True, "exact"),
                                            Check("b", "2", "3", False, "exact")], "kvsim report x")
    assert rep.verdict == "differs: b"
    assert "**Verdict: differs: b**" in render(rep)


def test_unknown_report_name_is_a_user_error(tmp_path):
    with pytest.raises(ValueError, match="report 'nope' does not exist; allowed: static_vs_continuous"):
        run_reports(["nope"], tmp_path)


def test_cli_rejects_an_unknown_report_with_exit_status_2(capsys, tmp_path):
    from kvsim.cli import main
    assert main(["report", "nope", "--out", str(tmp_path)]) == 2
    assert "report 'nope' does not exist" in capsys.readouterr().err


def test_reports_find_their_scenarios_through_the_scenarios_option_from_any_folder(tmp_path, monkeypatch):
    from kvsim.cli import main
    monkeypatch.chdir(tmp_path)
    assert main(["report", "quickstart", "--fast", "--out", "r", "--scenarios", str(SCENARIOS)]) == 0
    assert "**Verdict: agrees**" in (tmp_path / "r" / "quickstart.md").read_text()


def test_a_folder_without_the_report_scenarios_is_one_line_naming_it(tmp_path, monkeypatch, capsys):
    from kvsim.cli import main
    monkeypatch.chdir(tmp_path)           # no scenarios/ here: the default does not resolve
    assert main(["report", "quickstart", "--fast", "--out", "r"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("kvsim report: error: --scenarios scenarios: no quickstart.yaml there; give the "
                   "folder of the report scenarios (the repository's scenarios/) with --scenarios DIR")
    assert not (tmp_path / "r").exists()


def test_radix_hits_only_the_partial_block_tails_more_than_the_hash_cache(reports):
    n = reports[1]["radix_vs_hash"].numbers
    assert n["hash_partial_tokens"] == 0
    assert n["multi_turn_extra_hits"] == n["multi_turn_partial_tokens"] > 0
    assert 0 < n["multi_turn_gain"] < 0.05 and 0 < n["shared_prefix_gain"] < 0.05
    assert n["same_step"] == {"hash": 1024, "radix": 0}
    rates = n["hit_rate"]
    assert rates["n=4 | radix"] < rates["n=4 | hash"]
    assert rates["multi-turn | off"] == 0.0
def test_fleet_hit_rate_falls_under_round_robin_and_recovers_under_prefix_aware(reports):
    n = reports[1]["fleet_routing"].numbers["hit_rate"]
    for workload in ("shared system prompts", "multi-turn chat"):
        rr, pa = n[workload]["round_robin"], n[workload]["prefix_aware"]
        assert rr[1] > rr[4] > rr[16]
        assert pa[16] >= pa[1] - 0.03 and pa[16] > 2 * rr[16]
    small = n["small cache"]
    assert small["prefix_aware"][16] > small["prefix_aware"][1] + 0.2     # the fleet's caches add up


def test_a_cpu_tier_that_holds_the_conversations_halves_the_median_ttft(reports):
    n = reports[1]["kv_offload"].numbers
    assert n["ttft_gain"] > 0.3
    rows = {r["run"]: r for r in n["rows"]}
    assert rows["GPU only"]["cpu_hit_rate"] == 0.0
    assert rows["CPU 64 GiB"]["cpu_hit_rate"] > 5 * rows["CPU 4 GiB"]["cpu_hit_rate"]
    assert abs(n["load_time_s"] - n["expected_load_time_s"]) < 1e-9


def test_a_shared_store_gives_round_robin_replicas_back_the_turns_they_never_saw(reports):
    n = reports[1]["kv_offload"].numbers
    assert n["fleet_rr_store_gain"] > 0.1
    assert abs(n["fleet_pa_store_gain"]) < n["fleet_rr_store_gain"]


def test_pd_goodput_tables_have_the_columns_they_claim(reports):
    from kvsim.reports.pd_goodput import BASELINE, PD, WORKLOADS
    out, done = reports
    text = (out / "pd_goodput.md").read_text()
    assert "| workload | system | goodput_per_gpu | vs_colocated_vllm |" in text
    assert ("| workload | system | rate_per_gpu | attainment | ttft_ok | tpot_ok | p90_ttft_ms "
            "| p90_tpot_ms | attainment_p_token |") in text
    assert "| system | requests | rate | measured | simulated | with_ray_overhead |" in text
    n = done["pd_goodput"].numbers
    for workload, w in WORKLOADS.items():
        g = n["goodput_per_gpu"][workload]
        assert set(g) == {BASELINE, PD}                   # --fast: the two checked systems
        assert all(0.0 <= v <= max(w["rates"]) for v in g.values())
        assert f"| {workload} | {PD} |" in text
    assert {p["system"] for p in n["measured_points"]} == {"vLLM v0, 1 GPU", "DistServe, 2+1 GPUs"}


def test_pd_goodput_is_distserves_interpolated_crossing_of_90_percent():
    from kvsim.reports.pd_goodput import goodput
    # crossing between 2.0 (95%) and 3.0 (85%): 2.0 + (0.90 - 0.95) * 1.0 / (0.85 - 0.95) = 2.5
    assert goodput([1.0, 2.0, 3.0], [1.0, 0.95, 0.85]) == pytest.approx(2.5, abs=1e-12)
    assert goodput([1.0, 2.0], [0.95, 0.91]) == 2.0          # never below 90%: the highest rate
    assert goodput([1.0, 2.0], [0.80, 0.70]) == 0.0          # below at the lowest rate


@pytest.mark.skipif(not HAVE_DATA, reason="no ../shared/data/traces/mooncake_conversation_trace.jsonl")
def test_on_the_mooncake_trace_a_large_cpu_tier_lowers_ttft_and_raises_saturated_throughput(reports):
    n = reports[1]["kv_offload_mooncake"].numbers
    rows = {r["run"]: r for r in n["rows"]}
    assert rows["GPU only"]["tier_hit_rate"] == 0.0
    assert rows["CPU 1024 GiB"]["tier_hit_rate"] > rows["CPU 256 GiB"]["tier_hit_rate"]
    assert rows["CPU 1024 GiB"]["hit_rate"] <= n["bound"]["hit_rate"]
    assert n["ttft_gain"] > 0 and n["throughput_gain"] > 0
