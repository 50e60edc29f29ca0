#!/bin/bash
# usage: cmp_outputs.sh A B SCENARIO...: kvsim run --out of scenarios/SCENARIO.yaml in both trees; are the files the same bytes?
A=$(cd "$1" && pwd); B=$(cd "$2" && pwd); shift 2
PY=${PYTHON:-$(python3 -c 'import sys; print(sys.executable)')}
T=$(mktemp -d)
for s in "$@"; do
  e=${s//\//_}                  # (a scenario under a folder: bench/w7)
  for t in A B; do
    [ $t = A ] && R=$A || R=$B
    (cd "$R" && PYTHONPATH="$R" "$PY" -m kvsim run "scenarios/$s.yaml" --out "$T/$t/$s" > /dev/null 2> "$T/$t.$e.err") \
      || { echo "$s: failed in $R"; tail -2 "$T/$t.$e.err"; }
  done
  if diff -rq "$T/A/$s" "$T/B/$s" > /dev/null; then
    echo "$s: the same ($(ls "$T/A/$s" | wc -l) files)"
  else
    echo "$s: DIFFERENT"; diff -rq "$T/A/$s" "$T/B/$s" | head -5
  fi
done
rm -rf "$T"
