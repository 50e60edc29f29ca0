"""``kvsim bench``: speed of the simulator on fixed reference workloads.

Each workload is a scenario in ``scenarios/bench/`` (W1-W4, see
docs/bench.md). Every measurement runs in a fresh child process, so imports
and peak memory belong to that workload alone:

* a ``run`` workload runs ``kvsim run SCENARIO --out TMP`` inside a small
  runner (``python -m kvsim.bench _child ...``) that also times the call to
  ``simulate`` and counts the engine steps; the parent times the whole
  process and takes its peak RSS from ``os.wait4`` (the child's own
  ``ru_maxrss``, not the maximum over every child so far);
* a ``sweep`` workload (W3) runs ``kvsim sweep SCENARIO --out TMP --workers N``
  and is judged on its whole wall time;
* the ratio to the step-by-step reference path runs the same scenario with
  ``simulate(..., fast_path=False)`` and compares the summaries too.

Targets come from the speed issue; the met / not-met column is computed from
the numbers by :func:`judge`, never written by hand. The machine is shared, so
the load average is recorded: above 1 per core the numbers are pessimistic.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
BENCH_DIR = REPO_ROOT / "scenarios" / "bench"
DEFAULT_OUT = REPO_ROOT / "reports" / "performance.md"

# The best-known peer (a Python simulator stepping every iteration) on W1's
# workload, 10,000 Azure conversation requests on a 2-core machine: 37 s of
# event loop, 110 s wall with its output writing, 60-75 us per event (issue).
PEER_EVENT_LOOP_S = 37.0
PEER_WALL_S = 110.0

REPORT_COLUMNS = ("metric", "median", "min", "max", "target", "met")


@dataclass(frozen=True)
class Workload:
    """One reference workload: a scenario file and how to shrink it."""

    name: str
    scenario: str                 # file name in scenarios/bench/
    kind: str                     # "run" (kvsim run) or "sweep" (kvsim sweep)
    title: str
    size_key: str                 # the scenario key that sets the number of requests
    ratio_requests: int | None    # prefix for the step-path ratio with --quick (None: no ratio)
    ratio_always_prefix: bool = False   # the full step path would take far too long
    heavy: bool = False           # minutes per run: repeated --heavy-reps times, not --reps


WORKLOADS: dict[str, Workload] = {w.name: w for w in (
    Workload("W1", "w1.yaml", "run",
             "Azure 2023 conversation trace, first 10,000 requests; Llama-3.1-8B, 1x H100, "
             "chunked, budget 2048, prefix caching, roofline",
             "workload.trace.max_requests", 2000),
    Workload("W2", "w2.yaml", "run",
             "Mooncake conversation trace, all 12,031 requests with hash_ids prefix sharing; "
             "Llama-3.1-70B, TP4 on H100, chunked, roofline",
             "workload.trace.max_requests", 1000, heavy=True),
    Workload("W3", "w3.yaml", "sweep",
             "100-point sweep of W1's first 2,000 requests: 10 budgets x 5 block sizes x "
             "prefix caching on/off, on all cores",
             "workload.trace.max_requests", None, heavy=True),
    Workload("W4", "w4.yaml", "run",
             "1,000,000 synthetic requests, streaming metrics; Qwen3-1.7B, 1x H100, "
             "Poisson 1000 req/s, 4 output tokens",
             "workload.num_requests", 10000, ratio_always_prefix=True, heavy=True),
)}


@dataclass(frozen=True)
class Target:
    """A goal from the issue: ``metric`` of ``workload`` must be below ``limit``."""

    workload: str
    metric: str
    limit: float
    unit: str
    text: str


TARGETS = (
    Target("W1", "sim_s", 1.0, "s", "simulated in under 1 s on one core"),
    Target("W1", "process_wall_s", 3.0, "s",
           "whole `kvsim run` process (imports, output writing) under 3 s"),
    # The same two targets in CPU time: on a shared machine wall time includes
    # waiting for the CPU; CPU time does not (equal to wall on an idle core).
    Target("W1", "sim_cpu_s", 1.0, "s", "simulation under 1 s of CPU time (load-independent view)"),
    Target("W1", "process_cpu_s", 3.0, "s", "whole process under 3 s of CPU time (load-independent view)"),
    Target("W3", "process_wall_s", 30.0, "s", "100-point sweep under 30 s on two cores"),
    Target("W3", "cpu_per_worker_s", 30.0, "s",
           "sweep CPU time / workers under 30 s (load-independent view)"),
    Target("W4", "peak_rss_mib", 1024.0, "MiB", "peak memory under 1 GiB"),
)

# metric key -> (label, unit, format)
METRICS = {
    "sim_s": ("time inside simulate()", "s", "{:.3f}"),
    "sim_cpu_s": ("CPU time inside simulate()", "s", "{:.3f}"),
    "process_wall_s": ("whole process wall time", "s", "{:.2f}"),
    "process_cpu_s": ("whole process CPU time (user + system)", "s", "{:.2f}"),
    "requests_per_s": ("simulated requests per wall second (W3: of the sweep, else in simulate)",
                       "req/s", "{:,.0f}"),
    "steps_per_s": ("engine steps per wall second (in simulate)", "steps/s", "{:,.0f}"),
    "us_per_step": ("wall time per engine step", "us", "{:.1f}"),
    "num_steps": ("engine steps", "", "{:,.0f}"),
    "fast_step_share": ("steps taken by the fast path", "%", "{:.1f}"),
    "num_requests": ("simulated requests", "", "{:,.0f}"),
    "peak_rss_mib": ("peak memory (RSS of the process; W3: its largest process)", "MiB", "{:,.0f}"),
    "points_sim_s_sum": ("sum of the points' own wall times", "s", "{:.2f}"),
    "cpu_per_worker_s": ("CPU time (user + system, workers included) / workers", "s", "{:.2f}"),
}


def judge(value: float | None, limit: float) -> str:
    """Met / not-met cell for ``value < limit``; how far off when not met."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a (not measured)"
    if value < limit:
        return "met"
    return f"NOT met ({value / limit:.2f}x the target)"


# ------------------------------------------------------------------ measurements


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
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
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


def measure_run(w: Workload, workdir: Path, *, path: str, requests: int | None, label: str) -> dict:
    """One ``kvsim run`` of ``w`` in a child; ``path`` is "fast" or "step"."""
    record_file = workdir / f"{label}.json"
    out_dir = workdir / f"{label}-out"
    cmd = [*_cli_prefix(), "kvsim.bench", "_child", str(record_file), path,
           "run", str(BENCH_DIR / w.scenario), "--out", str(out_dir), *size_overrides(w, requests)]
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


def measure_sweep(w: Workload, workdir: Path, *, workers: int, requests: int | None, label: str) -> dict:
    out_dir = workdir / f"{label}-out"
    cmd = [*_cli_prefix(), "kvsim", "sweep", str(BENCH_DIR / w.scenario), "--out", str(out_dir),
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
                     workers: int, ratio: bool, log=print) -> Measurement:
    m = Measurement(w)
    for i in range(reps):
        if w.kind == "sweep":
            rec = measure_sweep(w, workdir, workers=workers, requests=requests, label=f"{w.name}-rep{i}")
            log(f"  {w.name} rep {i + 1}/{reps}: {rec['process_wall_s']:.2f} s wall "
                f"({rec['num_points']} points, {workers} workers), peak {rec['peak_rss_mib']:.0f} MiB")
        else:
            rec = measure_run(w, workdir, path="fast", requests=requests, label=f"{w.name}-rep{i}")
            log(f"  {w.name} rep {i + 1}/{reps}: simulate {rec['sim_s']:.3f} s, process "
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
            fast = measure_run(w, workdir, path="fast", requests=prefix, label=f"{w.name}-ratio-fast")
            fast_sim, fast_cpu, fast_summary = fast["sim_s"], fast["sim_cpu_s"], fast["summary"]
        step = measure_run(w, workdir, path="step", requests=prefix if prefix is not None else requests,
                           label=f"{w.name}-ratio-step")
        m.ratio = {"prefix": prefix, "requests": step["num_requests"], "fast_sim_s": fast_sim,
                   "step_sim_s": step["sim_s"], "fast_cpu_s": fast_cpu, "step_cpu_s": step["sim_cpu_s"],
                   "same_summary": same_summary(fast_summary, step["summary"]),
                   "step_steps": step["num_steps"]}
        log(f"  {w.name} step path: {step['sim_cpu_s']:.2f} s CPU vs fast {fast_cpu:.3f} s "
            f"({step['sim_cpu_s'] / fast_cpu:.1f}x) on {step['num_requests']:,} requests; "
            f"same summary: {m.ratio['same_summary']}")
    return m


# ------------------------------------------------------------------ profile


def profile_w1(workdir: Path, *, requests: int | None) -> dict:
    """pyinstrument over W1's simulate() in a child: call tree and top self times."""
    out = workdir / "profile.json"
    cmd = [*_cli_prefix(), "kvsim.bench", "_profile", str(out), str(BENCH_DIR / "w1.yaml"),
           *size_overrides(WORKLOADS["W1"], requests)]
    run_child(cmd, workdir, label="profile")
    return json.loads(out.read_text())


def _profile_child(argv: list[str]) -> int:
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


# ------------------------------------------------------------------ child runner


def _run_child(argv: list[str]) -> int:
    """``_child RECORD.json fast|step <kvsim cli args>``: kvsim's CLI, timing simulate()."""
    record_file, path, *cli_argv = argv
    import importlib

    from kvsim import cli

    # kvsim.scenario re-exports the function simulate, which hides the module
    # of the same name from `import ... as`; take the module itself.
    simulate_module = importlib.import_module("kvsim.scenario.simulate")

    record: dict = {}
    plain_simulate, plain_run_engine = simulate_module.simulate, simulate_module.run_engine

    def run_engine(*args, **kwargs):
        engine = plain_run_engine(*args, **kwargs)
        record["num_steps"] = engine.steps.next_step
        record["num_fast_steps"] = engine.num_run_steps
        return engine

    def simulate(*args, **kwargs):
        kwargs["fast_path"] = path == "fast"
        t0, c0 = time.perf_counter(), time.process_time()
        result = plain_simulate(*args, **kwargs)
        record["sim_s"] = time.perf_counter() - t0
        record["sim_cpu_s"] = time.process_time() - c0
        s = result.summary
        record["num_requests"] = int(s["completed"]) + int(s["failed"])
        record["summary"] = s
        return result

    # `kvsim run` imports simulate when it runs and simulate() calls the
    # module's run_engine, so both wrappers are seen without other changes.
    simulate_module.simulate, simulate_module.run_engine = simulate, run_engine
    with open(os.devnull, "w") as quiet:
        stdout, sys.stdout = sys.stdout, quiet
        try:
            status = cli.main(cli_argv)
        finally:
            sys.stdout = stdout
    if status != 0 or "sim_s" not in record:
        print(f"kvsim bench child: kvsim {' '.join(cli_argv)} exited {status}", file=sys.stderr)
        return status or 1
    Path(record_file).write_text(json.dumps(record, default=float))
    return 0


# ------------------------------------------------------------------ report


def machine_info() -> dict:
    import numpy

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu, "cores": len(os.sched_getaffinity(0)), "python": platform.python_version(),
        "numpy": numpy.__version__, "loadavg": os.getloadavg(),
    }


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT,
                             capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "kvsim"], cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return out.stdout.strip() + (" (kvsim/ has uncommitted changes)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _fmt(metric: str, value) -> str:
    if value is None:
        return "—"
    return METRICS[metric][2].format(value)


def workload_table(m: Measurement, *, scaled: bool) -> list[str]:
    w = m.workload
    lines = ["| " + " | ".join(REPORT_COLUMNS) + " |", "|" + "---|" * len(REPORT_COLUMNS)]
    order = (["process_wall_s", "process_cpu_s", "cpu_per_worker_s", "points_sim_s_sum", "num_requests", "requests_per_s",
              "peak_rss_mib"]
             if w.kind == "sweep" else
             ["sim_s", "sim_cpu_s", "process_wall_s", "process_cpu_s", "num_requests", "requests_per_s", "num_steps", "steps_per_s",
              "us_per_step", "fast_step_share", "peak_rss_mib"])
    for metric in order:
        vals = m.values(metric)
        if not vals:
            continue
        label, unit, _ = METRICS[metric]
        target = next((t for t in TARGETS if t.workload == w.name and t.metric == metric), None)
        if target is None:
            tcell, met = "—", "—"
        else:
            tcell = f"< {target.limit:g} {target.unit}"
            met = "n/a (scaled-down run)" if scaled else judge(m.median(metric), target.limit)
        name = f"{label} ({unit})" if unit else label
        lines.append(f"| {name} | {_fmt(metric, statistics.median(vals))} | {_fmt(metric, min(vals))} | "
                     f"{_fmt(metric, max(vals))} | {tcell} | {met} |")
    if m.ratio is not None:
        r = m.ratio
        where = (f"first {r['requests']:,} requests" if r["prefix"] is not None else "the full workload")
        # CPU time: the two runs happen at different moments of a shared
        # machine's load, which wall time would mix into the ratio.
        cpu_ratio = r["step_cpu_s"] / r["fast_cpu_s"] if r["fast_cpu_s"] else float("nan")
        wall_ratio = r["step_sim_s"] / r["fast_sim_s"] if r["fast_sim_s"] else float("nan")
        lines.append(f"| step-by-step path / fast path, CPU time in simulate() ({where}; "
                     f"{r['step_cpu_s']:.2f} s / {r['fast_cpu_s']:.3f} s; wall: {r['step_sim_s']:.2f} s / "
                     f"{r['fast_sim_s']:.3f} s = {wall_ratio:.1f}x) | {cpu_ratio:.1f}x | — | — | — | — |")
        lines.append(f"| same summary from both paths | {'yes' if r['same_summary'] else 'NO'} | — | — | "
                     f"identical | {'met' if r['same_summary'] else 'NOT met'} |")
    return lines


def render_report(measurements: list[Measurement], *, machine: dict, load_end: tuple, command: str,
                  reps: int, heavy_reps: int = 1, quick: bool, requests: int | None, commit: str,
                  profile: dict | None, started: str) -> str:
    cores = machine["cores"]
    load1 = machine["loadavg"][0]
    scaled = requests is not None
    out = ["# kvsim performance",
           "",
           f"Generated by `{command}` on {started} (git {commit}); regenerate with the same command. "
           "Every number below is computed by `kvsim/bench.py`; the met column is computed from the "
           "numbers. See docs/bench.md for what each workload and metric is.",
           ""]
    if scaled:
        out += [f"**Scaled-down run** (`--requests {requests}`): every workload was cut to its first "
                f"{requests:,} requests, so the targets do not apply.", ""]
    out += ["## Machine", "",
            "| CPU | cores usable | python | numpy | load average at start (1/5/15 min) | at end |",
            "|---|---|---|---|---|---|",
            f"| {machine['cpu']} | {cores} | {machine['python']} | {machine['numpy']} | "
            f"{' / '.join(f'{x:.2f}' for x in machine['loadavg'])} | "
            f"{' / '.join(f'{x:.2f}' for x in load_end)} |", ""]
    if max(load1, load_end[0]) > 1:
        out += [f"The machine is shared with other engineers: a load average above 1 (here "
                f"{load1:.2f} at the start, {load_end[0]:.2f} at the end, on {cores} cores) means "
                "other processes competed for the CPU, so these times are **pessimistic** (an idle "
                "machine gives shorter ones).", ""]
    out += [f"Repetitions: {reps} of W1, {heavy_reps} of each of W2, W3, W4 (they take minutes "
            "each); tables give the median, min and max; every run is a fresh process. "
            "Time inside simulate() is the simulation alone (scenario loaded, no output writing); "
            "the whole-process wall time includes interpreter start, imports, loading the trace and "
            "writing summary.json, requests.csv and steps.csv (`kvsim run --out`). Peak memory is "
            "the process's maximum RSS (`os.wait4`).", ""]

    # Targets first: what the issue asks.
    out += ["## Targets", "", "| workload | target | measured (median) | met |", "|---|---|---|---|"]
    by_name = {m.workload.name: m for m in measurements}
    for t in TARGETS:
        m = by_name.get(t.workload)
        value = m.median(t.metric) if m else None
        cell = "not run" if m is None else f"{_fmt(t.metric, value)} {t.unit}"
        met = "not run" if m is None else ("n/a (scaled-down run)" if scaled else judge(value, t.limit))
        out.append(f"| {t.workload} | {t.text} | {cell} | {met} |")
    for m in measurements:
        if m.ratio is not None:
            out.append(f"| {m.workload.name} | fast path gives the same summary as the step path "
                       f"(tests/test_fast_path.py checks per-request times too) | "
                       f"{'same' if m.ratio['same_summary'] else 'different'} | "
                       f"{'met' if m.ratio['same_summary'] else 'NOT met'} |")
    out.append("")

    for m in measurements:
        w = m.workload
        out += [f"## {w.name}: {w.title}", "",
                f"Scenario: `scenarios/bench/{w.scenario}`"
                + (f" (`--set {w.size_key}={requests}`)" if scaled else "") + ".", ""]
        if w.kind == "sweep" and m.reps:
            rec = m.reps[0]
            out += [f"`kvsim sweep scenarios/bench/{w.scenario} --workers {rec['workers']}`: "
                    f"{rec['num_points']} points; requests per second counts every point's requests "
                    "over the whole sweep's wall time.", ""]
        if w.kind == "run" and w.ratio_requests is not None and m.ratio is not None and m.ratio["prefix"]:
            why = ("the full step path over a million requests would take far longer than the rest "
                   "of the benchmark" if w.ratio_always_prefix else "`--quick`")
            out += [f"The step-path ratio uses the first {m.ratio['prefix']:,} requests ({why}); both "
                    "paths run that same prefix in fresh processes.", ""]
        out += workload_table(m, scaled=scaled) + [""]

    w1 = by_name.get("W1")
    if w1 and w1.reps:
        sim, cpu = w1.median("sim_s"), w1.median("sim_cpu_s")
        steps = w1.median("num_steps")
        out += ["## Peer comparison", "",
                f"The best-known peer, a Python simulator that steps every iteration, needs about "
                f"{PEER_EVENT_LOOP_S:.0f} s of event loop ({PEER_WALL_S:.0f} s wall with its output "
                f"writing) for W1's 10,000 Azure conversation requests on a 2-core machine, about "
                f"60-75 us per event (figures from the issue, not measured here).", "",
                "| | peer | kvsim (median) | peer / kvsim |", "|---|---|---|---|",
                f"| event loop / time in simulate() | {PEER_EVENT_LOOP_S:.0f} s | {sim:.2f} s | "
                f"{PEER_EVENT_LOOP_S / sim:.1f}x |",
                f"| event loop / CPU time in simulate() | {PEER_EVENT_LOOP_S:.0f} s (wall) | "
                f"{cpu:.2f} s | {PEER_EVENT_LOOP_S / cpu:.1f}x |",
                f"| whole process | {PEER_WALL_S:.0f} s | {w1.median('process_wall_s'):.2f} s | "
                f"{PEER_WALL_S / w1.median('process_wall_s'):.1f}x |",
                f"| per engine step | 60-75 us | {1e6 * sim / steps:.1f} us | "
                f"{60 / (1e6 * sim / steps):.1f}-{75 / (1e6 * sim / steps):.1f}x |", ""]
        if scaled:
            out += ["(Scaled-down run: the peer figures are for 10,000 requests, so this comparison "
                    "is not meaningful here.)", ""]

    if profile is not None:
        out += ["## Profile of W1 (pyinstrument)", "",
                f"pyinstrument (1 ms sampling) around simulate() of W1 in a fresh process: "
                f"{profile['sim_s']:.2f} s profiled (the profiler itself slows the run). Self time "
                "per function (time spent in the function's own code, not in what it calls):", "",
                "| function (file:line) | self time (s) | % of sampled time |", "|---|---|---|"]
        for row in profile["top_self"]:
            out.append(f"| `{row['function']}` | {row['self_s']:.2f} | {row['percent']:.1f} |")
        tree = profile["tree"].strip("\n").splitlines()
        keep = [ln for ln in tree if ln.strip()][:70]
        out += ["", "Top of the call tree (% of total time):", "", "```", *keep, "```", ""]

    out += ["## Command", "", "```", command, "```", ""]
    return "\n".join(out)


# ------------------------------------------------------------------ command


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "bench", help="speed benchmarks; write reports/performance.md",
        description="Run the reference workloads of scenarios/bench/ (W1: Azure conversation 10k; "
                    "W2: Mooncake 12k, 70B TP4; W3: 100-point sweep; W4: 1M synthetic, streaming), "
                    "each in fresh processes, and write the timings, peak memory, the ratio to the "
                    "step-by-step path and the targets to a Markdown report. See docs/bench.md.")
    _add_arguments(p)
    p.set_defaults(func=bench_command)
    return p


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("workloads", nargs="*", metavar="W", help="W1 W2 W3 W4 (default: all)")
    p.add_argument("--reps", type=int, default=3, metavar="N",
                   help="repetitions of W1 (default 3; see --heavy-reps for the others)")
    p.add_argument("--heavy-reps", type=int, default=1, metavar="N",
                   help="repetitions of the workloads that take minutes each (W2, W3, W4; default 1)")
    p.add_argument("--quick", action="store_true",
                   help="step-path ratio on a prefix of each trace (W1: 2,000 requests, W2: 1,000) "
                        "instead of the whole workload")
    p.add_argument("--no-ratio", action="store_true", help="skip the step-by-step path ratio")
    p.add_argument("--profile", action="store_true", help="profile W1's simulation with pyinstrument")
    p.add_argument("--requests", type=int, default=None, metavar="N",
                   help="cut every workload to its first N requests (smoke tests; targets then do not apply)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="sweep workers for W3 (default: every core this process may use)")
    p.add_argument("--out", default=str(DEFAULT_OUT), metavar="FILE.md",
                   help="report to write (default reports/performance.md)")


def bench_command(args: argparse.Namespace, *, log=print) -> int:
    names = [n.upper() for n in args.workloads] or list(WORKLOADS)
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        raise ValueError(f"workload {unknown[0]!r}: not a bench workload; allowed: {', '.join(WORKLOADS)}")
    for flag, value in (("--reps", args.reps), ("--heavy-reps", args.heavy_reps)):
        if value < 1:
            raise ValueError(f"{flag}: expected an integer >= 1, got {value}")
    if args.requests is not None and args.requests < 1:
        raise ValueError(f"--requests: expected an integer >= 1, got {args.requests}")
    workers = args.workers or len(os.sched_getaffinity(0))
    if workers < 1:
        raise ValueError(f"--workers: expected an integer >= 1, got {workers}")
    command = " ".join(["kvsim bench", *_argv_text(args)])
    machine = machine_info()
    started = time.strftime("%Y-%m-%d %H:%M %Z")
    log(f"kvsim bench: load average {machine['loadavg'][0]:.2f} on {machine['cores']} cores")
    measurements = []
    with tempfile.TemporaryDirectory(prefix="kvsim-bench-") as tmp:
        workdir = Path(tmp)
        for name in names:
            log(f"{name}: {WORKLOADS[name].title}")
            measurements.append(measure_workload(
                WORKLOADS[name], workdir, reps=args.heavy_reps if WORKLOADS[name].heavy else args.reps,
                quick=args.quick, requests=args.requests,
                workers=workers, ratio=not args.no_ratio, log=log))
        profile = profile_w1(workdir, requests=args.requests) if args.profile else None
    text = render_report(measurements, machine=machine, load_end=os.getloadavg(), command=command,
                         reps=args.reps, heavy_reps=args.heavy_reps, quick=args.quick, requests=args.requests,
                         commit=git_commit(), profile=profile, started=started)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    for t in TARGETS:
        m = next((m for m in measurements if m.workload.name == t.workload), None)
        if m is not None:
            log(f"{t.workload} {t.text}: {_fmt(t.metric, m.median(t.metric))} {t.unit} -> "
                f"{'n/a (scaled)' if args.requests else judge(m.median(t.metric), t.limit)}")
    log(f"wrote {out}")
    return 0


def _argv_text(args: argparse.Namespace) -> list[str]:
    parts = list(args.workloads)
    if args.reps != 3:
        parts += ["--reps", str(args.reps)]
    if args.heavy_reps != 1:
        parts += ["--heavy-reps", str(args.heavy_reps)]
    for flag in ("quick", "no_ratio", "profile"):
        if getattr(args, flag):
            parts.append("--" + flag.replace("_", "-"))
    if args.requests is not None:
        parts += ["--requests", str(args.requests)]
    if args.workers is not None:
        parts += ["--workers", str(args.workers)]
    if Path(args.out).resolve() != DEFAULT_OUT:
        parts += ["--out", args.out]
    return parts


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "_child":
        return _run_child(argv[1:])
    if argv and argv[0] == "_profile":
        return _profile_child(argv[1:])
    from kvsim.cli import main as cli_main
    return cli_main(["bench", *argv])


if __name__ == "__main__":
    sys.exit(main())
