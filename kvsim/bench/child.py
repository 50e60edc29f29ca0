"""What runs inside the benchmark's child processes (``python -m kvsim.bench _child | _attribute | _profile``).

Nothing here patches the library. ``_child`` does the work of ``kvsim run
SCENARIO --out DIR`` (import, load, simulate, write the five files, format
the summary) and stamps the monotonic clock between the phases, so the
parent can break the whole process down: interpreter start (parent's stamp
before the fork to the child's first line), imports, loading, simulate(),
each file, the summary, and the exit. The files are written one at a time
with the functions ``Result.write`` and ``write_vllm_outputs`` use, so each
has its own time: summary.json, requests.csv and steps.csv here, while a
forked child makes metrics.csv and bench_serve.json, as ``kvsim run`` does
(``FilesApart``: the child times its files, the wait for it is a phase);
``tests/test_bench.py`` checks they are byte for byte the files ``kvsim run
--out`` writes. How the run was simulated (steps, decode
runs, arrivals) comes from ``Result.stats``.
"""

from __future__ import annotations

import time

_CLOCK = time.CLOCK_MONOTONIC           # one clock for every process of the machine


def now() -> float:
    return time.clock_gettime(_CLOCK)


_T0 = now()                             # before this module's other imports

import gc                               # noqa: E402  (the stamp above comes first)
import json                             # noqa: E402
import os                               # noqa: E402
import sys                              # noqa: E402
from pathlib import Path                # noqa: E402


def _cpu_s() -> float:
    """CPU seconds of this process and of the children it has waited for: a fleet
    with ``cluster.workers`` simulates in worker processes (kvsim/scenario/cluster_parallel.py),
    whose time is the run's too."""
    import resource
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def run_child(argv: list[str]) -> int:
    """``_child RECORD.json fast|step SCENARIO --out DIR [--set KEY=VALUE ...]``.

    Writes RECORD.json: the phase stamps, the times of simulate() (wall and
    CPU), the counts of ``Result.stats`` and the summary.
    """
    stamps = [("start", _T0)]

    def stamp(name: str) -> None:
        stamps.append((name, now()))

    record_file, path, scenario, *rest = argv
    out_dir, overrides = _run_arguments(rest)
    gc.disable()            # as `kvsim run` runs, from its first import on (kvsim/cli.py COLLECTOR_OFF)
    # What `kvsim run` imports before it starts (kvsim/cli.py, kvsim/scenario/cli.py).
    import kvsim.cli  # noqa: F401
    import kvsim.scenario.cli  # noqa: F401
    import kvsim.scenario.run_progress  # noqa: F401
    from kvsim.metrics.summary import format_summary
    from kvsim.scenario.loader import load_scenario
    from kvsim.scenario.outputs import check_output_dir
    from kvsim.scenario.simulate import RUN_FILES, simulate
    from kvsim.vllm_outputs import VLLM_FILES
    stamp("imports")
    sc = load_scenario(scenario, overrides=overrides)
    check_output_dir(out_dir, files=RUN_FILES + VLLM_FILES)
    stamp("load scenario")
    from kvsim.scenario.result import steps_csv_ahead
    ahead = steps_csv_ahead(sc)                     # as `kvsim run --out` (kvsim/scenario/cli.py)
    c0 = _cpu_s()
    result = simulate(sc, fast_path=path == "fast", watch_steps=ahead.watch if ahead else None)
    sim_cpu_s = _cpu_s() - c0
    stamp("simulate()")
    own, apart = file_writers(result, Path(out_dir), steps_ahead=ahead)
    vllm_files = _files_apart(apart, Path(out_dir))
    try:
        for name, write in own:
            write()
            stamp(f"write {name}")
        apart_s = vllm_files.join()
        if apart:
            stamp(f"wait for {' and '.join(name for name, _, _ in apart)}")
    finally:
        vllm_files.close()
        if ahead is not None:
            ahead.close()
    with open(os.devnull, "w") as quiet:           # what `kvsim run` prints, to nowhere
        print(format_summary(result.summary), file=quiet)
    stamp("format the summary")
    s, stats = result.summary, result.stats
    Path(record_file).write_text(json.dumps({
        "stamps": stamps, "sim_cpu_s": sim_cpu_s,
        "num_requests": int(s["completed"]) + int(s["failed"]),
        "num_steps": stats.num_steps, "num_fast_steps": stats.num_run_steps,
        "num_runs": stats.num_runs, "num_arrived": stats.num_arrived,
        "streaming": sc.scenario.metrics.streaming,
        "apart_s": apart_s, "summary": s}, default=float))
    return 0


def _files_apart(apart: list, out: Path):
    """The files ``kvsim run`` has a forked child make while it writes its own
    (``vllm_outputs_apart``), each timed in that child: ``join()`` gives
    [[name, seconds], ...]."""
    from kvsim.scenario.outputs import FilesApart, write_files

    def job(staged: list | None) -> list:
        times = []
        for name, target, write in apart:
            t0 = now()
            write_files({target: write}, staged=staged)
            times.append([name, now() - t0])
        return times

    return FilesApart(job, targets=[target for _, target, _ in apart])


def file_writers(result, out: Path, steps_ahead=None) -> tuple[list, list]:
    """The files ``kvsim run --out`` writes, one at a time: (its own, the child's).

    Its own: one callable per file, in its order, each atomic, the same
    functions as ``Result.write`` (summary.json, requests.csv, steps.csv, with
    the rows made text during the run: ``steps_ahead``). The child's:
    (name, target, writer of a path) of what ``write_vllm_outputs`` writes
    (metrics.csv, bench_serve.json; none with streaming metrics, which keep
    no tables), for ``write_files``.
    """
    from kvsim.metrics.tables import write_csv
    from kvsim.scenario.outputs import summary_json, write_files

    def one(target: Path, write) -> object:
        return lambda: write_files({target: write})

    summary = result.summary
    writers = [
        ("summary.json", one(out / "summary.json",
                             lambda p: p.write_text(summary_json(summary), encoding="utf-8"))),
        ("requests.csv", one(out / "requests.csv", lambda p: write_csv(result.requests, p))),
        ("steps.csv", one(out / "steps.csv", lambda p: write_csv(result.steps, p, ahead=steps_ahead))),
    ]
    sc = result.scenario
    if sc is not None and not sc.scenario.metrics.streaming:
        from kvsim.metrics.bench_json import bench_serve_result
        from kvsim.metrics.prometheus import prometheus_series
        from kvsim.vllm_outputs import BENCH_FILE, METRICS_FILE, bench_setup

        def metrics(p: Path) -> None:
            series = prometheus_series(result.requests, result.steps,
                                       max_model_len=sc.sched_config.max_model_len,
                                       enable_prefix_caching=sc.sched_config.enable_prefix_caching,
                                       interval_s=1.0)
            write_csv(series, p)

        def bench(p: Path) -> None:
            data, _ = bench_serve_result(result.summary, result.requests, result.steps, result.itl_s,
                                         setup=bench_setup(sc, len(result.requests)),
                                         slo=sc.scenario.slo.as_dict() or None, detailed=False)
            p.write_text(json.dumps(data) + "\n", encoding="utf-8")

        return writers, [(METRICS_FILE, out / METRICS_FILE, metrics),
                         (BENCH_FILE, out / BENCH_FILE, bench)]
    return writers, []


def attribute_child(argv: list[str]) -> int:
    """``_attribute OUT.json SCENARIO [--set KEY=VALUE ...]``: cProfile over the run, by component.

    The work of ``_child`` after the imports (load, simulate, write every file,
    format the summary) under ``cProfile``; ``kvsim.bench.attribution`` groups
    the functions' own times by component.
    """
    import cProfile

    from kvsim.bench.attribution import attribute
    from kvsim.metrics.summary import format_summary
    from kvsim.scenario.loader import load_scenario
    from kvsim.scenario.outputs import write_files
    from kvsim.scenario.simulate import simulate

    out, scenario, *rest = argv
    overrides = [rest[i + 1] for i in range(0, len(rest), 2) if rest[i] == "--set"]
    import tempfile
    with tempfile.TemporaryDirectory(prefix="kvsim-attr-") as tmp:
        profiler = cProfile.Profile()
        t0 = time.perf_counter()
        profiler.enable()
        sc = load_scenario(scenario, overrides=overrides)
        result = simulate(sc)
        own, apart = file_writers(result, Path(tmp))
        for _, write in own:
            write()
        for _, target, write in apart:            # in this process: the profiler sees them
            write_files({target: write})
        format_summary(result.summary)
        profiler.disable()
        profiled_s = time.perf_counter() - t0
    Path(out).write_text(json.dumps({"profiled_s": profiled_s, **attribute(profiler)}))
    return 0


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


CHILDREN = {"_child": run_child, "_attribute": attribute_child, "_profile": profile_child}


def main(argv: list[str]) -> int:
    """``python -m kvsim.bench _child|_attribute|_profile ...``: run one, then exit at once.

    As ``kvsim run`` does (``kvsim.cli.exit_without_cleanup``): everything is
    written when the child returns, so the interpreter's teardown is skipped.
    """
    code = CHILDREN[argv[0]](argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
