"""Two trees' CPU time per sweep point, measured in turns on one core (ping-pong A/B).

usage: python reports/perf_tools/pingpong.py A B [--scenario scenarios/bench/w3.yaml]
                                             [--pairs 60] [--cpu 1] [--seed 0]
       (W1: --scenario scenarios/bench/w1.yaml --pairs 20)

One worker process per tree (``PYTHONPATH`` = the tree, working folder = the
tree), both pinned to the same CPU. The parent hands them the sweep's points
in turns: point i goes to A and then B, or B and then A (a seeded coin), and
each worker answers with the CPU seconds (``time.process_time``) of
``load_scenario`` + ``simulate`` for that point, in a process that has run
every point before it, as a sweep worker with ``--workers 1`` does (the
collector's generations fill up the same way). Both halves of a pair run
within about a second of each other on the same core, so they see nearly the
same neighbours; the ratio of each pair is the sample, and the report gives
their median, the geometric mean with a bootstrap 95% interval, and the
ratio of the sums.

A warm-up point (imports, first call) is run by each worker and not counted.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path

WORKER = r"""
import json, os, sys, time
os.sched_setaffinity(0, [__CPU__])
import kvsim
from kvsim.scenario.loader import load_scenario
scenario = __SCENARIO__
for line in sys.stdin:
    overrides = json.loads(line)
    t0 = time.process_time()
    sc = load_scenario(scenario, overrides=overrides)
    t1 = time.process_time()
    kvsim.simulate(sc)
    print(t1 - t0, time.process_time() - t1, flush=True)
"""


def sweep_points(scenario: Path) -> list[list[str]]:
    """The grid's points as ``key=value`` overrides, in the grid's order (a scenario
    without a sweep: its one point, run again and again)."""
    import yaml
    grid = (yaml.safe_load(scenario.read_text()).get("sweep") or {}).get("grid") or {}
    keys = list(grid)
    return [[f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in zip(keys, values)]
            for values in itertools.product(*(grid[k] for k in keys))]


def start(tree: Path, scenario: str, cpu: int) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONHASHSEED="0")
    code = WORKER.replace("__CPU__", str(cpu)).replace("__SCENARIO__", repr(scenario))
    return subprocess.Popen([sys.executable, "-c", code], cwd=tree, env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def ask(worker: subprocess.Popen, overrides: list[str]) -> tuple[float, float]:
    """The CPU seconds of loading and of simulating the point."""
    worker.stdin.write(json.dumps(overrides) + "\n")
    worker.stdin.flush()
    line = worker.stdout.readline()
    if not line:
        raise SystemExit("a worker stopped (see its error above)")
    load, sim = map(float, line.split())
    return load, sim


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    p.add_argument("--scenario", default="scenarios/bench/w3.yaml")
    p.add_argument("--pairs", type=int, default=60)
    p.add_argument("--cpu", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    a, b = args.a.resolve(), args.b.resolve()
    points = sweep_points(a / args.scenario)
    workers = {"A": start(a, args.scenario, args.cpu), "B": start(b, args.scenario, args.cpu)}
    for w in workers.values():
        ask(w, points[0])                           # warm-up: imports, first run
    coin = random.Random(args.seed)
    times = {"A": [], "B": []}
    parts = {"A": [0.0, 0.0], "B": [0.0, 0.0]}       # load, simulate
    for i in range(args.pairs):
        point = points[(i + 1) % len(points)]
        order = "AB" if coin.random() < 0.5 else "BA"
        for name in order:
            load, sim = ask(workers[name], point)
            times[name].append(load + sim)
            parts[name][0] += load
            parts[name][1] += sim
        ratio = times["A"][-1] / times["B"][-1]
        print(f"pair {i + 1:3d} {order} {times['A'][-1]:.3f} {times['B'][-1]:.3f} {ratio:.3f}  "
              f"{' '.join(point)}", flush=True)
    for w in workers.values():
        w.stdin.close()
        w.wait()
    logs = [math.log(x / y) for x, y in zip(times["A"], times["B"])]
    boot = random.Random(args.seed + 1)
    means = sorted(statistics.fmean(boot.choices(logs, k=len(logs))) for _ in range(2000))
    lo, hi = math.exp(means[50]), math.exp(means[1949])
    print(f"A = {a}\nB = {b}\n{args.pairs} pairs on CPU {args.cpu}, {args.scenario}: "
          f"A/B median {statistics.median(math.exp(x) for x in logs):.3f}, "
          f"geometric mean {math.exp(statistics.fmean(logs)):.3f} (95% {lo:.3f}-{hi:.3f}), "
          f"sums {sum(times['A']):.1f} / {sum(times['B']):.1f} s = "
          f"{sum(times['A']) / sum(times['B']):.3f}; load_scenario {parts['A'][0]:.1f} / "
          f"{parts['B'][0]:.1f} s, simulate {parts['A'][1]:.1f} / {parts['B'][1]:.1f} s = "
          f"{parts['A'][1] / parts['B'][1]:.3f}")


if __name__ == "__main__":
    main()
