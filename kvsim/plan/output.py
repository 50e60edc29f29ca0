"""What a plan leaves: the table on the terminal, ``plan.csv``, ``plan.png``, ``runs/*.yaml``."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import yaml

from kvsim.plan.fleet import FLEET_COLUMNS, fleet_scenario, router_label
from kvsim.plan.spec import Plan, with_rate

CSV_COLUMNS = ["candidate", "gpu", "tp", "kv_cache_dtype", "max_num_batched_tokens",
               "max_num_seqs", "status", "max_rate_req_s", "max_rate_std", "max_rate_min",
               "max_rate_max", "num_seeds", "goodput_req_s_per_gpu",
               "target_rate_req_s", "replicas", "num_gpus", "binding", "detail", "num_probes",
               "seed0_max_rate_req_s", "seed0_fails_at_rate_req_s"]


def format_table(rows: list[dict], plan: Plan) -> str:
    if plan.fleet is not None:                 # kvsim/plan/fleet.py
        return format_fleet_table(rows, plan)
    slo = ", ".join(f"{k} <= {v:g}" for k, v in plan.slo_ms.items())
    lines = [f"SLOs: {slo}; {len(plan.seeds)} seed(s); tolerance {100 * plan.bounds.tolerance:g}%"
             + (f"; target {plan.target_rate_req_s:g} req/s" if plan.target_rate_req_s else "")]
    header = (f"{'candidate':<28} {'max rate (req/s)':>18} {'req/s/GPU':>10} "
              f"{'replicas':>8} {'GPUs':>5}  binding")
    lines += [header, "-" * len(header)]
    for r in rows:
        if r["status"] in ("ok", "capped"):
            rate = f"{r['max_rate_req_s']:.2f} ± {r['max_rate_std']:.2f}"
            per_gpu = f"{r['goodput_req_s_per_gpu']:.2f}"
            reps = "-" if r["replicas"] is None else str(r["replicas"])
            gpus = "-" if r["num_gpus"] is None else str(r["num_gpus"])
            lines.append(f"{r['candidate']:<28} {rate:>18} {per_gpu:>10} {reps:>8} {gpus:>5}  "
                         f"{r['binding']}: {r['detail']}")
        else:
            lines.append(f"{r['candidate']:<28} {r['status'].upper()}: {r['detail']}")
    return "\n".join(lines)


def write_outputs(rows: list[dict], plan: Plan, out_dir: str | os.PathLike) -> Path:
    """``DIR/plan.csv``, ``DIR/plan.png``, and ``DIR/runs/<candidate>.yaml``: each
    candidate's scenario at its max rate (first seed), for ``kvsim run``."""
    import pandas as pd

    from kvsim import plots

    if plan.fleet is not None:                 # kvsim/plan/fleet.py
        write_fleet_outputs(rows, plan, out_dir)
        return Path(out_dir)
    table = pd.DataFrame(rows, columns=CSV_COLUMNS)
    runs = {}
    for cand, row in zip(plan.candidates, rows):
        if row["status"] not in ("ok", "capped"):
            continue
        scenario = with_rate(cand.apply(plan.base), row["seed0_max_rate_req_s"], plan.seeds[0])
        scenario["name"] = f"{plan.base.get('name', 'plan')} {cand.label}"
        if "workload" in scenario:  # relative paths in it must still resolve from runs/
            scenario["workload"] = _absolute_paths(scenario["workload"], plan.base_dir)
        runs[_file_name(cand.label)] = (
            f"# kvsim plan: {cand.label} at its max rate for seed {plan.seeds[0]}; "
            f"the SLOs fail at {row['seed0_fails_at_rate_req_s']} req/s\n"
            + yaml.safe_dump(scenario, sort_keys=False))
    _write_plan_files(Path(out_dir), table, plots.plan_goodput(table, title=plan.base.get("name")), runs)
    return Path(out_dir)


def _write_plan_files(out: Path, table, figure, runs: dict[str, str]) -> None:
    """``plan.csv``, ``plan.png`` and ``runs/<name>.yaml``, all or none: each is written
    under a temporary name, and renamed once every one is (scenario/outputs.write_files),
    so an error or Ctrl-C leaves an earlier plan's files as they were."""
    from kvsim.scenario.outputs import write_files

    (out / "runs").mkdir(parents=True, exist_ok=True)
    writers = {out / "plan.csv": lambda path: table.to_csv(path, index=False),
               # (the format named: the temporary name's suffix is not .png)
               out / "plan.png": lambda path: figure.savefig(path, dpi=110, format="png")}
    for name, text in runs.items():
        writers[out / "runs" / f"{name}.yaml"] = lambda path, text=text: path.write_text(text, encoding="utf-8")
    write_files(writers)


def _file_name(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-." else "_" for c in label)


def _absolute_paths(workload: dict, base_dir: Path) -> dict:
    workload = copy.deepcopy(workload)
    trace = workload.get("trace")
    if isinstance(trace, dict) and "path" in trace:
        trace["path"] = str((base_dir / os.path.expandvars(trace["path"])).resolve())
    for key in ("prompt_len", "output_len"):
        dist = workload.get(key)
        if isinstance(dist, dict) and "file" in dist:
            dist["file"] = str((base_dir / os.path.expandvars(dist["file"])).resolve())
    return workload


# ----------------------------------------------------------------------------- fleet plans

def format_fleet_table(rows: list[dict], plan) -> str:
    slo = ", ".join(f"{k} <= {v:g}" for k, v in plan.slo_ms.items())
    lines = [f"SLOs: {slo} at {plan.target_rate_req_s:g} req/s; {len(plan.seeds)} seed(s); "
             f"1..{plan.fleet.max_replicas} replicas"]
    header = (f"{'candidate':<24} {'router':<20} {'replicas':>8} {'GPUs':>5} {'hit rate':>8} "
              f"{'imbal.':>6}  binding (one replica fewer)")
    lines += [header, "-" * len(header)]
    for r in rows:
        if r["status"] == "ok":
            hit = "-" if r["prefix_cache_hit_rate"] != r["prefix_cache_hit_rate"] else \
                f"{100 * r['prefix_cache_hit_rate']:.1f}%"
            size = r["replicas"] if r.get("prefill_replicas") is None else \
                f"{r['prefill_replicas']}P+{r['decode_replicas']}D"        # prefill + decode pools
            lines.append(f"{r['candidate']:<24} {r['router']:<20} {size:>8} {r['num_gpus']:>5} "
                         f"{hit:>8} {r['imbalance_routed']:>6.2f}  {r['binding']}: {r['detail']}")
        else:
            lines.append(f"{r['candidate']:<24} {r['router']:<20} {r['status'].upper()}: {r['detail']}")
    return "\n".join(lines)


def write_fleet_outputs(rows: list[dict], plan, out_dir) -> None:
    """``plan.csv`` (``FLEET_COLUMNS`` and the SLO metrics at the answer, worst seed), ``plan.png``
    (GPUs per candidate and router) and ``runs/<candidate>_<router>.yaml`` (the fleet at its
    answer, first seed, for ``kvsim run``)."""
    import pandas as pd

    from kvsim.plots_fleet import fleet_plan_gpus

    columns = [*FLEET_COLUMNS, *plan.slo_ms]
    table = pd.DataFrame(rows, columns=columns)
    runs = {}
    for row in rows:
        if row["status"] != "ok":
            continue
        cand = next(c for c in plan.candidates if c.label == row["candidate"])
        router = next(r for r in plan.fleet.routers if router_label(r) == row["router"])
        scenario = fleet_scenario(plan.base, cand, router, row["replicas"], plan.target_rate_req_s,
                                  plan.seeds[0], prefill=row.get("prefill_replicas"))
        scenario["name"] = f"{plan.base.get('name', 'plan')} {cand.label} {row['router']}"
        if "workload" in scenario:
            scenario["workload"] = _absolute_paths(scenario["workload"], plan.base_dir)
        fails = row["fails_at_replicas"]
        runs[_file_name(f"{cand.label}_{row['router']}")] = (
            f"# kvsim plan: {cand.label}, {row['replicas']} replicas behind {row['router']} at "
            f"{plan.target_rate_req_s:g} req/s (seed {plan.seeds[0]})"
            + (f"; the SLOs fail with {fails}\n" if fails else "\n")
            + yaml.safe_dump(scenario, sort_keys=False))
    _write_plan_files(Path(out_dir), table, fleet_plan_gpus(table, title=plan.base.get("name")), runs)
