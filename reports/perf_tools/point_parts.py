"""CPU milliseconds of each part of one sweep point, averaged over repetitions.

usage: PYTHONPATH=TREE python reports/perf_tools/point_parts.py [OVERRIDE...] [--reps 5]
(run from the tree; default point: W3's budget 1536, block 128, prefix caching off)

Parts: ``load_scenario``, ``build_workload``, the request specs, ``run_engine``
(the collector off, as ``simulate()`` has it), the requests table, the step
table, the ITL gaps and ``summarize``. Needs a tree with ``kvsim.scenario.result``.
"""

import gc
import sys
import time

import numpy as np

from kvsim.metrics.summary import summarize
from kvsim.scenario.loader import load_scenario
from kvsim.scenario.result import itl_seconds, requests_frame, steps_frame
from kvsim.sim.run import run_engine
from kvsim.workload import build_workload

args = sys.argv[1:]
reps = 5
if "--reps" in args:
    i = args.index("--reps")
    reps = int(args[i + 1])
    del args[i:i + 2]
overrides = args or ["engine.max_num_batched_tokens=1536", "engine.block_size=128",
                     "engine.enable_prefix_caching=false"]
spent: dict[str, float] = {}


def timed(name, f, *a, **k):
    t = time.process_time()
    out = f(*a, **k)
    spent[name] = spent.get(name, 0.0) + time.process_time() - t
    return out


for rep in range(reps + 1):                     # the first is a warm-up, not counted
    if rep == 1:
        spent.clear()
    sc = timed("load_scenario", load_scenario, "scenarios/bench/w3.yaml", overrides=overrides)
    workload = timed("build_workload", build_workload, sc.workload, rng=np.random.default_rng(sc.seed),
                     base_dir=sc.base_dir, max_prompt_len=sc.sched_config.max_model_len - 1)
    specs = timed("request specs", list, workload.requests())
    gc.disable()
    engine = timed("run_engine", run_engine, iter(specs), sc.sched_config, scheduler=sc.scheduler,
                   cost_model=sc.cost_model)
    requests = timed("requests table", requests_frame, engine.done)
    steps = timed("step table", steps_frame, engine)
    itl = timed("ITL gaps", itl_seconds, engine.done)
    timed("summarize", summarize, requests, steps, itl,
          num_gpu_blocks=engine.scheduler.config.num_gpu_blocks, slo=None)
    del engine
    gc.enable()
for name, seconds in spent.items():
    print(f"{name:16s} {1000 * seconds / reps:8.1f} ms")
