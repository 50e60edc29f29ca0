"""CPython side of pypy_probe.sh: a scenario's request specs, pickled as plain data
(numpy arrays as dtype, bytes and shape), so that another interpreter rebuilds
exactly the specs simulate() draws. usage: dump_specs.py SCENARIO OUT.pkl"""
import pickle
import sys

import numpy as np

from kvsim.scenario.loader import load_scenario
from kvsim.workload import build_workload


def plain(v):
    if isinstance(v, np.ndarray):
        return ("nd", v.dtype.str, v.tobytes(), v.shape)
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    return v


sc = load_scenario(sys.argv[1])
workload = build_workload(sc.workload, rng=np.random.default_rng(sc.seed), base_dir=sc.base_dir,
                          max_prompt_len=sc.sched_config.max_model_len - 1)
specs = [{k: plain(getattr(s, k)) for k in s.__slots__} for s in workload.requests()]
with open(sys.argv[2], "wb") as f:
    pickle.dump({"specs": specs, "concurrency": workload.concurrency}, f, protocol=4)
print(f"{len(specs)} request specs -> {sys.argv[2]}")
