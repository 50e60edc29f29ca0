#!/bin/bash
# usage: ir.sh TREE [N]: callgrind instructions (G) of simulate() on W1 cut to N (2000) requests, minus a workload-only run
TREE=$(cd "$1" && pwd); N=${2:-2000}
PY=${PYTHON:-$(python3 -c 'import sys; print(sys.executable)')}
# Byte-compile the tree first: where no .pyc can be written (PYTHONDONTWRITEBYTECODE,
# a fresh worktree), every run would otherwise count compiling the modules it imports.
env -u PYTHONDONTWRITEBYTECODE "$PY" -m compileall -q "$TREE/kvsim" > /dev/null
run() { cd "$TREE"; PYTHONHASHSEED=0 PYTHONPATH="$TREE" valgrind --tool=callgrind --callgrind-out-file=/dev/null "$PY" -c "
import kvsim
from kvsim.scenario.loader import load_scenario
from kvsim.workload import build_workload
import numpy as np
sc = load_scenario('scenarios/bench/w1.yaml', overrides=['workload.trace.max_requests=$N'])
if $1: kvsim.simulate(sc)
else: list(build_workload(sc.workload, rng=np.random.default_rng(0), base_dir=sc.base_dir).requests())
" 2>&1 | grep -o "Collected : [0-9]*" | grep -o "[0-9]*"; }
a=$(run 1); b=$(run 0)
"$PY" -c "print('$TREE', round(($a - $b) / 1e9, 3), 'G instructions, W1 cut to $N')"
