#!/bin/bash
# usage: w3_at_once.sh A B [ROUNDS]: the W3 sweep (one worker) in both trees at the same time; user and system seconds of each
A=$(cd "$1" && pwd); B=$(cd "$2" && pwd); ROUNDS=${3:-2}
PY=${PYTHON:-$(python3 -c 'import sys; print(sys.executable)')}
T=$(mktemp -d)
for r in $(seq 1 "$ROUNDS"); do
  for t in A B; do
    [ $t = A ] && R=$A || R=$B
    (cd "$R" && /usr/bin/time -f "round $r $t user %U s, system %S s, wall %e s" env PYTHONPATH="$R" "$PY" -m kvsim sweep \
        scenarios/bench/w3.yaml --out "$T/$t" --workers 1 > /dev/null 2>> "$T/times"; rm -rf "$T/$t") &
  done
  wait
done
cat "$T/times"; rm -rf "$T"
