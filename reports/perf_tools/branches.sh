#!/bin/bash
# usage: branches.sh TREE [N]: cachegrind branch simulation of simulate() alone on W1 cut to N (1000)
TREE=$(cd "$1" && pwd); N=${2:-1000}
PY=${PYTHON:-$(python3 -c 'import sys; print(sys.executable)')}
run() { cd "$TREE"; PYTHONHASHSEED=0 PYTHONPATH="$TREE" valgrind --tool=cachegrind --cache-sim=no --branch-sim=yes --cachegrind-out-file=/dev/null "$PY" -c "
import kvsim
from kvsim.scenario.loader import load_scenario
from kvsim.workload import build_workload
import numpy as np
sc = load_scenario('scenarios/bench/w1.yaml', overrides=['workload.trace.max_requests=$N'])
if $1: kvsim.simulate(sc)
else: list(build_workload(sc.workload, rng=np.random.default_rng(0), base_dir=sc.base_dir).requests())
" 2>&1 | grep -E "Mispred|Branches" | sed 's/(.*//' | awk -F: '{gsub(/[ ,]/,"",$2); print $2}' | tr '\n' ' '; }
a=($(run 1)); b=($(run 0))
echo "$TREE branches $(( ${a[0]} - ${b[0]} )), mispredicts $(( ${a[1]} - ${b[1]} )) (simulate() only, W1 cut to $N)"
