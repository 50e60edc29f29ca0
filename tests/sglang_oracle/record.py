"""Record SGLang's answers to seeded random scripts: tests/golden/sglang_radix/.

    KVSIM_SGLANG_SRC=.../sglang-0.4.6.post5-py3-none-any.whl \\
    KVSIM_SGLANG_PYTHON=/path/to/python-with-torch \\
    PYTHONPATH=.:tests python tests/sglang_oracle/record.py [NUM_CASES]

Writes ``cases.json.gz`` (an 0.4.x wheel: request-level scripts through the
tree and the slot allocators) or ``tree_05.json.gz`` (an 0.5.x wheel:
tree-level scripts under each eviction policy): every script with the
snapshots SGLang's code gave after each operation.
tests/test_radix_sglang.py replays them on kvsim.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import subprocess
import sys
import zipfile
from pathlib import Path

from sglang_oracle.scripts import make_script, make_tree_script

HERE = Path(__file__).parent
OUT = HERE.parent / "golden" / "sglang_radix" / "cases.json.gz"
OUT_TREE = HERE.parent / "golden" / "sglang_radix" / "tree_05.json.gz"
POLICIES = ("lru", "lfu", "fifo", "mru", "filo")

# (page_size, slots, clock) per case, cycled: token-granular and paged, a
# counter clock (SGLang's distinct monotonic stamps) and a coarse one (ties).
SHAPES = [(1, 24, "counter"), (1, 40, "step"), (1, 64, "counter"), (4, 40, "step"),
          (4, 64, "counter"), (2, 24, "counter"), (1, 16, "step"), (2, 48, "step")]


def seeded_cases(num: int, num_ops: int = 60) -> list[dict]:
    cases = []
    for seed in range(num):
        rng = random.Random(seed)
        page_size, size, clock = SHAPES[seed % len(SHAPES)]
        case = make_script(lambda n: rng.randrange(n), size=size, page_size=page_size,
                           clock=clock, num_ops=num_ops)
        case["seed"] = seed
        cases.append(case)
    return cases


def seeded_tree_cases(num: int, num_ops: int = 50) -> list[dict]:
    cases = []
    for seed in range(num):
        rng = random.Random(seed)
        case = make_tree_script(lambda n: rng.randrange(n), page_size=(1, 1, 4)[seed % 3],
                                policy=POLICIES[seed % len(POLICIES)], num_ops=num_ops)
        case["seed"] = seed
        cases.append(case)
    return cases


def is_05(src: str) -> bool:
    name = "sglang/srt/mem_cache/evict_policy.py"
    if Path(src).is_file():
        return name in zipfile.ZipFile(src).namelist()
    return (Path(src) / name).exists()


def run_sglang(cases: list[dict], src: str, python: str) -> list[list[dict]]:
    driver = HERE / "driver.py"
    proc = subprocess.run([python, str(driver), "--src", src], input=json.dumps({"cases": cases}),
                          capture_output=True, text=True, check=False)
    if proc.returncode:
        raise RuntimeError(f"driver.py failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout)


def main() -> None:
    num = int(sys.argv[1]) if len(sys.argv) > 1 else 80
    src = os.environ["KVSIM_SGLANG_SRC"]
    python = os.environ.get("KVSIM_SGLANG_PYTHON", sys.executable)
    tree = is_05(src)
    cases = seeded_tree_cases(num) if tree else seeded_cases(num)
    for case, snaps in zip(cases, run_sglang(cases, src, python)):
        case["expected"] = snaps
    out = OUT_TREE if tree else OUT
    out.parent.mkdir(parents=True, exist_ok=True)
    source = ("python/sglang/srt/mem_cache/{radix_cache,evict_policy}.py" if tree else
              "python/sglang/srt/mem_cache/{radix_cache,memory_pool,paged_allocator}.py")
    meta = {"sglang": Path(src).name, "source": source, "cases": cases}
    with gzip.open(out, "wt") as f:
        json.dump(meta, f, separators=(",", ":"))
    print(f"wrote {len(cases)} cases ({sum(len(c['ops']) for c in cases)} operations) to {out}")


if __name__ == "__main__":
    main()
