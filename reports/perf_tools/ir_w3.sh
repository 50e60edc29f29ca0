#!/bin/bash
# usage: ir_w3.sh TREE [N]: callgrind instructions (G) of simulate() over 8 corners of W3's grid, W1 cut to N (500), minus workload-only runs
TREE=$(cd "$1" && pwd); N=${2:-500}
PY=${PYTHON:-$(python3 -c 'import sys; print(sys.executable)')}
run() { cd "$TREE"; PYTHONHASHSEED=0 PYTHONPATH="$TREE" valgrind --tool=callgrind --callgrind-out-file=/dev/null "$PY" -c "
import itertools
import kvsim
from kvsim.scenario.loader import load_scenario
from kvsim.workload import build_workload
import numpy as np
for b, bs, pc in itertools.product([256, 8192], [8, 128], ['true', 'false']):
    sc = load_scenario('scenarios/bench/w3.yaml', overrides=['workload.trace.max_requests=$N', f'engine.max_num_batched_tokens={b}',
                       f'engine.block_size={bs}', f'engine.enable_prefix_caching={pc}', 'sweep=null'])
    if $1: kvsim.simulate(sc)
    else: list(build_workload(sc.workload, rng=np.random.default_rng(0), base_dir=sc.base_dir).requests())
" 2>&1 | grep -o "Collected : [0-9]*" | grep -o "[0-9]*"; }
a=$(run 1); b=$(run 0)
"$PY" -c "print('$TREE', round(($a - $b) / 1e9, 3), 'G instructions, W3 corners, W1 cut to $N')"
