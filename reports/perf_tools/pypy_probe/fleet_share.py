"""Both sides of pypy_probe.sh --fleet: replicas ONLY (comma-separated) of a fleet
scenario whose replicas run apart, in one process: the workload drawn and routed
whole (as a cluster.workers worker does), no tables; CPU seconds and a fingerprint.
usage: fleet_share.py SCENARIO ONLY"""
import gc
import hashlib
import platform
import sys
import time

from kvsim.fleet.runner import Fleet
from kvsim.scenario.cluster import fleet_workload, load_cluster
from kvsim.scenario.loader import load_scenario

sc = load_scenario(sys.argv[1])
only = [int(k) for k in sys.argv[2].split(",")]
cluster, plans = load_cluster(sc)
workload = fleet_workload(sc, plans)
if platform.python_implementation() != "PyPy":
    gc.disable()
start = time.process_time()
run = Fleet(plans, cluster, seed=sc.seed, fast_path=True, independent=True, only=only).run(workload.requests())
cpu = time.process_time() - start
h = hashlib.sha256()
n = 0
for k in only:
    for r in run.replicas[k].done:
        n += 1
        h.update(repr((k, str(r.request_id), r.finish_time, len(r.token_times), sum(r.token_times))).encode())
print(f"{platform.python_implementation()} {platform.python_version()} replicas {sys.argv[2]}: "
      f"{cpu:.3f} s CPU, {n} requests done, fingerprint {h.hexdigest()[:16]}", flush=True)
