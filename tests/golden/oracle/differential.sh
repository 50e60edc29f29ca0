#!/usr/bin/env bash
# A differential campaign: random cases (make_cases.py's differential(seed)),
# the real vLLM 0.33 scheduler's trace of each, and kvsim on both paths
# against it (check_cases.py). Nothing here is committed: the cases go to a
# scratch folder; a seed worth keeping joins DIFFERENTIAL_SEEDS in make_cases.py.
#
# Usage: tests/golden/oracle/differential.sh [--hybrid | --long] FROM TO [DIR]   (seeds FROM..TO-1,
#        DIR: a fresh folder, default /tmp/kvsim-differential)
#   --long    longer cases (make_cases.py's differential_long: long outputs and decode runs)
#   --hybrid  models that mix layer types (tests/golden/hybrid_oracle/make_cases.py's
#             differential(seed), run_hybrid_cases.py, hybrid_oracle/check_cases.py)
# Environment: VLLM_VENV, ORACLE_DIR, PYTHON as for regenerate.sh (the venv must exist:
#        regenerate.sh creates it). About 0.1 s of oracle and 0.05 s of kvsim a case.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/oracle_env.sh"
hybrid=0 long=()
if [[ "${1:-}" == "--hybrid" ]]; then hybrid=1; shift; fi
if [[ "${1:-}" == "--long" ]]; then long=(--long); shift; fi
if [[ $# -lt 2 ]]; then
    echo "usage: differential.sh [--hybrid | --long] FROM TO [DIR]" >&2
    exit 2
fi
from=$1 to=$2 dir=${3:-/tmp/kvsim-differential}
if ! "$VLLM_VENV/bin/python" -c "import vllm" 2>/dev/null; then
    echo "differential.sh: no vLLM in VLLM_VENV=$VLLM_VENV (run regenerate.sh once to create it)" >&2
    exit 2
fi
rm -rf "$dir"
mkdir -p "$dir"
if [[ $hybrid -eq 1 ]]; then
    HYBRID="$HERE/../hybrid_oracle"
    "$PYTHON" "$HYBRID/make_cases.py" --differential "$from" "$to" --out "$dir"
    mapfile -t dirs < <(ls -d "$dir"/differential_* | sort -V)
    # A case vLLM refuses or stalls on is reported in the log; the checker reads it.
    "$VLLM_VENV/bin/python" "$HERE/run_hybrid_cases.py" --oracle-dir "$ORACLE_DIR" "${dirs[@]}" \
        > "$dir/oracle.log" 2>&1 || true
    cd "$REPO"
    "$PYTHON" "$HYBRID/check_cases.py" "$dir"
else
    "$PYTHON" "$HERE/make_cases.py" --differential "$from" "$to" "${long[@]}" --out "$dir" 2> /dev/null
    mapfile -t dirs < <(ls -d "$dir"/differential_* | sort -V)
    # A case the oracle stops (a livelock past --max-steps) is reported in the log; the checker reads it.
    # 300,000 steps: 8 times the longest case of 400 long seeds; a livelock gives up in seconds.
    "$VLLM_VENV/bin/python" "$HERE/run_cases.py" --oracle-dir "$ORACLE_DIR" --max-steps 300000 \
        "${dirs[@]}" > "$dir/oracle.log" 2>&1 || true
    cd "$REPO"
    "$PYTHON" "$HERE/check_cases.py" "$dir"
fi
