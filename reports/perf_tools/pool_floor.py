"""The block work of one run, replayed alone: a floor under any exact engine on this pool.

Runs a scenario (W1 by default) with every call the engine makes on its
``BlockPool`` recorded (arguments copied as they were at the call), then
replays that exact sequence on a fresh pool, nothing else running: no
scheduling, no costing, no records. The replay's CPU time is what the
scenario's KV block operations alone cost in this interpreter: allocation,
eviction, hashing into the prefix-cache map, prefix lookups, frees, in vLLM's
order. Prints the calls, the blocks they move, and the replay's CPU time
(best of ``--reps``) beside the scenario's whole ``simulate()``.

    PYTHONPATH=. python reports/perf_tools/pool_floor.py [SCENARIO] [--reps N]

The replay checks itself: every call returns what it returned in the run.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

from kvsim.kv.block_pool import BlockPool
from kvsim.scenario.loader import load_scenario
from kvsim.scenario.simulate import simulate

# The pool's calls from the KV manager (their list arguments are copied at the
# call: their owners change them after it).
METHODS = ("get_new_blocks", "touch", "free_blocks", "free_request_blocks",
           "cache_full_blocks", "cache_blocks_in_order", "get_cached_prefix")


def _frozen(value):
    if isinstance(value, list):
        return list(value)
    if hasattr(value, "__next__"):            # free_blocks may be handed an iterator
        return list(value)
    return value


def record(scenario: str):
    """(pool size and flags, [(method, args, result)], simulate() CPU seconds)."""
    calls: list[tuple[str, tuple, object]] = []
    pools: list[tuple] = []
    originals = {name: getattr(BlockPool, name) for name in METHODS}
    original_init = BlockPool.__init__

    def init(self, num_gpu_blocks, **kwargs):
        pools.append((num_gpu_blocks, kwargs))
        original_init(self, num_gpu_blocks, **kwargs)

    depth = [0]            # only the engine's calls: one pool method calling another is not one

    def recorded(name):
        method = originals[name]

        def call(self, *args):
            if depth[0]:
                return method(self, *args)
            args = tuple(_frozen(a) for a in args)
            depth[0] += 1
            try:
                result = method(self, *args)
            finally:
                depth[0] -= 1
            calls.append((name, args, _frozen(result)))
            return result
        return call

    sc = load_scenario(scenario)
    BlockPool.__init__ = init
    for name in METHODS:
        setattr(BlockPool, name, recorded(name))
    try:
        simulate(sc)
    finally:
        BlockPool.__init__ = original_init
        for name, method in originals.items():
            setattr(BlockPool, name, method)
    if len(pools) != 1:
        raise SystemExit(f"{scenario}: {len(pools)} block pools; this tool replays one engine's")
    t = time.process_time()
    simulate(load_scenario(scenario))
    return pools[0], calls, time.process_time() - t


def replay(pool_args, calls, check: bool) -> float:
    num_gpu_blocks, kwargs = pool_args
    pool = BlockPool(num_gpu_blocks, **kwargs)
    bound = [(getattr(pool, name), args, result) for name, args, result in calls]
    t = time.process_time()
    if check:
        for method, args, result in bound:
            if (got := method(*args)) != result and result is not None:
                raise AssertionError(f"replay differs at {method.__name__}{args}: {got} != {result}")
    else:
        for method, args, _ in bound:
            method(*args)
    return time.process_time() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", nargs="?", default="scenarios/bench/w1.yaml")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    pool_args, calls, sim_cpu = record(args.scenario)
    replay(pool_args, calls, check=True)
    counts = Counter(name for name, _, _ in calls)
    moved = Counter()
    for name, a, result in calls:
        if name == "get_new_blocks":
            moved["popped"] += a[0]
        elif name in ("free_blocks", "free_request_blocks"):
            moved["freed"] += len(a[0])
        elif name == "touch":
            moved["touched"] += len(a[0])
        elif name == "cache_full_blocks":
            moved["hashed"] += a[3] - a[2]
        elif name == "cache_blocks_in_order":
            moved["hashed"] += len(a[0])
        elif name == "get_cached_prefix":
            moved["looked up (hits)"] += len(result)
    best = min(replay(pool_args, calls, check=False) for _ in range(args.reps))
    print(f"{args.scenario}: {len(calls):,} pool calls "
          + ", ".join(f"{n} {c:,}" for n, c in counts.most_common()))
    print("blocks: " + ", ".join(f"{n} {c:,}" for n, c in moved.items()))
    print(f"replay CPU {best:.3f} s (best of {args.reps}); simulate() {sim_cpu:.3f} s; "
          f"the block work is {100 * best / sim_cpu:.0f}% of it")


if __name__ == "__main__":
    main()
