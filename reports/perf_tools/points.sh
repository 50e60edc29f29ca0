#!/bin/bash
# usage: points.sh TREE K: cachegrind counters (Ir, I1 misses, D1 misses, LL misses) of one process that simulates K W3 points (W1-2000, different budgets and block sizes)
TREE=$(cd "$1" && pwd); K=$2
PY=${PYTHON:-$(python3 -c "import sys; print(sys.executable)")}
cd $TREE; PYTHONHASHSEED=0 PYTHONPATH=$TREE valgrind --tool=cachegrind --cache-sim=yes --cachegrind-out-file=/dev/null "$PY" -c "
import kvsim
from kvsim.scenario.loader import load_scenario
pts = [(512, 16), (2048, 32), (1024, 64), (4096, 16), (256, 32)][:$K]
for b, bs in pts:
    sc = load_scenario('scenarios/bench/w3.yaml', overrides=[f'engine.max_num_batched_tokens={b}', f'engine.block_size={bs}'])
    kvsim.simulate(sc)
" 2>&1 | grep -E "I *refs|I1 *misses|D1 *misses|LL misses" | sed 's/(.*//' | awk -F: '{gsub(/[ ,]/,"",$2); print $2}' | tr '\n' ' '
