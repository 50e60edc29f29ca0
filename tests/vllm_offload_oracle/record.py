"""Record vLLM's answers to seeded random scripts: tests/golden/vllm_offload/.

    KVSIM_VLLM_PYTHON=/path/to/python-with-vllm PYTHONPATH=.:tests \\
        python tests/vllm_offload_oracle/record.py [NUM_CASES]
"""

from __future__ import annotations

import gzip
import json
import os
import random
import subprocess
import sys
from pathlib import Path

from vllm_offload_oracle.scripts import make_script

HERE = Path(__file__).parent
OUT = HERE.parent / "golden" / "vllm_offload" / "cases.json.gz"
SIZES = (2, 4, 6, 10)


def seeded_cases(num: int, num_ops: int = 60) -> list[dict]:
    cases = []
    for seed in range(num):
        rng = random.Random(seed)
        case = make_script(lambda n: rng.randrange(n), num_chunks=SIZES[seed % len(SIZES)], num_ops=num_ops)
        case["seed"] = seed
        cases.append(case)
    return cases


def run_vllm(cases: list[dict], python: str) -> list[list[dict]]:
    proc = subprocess.run([python, str(HERE / "driver.py")], input=json.dumps({"cases": cases}),
                          capture_output=True, text=True, cwd="/", check=False)
    if proc.returncode:
        raise RuntimeError(f"driver.py failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout)


def main() -> None:
    num = int(sys.argv[1]) if len(sys.argv) > 1 else 120
    python = os.environ["KVSIM_VLLM_PYTHON"]
    version = subprocess.run([python, "-c", "import vllm; print(vllm.__version__)"],
                             capture_output=True, text=True, cwd="/").stdout.strip()
    cases = seeded_cases(num)
    for case, snaps in zip(cases, run_vllm(cases, python)):
        case["expected"] = snaps
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(OUT, "wt") as f:
        json.dump({"vllm": version, "source": "vllm/v1/kv_offload/cpu/{manager,policies/lru}.py",
                   "cases": cases}, f, separators=(",", ":"))
    print(f"wrote {len(cases)} cases ({sum(len(c['ops']) for c in cases)} operations), vLLM {version}, to {OUT}")


if __name__ == "__main__":
    main()
