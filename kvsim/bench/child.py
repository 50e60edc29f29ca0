"""What runs inside the benchmark's child processes (``python -m kvsim.bench _child | _profile``).

Nothing here patches the library: the child does what ``kvsim run`` does
(load, simulate, write the three tables, format the summary) and reads how
the run was simulated from ``Result.stats``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path


def profile_child(argv: list[str]) -> int:
    """``_profile OUT.json SCENARIO [--set KEY=VALUE ...]``: pyinstrument around simulate()."""
    from pyinstrument import Profiler

    from kvsim.scenario.loader import load_scenario
    from kvsim.scenario.simulate import simulate

    out, scenario, *rest = argv
    overrides = [rest[i + 1] for i in range(0, len(rest), 2) if rest[i] == "--set"]
    sc = load_scenario(scenario, overrides=overrides)
    profiler = Profiler(interval=0.001)
    profiler.start()
    t0 = time.perf_counter()
    simulate(sc)
    sim_s = time.perf_counter() - t0
    profiler.stop()
    session = profiler.last_session
    flat = _self_times(session.root_frame())
    total = sum(flat.values()) or 1.0
    top = sorted(flat.items(), key=lambda kv: -kv[1])[:15]
    tree = profiler.output_text(unicode=False, color=False, show_all=False, time="percent_of_total")
    Path(out).write_text(json.dumps({
        "sim_s": sim_s, "sampled_s": total,
        "top_self": [{"function": k, "self_s": v, "percent": 100.0 * v / total} for k, v in top],
        "tree": tree,
    }))
    return 0


def _self_times(root) -> dict[str, float]:
    """Self time per function (synthetic [self]/[await] leaves count for their parent)."""
    acc: dict[str, float] = {}
    stack = [root] if root is not None else []
    while stack:
        frame = stack.pop()
        real = [c for c in frame.children if not c.is_synthetic]
        own = frame.time - sum(c.time for c in real)
        key = f"{frame.function} ({frame.file_path_short}:{frame.line_no})"
        acc[key] = acc.get(key, 0.0) + own
        stack.extend(real)
    return acc


def run_child(argv: list[str]) -> int:
    """``_child RECORD.json fast|step SCENARIO --out DIR [--set KEY=VALUE ...]``.

    The work of ``kvsim run SCENARIO --out DIR`` (load the scenario, simulate,
    write summary.json, requests.csv, steps.csv, format the summary), with the
    call to ``simulate`` timed; ``fast|step`` runs it with the skip-ahead on
    or off. Writes RECORD.json: the times, the step counts of
    ``Result.stats``, the request count and the summary.
    """
    from kvsim.metrics.summary import format_summary
    from kvsim.scenario.loader import load_scenario
    from kvsim.scenario.simulate import simulate

    record_file, path, scenario, *rest = argv
    out_dir, overrides = _run_arguments(rest)
    sc = load_scenario(scenario, overrides=overrides)
    t0, c0 = time.perf_counter(), time.process_time()
    result = simulate(sc, fast_path=path == "fast")
    sim_s, sim_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    result.write(out_dir)
    with open(os.devnull, "w") as quiet:           # what `kvsim run` prints, to nowhere
        print(format_summary(result.summary), file=quiet)
    s, stats = result.summary, result.stats
    Path(record_file).write_text(json.dumps({
        "sim_s": sim_s, "sim_cpu_s": sim_cpu_s,
        "num_requests": int(s["completed"]) + int(s["failed"]),
        "num_steps": stats.num_steps, "num_fast_steps": stats.num_run_steps,
        "summary": s}, default=float))
    return 0


def _run_arguments(rest: list[str]) -> tuple[str, list[str]]:
    """``--out DIR`` and the ``--set`` overrides of a child's command line."""
    out_dir, overrides, i = None, [], 0
    while i < len(rest):
        flag, value = rest[i], rest[i + 1] if i + 1 < len(rest) else None
        if flag not in ("--out", "--set") or value is None:
            raise SystemExit(f"kvsim bench child: unexpected arguments {rest[i:]}")
        if flag == "--out":
            out_dir = value
        else:
            overrides.append(value)
        i += 2
    if out_dir is None:
        raise SystemExit("kvsim bench child: --out DIR is required")
    return out_dir, overrides
