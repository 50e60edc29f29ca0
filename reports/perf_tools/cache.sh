#!/bin/bash
# usage: cache.sh TREE [N]: cachegrind counters of simulate() alone on W1 cut to N (1000): (with simulate) - (workload only)
TREE=$(cd "$1" && pwd); N=${2:-1000}
PY=${PYTHON:-$(python3 -c 'import sys; print(sys.executable)')}
run() { cd "$TREE"; PYTHONHASHSEED=0 PYTHONPATH="$TREE" valgrind --tool=cachegrind --cache-sim=yes --cachegrind-out-file=/dev/null "$PY" -c "
import kvsim
from kvsim.scenario.loader import load_scenario
from kvsim.workload import build_workload
import numpy as np
sc = load_scenario('scenarios/bench/w1.yaml', overrides=['workload.trace.max_requests=$N'])
if $1: kvsim.simulate(sc)
else: list(build_workload(sc.workload, rng=np.random.default_rng(0), base_dir=sc.base_dir).requests())
" 2>&1 | grep -E "I *refs|I1 *misses|D1 *misses|LL misses" | sed 's/(.*//' | awk -F: '{gsub(/[ ,]/,"",$2); print $2}' | tr '\n' ' '; }
a=$(run 1); b=$(run 0)
"$PY" -c "
a = [int(x) for x in '$a'.split()]; b = [int(x) for x in '$b'.split()]
d = [x - y for x, y in zip(a, b)]
names = ['Ir', 'I1 misses', 'D1 misses', 'LL misses']
print('$TREE', ', '.join(f'{n} {v / 1e6:.1f} M' for n, v in zip(names, d)),
      '; est. cycles', round((d[0] + 10 * (d[1] + d[2]) + 100 * d[3]) / 1e9, 3), 'G')
"
