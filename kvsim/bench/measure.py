"""Measuring one workload: each run in a fresh child process, timed from outside and inside.

* a ``run`` workload runs the child runner ``python -m kvsim.bench _child ...``
  (``child.py``: what ``kvsim run SCENARIO --out TMP`` does, with its phases
  stamped and the engine's counts read from ``Result.stats``); this process
  stamps the same clock before the fork and after the child ends, so the
  whole process splits into interpreter start, imports, loading, simulate(),
  each file, the summary and the exit; it takes the child's peak RSS from
  ``os.wait4`` (the child's own ``ru_maxrss``, not the maximum over every
  child so far);
* once per ``run`` workload, a small cut of it under ``python -X importtime``
  splits the imports by package (``imports.py``), and a cProfile run splits
  the time by component (``attribution.py``);
* a ``sweep`` workload (W3) runs ``kvsim sweep SCENARIO --out TMP --workers N``
  and is judged on its whole wall time;
* the ratio to the step-by-step reference path runs the same scenario with
  ``simulate(..., fast_path=False)`` and compares the summaries too.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from kvsim.bench.child import now
from kvsim.bench.imports import import_time_by_owner
from kvsim.bench.workloads import WORKLOADS, Workload


@dataclass
class Measurement:
    """The repetitions of one workload and its step-path ratio."""

    workload: Workload
    reps: list[dict] = field(default_factory=list)
    ratio: dict | None = None        # {"requests", "fast_sim_s", "step_sim_s", "same_summary", "prefix"}
    note: str = ""
    imports: dict | None = None      # owner -> seconds of import time (-X importtime of a small cut)
    attribution: dict | None = None  # attribution.attribute() of one cProfile run, + "requests"

    def values(self, metric: str) -> list[float]:
        return [r[metric] for r in self.reps if r.get(metric) is not None]

    def median(self, metric: str) -> float | None:
        vals = self.values(metric)
        return statistics.median(vals) if vals else None


def _cli_prefix() -> list[str]:
    return [sys.executable, "-m"]


def run_child(cmd: list[str], workdir: Path, *, label: str, stamps: list | None = None,
              env: dict | None = None, cwd: Path | None = None) -> tuple[float, float, float]:
    """Run ``cmd`` in a fresh process; its wall time (s), CPU time (s) and peak RSS (MiB).

    ``stamps``, if given, receives the monotonic clock before the fork and
    after the end (the clock of ``child.now``).
    """
    log_path = workdir / f"{label}.log"
    with open(log_path, "w") as log:
        t0 = now()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        # wait4 gives this child's own resource usage (its ru_maxrss covers the
        # children it waited for, e.g. sweep workers), unlike RUSAGE_CHILDREN,
        # which is the maximum over every child this process ever had.
        _, status, usage = os.wait4(proc.pid, 0)
        t1 = now()
        wall = t1 - t0
    if stamps is not None:
        stamps[:] = [t0, t1]
    proc.returncode = os.waitstatus_to_exitcode(status)
    text = log_path.read_text()
    if proc.returncode != 0:
        tail = "\n".join(text.splitlines()[-15:])
        raise RuntimeError(f"kvsim bench: {label} failed (exit {proc.returncode}):\n{tail}")
    cpu = usage.ru_utime + usage.ru_stime
    return wall, cpu, usage.ru_maxrss / 1024.0   # ru_maxrss is in KiB on Linux


def size_overrides(w: Workload, requests: int | None) -> list[str]:
    return [] if requests is None else ["--set", f"{w.size_key}={requests}"]


def measure_run(w: Workload, workdir: Path, *, path: str, requests: int | None, label: str,
                scenarios: Path) -> dict:
    """One ``kvsim run`` of ``w`` in a child; ``path`` is "fast" or "step"."""
    record_file = workdir / f"{label}.json"
    out_dir = workdir / f"{label}-out"
    cmd = [*_cli_prefix(), "kvsim.bench", "_child", str(record_file), path,
           str(scenarios / w.scenario), "--out", str(out_dir), *size_overrides(w, requests)]
    outside: list[float] = []
    wall, cpu, rss_mib = run_child(cmd, workdir, label=label, stamps=outside)
    rec = json.loads(record_file.read_text())
    phases = process_phases(outside[0], rec["stamps"], outside[1])
    sim_s = dict(phases)["simulate()"]
    n_steps = rec["num_steps"]
    events = num_events(rec)
    duration = rec["summary"].get("duration")
    simulated = duration if isinstance(duration, (int, float)) and math.isfinite(duration) else None
    return {
        "sim_s": sim_s, "sim_cpu_s": rec["sim_cpu_s"], "process_wall_s": wall, "process_cpu_s": cpu,
        "peak_rss_mib": rss_mib,
        "num_requests": rec["num_requests"], "num_steps": n_steps, "num_events": events,
        "requests_per_s": rec["num_requests"] / sim_s if sim_s > 0 else None,
        "steps_per_s": n_steps / sim_s if sim_s > 0 else None,
        "us_per_step": 1e6 * sim_s / n_steps if n_steps else None,
        "us_per_event": 1e6 * sim_s / events if events else None,
        "x_real_time": simulated / sim_s if simulated is not None and sim_s > 0 else None,
        "fast_step_share": 100.0 * rec["num_fast_steps"] / n_steps if n_steps else None,
        "phases": phases, "apart_s": rec.get("apart_s") or [], "summary": rec["summary"],
    }


def num_events(rec: dict) -> int:
    """Arrivals + finishes (completed or failed) + single steps + decode runs (docs/bench.md)."""
    single = rec["num_steps"] - rec["num_fast_steps"]
    return rec["num_arrived"] + rec["num_requests"] + single + rec["num_runs"]


def process_phases(before: float, stamps: list, after: float) -> list[tuple[str, float]]:
    """The whole process as consecutive phases: the child's stamps between the parent's two.

    The first phase runs from the fork to the child's first line (interpreter
    start); the last from the child's last stamp to its end as this process
    saw it (the record, the exit).
    """
    names = ["interpreter start", *(name for name, _ in stamps[1:]), "exit"]
    times = [before, *(t for _, t in stamps), after]
    return [(name, b - a) for name, a, b in zip(names, times, times[1:])]


def measure_sweep(w: Workload, workdir: Path, *, workers: int, requests: int | None, label: str,
                  scenarios: Path) -> dict:
    out_dir = workdir / f"{label}-out"
    cmd = [*_cli_prefix(), "kvsim", "sweep", str(scenarios / w.scenario), "--out", str(out_dir),
           "--workers", str(workers), *size_overrides(w, requests)]
    wall, cpu, rss_mib = run_child(cmd, workdir, label=label)
    import pandas as pd
    rows = pd.read_csv(out_dir / "results.csv")
    ok = rows[rows["status"] == "ok"]
    if len(ok) != len(rows):
        raise RuntimeError(f"kvsim bench: {label}: {len(rows) - len(ok)} sweep point(s) failed; "
                           f"see {out_dir / 'results.csv'}")
    num_requests = int((ok["completed"] + ok["failed"]).sum())
    return {
        "process_wall_s": wall, "process_cpu_s": cpu, "cpu_per_worker_s": cpu / workers,
        "peak_rss_mib": rss_mib, "num_requests": num_requests,
        "requests_per_s": num_requests / wall, "points_sim_s_sum": float(ok["wall_time_s"].sum()),
        "num_points": len(ok), "workers": workers,
    }


def same_summary(a: dict, b: dict) -> bool:
    """Equal summaries; NaN equals NaN (an empty metric in both)."""
    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
            continue
        if x != y:
            return False
    return True


def measure_imports(w: Workload, workdir: Path, *, scenarios: Path, requests: int = 20) -> dict:
    """Import time by package: ``w`` cut to ``requests`` requests under ``python -X importtime``.

    A separate small run, so the timed repetitions carry no logging; the
    imports do not depend on the size (what a bigger run imports late, a
    small one imports too).
    """
    label = f"{w.name}-imports"
    cmd = [sys.executable, "-X", "importtime", "-m", "kvsim.bench", "_child", str(workdir / f"{label}.json"),
           "fast", str(scenarios / w.scenario), "--out", str(workdir / f"{label}-out"),
           *size_overrides(w, requests)]
    run_child(cmd, workdir, label=label)
    return import_time_by_owner((workdir / f"{label}.log").read_text(), after="kvsim.bench.child")


def measure_attribution(w: Workload, workdir: Path, *, scenarios: Path, requests: int | None) -> dict:
    """cProfile over one run of ``w`` in a child (``child.attribute_child``), grouped by component."""
    label = f"{w.name}-attribution"
    out = workdir / f"{label}.json"
    cut = requests if requests is not None else w.attribution_requests
    cmd = [*_cli_prefix(), "kvsim.bench", "_attribute", str(out), str(scenarios / w.scenario),
           *size_overrides(w, cut), *(arg for o in w.attribution_overrides for arg in ("--set", o))]
    run_child(cmd, workdir, label=label)
    return {**json.loads(out.read_text()), "requests": cut}


def measure_workload(w: Workload, workdir: Path, *, reps: int, quick: bool, requests: int | None,
                     workers: int, ratio: bool, scenarios: Path, attribution: bool = True,
                     log=print) -> Measurement:
    m = Measurement(w)
    for i in range(reps):
        if w.kind == "sweep":
            rec = measure_sweep(w, workdir, workers=workers, requests=requests, label=f"{w.name}-rep{i}",
                                scenarios=scenarios)
            log(f"  {w.name} rep {i + 1}/{reps}: {rec['process_wall_s']:.2f} s wall "
                f"({rec['num_points']} points, {workers} workers), peak {rec['peak_rss_mib']:.0f} MiB")
        else:
            rec = measure_run(w, workdir, path="fast", requests=requests, label=f"{w.name}-rep{i}",
                              scenarios=scenarios)
            log(f"  {w.name} rep {i + 1}/{reps}: simulate {rec['sim_s']:.3f} s "
                f"({rec['sim_cpu_s']:.3f} s CPU, {rec['us_per_event']:.1f} us/event), process "
                f"{rec['process_wall_s']:.2f} s, {rec['num_steps']:,} steps, peak {rec['peak_rss_mib']:.0f} MiB")
        m.reps.append(rec)
    if ratio and w.kind == "run" and w.ratio_requests is not None:
        prefix = None
        if quick or w.ratio_always_prefix:
            prefix = w.ratio_requests if requests is None else min(requests, w.ratio_requests)
        if prefix is None or prefix == requests:
            # The repetitions already ran this size on the fast path.
            fast_sim, fast_cpu = m.median("sim_s"), m.median("sim_cpu_s")
            fast_summary = m.reps[0]["summary"]
        else:
            fast = measure_run(w, workdir, path="fast", requests=prefix, label=f"{w.name}-ratio-fast",
                              scenarios=scenarios)
            fast_sim, fast_cpu, fast_summary = fast["sim_s"], fast["sim_cpu_s"], fast["summary"]
        step = measure_run(w, workdir, path="step", requests=prefix if prefix is not None else requests,
                           label=f"{w.name}-ratio-step", scenarios=scenarios)
        m.ratio = {"prefix": prefix, "requests": step["num_requests"], "fast_sim_s": fast_sim,
                   "step_sim_s": step["sim_s"], "fast_cpu_s": fast_cpu, "step_cpu_s": step["sim_cpu_s"],
                   "same_summary": same_summary(fast_summary, step["summary"]),
                   "step_steps": step["num_steps"]}
        log(f"  {w.name} step path: {step['sim_cpu_s']:.2f} s CPU vs fast {fast_cpu:.3f} s "
            f"({step['sim_cpu_s'] / fast_cpu:.1f}x) on {step['num_requests']:,} requests; "
            f"same summary: {m.ratio['same_summary']}")
    if w.kind == "run":
        m.imports = measure_imports(w, workdir, scenarios=scenarios)
        if attribution:
            m.attribution = measure_attribution(w, workdir, scenarios=scenarios, requests=requests)
            shares = m.attribution["components"]
            total = m.attribution["total_s"] or 1.0
            log(f"  {w.name} cProfile ({m.attribution['profiled_s']:.2f} s profiled): " + ", ".join(
                f"{name} {100 * t / total:.0f}%" for name, t in shares.items() if t / total >= 0.01))
    return m


# ------------------------------------------------------------------ profile


def profile_w1(workdir: Path, *, requests: int | None, scenarios: Path) -> dict:
    """pyinstrument over W1's simulate() in a child: call tree and top self times."""
    out = workdir / "profile.json"
    cmd = [*_cli_prefix(), "kvsim.bench", "_profile", str(out), str(scenarios / "w1.yaml"),
           *size_overrides(WORKLOADS["W1"], requests)]
    run_child(cmd, workdir, label="profile")
    return json.loads(out.read_text())
