"""Measuring one workload: each run in a fresh child process, timed from outside and inside.

* a ``run`` workload runs the child runner ``python -m kvsim.bench _child ...``
  (``child.py``: what ``kvsim run SCENARIO --out TMP`` does, with the call to
  ``simulate`` timed and the engine steps read from ``Result.stats``); this
  process times the whole child and takes its peak RSS from ``os.wait4`` (the
  child's own ``ru_maxrss``, not the maximum over every child so far);
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
import time
from dataclasses import dataclass, field
from pathlib import Path

from kvsim.bench.workloads import WORKLOADS, Workload

@dataclass
class Measurement:
    """The repetitions of one workload and its step-path ratio."""

    workload: Workload
    reps: list[dict] = field(default_factory=list)
    ratio: dict | None = None        # {"requests", "fast_sim_s", "step_sim_s", "same_summary", "prefix"}
    note: str = ""

    def values(self, metric: str) -> list[float]:
        return [r[metric] for r in self.reps if r.get(metric) is not None]

    def median(self, metric: str) -> float | None:
        vals = self.values(metric)
        return statistics.median(vals) if vals else None


def _cli_prefix() -> list[str]:
    return [sys.executable, "-m"]


def run_child(cmd: list[str], workdir: Path, *, label: str) -> tuple[float, float, float]:
    """Run ``cmd`` in a fresh process; its wall time (s), CPU time (s) and peak RSS (MiB)."""
    log_path = workdir / f"{label}.log"
    with open(log_path, "w") as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        # wait4 gives this child's own resource usage (its ru_maxrss covers the
        # children it waited for, e.g. sweep workers), unlike RUSAGE_CHILDREN,
        # which is the maximum over every child this process ever had.
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
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
    wall, cpu, rss_mib = run_child(cmd, workdir, label=label)
    rec = json.loads(record_file.read_text())
    sim_s = rec["sim_s"]
    return {
        "sim_s": sim_s, "sim_cpu_s": rec["sim_cpu_s"], "process_wall_s": wall, "process_cpu_s": cpu,
        "peak_rss_mib": rss_mib,
        "num_requests": rec["num_requests"], "num_steps": rec["num_steps"],
        "requests_per_s": rec["num_requests"] / sim_s if sim_s > 0 else None,
        "steps_per_s": rec["num_steps"] / sim_s if sim_s > 0 else None,
        "us_per_step": 1e6 * sim_s / rec["num_steps"] if rec["num_steps"] else None,
        "fast_step_share": 100.0 * rec["num_fast_steps"] / rec["num_steps"] if rec["num_steps"] else None,
        "summary": rec["summary"],
    }


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


def measure_workload(w: Workload, workdir: Path, *, reps: int, quick: bool, requests: int | None,
                     workers: int, ratio: bool, scenarios: Path, log=print) -> Measurement:
    m = Measurement(w)
    for i in range(reps):
        if w.kind == "sweep":
            rec = measure_sweep(w, workdir, workers=workers, requests=requests, label=f"{w.name}-rep{i}",
                                scenarios=scenarios)
            log(f"  {w.name} rep {i + 1}/{reps}: {rec['process_wall_s']:.2f} s wall "
                f"({rec['num_points']} points, {workers} workers), peak {rec['peak_rss_mib']:.0f} MiB")
        else:
            ref = None
            if w.relative_to is not None:       # alternate: the reference, then this workload
                ref = measure_run(WORKLOADS[w.relative_to], workdir, path="fast", requests=requests,
                                  label=f"{w.name}-rep{i}-{w.relative_to}", scenarios=scenarios)
            rec = measure_run(w, workdir, path="fast", requests=requests, label=f"{w.name}-rep{i}",
                              scenarios=scenarios)
            if ref is not None:
                rec["ref_sim_cpu_s"] = ref["sim_cpu_s"]
                rec["sim_cpu_vs_ref"] = rec["sim_cpu_s"] / ref["sim_cpu_s"] if ref["sim_cpu_s"] else None
            log(f"  {w.name} rep {i + 1}/{reps}: simulate {rec['sim_s']:.3f} s, process "
                f"{rec['process_wall_s']:.2f} s, {rec['num_steps']:,} steps, peak {rec['peak_rss_mib']:.0f} MiB"
                + (f"; CPU {rec['sim_cpu_s']:.2f} s = {rec['sim_cpu_vs_ref']:.2f}x {w.relative_to}'s "
                   f"{ref['sim_cpu_s']:.2f} s" if ref is not None else ""))
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
    return m


# ------------------------------------------------------------------ profile


def profile_w1(workdir: Path, *, requests: int | None, scenarios: Path) -> dict:
    """pyinstrument over W1's simulate() in a child: call tree and top self times."""
    out = workdir / "profile.json"
    cmd = [*_cli_prefix(), "kvsim.bench", "_profile", str(out), str(scenarios / "w1.yaml"),
           *size_overrides(WORKLOADS["W1"], requests)]
    run_child(cmd, workdir, label="profile")
    return json.loads(out.read_text())
