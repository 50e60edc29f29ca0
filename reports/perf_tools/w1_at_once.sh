#!/bin/bash
# usage: w1_at_once.sh A B [ROUNDS]: W1 simulate() CPU seconds of both trees run at the same time, one core each; per round: A B A/B
A=$(cd "$1" && pwd); B=$(cd "$2" && pwd); ROUNDS=${3:-10}
PY=${PYTHON:-$(python3 -c 'import sys; print(sys.executable)')}
T=$(mktemp -d)
CODE="import time, kvsim
from kvsim.scenario.loader import load_scenario
sc = load_scenario('scenarios/bench/w1.yaml')
t = time.process_time(); kvsim.simulate(sc); print(time.process_time() - t)"
for r in $(seq 1 "$ROUNDS"); do
  (cd "$A" && PYTHONPATH="$A" "$PY" -c "$CODE" > "$T/a") &
  (cd "$B" && PYTHONPATH="$B" "$PY" -c "$CODE" > "$T/b") &
  wait
  "$PY" -c "a = float(open('$T/a').read()); b = float(open('$T/b').read()); print(f'round $r: {a:.3f} {b:.3f} {a / b:.3f}')"
done
rm -rf "$T"
