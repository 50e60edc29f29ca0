"""A fleet whose replicas run apart, simulated in several processes (``cluster.workers``).

Replicas behind a router that reads no replica state, serving requests that
wait on none, never affect one another (kvsim/fleet/separate.py): each one's
events depend only on the requests routed to it and on when the front end
sends its last request. So the replicas can be shared out among processes::

    this process: Fleet (built, not run) ──> tasks: replicas {0, 2, ...}, {1, 3, ...}
                                                │                     │
    worker j:  load the scenario, draw the workload, route every request
               (the same choices), simulate only its replicas (Fleet(only=...)),
               build their tables (cluster.simulate_share) ──> back, pickled
                                                │                     │
    this process: collect_fleet(run, tables) ── the fleet's tables and summaries

Every worker draws the whole workload from the scenario's seed and routes
all of it, so each sees the same arrivals, router choices and last send as a
one-process run; the tables are that run's, byte for byte
(tests/test_fleet_parallel.py). What a worker costs beyond its replicas is
loading the scenario and drawing and routing the workload (a few % of W7).

The processes are the sweep executor's (kvsim/scenario/executor.py, local
pool: they die with this process, ignore Ctrl-C, are killed on an error).
A progress callback is not called: the replicas' clocks live in other
processes.
"""

from __future__ import annotations

from kvsim.fleet.runner import Fleet, FleetRun
from kvsim.scenario.executor import Task, execute


def simulate_apart(sc, fleet: Fleet, workers: int, run_share, *, fast_path: bool = True):
    """``fleet`` (built here, never run) simulated by ``workers`` processes, each
    running ``run_share(task) -> {"tables": [...], "num_routed": [...]}`` on its
    replicas (``kvsim.scenario.cluster.simulate_share``): (the FleetRun, without
    replicas, and each replica's tables)."""
    n = len(fleet.replicas)
    shares = [list(range(j, n, workers)) for j in range(workers)]   # pools spread evenly
    raw = {"raw": sc.raw, "base_dir": str(sc.base_dir), "fast_path": fast_path}
    tasks = [Task(key=j, scenario={**raw, "replicas": share}) for j, share in enumerate(shares)]
    records: dict[int, dict] = {}

    def on_done(task: Task, record: dict) -> None:
        share = task.scenario["replicas"]
        if record["summary"] is None and not record["traceback"]:
            # The process died (killed, out of memory): one line, as for a full disk.
            why = record["error"].removesuffix(" while this point was running")
            raise ChildProcessError(f"cluster.workers: a worker simulating replicas {share} failed: "
                                    f"{why}; fewer workers need less memory at once "
                                    f"(cluster.workers: 1 runs the fleet in this process)")
        if record["summary"] is None:
            # An exception in the worker: the one-process run would raise it too.
            error = RuntimeError(f"a fleet worker simulating replicas {share} failed: {record['error']}")
            error.add_note(f"in the worker:\n{record['traceback'].rstrip()}")
            raise error
        records[task.key] = record["summary"]

    execute(tasks, run_share, on_done, workers=workers)
    tables = [None] * n
    for j, share in enumerate(shares):
        for k, t in zip(share, records[j]["tables"]):
            tables[k] = t
    fleet._close()
    run = FleetRun([], fleet.infos, fleet.pools, fleet.router, records[0]["num_routed"])
    return run, tables
