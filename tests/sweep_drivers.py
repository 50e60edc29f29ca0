"""Point runners and a sweep driver for the tests that kill or interrupt a sweep.

Imported by the driver process (``python -m sweep_drivers OUT N SLEEP``, run
with tests/ on the path) and by the tests themselves. Each slow point leaves
its worker's pid in ``OUT/pids/`` so a test can watch the workers.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def scenario(n: int, seed: int = 7) -> dict:
    return {"name": "slow", "seed": seed, "engine": {"block_size": 16},
            "sweep": {"grid": {"engine.block_size": list(range(1, n + 1))}}}


def slow_run(point_scenario, point_dir=None, *, out: str, sleep_s: float) -> dict:
    pids = Path(out) / "pids"
    pids.mkdir(exist_ok=True)
    (pids / str(os.getpid())).touch()
    time.sleep(sleep_s)
    return {"completed": point_scenario["engine"]["block_size"], "seed_seen": point_scenario["seed"]}


def quick_run(point_scenario, point_dir=None) -> dict:
    return {"completed": point_scenario["engine"]["block_size"], "seed_seen": point_scenario["seed"]}


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie (an unreaped corpse counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def main(argv: list[str]) -> int:
    import functools

    from kvsim.scenario.executor import signals_as_interrupts
    from kvsim.scenario.sweep import run_sweep

    out, n, sleep_s, workers = argv[0], int(argv[1]), float(argv[2]), int(argv[3])
    runner = functools.partial(slow_run, out=out, sleep_s=sleep_s)
    try:
        with signals_as_interrupts():
            run_sweep(scenario(n), out, workers=workers, run_point=runner, progress=False)
    except KeyboardInterrupt as exc:
        print(f"interrupted {getattr(exc, 'signum', 2)}", flush=True)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
