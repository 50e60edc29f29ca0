#!/usr/bin/env bash
# Rebuild the hybrid-KV golden fixtures: <case>/config.json + workload.jsonl
# (make_cases.py here) and <case>/expected.jsonl + groups.json (the real vLLM
# 0.33 scheduler, driven by tests/golden/oracle/run_hybrid_cases.py on the
# oracle's own step loop).  The oracle's virtualenv is set up as
# tests/golden/oracle/regenerate.sh does.
#
# Usage: tests/golden/hybrid_oracle/regenerate.sh [CASE ...]
# Environment: VLLM_VENV [/work/venv-vllm], ORACLE_DIR [/work/shared/tools/vllm-oracle],
#              PYTHON [python3] (runs make_cases.py; needs numpy)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VLLM_VENV="${VLLM_VENV:-/work/venv-vllm}"
ORACLE_DIR="${ORACLE_DIR:-/work/shared/tools/vllm-oracle}"
PYTHON="${PYTHON:-python3}"
if [[ $# -gt 0 ]]; then
    "$PYTHON" "$HERE/make_cases.py" --only "$@"
    cases=("$@")
else
    "$PYTHON" "$HERE/make_cases.py"
    mapfile -t cases < <("$PYTHON" "$HERE/make_cases.py" --list)
fi
dirs=()
for c in "${cases[@]}"; do dirs+=("$HERE/$c"); done
"$VLLM_VENV/bin/python" "$HERE/../oracle/run_hybrid_cases.py" --oracle-dir "$ORACLE_DIR" "${dirs[@]}"
echo "regenerate.sh: wrote expected.jsonl and groups.json for ${#dirs[@]} case(s)" >&2
