"""``kvsim bench --compare REF``: A/B of this tree and another version on one workload.

On a shared machine the wall and CPU times of one run drift by 20-30% within
minutes, so a before/after pair proves little. Here:

* **CPU time, alternated.** The two versions (A: this tree, B: REF) run in
  fresh processes in ABBA order (A B, B A, A B, ...), so a slow drift of the
  machine falls on both; each pair gives a ratio A / B, and the report gives
  the median of the pairs' ratios beside each version's median and minimum.
* **Instructions, where valgrind exists.** ``valgrind --tool=callgrind``
  counts the instructions a run executes, which do not depend on the load:
  the workload cut to ``--ir-requests`` (default 2,000) requests, simulated,
  minus a run that only imports, loads the scenario and builds the
  workload's requests (``/work/ir.sh`` of the speed work, the same two
  runs). The timed runs also write the files of ``kvsim run --out`` (timed
  apart); the callgrind runs do not. Instruction counts miss memory stalls (cache misses cost time, not
  instructions), so the two views together say more than either.

Both trees' ``kvsim/`` are byte-compiled first (``compileall``, as Python
would on a first import), so that neither side's process times or
instruction counts include compiling its modules: where bytecode is not
written (``PYTHONDONTWRITEBYTECODE``, a fresh export of REF) every run
would otherwise compile every module it imports.

Both versions run the same scenario file (this tree's ``scenarios/bench/``)
through the public API (``kvsim.load_scenario``, ``kvsim.simulate``), so any
version with that API can be compared. REF is a worktree path (a folder
with ``kvsim/``) or a git commit of this repository (exported with ``git
archive`` to a temporary folder; the repository is not touched).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from kvsim.bench.measure import run_child, size_overrides
from kvsim.bench.workloads import DEFAULT_SCENARIOS, WORKLOADS
from kvsim.scenario.outputs import atomic_open, check_output_file

DEFAULT_PAIRS = 5

# Simulate one scenario with the version on PYTHONPATH, then (OUT not "-") write
# what `kvsim run --out OUT` writes; print one JSON line.
_RUN = """
import json, resource, sys, time
import kvsim
from kvsim import load_scenario, simulate
path, out, overrides = sys.argv[1], sys.argv[2], sys.argv[3:]
sc = load_scenario(path, overrides=overrides)
def cpu():   # with the fleet workers' (cluster.workers) once waited for
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime
c0, w0 = cpu(), time.perf_counter()
r = simulate(sc)
c1, w1 = cpu(), time.perf_counter()
if out != "-":
    r.write(out)
    try:
        from kvsim.vllm_outputs import write_vllm_outputs
    except ImportError:                 # a version without metrics.csv / bench_serve.json
        write_vllm_outputs = None
    if write_vllm_outputs is not None:
        write_vllm_outputs(r, out)
c2 = time.process_time()
print("KVSIM-COMPARE " + json.dumps({"kvsim": kvsim.__file__, "sim_cpu_s": c1 - c0, "sim_s": w1 - w0,
                                     "write_cpu_s": c2 - c1, "summary": r.summary}, default=float))
"""

# The same imports and loading, then only the workload's requests (ir.sh's baseline).
_WORKLOAD_ONLY = """
import sys
import numpy as np
import kvsim
from kvsim import load_scenario
from kvsim.workload import build_workload
path, overrides = sys.argv[1], sys.argv[2:]
sc = load_scenario(path, overrides=overrides)
try:
    w = build_workload(sc.workload, rng=np.random.default_rng(sc.seed), base_dir=sc.base_dir,
                       max_prompt_len=sc.sched_config.max_model_len - 1)
except TypeError:                      # a version without max_prompt_len
    w = build_workload(sc.workload, rng=np.random.default_rng(sc.seed), base_dir=sc.base_dir)
sum(1 for _ in w.requests())
"""


def this_tree() -> Path:
    """The repository root of the kvsim being run."""
    import kvsim
    return Path(kvsim.__file__).resolve().parent.parent


def resolve_ref(ref: str, workdir: Path, *, repo: Path) -> tuple[Path, str]:
    """A folder holding REF's ``kvsim/`` package, and how to name it in the report."""
    folder = Path(ref)
    if folder.is_dir():
        if not (folder / "kvsim" / "__init__.py").is_file():
            raise ValueError(f"--compare {ref}: the folder has no kvsim/ package; give a "
                             f"worktree (repository root) or a git commit")
        return folder.resolve(), f"{ref} ({_describe(folder)})"
    found = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
                           capture_output=True, text=True)
    if found.returncode != 0:
        raise ValueError(f"--compare {ref}: neither a folder nor a git commit of {repo}; give a "
                         f"worktree path or a commit (a hash, a branch, HEAD~1)")
    sha = found.stdout.strip()
    target = workdir / f"ref-{sha[:12]}"
    target.mkdir()
    archive = subprocess.Popen(["git", "-C", str(repo), "archive", "--format=tar", sha, "kvsim"],
                               stdout=subprocess.PIPE)
    with tarfile.open(fileobj=archive.stdout, mode="r|") as tar:
        tar.extractall(target, filter="data")
    if archive.wait() != 0:
        raise ValueError(f"--compare {ref}: git archive of {sha[:12]} failed")
    return target, f"{ref} (git {sha[:12]})"


def _describe(folder: Path) -> str:
    out = subprocess.run(["git", "-C", str(folder), "log", "-1", "--format=git %h"],
                         capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(folder), "status", "--porcelain", "--", "kvsim"],
                           capture_output=True, text=True).stdout.strip()
    text = out.stdout.strip() if out.returncode == 0 else "not a git worktree"
    return text + (", kvsim/ has uncommitted changes" if dirty else "")


def byte_compile(root: Path) -> None:
    """Write the bytecode of ``root``'s ``kvsim/`` (best effort: a folder that
    cannot be written to leaves its runs compiling, as before)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(root / "kvsim")], env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _env(root: Path, *, fixed_hash: bool = False) -> dict:
    env = dict(os.environ)
    if fixed_hash:
        # String hashes (dict and set layouts) otherwise change from run to
        # run and move the instruction counts by a few million.
        env["PYTHONHASHSEED"] = "0"
    env["PYTHONPATH"] = str(root) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def timed_run(root: Path, scenario: Path, overrides: list[str], workdir: Path, label: str) -> dict:
    """One simulate() of ``scenario`` with the kvsim of ``root``, in a fresh process."""
    # Run from the scratch folder: `python -c` puts the current folder first on
    # sys.path, where a kvsim/ would shadow PYTHONPATH's.
    cmd = [sys.executable, "-c", _RUN, str(scenario), str(workdir / f"{label}-out"), *overrides]
    wall, cpu, rss = run_child(cmd, workdir, label=label, env=_env(root), cwd=workdir)
    line = next(ln for ln in (workdir / f"{label}.log").read_text().splitlines()
                if ln.startswith("KVSIM-COMPARE "))
    rec = json.loads(line[len("KVSIM-COMPARE "):])
    if not Path(rec["kvsim"]).resolve().is_relative_to(root):
        raise RuntimeError(f"kvsim bench --compare: {label} imported {rec['kvsim']}, not the "
                           f"kvsim of {root} (an installed kvsim shadows PYTHONPATH?)")
    return {**rec, "process_wall_s": wall, "process_cpu_s": cpu, "peak_rss_mib": rss}


def instructions(root: Path, scenario: Path, overrides: list[str], workdir: Path, label: str) -> dict:
    """callgrind's instruction counts of simulate() and of the workload-only baseline."""
    counts = {}
    for kind, script in (("simulate", _RUN), ("baseline", _WORKLOAD_ONLY)):
        # The simulate run writes nothing ("-"): ir.sh's engine count.
        args = [str(scenario), "-", *overrides] if kind == "simulate" else [str(scenario), *overrides]
        cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
               sys.executable, "-c", script, *args]
        run_child(cmd, workdir, label=f"{label}-ir-{kind}", env=_env(root, fixed_hash=True), cwd=workdir)
        text = (workdir / f"{label}-ir-{kind}.log").read_text()
        found = re.findall(r"Collected\s*:\s*(\d+)", text)
        if not found:
            raise RuntimeError(f"kvsim bench --compare: no callgrind count in {label}-ir-{kind}")
        counts[kind] = int(found[-1])
    counts["engine"] = counts["simulate"] - counts["baseline"]
    return counts


def compare(ref: str, *, workload: str = "W1", pairs: int = DEFAULT_PAIRS, requests: int | None = None,
            ir_requests: int | None = 2000, scenarios: Path = DEFAULT_SCENARIOS, log=print) -> str:
    """Run the A/B and return its Markdown report (A: this tree, B: REF)."""
    w = WORKLOADS[workload]
    if w.kind != "run":
        raise ValueError(f"--compare: {workload} is a sweep; compare a single-run workload "
                         f"({', '.join(n for n, x in WORKLOADS.items() if x.kind == 'run')})")
    scenario = (scenarios / w.scenario).resolve()
    if not scenario.is_file():
        raise ValueError(f"--scenarios {scenarios}: no {w.scenario} there")
    a_root = this_tree()
    overrides = [o for o in size_overrides(w, requests) if o != "--set"]
    with tempfile.TemporaryDirectory(prefix="kvsim-compare-") as tmp:
        workdir = Path(tmp)
        b_root, b_name = resolve_ref(ref, workdir, repo=a_root)
        a_name = f"this tree {a_root} ({_describe(a_root)})"
        runs = {"A": [], "B": []}
        roots = {"A": a_root, "B": b_root}
        for root in roots.values():
            byte_compile(root)
        log(f"kvsim bench --compare: A = {a_name}; B = {b_name}; {workload}, {pairs} pairs, ABBA order")
        for i in range(pairs):
            for side in ("A", "B") if i % 2 == 0 else ("B", "A"):
                try:
                    rec = timed_run(roots[side], scenario, overrides, workdir, f"{side}{i}")
                except RuntimeError as exc:
                    # REF (or this tree) cannot run the workload: one line, its last log line.
                    name = f"--compare {ref}" if side == "B" else "this tree"
                    last = (str(exc).splitlines()[1:] or [""])[-1].strip()
                    raise ValueError(f"{name}: its kvsim failed to run {workload} "
                                     f"(run {side}{i}); its last line: {last}") from None
                runs[side].append(rec)
                log(f"  pair {i + 1}/{pairs} {side}: simulate {rec['sim_cpu_s']:.3f} s CPU, "
                    f"process {rec['process_cpu_s']:.2f} s CPU")
        ir = None
        if ir_requests and shutil.which("valgrind"):
            cut = [o for o in size_overrides(w, ir_requests) if o != "--set"]
            ir = {}
            for side in ("A", "B"):
                log(f"  callgrind {side} ({ir_requests:,} requests; minutes)")
                ir[side] = instructions(roots[side], scenario, cut, workdir, side)
                log(f"    {ir[side]['engine'] / 1e9:.3f} G instructions")
    return render_compare(a_name, b_name, workload, runs, ir, ir_requests=ir_requests,
                          requests=requests, valgrind=shutil.which("valgrind") is not None)


def render_compare(a_name: str, b_name: str, workload: str, runs: dict, ir: dict | None, *,
                   ir_requests: int | None, requests: int | None, valgrind: bool) -> str:
    size = f"first {requests:,} requests" if requests else "the whole workload"
    out = ["# kvsim bench --compare", "",
           f"A = {a_name}", "", f"B = {b_name}", "",
           f"Workload {workload} ({size}); {len(runs['A'])} pairs of fresh processes in ABBA order. "
           "A / B below 1 means this tree is faster than REF.", "",
           "| metric | A median | A min | B median | B min | A / B (median of the pairs) |",
           "|---|---|---|---|---|---|"]
    for key, label in (("sim_cpu_s", "CPU time in simulate() (s)"), ("sim_s", "wall time in simulate() (s)"),
                       ("write_cpu_s", "CPU time writing the files of `kvsim run --out` (s)"),
                       ("process_cpu_s", "whole process CPU time (s)"),
                       ("process_wall_s", "whole process wall time (s)"),
                       ("peak_rss_mib", "peak RSS (MiB)")):
        a = [r[key] for r in runs["A"]]
        b = [r[key] for r in runs["B"]]
        if not any(b):
            continue
        ratio = statistics.median(x / y for x, y in zip(a, b) if y)
        out.append(f"| {label} | {statistics.median(a):.3f} | {min(a):.3f} | {statistics.median(b):.3f} | "
                   f"{min(b):.3f} | {ratio:.3f} |")
    same = all(_same(runs["A"][0]["summary"], r["summary"]) for r in runs["A"] + runs["B"])
    out += ["", f"Same summary from both versions: {'yes' if same else 'NO'}.", ""]
    if ir is not None:
        out += [f"Instructions (callgrind, {ir_requests:,} requests; simulate() run minus a run that "
                "only imports, loads and builds the workload):", "",
                "| | simulate run (imports, load, simulate) | baseline (imports, load, workload) | "
                "engine (difference) |", "|---|---|---|---|"]
        for side in ("A", "B"):
            c = ir[side]
            out.append(f"| {side} | {c['simulate'] / 1e9:.3f} G | {c['baseline'] / 1e9:.3f} G | "
                       f"{c['engine'] / 1e9:.3f} G |")
        out.append("| A / B | " + " | ".join(f"{ir['A'][k] / ir['B'][k]:.3f}"
                                            for k in ("simulate", "baseline", "engine")) + " |")
        out += ["", f"A / B, engine instructions: {ir['A']['engine'] / ir['B']['engine']:.3f}", ""]
    elif not valgrind:
        out += ["Instructions: valgrind is not installed here; CPU times only.", ""]
    return "\n".join(out)


def _same(a: dict, b: dict) -> bool:
    from kvsim.bench.measure import same_summary
    return same_summary(a, b)


def compare_command(args, *, log=print) -> int:
    names = [n.upper() for n in args.workloads] or ["W1"]
    if len(names) != 1 or names[0] not in WORKLOADS:
        raise ValueError(f"--compare: give one workload (default W1), got {' '.join(names)}; "
                         f"allowed: {', '.join(WORKLOADS)}")
    pairs = args.reps if args.reps is not None else DEFAULT_PAIRS
    if pairs < 1:
        raise ValueError(f"--reps: expected an integer >= 1, got {pairs}")
    # The report's path is checked before the runs (minutes), and written atomically.
    out = check_output_file(args.out or Path("out") / "compare.md", option="--out")
    text = compare(args.compare, workload=names[0], pairs=pairs, requests=args.requests,
                   ir_requests=None if args.no_instructions else args.ir_requests,
                   scenarios=Path(args.scenarios), log=log)
    with atomic_open(out, option="--out") as f:
        f.write(text + "\n")
    log(text)
    log(f"wrote {out}")
    return 0
