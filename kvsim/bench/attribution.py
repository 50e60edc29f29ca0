"""Where a run's time goes, by component: cProfile's function times grouped by kvsim module.

Why cProfile: it is Python's *deterministic* profiler (every call and
return is recorded, none sampled), so every function's call count is exact
and the same on every run, and it runs wherever Python does. Why not
callgrind for this: on Python 3.11 valgrind sees the interpreter's C
functions (``_PyEval_EvalFrameDefault``), not which Python module runs, so
its instruction counts cannot be split by module; ``kvsim bench --compare``
uses them for whole-run totals instead. cProfile's times are measured, and
each call costs the profiler about a microsecond more, so components made of
many small calls (the scheduler, the KV manager) read a little higher than
they are; the report gives the profiled total beside the unprofiled one.

Grouping: a function's own time (``tottime``) goes to the component of its
file (``COMPONENTS``). A function outside kvsim (a builtin such as
``list.append``, numpy, pandas, simpy) is charged to whoever called it, in
proportion to the time of each caller's calls (cProfile keeps, per caller,
the time spent in the callee on its behalf), and so on up to a kvsim
function. SimPy's own event loop, called by ``kvsim/sim/``, is the engine loop's.
"""

from __future__ import annotations

import pstats

# (path prefix inside the repository, component), first match wins.
COMPONENTS = (
    ("kvsim/sched/", "scheduler"),
    ("kvsim/kv/", "KV manager"),
    ("kvsim/cost/", "cost model"),
    ("kvsim/sim/steplog.py", "metrics"),            # the per-step records
    ("kvsim/sim/", "engine loop (sim/, SimPy)"),
    ("kvsim/fleet/", "fleet (routing, dispatch)"),
    ("kvsim/workload/", "workload (trace, requests)"),
    ("kvsim/metrics/tables.py", "output writing"),
    ("kvsim/scenario/outputs.py", "output writing"),
    ("kvsim/vllm_outputs.py", "output writing"),
    ("kvsim/bench/child.py", "output writing"),     # the writers it calls, one file at a time
    ("kvsim/metrics/", "metrics"),                  # summary, streaming stats, series, bench JSON
    ("kvsim/scenario/simulate.py", "metrics"),      # the result's tables
    ("kvsim/scenario/result.py", "metrics"),        # (they moved here with the fleet)
    ("kvsim/scenario/cluster.py", "metrics"),       # a fleet's tables and summaries (collect_fleet)
    ("kvsim/scenario/cluster_outputs.py", "output writing"),
    ("kvsim/scenario/", "scenario loading (YAML, validation, specs)"),
    ("kvsim/specs/", "scenario loading (YAML, validation, specs)"),
    ("kvsim/", "other kvsim"),
)
ORDER = ("scheduler", "KV manager", "cost model", "engine loop (sim/, SimPy)",
         "fleet (routing, dispatch)", "metrics",
         "output writing", "workload (trace, requests)",
         "scenario loading (YAML, validation, specs)", "other kvsim", "unattributed")
UNATTRIBUTED = "unattributed"


def component_of(filename: str) -> str | None:
    """The component of a source file, or None outside kvsim."""
    path = filename.replace("\\", "/")
    at = path.rfind("/kvsim/")
    if at < 0:
        return None
    rel = path[at + 1:]
    return next(name for prefix, name in COMPONENTS if rel.startswith(prefix))


def attribute(profiler) -> dict:
    """``{"components": {name: seconds}, "top": [...]}`` from a finished ``cProfile.Profile``.

    ``top``: the 15 kvsim functions with the most time charged to them (their
    own plus what they call outside kvsim), with exact call counts.
    """
    stats = pstats.Stats(profiler).stats      # func -> (cc, nc, tt, ct, callers)
    memo: dict = {}
    on_path: set = set()

    def owners(func) -> dict:
        """Shares of ``func``'s time per kvsim function it ran for (None: no kvsim caller).

        Empty when every way up leads back into the chain being followed
        (mutual recursion, e.g. a parser's states); such a partial answer is
        not remembered.
        """
        if component_of(func[0]) is not None:
            return {func: 1.0}
        if func in memo:
            return memo[func]
        callers = stats.get(func, (0, 0, 0, 0, {}))[4]
        if not callers:
            return {None: 1.0}
        on_path.add(func)
        # A caller edge is (calls, primitive calls, own time, time with callees).
        share: dict = {}
        found = 0.0
        complete = True
        for caller, edge in callers.items():
            if caller in on_path:
                complete = False
                continue
            above = owners(caller)
            if not above:
                complete = False
                continue
            w = edge[3] if edge[3] > 0 else 1e-12
            found += w
            for owner, f in above.items():
                share[owner] = share.get(owner, 0.0) + f * w
        on_path.discard(func)
        share = {owner: v / found for owner, v in share.items()} if found > 0 else {}
        if complete:
            memo[func] = share
        return share

    charged: dict = {}
    for func, (_, _, tt, _, callers) in stats.items():
        if component_of(func[0]) is not None or not callers:
            parts = {func if component_of(func[0]) is not None else None: tt}
        else:
            # Each caller's own share of this function's time, then up the chain.
            parts = {}
            for caller, edge in callers.items():
                for owner, f in (owners(caller) or {None: 1.0}).items():
                    parts[owner] = parts.get(owner, 0.0) + edge[2] * f
        for owner, t in parts.items():
            charged[owner] = charged.get(owner, 0.0) + t
    components: dict[str, float] = {}
    for owner, t in charged.items():
        name = UNATTRIBUTED if owner is None else component_of(owner[0])
        components[name] = components.get(name, 0.0) + t
    ordered = {name: components[name] for name in ORDER if name in components}
    kvsim_funcs = sorted(((t, f) for f, t in charged.items() if f is not None), reverse=True)[:15]
    top = [{"function": f"{f[2]} ({_short(f[0])}:{f[1]})", "component": component_of(f[0]),
            "seconds": t, "calls": stats[f][1]} for t, f in kvsim_funcs]
    return {"components": ordered, "top": top, "total_s": sum(components.values())}


def _short(filename: str) -> str:
    path = filename.replace("\\", "/")
    at = path.rfind("/kvsim/")
    return path[at + 1:] if at >= 0 else path
