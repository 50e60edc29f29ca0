#!/usr/bin/env bash
# Rebuild the vLLM-oracle golden fixtures: <case>/workload.jsonl, config.json
# (make_cases.py) and <case>/expected.jsonl (the real vLLM 0.33 scheduler,
# driven by vllm_oracle.py).  vLLM lives in its own virtualenv, never in
# kvsim's.  See README.md in this folder.
#
# Usage: tests/golden/oracle/regenerate.sh [--one-by-one | --pending] [CASE ...]
#   --one-by-one  run the oracle's own CLI once per case (slow: vLLM is
#                 imported each time) instead of run_cases.py (one import)
# Environment (defaults in brackets):
#   VLLM_VENV   [/work/venv-vllm]                   created if missing
#   ORACLE_DIR  [/work/shared/tools/vllm-oracle]    vllm_oracle.py + requirements-lean.txt
#   PYTHON      [<repo>/.venv/bin/python, else python3]  runs make_cases.py
#               (needs numpy) and creates the oracle venv
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/oracle_env.sh"

one_by_one=0
if [[ "${1:-}" == "--one-by-one" ]]; then one_by_one=1; shift; fi
# --pending: the vLLM 0.33 cases kvsim does not pass yet, in pending/ (make_cases.py --pending);
# they need run_cases.py (baseline.jsonl, max_num_scheduled_tokens), so not --one-by-one.
pending=()
case_root="$HERE"
if [[ "${1:-}" == "--pending" ]]; then pending=(--pending); case_root="$HERE/pending"; shift; fi

if [[ ! -f "$ORACLE_DIR/vllm_oracle.py" ]]; then
    echo "regenerate.sh: no vllm_oracle.py in ORACLE_DIR=$ORACLE_DIR" >&2
    exit 2
fi

# 1. The oracle's virtualenv, exactly as its README sets it up (~2 min, 3.4 GB).
if ! "$VLLM_VENV/bin/python" -c "import vllm, sys; sys.exit(vllm.__version__ != '0.33.0')" 2>/dev/null; then
    echo "regenerate.sh: creating $VLLM_VENV (torch 2.13.0 CPU + vllm 0.33.0, no CUDA deps)" >&2
    "$PYTHON" -m venv "$VLLM_VENV"
    "$VLLM_VENV/bin/pip" install torch==2.13.0
    "$VLLM_VENV/bin/pip" install --no-deps vllm==0.33.0
    "$VLLM_VENV/bin/pip" install --no-deps -r "$ORACLE_DIR/requirements-lean.txt"
fi

# 2. Case inputs (deterministic; rewrites the same bytes).
if [[ $# -gt 0 ]]; then
    "$PYTHON" "$HERE/make_cases.py" "${pending[@]}" --only "$@"
    cases=("$@")
else
    "$PYTHON" "$HERE/make_cases.py" "${pending[@]}"
    mapfile -t cases < <("$PYTHON" "$HERE/make_cases.py" "${pending[@]}" --list)
fi

# 3. Expected traces from the real scheduler.
dirs=()
for c in "${cases[@]}"; do dirs+=("$case_root/$c"); done
if [[ $one_by_one -eq 1 ]]; then
    for d in "${dirs[@]}"; do
        echo "$(basename "$d"):" >&2
        "$VLLM_VENV/bin/python" "$ORACLE_DIR/vllm_oracle.py" \
            --workload "$d/workload.jsonl" --config "$d/config.json" --out "$d/expected.jsonl"
    done
else
    "$VLLM_VENV/bin/python" "$HERE/run_cases.py" --oracle-dir "$ORACLE_DIR" "${dirs[@]}"
fi
echo "regenerate.sh: wrote expected.jsonl for ${#dirs[@]} case(s)" >&2
