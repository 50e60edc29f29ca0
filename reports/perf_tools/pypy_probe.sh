#!/bin/bash
# usage: pypy_probe.sh TREE [REPS] [--fleet]: W1's engine loop (run_engine on W1's request specs)
# REPS times in one CPython process and in one PyPy process, with a fingerprint of the
# results; --fleet adds W7's replicas $FLEET_REPLICAS (default 0; a worker's share of two:
# 0,2,4,6,8,10,12,14), the workload drawn and routed whole, as a worker does.
#
# A measurement, not a way to run kvsim: kvsim needs Python 3.11, and the PyPy this
# machine can install is Debian's 7.3.11 (Python 3.9). So the script runs a scratch copy
# of TREE's kvsim on it, changed only where 3.9 cannot run it: `@dataclass(slots=True)`
# (3.10) becomes `@dataclass`, and an empty `pandas` module stands in (no PyPy wheel on
# PyPI; the engine loop never calls pandas, and --fleet reads the length column with the
# csv module instead). The PyPy side needs (once, as root):
#   apt-get install pypy3
#   pypy3 -m venv --without-pip /tmp/venv-pypy
#   pip download "pip==25.1" --python-version 3.9 --only-binary=:all: -d /tmp/pp
#   /tmp/venv-pypy/bin/python /tmp/pp/pip-25.1-py3-none-any.whl/pip install /tmp/pp/pip-25.1-py3-none-any.whl
#   /tmp/venv-pypy/bin/python -m pip install numpy simpy pydantic pyyaml eval_type_backport
# (eval_type_backport: pydantic reads the schema's `X | None` annotations on 3.9).
# PROBE_GC_OFF=1: PyPy runs W1 with its collector off too (CPython always does, as simulate()).
set -e
TREE=$(cd "$1" && pwd); REPS=${2:-5}; FLEET=${3:-}
PY=${PYTHON:-$(python3 -c 'import sys; print(sys.executable)')}
PYPY=${PYPY:-/tmp/venv-pypy/bin/python}
HERE=$(cd "$(dirname "$0")/pypy_probe" && pwd)
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
cp -r "$TREE/kvsim" "$T/kvsim"; find "$T/kvsim" -name __pycache__ -prune -exec rm -rf {} +
sed -i -E '/^\s*@dataclass\(/ s/\(slots=True\)//; /^\s*@dataclass\(/ s/, *slots=True//' $(grep -rl "slots=True" "$T/kvsim")
mkdir -p "$T/stub/pandas"
printf '%s\n' "# pypy_probe.sh: the engine loop imports pandas and never calls it" \
  "def __getattr__(name):" "    raise AttributeError(f'pandas.{name}: pandas is not installed (pypy_probe)')" \
  > "$T/stub/pandas/__init__.py"
"$PY" - "$T/kvsim/workload/lengths.py" <<'PYEOF'
import sys
path = sys.argv[1]; s = open(path).read()
i = s.index("def read_length_column"); j = s.index("    return values", i) + len("    return values")
s = s[:i] + '''def read_length_column(config, *, base_dir, yaml_path):
    import csv
    path = resolve_path(config.file, base_dir, yaml_path=f"{yaml_path}.file")
    with open(path, newline="") as f:
        return np.array([float(row[config.column]) for row in csv.DictReader(f)], dtype=float)''' + s[j:]
open(path, "w").write(s)
PYEOF
W1="$TREE/scenarios/bench/w1.yaml"; W7="$TREE/scenarios/bench/w7.yaml"
(cd "$TREE" && PYTHONPATH="$TREE" "$PY" "$HERE/dump_specs.py" "$W1" "$T/w1.pkl")
(cd "$TREE" && PYTHONPATH="$TREE" "$PY" "$HERE/run_engine.py" "$W1" "$T/w1.pkl" "$REPS")
(cd "$T" && PYTHONPATH="$T:$T/stub" "$PYPY" "$HERE/run_engine.py" "$W1" "$T/w1.pkl" "$REPS")
if [ "$FLEET" = --fleet ]; then
  (cd "$TREE" && PYTHONPATH="$TREE" "$PY" "$HERE/fleet_share.py" "$W7" "${FLEET_REPLICAS:-0}")
  (cd "$T" && PYTHONPATH="$T:$T/stub" "$PYPY" "$HERE/fleet_share.py" "$W7" "${FLEET_REPLICAS:-0}")
fi
