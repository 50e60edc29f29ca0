"""``kvsim plan``: the command line, flags merged into the plan file."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

import yaml

from kvsim.plan.output import format_table, write_outputs
from kvsim.plan.run import run_plan
from kvsim.plan.spec import PlanError, parse_plan
from kvsim.scenario.executor import signals_as_interrupts


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "plan", help="capacity planning: highest rate meeting SLOs per GPU candidate, or the "
                     "fewest replicas per router (--router)",
        description="For each candidate (GPU, TP, KV dtype, engine knobs) find by bisection over "
                    "simulations the highest request rate that meets the SLOs; with plan.fleet or "
                    "--router, the fewest replicas (GPUs) that meet them at the target rate behind "
                    "each router, simulating the whole fleet; print a table and write "
                    "DIR/plan.csv and DIR/plan.png. See docs/plan.md.")
    p.add_argument("plan", nargs="?", metavar="PLAN.yaml",
                   help="a scenario with a plan: section (or give --workload and flags)")
    p.add_argument("--out", metavar="DIR",
                   help="folder for plan.csv and plan.png (created); every finished simulation "
                        "is logged there (probes.jsonl), so a rerun resumes")
    p.add_argument("--workload", metavar="SCENARIO.yaml",
                   help="take model, engine, cost model and workload from this scenario")
    p.add_argument("--model", help="model catalog name (overrides the file's)")
    p.add_argument("--gpu", action="append", metavar="NAME", help="GPU candidate; repeatable")
    p.add_argument("--tp", action="append", type=int, metavar="N", help="TP degree; repeatable")
    p.add_argument("--kv-cache-dtype", action="append", metavar="DTYPE", help="repeatable")
    p.add_argument("--max-num-batched-tokens", action="append", type=int, metavar="N",
                   help="repeatable")
    p.add_argument("--max-num-seqs", action="append", type=int, metavar="N", help="repeatable")
    p.add_argument("--slo", action="append", metavar="KEY=MS",
                   help="e.g. --slo p99_ttft_ms=2000 --slo p99_tpot_ms=100; replaces plan.slo")
    p.add_argument("--target-rate", type=float, metavar="REQ_S", help="total rate to size for")
    p.add_argument("--seeds", type=int, metavar="N", help="seeds per candidate")
    p.add_argument("--num-requests", type=int, metavar="N", help="requests per probe")
    p.add_argument("--router", action="append", metavar="POLICY",
                   help="plan a fleet: the fewest replicas meeting the SLOs at --target-rate behind "
                        "this router (round_robin, prefix_aware, ...); repeatable (plan.fleet.routers)")
    p.add_argument("--max-replicas", type=int, metavar="N",
                   help="largest fleet a fleet plan tries (plan.fleet.max_replicas, default 64)")
    p.add_argument("--workers", type=int, metavar="N", help="probes at once (default: all cores)")
    p.add_argument("--executor", choices=["local", "ray"], default="local",
                   help="local process pool (default) or Ray (needs the ray extra), as kvsim sweep")
    p.add_argument("--address", default=None, metavar="ADDR",
                   help="Ray cluster to join (default: start a local Ray)")
    p.set_defaults(func=plan_command)
    return p


def _notice(text: str) -> None:
    print(f"kvsim plan: {text}", file=sys.stderr)


def _read_yaml(path: str, what: str) -> dict:
    file = Path(path)
    if not file.is_file():
        raise PlanError(f"{what}: no such file: {path}")
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise PlanError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise PlanError(f"{path}: expected a mapping, got {type(data).__name__}")
    return data


def plan_from_args(args: argparse.Namespace) -> Plan:
    if not args.plan and not args.workload:
        raise PlanError("give PLAN.yaml or --workload SCENARIO.yaml (see docs/plan.md)")
    data = _read_yaml(args.plan, "PLAN.yaml") if args.plan else {}
    base_dir = Path(args.plan).resolve().parent if args.plan else Path.cwd()
    if args.workload:
        scenario = _read_yaml(args.workload, "--workload")
        for key in ("model", "engine", "cost_model", "workload", "seed"):
            if key in scenario and (key == "workload" or key not in data):
                data[key] = scenario[key]
        base_dir = Path(args.workload).resolve().parent
    section = dict(data.get("plan") or {})
    for flag, key in (("gpu", "gpus"), ("tp", "tp"), ("kv_cache_dtype", "kv_cache_dtype"),
                      ("max_num_batched_tokens", "max_num_batched_tokens"),
                      ("max_num_seqs", "max_num_seqs"), ("target_rate", "target_rate"),
                      ("seeds", "seeds"), ("workers", "workers")):
        value = getattr(args, flag)
        if value is not None:
            section[key] = value
    if args.slo:
        slo = {}
        for item in args.slo:
            key, sep, value = item.partition("=")
            try:
                slo[key] = float(value)
            except ValueError:
                raise PlanError(f"--slo {item!r}: expected KEY=MS like p99_ttft_ms=2000") from None
            if not sep:
                raise PlanError(f"--slo {item!r}: expected KEY=MS like p99_ttft_ms=2000")
        section["slo"] = slo
    if args.router or args.max_replicas is not None:        # a fleet plan (kvsim/plan/fleet.py)
        fleet = dict(section.get("fleet") or {})
        if args.router:
            fleet["routers"] = list(args.router)
        if args.max_replicas is not None:
            fleet["max_replicas"] = args.max_replicas
        section["fleet"] = fleet
    data["plan"] = section
    if args.model:
        data["model"] = args.model
    if args.num_requests is not None:
        data.setdefault("workload", {})["num_requests"] = args.num_requests
    try:
        return parse_plan(data, base_dir)
    except PlanError as exc:
        # A bad --router names the flag, not the plan.fleet.routers entry it became.
        message = str(exc)
        for i, router in enumerate(args.router or ()):
            for where in (f"plan.fleet.routers[{i}].policy", f"plan.fleet.routers[{i}]"):
                message = message.replace(where, f"--router {router}")
        raise PlanError(message) from None


def plan_command(args: argparse.Namespace) -> int:
    plan = plan_from_args(args)
    if args.out:
        # Checked before the probes (minutes), not found when the results are written.
        from kvsim.scenario.outputs import check_output_dir
        check_output_dir(args.out, files=("plan.csv", "plan.png", "probes.jsonl"))
    t0 = time.perf_counter()
    progress = None
    if sys.stderr.isatty():   # a redrawn count on a terminal; nothing when piped or in CI
        def progress(done: int) -> None:
            print(f"\rkvsim plan: {done} simulations", end="", file=sys.stderr, flush=True)
    try:
        with signals_as_interrupts():
            rows = run_plan(plan, workers=args.workers, progress=progress, executor=args.executor,
                            address=args.address, out_dir=args.out, log=_notice)
    except KeyboardInterrupt as exc:   # Ctrl-C, or SIGTERM as executor.Interrupted
        signum = getattr(exc, "signum", signal.SIGINT)
        kept = (f"every finished simulation is in {Path(args.out) / 'probes.jsonl'}; rerun the "
                f"same command to resume" if args.out else "give --out DIR to keep finished "
                                                            "simulations across runs")
        print(f"\nkvsim plan: stopped by {signal.Signals(signum).name}; the workers are stopped; "
              f"{kept}", file=sys.stderr)
        return 128 + signum
    if progress is not None:
        print(file=sys.stderr)
    wall = time.perf_counter() - t0
    print(format_table(rows, plan), flush=True)
    probes = sum(r["num_probes"] or 0 for r in rows)
    where = ""
    if args.out:
        write_outputs(rows, plan, args.out)
        where = f"; wrote {Path(args.out) / 'plan.csv'}, plan.png, runs/*.yaml"
    what = "candidate x router row(s)" if plan.fleet is not None else "candidate(s)"
    print(f"{len(rows)} {what}, {probes} simulations in {wall:.1f} s wall{where}",
          file=sys.stderr)
