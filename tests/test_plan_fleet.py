"""kvsim plan with plan.fleet: the fewest replicas per router, found by simulating fleets."""

from __future__ import annotations

import copy

import pandas as pd
import pytest
import yaml

from kvsim.cli import main
from kvsim.plan import PlanError, parse_plan, run_plan, slo_violations
from kvsim.plan.fleet import ReplicaSearch, fleet_scenario, router_label
from kvsim.plan.output import format_fleet_table, write_fleet_outputs
from kvsim.scenario import load_scenario, simulate

# 16 system prompts of 1,500 tokens; each replica's cache (1,500 blocks, 24k
# tokens) holds a few of them beside its running requests.
BASE = {
    "name": "fleet_plan", "seed": 0, "model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm", "tp": 1},
    "engine": {"max_model_len": 4096, "max_num_batched_tokens": 2048, "max_num_seqs": 128,
               "num_gpu_blocks_override": 1500},
    "cost_model": {"type": "roofline"},
    "workload": {"num_requests": 240, "arrival": {"type": "poisson", "rate": 4.0},
                 "prefix": {"shared_prompt_tokens": 1500, "num_groups": 16},
                 "prompt_len": {"type": "lognormal", "median": 150, "sigma": 0.5, "min": 16, "max": 1000},
                 "output_len": {"type": "lognormal", "median": 100, "sigma": 0.5, "min": 8, "max": 400}},
}
SLO = {"p99_ttft_ms": 500, "p99_tpot_ms": 40}


def plan_file(**fleet):
    data = copy.deepcopy(BASE)
    data["plan"] = {"slo": SLO, "target_rate": 40, "seeds": 1,
                    "fleet": {"routers": ["round_robin", "prefix_aware"], "max_replicas": 8, **fleet}}
    return data


def search(threshold: int, start: int = 1, maximum: int = 64) -> ReplicaSearch:
    s = ReplicaSearch(start, maximum)
    while (n := s.next_size()) is not None:
        s.record(n, n >= threshold)
    return s


@pytest.mark.parametrize("threshold", [1, 2, 3, 5, 13, 64])
def test_the_replica_search_finds_the_smallest_size_that_meets(threshold):
    s = search(threshold)
    assert (s.status, s.met) == ("ok", threshold)
    assert s.missed == (threshold - 1 if threshold > 1 else None)


def test_the_replica_search_doubles_then_bisects():
    assert [n for n, _ in search(13).probes] == [1, 2, 4, 8, 16, 12, 14, 13]
    assert [n for n, _ in search(3, start=8).probes] == [8, 4, 2, 3]


def test_a_fleet_that_misses_even_at_max_replicas_is_unreachable():
    s = search(100, maximum=20)
    assert s.status == "unreachable" and s.missed == 20 and s.met is None
    assert [n for n, _ in s.probes] == [1, 2, 4, 8, 16, 20]


def test_a_probe_is_the_candidates_fleet_at_the_target_rate():
    plan = parse_plan(plan_file())
    sc = fleet_scenario(plan.base, plan.candidates[0], "prefix_aware", 3, 40.0, 7)
    assert sc["cluster"] == {"replicas": 3, "router": "prefix_aware"}
    assert sc["workload"]["arrival"] == {"type": "poisson", "rate": 40.0} and sc["seed"] == 7
    assert router_label({"policy": "prefix_aware", "mode": "precise"}) == "prefix_aware(mode=precise)"


def test_a_fleet_plan_sizes_each_router_by_simulating_its_fleet(tmp_path):
    plan = parse_plan(plan_file())
    rows = run_plan(plan, workers=1, out_dir=tmp_path)
    rr, pa = rows
    assert (rr["router"], pa["router"]) == ("round_robin", "prefix_aware")
    assert rr["status"] == pa["status"] == "ok"
    # Keeping each system prompt on one replica needs fewer GPUs than spreading them.
    assert pa["num_gpus"] < rr["num_gpus"]
    assert pa["prefix_cache_hit_rate"] > rr["prefix_cache_hit_rate"]
    for row in rows:                     # the answer meets the SLOs, one replica fewer does not
        cand = plan.candidates[0]
        met = simulate(load_scenario(fleet_scenario(plan.base, cand, row["router"], row["replicas"], 40, 0)))
        assert not slo_violations(met.summary, plan.slo_ms)
        assert row["fails_at_replicas"] == row["replicas"] - 1
        missed = simulate(load_scenario(fleet_scenario(plan.base, cand, row["router"], row["replicas"] - 1,
                                                       40, 0)))
        assert slo_violations(missed.summary, plan.slo_ms)
    # A rerun reads every probe back.
    logs = []
    again = run_plan(plan, workers=1, out_dir=tmp_path, log=logs.append)
    assert [r["num_gpus"] for r in again] == [rr["num_gpus"], pa["num_gpus"]]
    assert logs and logs[0].startswith(f"{rr['num_probes'] + pa['num_probes']} of")


def test_kvsim_plan_with_router_flags_writes_the_fleet_plan(tmp_path, capsys):
    data = copy.deepcopy(BASE)
    data["plan"] = {"slo": SLO, "seeds": 1}
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    assert main(["plan", str(path), "--router", "prefix_aware", "--target-rate", "40",
                 "--max-replicas", "4", "--workers", "1", "--out", str(out)]) in (0, None)
    printed = capsys.readouterr().out
    assert "prefix_aware" in printed and "replicas" in printed
    table = pd.read_csv(out / "plan.csv")
    assert table["router"].tolist() == ["prefix_aware"] and table["status"].tolist() == ["ok"]
    assert {"p99_ttft_ms", "p99_tpot_ms", "num_gpus"} <= set(table.columns)
    assert (out / "plan.png").stat().st_size > 0
    run = yaml.safe_load((out / "runs" / "h100-sxm_tp1_prefix_aware.yaml").read_text())
    assert run["cluster"] == {"replicas": int(table["replicas"][0]), "router": "prefix_aware"}


@pytest.mark.parametrize("change, message", [
    ({"fleet": {"routers": ["round_robin", "fastest"]}}, r"^plan.fleet.routers\[1\].policy: got 'fastest'"),
    ({"fleet": {"size": 3}}, r"^plan.fleet.size: unknown key; allowed: routers, max_replicas"),
    ({"fleet": {"max_replicas": 0}}, r"^plan.fleet.max_replicas: got 0; expected an integer >= 1"),
    ({"fleet": {}, "target_rate": None}, r"^plan.target_rate: missing; a fleet plan"),
])
def test_bad_fleet_plan_input_is_one_line_naming_the_key(change, message):
    data = plan_file()
    data["plan"].update(change)
    if data["plan"].get("target_rate") is None:
        del data["plan"]["target_rate"]
    with pytest.raises(PlanError, match=message):
        parse_plan(data)


def test_a_base_with_mixed_pools_is_refused_by_a_fleet_plan():
    data = plan_file()
    data["cluster"] = {"pools": [{"name": "a", "replicas": 2}]}
    with pytest.raises(PlanError, match=r"^plan.fleet: the base scenario's cluster.pools must be one "
                                        r"prefill and one decode pool"):
        parse_plan(data)


def pd_plan_file():
    data = copy.deepcopy(BASE)
    data["workload"] = {"num_requests": 60, "arrival": {"type": "poisson", "rate": 4.0},
                        "prompt_len": {"type": "lognormal", "median": 3000, "sigma": 0.3, "min": 500,
                                       "max": 3900},
                        "output_len": {"type": "lognormal", "median": 100, "sigma": 0.5, "min": 8, "max": 190}}
    data["cluster"] = {"pools": [{"name": "p", "role": "prefill"}, {"name": "d", "role": "decode"}],
                       "link": "roce-400g"}
    data["plan"] = {"slo": {"p99_ttft_ms": 400, "p99_itl_ms": 30}, "target_rate": 12, "seeds": 1,
                    "fleet": {"routers": ["least_loaded"], "max_replicas": 8}}
    return data


def test_a_pd_fleet_plan_sizes_prefill_plus_decode_trying_every_split(tmp_path):
    plan = parse_plan(pd_plan_file())
    assert plan.fleet.pd and plan.fleet.start_replicas == 2
    (row,) = run_plan(plan, workers=1, out_dir=tmp_path)
    assert row["status"] == "ok", row["detail"]
    n, p = row["replicas"], row["prefill_replicas"]
    assert p + row["decode_replicas"] == n and row["num_gpus"] == n
    cand = plan.candidates[0]

    def summary(size, split):
        return simulate(load_scenario(fleet_scenario(plan.base, cand, "least_loaded", size, 12, 0,
                                                     prefill=split))).summary
    assert not slo_violations(summary(n, p), plan.slo_ms)
    assert row["fails_at_replicas"] == n - 1
    for split in range(1, n - 1):          # no split of one replica fewer meets the SLOs
        assert slo_violations(summary(n - 1, split), plan.slo_ms), split
    write_fleet_outputs([row], plan, tmp_path)
    assert f"{p}P+{n - p}D" in format_fleet_table([row], plan)
    run = yaml.safe_load((tmp_path / "runs" / "h100-sxm_tp1_least_loaded.yaml").read_text())
    assert [pool["replicas"] for pool in run["cluster"]["pools"]] == [p, n - p]
    assert run["cluster"]["link"] == "roce-400g"
