"""Both sides of pypy_probe.sh: ``run_engine`` (the engine loop of simulate(), without
drawing the workload or building the tables) on the dumped specs, REPS times in one
process, each time with its CPU seconds and a fingerprint of every request's
finish and token times (the same fingerprint: the same results, bit for bit).
usage: run_engine.py SCENARIO SPECS.pkl REPS (PROBE_GC_OFF=1: PyPy's collector off too)"""
import gc
import hashlib
import os
import pickle
import platform
import sys
import time

import numpy as np

from kvsim.scenario.loader import load_scenario
from kvsim.sim.run import run_engine
from kvsim.workload.request import RequestSpec

scenario, specs_file, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(specs_file, "rb") as f:
    data = pickle.load(f)


def rebuilt(v):
    if isinstance(v, tuple) and len(v) == 4 and v[0] == "nd":
        return np.frombuffer(v[2], dtype=np.dtype(v[1])).reshape(v[3])
    return v


pypy = platform.python_implementation() == "PyPy"
sc = load_scenario(scenario)
for rep in range(reps):
    specs = [RequestSpec(**{k: rebuilt(v) for k, v in d.items()}) for d in data["specs"]]
    if not pypy or os.environ.get("PROBE_GC_OFF"):
        gc.disable()          # as simulate() runs (kvsim.sim.gc_pause); PyPy's GC stays on unless asked
    start = time.process_time()
    engine = run_engine(iter(specs), sc.sched_config, scheduler=sc.scheduler, cost_model=sc.cost_model,
                        trace=None, concurrency=data["concurrency"], fast_path=True, sink=None,
                        progress=None, connector=None, watch_steps=None)
    cpu = time.process_time() - start
    gc.enable()
    h = hashlib.sha256()
    for r in sorted(engine.done, key=lambda r: str(r.request_id)):
        times = list(r.token_times)
        h.update(repr((str(r.request_id), r.finish_time, len(times), times[:1], times[-1:],
                       sum(times))).encode())
    print(f"{platform.python_implementation()} {platform.python_version()} run {rep + 1}: "
          f"{cpu:.3f} s CPU, {len(engine.done)} requests done, fingerprint {h.hexdigest()[:16]}",
          flush=True)
