# The oracle's environment, for regenerate.sh and differential.sh (sourced; HERE is
# this folder). Defaults in brackets:
#   VLLM_VENV   [/work/venv-vllm]                   the oracle's virtualenv
#   ORACLE_DIR  [/work/shared/tools/vllm-oracle]    vllm_oracle.py + requirements-lean.txt
#   PYTHON      [<repo>/.venv/bin/python, else python3]  runs make_cases.py and kvsim
VLLM_VENV="${VLLM_VENV:-/work/venv-vllm}"
ORACLE_DIR="${ORACLE_DIR:-/work/shared/tools/vllm-oracle}"
REPO="$(cd "$HERE/../../.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$REPO/.venv/bin/python" ]]; then PYTHON="$REPO/.venv/bin/python"; else PYTHON=python3; fi
fi
