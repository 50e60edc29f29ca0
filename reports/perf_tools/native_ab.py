#!/usr/bin/env python3
"""The compiled build against the plain modules on this host: CPU seconds of
``load_scenario`` + ``simulate()`` in fresh processes, alternating.

Usage: python reports/perf_tools/native_ab.py [SCENARIO] [--pairs N]
       (SCENARIO: scenarios/bench/w1.yaml; N: 9; run from the tree, after
       ``kvsim native build``)

Each pair runs one process with ``KVSIM_NATIVE=0`` and one with the build,
in a seeded order, and every run prints its CPU time and a hash of its
summary. The script prints each pair, the medians, the median of the pairs'
ratios, and exits 1 if any summary differs from the first (the build must
give the same results) or the build is not used.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys

CHILD = """
import hashlib, json, sys, time
from kvsim import native
from kvsim.scenario.loader import load_scenario
from kvsim.scenario.simulate import simulate
t = time.process_time()
result = simulate(load_scenario(sys.argv[1]))
cpu = time.process_time() - t
digest = hashlib.sha256(json.dumps(result.summary, sort_keys=True, default=str).encode()).hexdigest()
print(json.dumps({"cpu_s": cpu, "summary": digest[:12], "compiled": len(native.active()["compiled"])}))
"""


def run(scenario: str, native: bool) -> dict:
    env = {**os.environ, "KVSIM_NATIVE": "1" if native else "0"}
    out = subprocess.run([sys.executable, "-c", CHILD, scenario], capture_output=True, text=True,
                         env=env, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("scenario", nargs="?", default="scenarios/bench/w1.yaml")
    p.add_argument("--pairs", type=int, default=9)
    args = p.parse_args()
    order = random.Random(0)
    plain, compiled, summaries = [], [], set()
    for i in range(args.pairs):
        first_native = order.random() < 0.5
        runs = {native: run(args.scenario, native) for native in (first_native, not first_native)}
        if runs[True]["compiled"] == 0:
            print("native_ab: no compiled build of these sources is used (kvsim native build)",
                  file=sys.stderr)
            return 1
        plain.append(runs[False]["cpu_s"])
        compiled.append(runs[True]["cpu_s"])
        summaries |= {runs[False]["summary"], runs[True]["summary"]}
        print(f"pair {i + 1}: plain {plain[-1]:.3f} s, compiled {compiled[-1]:.3f} s "
              f"({runs[True]['compiled']} modules), ratio {compiled[-1] / plain[-1]:.3f}", flush=True)
    ratios = [c / q for c, q in zip(compiled, plain)]
    print(f"plain median {statistics.median(plain):.3f} s ({min(plain):.3f}-{max(plain):.3f}), "
          f"compiled median {statistics.median(compiled):.3f} s ({min(compiled):.3f}-{max(compiled):.3f}); "
          f"pair ratio median {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}); "
          f"summaries {'the same' if len(summaries) == 1 else 'DIFFER'}")
    return 0 if len(summaries) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
