"""The benchmark report: the machine, the targets, one table per workload, the peer comparison."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
from pathlib import Path

from kvsim.bench.measure import Measurement
from kvsim.bench.workloads import (METRICS, PEER_EVENT_LOOP_S, PEER_WALL_S, REPORT_COLUMNS, TARGETS, judge,
                                   target_range, target_value)

def reference_loop_ms(repeats: int = 5) -> float:
    """CPU milliseconds of a fixed pure-Python loop (dict inserts and deletes, list
    appends: the engine's kind of work), the best of ``repeats``. How fast this
    host runs Python right now: on a shared machine it drifts by tens of percent
    within an hour, and a workload's time drifts with it."""
    import time

    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        table: dict[int, int] = {}
        items: list[int] = []
        for i in range(100_000):
            table[i * 2654435761 % 1_000_003] = i
            items.append(i)
        for i in range(0, 100_000, 2):
            del table[i * 2654435761 % 1_000_003]
        best = min(best, time.process_time() - start)
    return 1e3 * best


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
        "reference_loop_ms": reference_loop_ms(),
        "engine_code": engine_code(),
    }


def engine_code() -> str:
    """What the runs execute: the plain modules, or a compiled build of them (kvsim/native)."""
    from kvsim import native
    s = native.status()
    if s["built"] and not s["disabled"]:
        problem = native.load_problem()
        if problem:
            return (f"the build of these sources does not load ({problem}): the plain modules "
                    f"run from the first that fails")
        return f"the hot modules compiled (`kvsim native build` {s['fingerprint']})"
    return "pure Python (no compiled build of these sources)" if not s["disabled"] else \
        "pure Python (KVSIM_NATIVE=0)"


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "kvsim"],
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
             ["sim_s", "sim_cpu_s", "process_wall_s", "process_cpu_s", "num_requests", "requests_per_s",
              "x_real_time", "num_events", "us_per_event", "num_steps", "steps_per_s", "us_per_step",
              "fast_step_share", "peak_rss_mib"])
    for metric in order:
        vals = m.values(metric)
        if not vals:
            continue
        label, unit, _ = METRICS[metric]
        target = next((t for t in TARGETS if t.workload == w.name and t.metric == metric
                       and t.relative_to is None), None)
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


def phases_table(m: Measurement) -> list[str]:
    """The whole process, phase by phase (median of the repetitions)."""
    reps = [r["phases"] for r in m.reps if r.get("phases")]
    if not reps:
        return []
    names = [name for name, _ in reps[0]]
    medians = [statistics.median(dict(p)[name] for p in reps) for name in names]
    total = sum(medians) or 1.0
    lines = ["Whole process by phase (median of the repetitions; the child stamps one monotonic "
             "clock between phases, the parent before the fork and after the end):", "",
             "| phase | wall time (s) | share |", "|---|---|---|"]
    lines += [f"| {name} | {t:.3f} | {100 * t / total:.1f}% |" for name, t in zip(names, medians)]
    lines += [f"| whole process | {total:.3f} | 100% |", ""]
    apart = [dict(r["apart_s"]) for r in m.reps if r.get("apart_s")]
    if apart:
        # Made by a forked child while the files above were written (kvsim run's FilesApart).
        made = ", ".join(f"{name} {statistics.median(a[name] for a in apart):.3f} s" for name in apart[0])
        lines += [f"Made by a forked child meanwhile, in its own time (the wait above is what "
                  f"was left of it): {made}.", ""]
    return lines


def imports_table(m: Measurement) -> list[str]:
    if not m.imports:
        return []
    total = sum(m.imports.values()) or 1.0
    lines = ["Imports by package (`python -X importtime` of a 20-request cut: each module's own "
             "time, charged to the third-party package that pulled it in, else to kvsim or the "
             "standard library; matplotlib is listed only if the run imports it):", "",
             "| package | import time (s) | share of imports |", "|---|---|---|"]
    lines += [f"| {name} | {t:.3f} | {100 * t / total:.1f}% |" for name, t in m.imports.items()
              if t >= 0.001]
    lines += [f"| all imports | {total:.3f} | 100% |", ""]
    if "matplotlib" not in m.imports:
        lines += ["(matplotlib is not imported by this run.)", ""]
    return lines


def attribution_table(m: Measurement) -> list[str]:
    a = m.attribution
    if not a:
        return []
    total = a["total_s"] or 1.0
    cut = f"the first {a['requests']:,} requests" if a.get("requests") else "the whole workload"
    lines = [f"Time by component (cProfile, deterministic: every call counted; {cut}, loading, "
             f"simulate(), every file and the summary; {a['profiled_s']:.2f} s under the profiler, "
             "which adds about a microsecond a call, so many-call components read high; functions "
             "outside kvsim are charged to their kvsim callers; see docs/bench.md):", "",
             "| component | profiled time (s) | share |", "|---|---|---|"]
    lines += [f"| {name} | {t:.3f} | {100 * t / total:.1f}% |" for name, t in a["components"].items()
              if t >= 0.0005]
    lines += ["", "Most time charged, by kvsim function (own time plus the non-kvsim calls it makes):", "",
              "| function | component | calls | profiled time (s) |", "|---|---|---|---|"]
    lines += [f"| `{f['function']}` | {f['component']} | {f['calls']:,} | {f['seconds']:.3f} |"
              for f in a["top"][:10]]
    return lines + [""]


def render_report(measurements: list[Measurement], *, machine: dict, load_end: tuple, command: str,
                  reps: int, heavy_reps: int = 1, quick: bool, requests: int | None, commit: str,
                  profile: dict | None, started: str, reference_end_ms: float | None = None) -> str:
    cores = machine["cores"]
    load1 = machine["loadavg"][0]
    scaled = requests is not None
    out = ["# kvsim performance",
           "",
           f"Generated by `{command}` on {started} (git {commit}); regenerate with the same command. "
           "Every number below is computed by `kvsim/bench/`; the met column is computed from the "
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
    if machine.get("engine_code"):
        out += [f"Engine code: {machine['engine_code']} (docs/bench.md, \"Compiled modules\").", ""]
    start_ms = machine.get("reference_loop_ms")
    if start_ms is not None:
        end = "" if reference_end_ms is None else f", {reference_end_ms:.1f} ms at the end"
        out += [f"Host speed: a fixed pure-Python loop (`kvsim.bench.render.reference_loop_ms`, best "
                f"of 5) took {start_ms:.1f} ms of CPU at the start{end}. Compare it between reports "
                "before comparing their times: the same code runs slower when it is higher.", ""]
    if max(load1, load_end[0]) > 1:
        out += [f"The machine is shared with other engineers: a load average above 1 (here "
                f"{load1:.2f} at the start, {load_end[0]:.2f} at the end, on {cores} cores) means "
                "other processes competed for the CPU, so these times are **pessimistic** (an idle "
                "machine gives shorter ones).", ""]
    light = [m.workload.name for m in measurements if not m.workload.heavy] or ["W1"]
    heavy = [m.workload.name for m in measurements if m.workload.heavy]
    out += [f"Repetitions: {reps} of {', '.join(light)}"
            + (f", {heavy_reps} of {', '.join(heavy)} (they take minutes each)" if heavy else "")
            + "; tables give the median, min and max; every run is a fresh process. "
            "Time inside simulate() is the simulation alone (scenario loaded, no output writing); "
            "the whole-process wall time includes interpreter start, imports, loading the trace and "
            "writing summary.json, requests.csv, steps.csv, metrics.csv and bench_serve.json "
            "(`kvsim run --out`; streaming runs write the first three). Peak memory is "
            "the process's maximum RSS (`os.wait4`). Events are arrivals + finishes + single "
            "steps + decode runs (docs/bench.md).", ""]

    # Targets first: what the issue asks.
    out += ["## Targets", "", "| workload | target | measured (median) | met |", "|---|---|---|---|"]
    by_name = {m.workload.name: m for m in measurements}
    for t in TARGETS:
        m = by_name.get(t.workload)
        value = target_value(t, by_name)
        if t.relative_to is None:
            cell = f"{_fmt(t.metric, value)} {t.unit}"
        elif value is None:
            cell = f"— ({t.relative_to} not run)"
        else:
            cell = (f"{value:.2f}x ({_fmt(t.metric, m.median(t.metric))} s / "
                    f"{_fmt(t.metric, by_name[t.relative_to].median(t.metric))} s)")
            if (spread := target_range(t, by_name)) is not None:
                cell += f"; {spread[0]:.2f}-{spread[1]:.2f}x from the repetitions' extremes"
        if m is None:
            cell = met = "not run"
        else:
            met = "n/a (scaled-down run)" if scaled else judge(value, t.limit)
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
        out += phases_table(m) + imports_table(m) + attribution_table(m)

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
                f"{60 / (1e6 * sim / steps):.1f}-{75 / (1e6 * sim / steps):.1f}x |"]
        per_event = w1.median("us_per_event")
        if per_event:
            out.append(f"| per event (the peer steps every iteration: its events are its steps) | "
                       f"60-75 us | {per_event:.1f} us | {60 / per_event:.1f}-{75 / per_event:.1f}x |")
        out.append("")
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
