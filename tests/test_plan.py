"""kvsim plan: the rate search, the SLO and binding rules, and small real plans."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import yaml

from kvsim.cli import main
from kvsim.plan import (PlanError, RateBounds, binding_constraint, bisect_max_rate,
                        normalize_slo_key, parse_plan, run_plan, slo_violations, with_rate)
from kvsim.scenario import load_scenario, simulate

# A small but real configuration: Llama-3.1-8B, roofline costs, 60 short
# chat requests per probe (a probe simulates in ~0.1 s).
TINY = {
    "name": "tiny_plan",
    "seed": 0,
    "model": "llama-3.1-8b",
    "engine": {"scheduler": "chunked", "max_model_len": 2048, "max_num_batched_tokens": 512,
               "max_num_seqs": 64},
    "cost_model": {"type": "roofline"},
    "workload": {"num_requests": 60, "arrival": {"type": "poisson", "rate": 1.0},
                 "prompt_len": {"type": "lognormal", "median": 300, "sigma": 0.5, "max": 1024},
                 "output_len": {"type": "fixed", "value": 32}},
}
SLO = {"p99_ttft_ms": 500, "p99_tpot_ms": 90}


def tiny_plan(**plan_section) -> dict:
    section = {"gpus": ["l4"], "slo": SLO, "seeds": 1, "tolerance": 0.1,
               "rate": {"start": 2, "min": 0.1, "max": 256}, **plan_section}
    return {**TINY, "plan": section}


def missed(summary, slo=SLO):
    return slo_violations(summary, slo)


# --- the search on a fake monotone SLO function -------------------------------------


@pytest.mark.parametrize("threshold, start", [(7.3, 1.0), (0.31, 4.0), (100.0, 100.0)])
def test_bisection_finds_the_threshold_to_the_tolerance(threshold, start):
    bounds = RateBounds(start_req_s=start, min_req_s=0.01, max_req_s=1000, tolerance=0.02)
    search = bisect_max_rate(lambda rate: rate <= threshold, bounds)
    assert search.status == "ok"
    assert search.lo <= threshold < search.hi
    assert search.hi <= search.lo * 1.02


def test_bisection_probes_the_bracket_then_bisects_in_log_space():
    bounds = RateBounds(start_req_s=1.0, min_req_s=0.01, max_req_s=1000, tolerance=0.25)
    search = bisect_max_rate(lambda rate: rate <= 5.0, bounds)
    assert [r for r, _ in search.probes][:4] == [1.0, 2.0, 4.0, 8.0]
    assert search.probes[4] == (pytest.approx(math.sqrt(32)), False)


def test_an_slo_missed_even_at_the_minimum_rate_is_unreachable():
    bounds = RateBounds(start_req_s=1.0, min_req_s=0.1, max_req_s=10, tolerance=0.05)
    search = bisect_max_rate(lambda rate: False, bounds)
    assert search.status == "unreachable" and search.lo is None
    assert min(r for r, _ in search.probes) == 0.1


def test_an_slo_met_at_the_maximum_rate_is_capped_there():
    bounds = RateBounds(start_req_s=1.0, min_req_s=0.1, max_req_s=10, tolerance=0.05)
    search = bisect_max_rate(lambda rate: True, bounds)
    assert (search.status, search.lo, search.hi) == ("capped", 10, None)


# --- SLOs and the binding constraint ------------------------------------------------------


@pytest.mark.parametrize("key", ["p99_ttft_ms", "ttft_p99_ms", "ttft_p99", "p99_ttft"])
def test_slo_keys_are_normalised_to_summary_keys(key):
    assert normalize_slo_key(key) == "p99_ttft_ms"


def test_an_unknown_slo_key_is_refused_with_the_allowed_form():
    with pytest.raises(PlanError, match=r"plan.slo.p99_latency: not a latency percentile"):
        normalize_slo_key("p99_latency")


def test_slo_violations_name_the_metric_value_and_limit_and_count_failed_requests():
    summary = {"p99_ttft_ms": 499.0, "p99_tpot_ms": 91.25, "failed": 2}
    assert missed(summary) == ["p99_tpot_ms = 91.2 > 90", "2 request(s) failed"]
    assert missed({"p99_ttft_ms": 500.0, "p99_tpot_ms": 90.0, "failed": 0}) == []


def test_a_nan_percentile_is_a_miss():
    assert missed({"p99_ttft_ms": float("nan"), "p99_tpot_ms": 1.0}) == ["p99_ttft_ms = nan > 500"]


@pytest.mark.parametrize("facts, miss, kind", [
    ({"num_preemptions": 3, "kv_cache_usage_max": 0.7}, ["p99_ttft_ms = 900 > 500"], "kv_capacity"),
    ({"kv_cache_usage_max": 0.97}, ["p99_tpot_ms = 70 > 60"], "kv_capacity"),
    ({"kv_cache_usage_max": 0.5}, ["p99_tpot_ms = 70 > 60"], "compute"),
    ({"kv_cache_usage_max": 0.5, "plan_budget_full_fraction": 0.8}, ["p99_ttft_ms = 900 > 500"],
     "compute"),
    ({"kv_cache_usage_max": 0.5, "plan_budget_full_fraction": 0.1}, ["p99_ttft_ms = 900 > 500"],
     "ttft_queueing"),
])
def test_binding_constraint_rule(facts, miss, kind):
    assert binding_constraint(facts, miss)[0] == kind


def test_ttft_queueing_behind_full_max_num_seqs_says_so():
    facts = {"kv_cache_usage_max": 0.5, "plan_budget_full_fraction": 0.1,
             "plan_seqs_full_fraction": 0.9}
    assert "max_num_seqs full in 90% of steps" in binding_constraint(facts, ["p99_ttft_ms"])[1]


# --- the plan file ------------------------------------------------------------------------------


def test_candidates_are_the_product_of_gpus_tp_and_dtypes():
    plan = parse_plan(tiny_plan(gpus=["l4", "h100-sxm"], tp=[1, 2], kv_cache_dtype=["auto", "fp8"]))
    assert len(plan.candidates) == 8
    assert plan.candidates[1].label == "l4 tp1 kv fp8"
    assert plan.candidates[-1].label == "h100-sxm tp2 kv fp8"


def test_a_probe_sets_the_rate_and_seed_and_keeps_the_rest():
    scenario = with_rate(TINY, 3.5, seed=7)
    assert scenario["seed"] == 7 and scenario["workload"]["arrival"] == {"type": "poisson", "rate": 3.5}
    assert TINY["workload"]["arrival"]["rate"] == 1.0


@pytest.mark.parametrize("change, message", [
    ({"plan": {"gpu": ["l4"]}}, "plan.gpu: unknown key; allowed: gpus, tp"),
    ({"plan": {"slo": {}}}, "plan.slo: give at least one SLO"),
    ({"plan": {"tp": [0]}}, "plan.tp: got [0]; every degree must be >= 1"),
    ({"plan": {"slo": {"p99_tpot_ms": -1}}}, "plan.slo.p99_tpot_ms: got -1; expected a number > 0"),
    ({"plan": {"rate": {"start": 10, "max": 5}}}, "plan.rate: need min <= start <= max"),
    ({"workload": {"arrival": {"type": "all_at_once"}}},
     "workload.arrival.type: got 'all_at_once'; kvsim plan varies the request rate"),
])
def test_bad_plan_files_name_the_key_and_value(change, message):
    plan_section = change.pop("plan", {}) if "plan" in change else {}
    data = {**tiny_plan(**plan_section), **change}
    with pytest.raises(PlanError) as err:
        parse_plan(data)
    assert str(err.value).startswith(message)


# --- real plans -------------------------------------------------------------------------------------


def test_a_small_real_plan_reports_rate_goodput_replicas_and_binding():
    plan = parse_plan(tiny_plan(gpus=["l4", "a10g"], seeds=2, target_rate=10))
    rows = run_plan(plan, workers=2)
    l4, a10g = rows
    assert [l4["status"], a10g["status"]] == ["ok", "ok"]
    assert 0 < l4["max_rate_req_s"] < a10g["max_rate_req_s"]
    assert l4["max_rate_min"] <= l4["max_rate_req_s"] <= l4["max_rate_max"]
    assert a10g["goodput_req_s_per_gpu"] == a10g["max_rate_req_s"]
    assert l4["replicas"] == math.ceil(10 / l4["max_rate_min"])
    assert l4["binding"] in ("kv_capacity", "compute", "ttft_queueing")
    assert l4["seed0_fails_at_rate_req_s"] <= l4["seed0_max_rate_req_s"] * 1.1


def test_kvsim_run_meets_the_slo_at_the_reported_rate_and_misses_just_above(tmp_path):
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(yaml.safe_dump(tiny_plan(gpus=["a10g"], tolerance=0.04)))
    assert main(["plan", str(plan_file), "--out", str(tmp_path / "out"), "--workers", "1"]) == 0
    row = pd.read_csv(tmp_path / "out" / "plan.csv").iloc[0]
    rate, fails_at = row["seed0_max_rate_req_s"], row["seed0_fails_at_rate_req_s"]
    assert rate < fails_at <= rate * 1.04
    # The replay scenario is what `kvsim run` would load.
    replay = tmp_path / "out" / "runs" / "a10g_tp1.yaml"
    assert missed(simulate(load_scenario(replay)).summary) == []
    above = simulate(load_scenario(replay, overrides=[f"workload.arrival.rate={fails_at}"]))
    assert missed(above.summary) != []
    # plan.png is the goodput chart of plan.csv (write_outputs saves it at 110 dpi)
    import io

    from matplotlib.image import imread

    from kvsim import plots
    buf = io.BytesIO()
    plots.plan_goodput(pd.read_csv(tmp_path / "out" / "plan.csv"), title="tiny_plan").savefig(
        buf, format="png", dpi=110)
    buf.seek(0)
    assert np.array_equal(imread(tmp_path / "out" / "plan.png"), imread(buf, format="png"))


def test_a_model_that_does_not_fit_is_a_row_not_a_crash():
    data = tiny_plan(gpus=["l4", "h100-sxm"])
    data["model"] = "llama-3.1-70b"
    rows = run_plan(parse_plan(data), workers=1)
    assert [r["status"] for r in rows] == ["does not fit", "does not fit"]
    assert rows[0]["detail"].startswith("model/hardware:")


def test_an_slo_no_rate_can_meet_is_reported_unreachable():
    rows = run_plan(parse_plan(tiny_plan(slo={"p99_tpot_ms": 1}, rate={"start": 0.4, "min": 0.1})),
                    workers=1)
    assert rows[0]["status"] == "unreachable"
    assert rows[0]["detail"].startswith("SLO missed even at 0.1 req/s (seed 0): p99_tpot_ms = ")


def test_cli_bad_input_is_one_line_with_exit_status_2(tmp_path, capsys):
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(yaml.safe_dump(tiny_plan()))
    assert main(["plan", str(plan_file), "--slo", "p99_speed_ms=3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvsim plan: error: plan.slo.p99_speed_ms: not a latency percentile")
    assert len(err.splitlines()) == 1


def broken_probe(scenario, point_dir=None, *, base_dir=None):
    raise RuntimeError("engine invariant broken")


def test_a_probe_that_raises_is_a_row_with_the_error_not_a_crash():
    rows = run_plan(parse_plan(tiny_plan()), workers=1, probe=broken_probe)
    assert rows[0]["status"] == "error"
    assert rows[0]["detail"] == ("the probe at 2 req/s (seed 0) raised RuntimeError: "
                                 "engine invariant broken")


def test_plan_plot_names_rows_without_a_rate_and_labels_the_binding_constraint():
    from kvsim import plots
    from kvsim.plan import CSV_COLUMNS

    table = pd.DataFrame([
        {"candidate": "h100-sxm tp1", "status": "ok", "goodput_req_s_per_gpu": 40.0, "tp": 1,
         "max_rate_min": 38.0, "max_rate_max": 42.0, "binding": "compute", "num_gpus": 2},
        {"candidate": "l4 tp1", "status": "does not fit", "tp": 1},
    ], columns=CSV_COLUMNS)
    ax = plots.plan_goodput(table).axes[0]
    assert [t.get_text() for t in ax.texts] == ["40 req/s/GPU\ncompute\n2 GPUs for target",
                                                "does not fit"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["h100-sxm tp1", "l4 tp1"]


def dying_probe(scenario, point_dir=None, *, base_dir=None):
    import os
    os._exit(7)   # the worker dies, as with a segfault or an OOM kill


def test_a_probe_whose_worker_dies_is_an_error_row_and_the_other_candidates_still_run():
    plan = parse_plan(tiny_plan(gpus=["l4", "a10g"]))
    rows = run_plan(plan, workers=2, probe=dying_probe)
    assert [r["status"] for r in rows] == ["error", "error"]
    assert rows[0]["detail"] == ("the probe at 2 req/s (seed 0) raised worker process died "
                                 "(exit status 7) while this point was running")


def test_a_rerun_with_the_same_out_reads_every_finished_probe_back(tmp_path):
    plan = parse_plan(tiny_plan(gpus=["l4"], seeds=2))
    first = run_plan(plan, workers=1, out_dir=tmp_path)
    notes: list[str] = []
    # Nothing is simulated again: a probe that would raise is never called.
    again = run_plan(plan, workers=1, out_dir=tmp_path, log=notes.append)
    assert again == first and first[0]["status"] == "ok"
    assert notes == [f"{first[0]['num_probes']} of {first[0]['num_probes']} probes read back "
                     f"from {tmp_path / 'probes.jsonl'}"]


def test_a_rerun_after_an_interruption_simulates_only_the_missing_probes(tmp_path):
    import json
    plan = parse_plan(tiny_plan(gpus=["l4"]))
    whole = run_plan(plan, workers=1, out_dir=tmp_path)
    log = tmp_path / "probes.jsonl"
    lines = log.read_text().splitlines()
    log.write_text("\n".join(lines[:3]) + "\n" + lines[3][:20])   # killed while writing the 4th
    resumed = run_plan(plan, workers=1, out_dir=tmp_path)
    assert resumed == whole
    after = log.read_text().splitlines()
    assert after[:3] == lines[:3] and after[3] == lines[3][:20]
    # one new line per probe simulated again: exactly the ones that were lost
    assert [json.loads(x)["probe_id"] for x in after[4:]] == [json.loads(x)["probe_id"] for x in lines[3:]]


def test_probes_of_another_probe_function_are_not_read_back(tmp_path):
    plan = parse_plan(tiny_plan(gpus=["l4"]))
    run_plan(plan, workers=1, out_dir=tmp_path)
    rows = run_plan(plan, workers=1, out_dir=tmp_path, probe=broken_probe)
    assert rows[0]["status"] == "error"


def test_plan_executor_options_are_checked_like_the_sweeps(tmp_path):
    from kvsim.scenario.executor import ExecutorError
    with pytest.raises(ExecutorError, match="--executor: 'dask' is not an executor; allowed: local, ray"):
        run_plan(parse_plan(tiny_plan()), executor="dask")


def test_kvsim_plan_on_ctrl_c_exits_130_with_one_line_and_a_rerun_resumes(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    plan_file = tmp_path / "plan.yaml"
    data = tiny_plan(gpus=["l4", "a10g", "a40", "a100-80gb-sxm"], seeds=2)
    data["workload"]["num_requests"] = 200
    plan_file.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    cli = subprocess.Popen([sys.executable, "-m", "kvsim", "plan", str(plan_file), "--out", str(out),
                            "--workers", "2"], env={**os.environ, "PYTHONPATH": str(repo)},
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        log = out / "probes.jsonl"
        deadline = time.monotonic() + 60
        while not (log.exists() and log.read_text().count("\n") >= 2) and cli.poll() is None:
            assert time.monotonic() < deadline, "no probe finished within 60 s"
            time.sleep(0.05)
        cli.send_signal(signal.SIGINT)
        stdout, stderr = cli.communicate(timeout=60)
    finally:
        cli.kill()
    if cli.returncode == 0:
        pytest.skip("the plan finished before the signal arrived (a very fast machine)")
    assert cli.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1] == (
        f"kvsim plan: stopped by SIGINT; the workers are stopped; every finished simulation is in "
        f"{out / 'probes.jsonl'}; rerun the same command to resume")
    kept = log.read_text().count("\n")
    assert main(["plan", str(plan_file), "--out", str(out), "--workers", "1"]) == 0
    assert pd.read_csv(out / "plan.csv")["status"].tolist() == ["ok"] * 4
    lines = log.read_text().splitlines()
    import json
    ids = [json.loads(x)["probe_id"] for x in lines if x.strip().endswith("}")]
    assert len(ids) == len(set(ids)) and len(ids) >= kept       # nothing kept was simulated again


def test_a_plans_files_are_written_all_or_none(tmp_path):
    """plan.csv, plan.png and runs/*.yaml are staged and renamed together: a file that cannot
    be written (a full disk) leaves the earlier plan's files as they were, and no temporary one."""
    from kvsim.plan.output import _write_plan_files
    from kvsim.scenario.outputs import OutputError

    class Figure:
        def __init__(self, fail):
            self.fail = fail

        def savefig(self, path, **options):
            assert options == {"dpi": 110, "format": "png"}
            if self.fail:
                raise OSError(28, "No space left on device")
            path.write_bytes(b"png")

    table = pd.DataFrame({"candidate": ["a"], "max_rate_req_s": [1.5]})
    _write_plan_files(tmp_path, table, Figure(False), {"a": "name: a\n", "b": "name: b\n"})
    before = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert set(map(str, before)) == {"plan.csv", "plan.png", "runs/a.yaml", "runs/b.yaml"}
    with pytest.raises(OutputError, match=r"cannot write .*plan\.png: No space left on device"):
        _write_plan_files(tmp_path, table.assign(max_rate_req_s=[9.0]), Figure(True), {"a": "name: new\n"})
    after = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert after == before
