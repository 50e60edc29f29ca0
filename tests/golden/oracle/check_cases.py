#!/usr/bin/env python3
"""kvsim's ``chunked`` scheduler against the real scheduler's trace of each case folder.

Runs every ``<case>/`` given (or every case under a folder given) that holds
``expected.jsonl`` through kvsim on the skip-ahead path and on the step path,
as ``tests/test_oracle_traces.py`` does for the committed cases, and prints
the first difference of each mismatch. Exits 1 if any case differs (or
fails to run), 0 otherwise; ``differential.sh`` calls it on a scratch folder.

A case the oracle stopped (``oracle.log`` beside the cases says ``FAILED``) is
not compared whole. When it ran past ``--max-steps`` (the real scheduler
livelocked), kvsim must match its first ``LIVELOCK_HEAD`` steps and then end
the run, failing a request for the livelock (``Engine._break_livelock``);
other oracle failures are counted and skipped.

Usage: check_cases.py DIR [DIR ...]
"""
from __future__ import annotations

import json
import re
import sys
from itertools import islice
from pathlib import Path

# This tree's kvsim, not an installed one (a campaign checks the tree it runs from),
# and its tests/ (the comparisons of the golden tests).
sys.path[:0] = [str(Path(__file__).resolve().parents[3]), str(Path(__file__).resolve().parents[2])]
import kvsim  # noqa: E402
from test_oracle_traces import first_difference, run_trace, scenario_for  # noqa: E402


ORACLE_FAILED = re.compile(r"^(\S+)/expected\.jsonl: FAILED: (.*)$")
LIVELOCK_HEAD = 20_000


def oracle_failures(cases: list[Path]) -> dict[Path, str]:
    """The cases ``oracle.log`` (in a case's parent folder) says the oracle stopped."""
    out = {}
    for parent in {c.parent for c in cases}:
        log = parent / "oracle.log"
        if log.exists():
            for line in log.read_text().splitlines():
                if m := ORACLE_FAILED.match(line):
                    out[parent / m.group(1)] = m.group(2)
    return out


def livelock_problems(case: Path) -> list[str]:
    """The oracle livelocked: kvsim's first steps must be vLLM's, and its run must end."""
    with open(case / "expected.jsonl") as f:
        head = [json.loads(line) for line in islice(f, LIVELOCK_HEAD)]
    out = []
    for fast_path in (True, False):
        steps: list[dict] = []
        result = kvsim.simulate(scenario_for(case), trace=steps.append, fast_path=fast_path)
        diff = first_difference(head, steps[:len(head)])
        reasons = result.requests["fail_reason"].astype(str)
        if diff:
            out.append(f"{'skip-ahead' if fast_path else 'step-by-step'}: {diff}")
        elif not reasons.str.startswith("livelock:").any():
            out.append(f"{'skip-ahead' if fast_path else 'step-by-step'}: vLLM livelocked, "
                       f"kvsim ended without a livelock failure")
    return out


def case_folders(paths: list[str]) -> list[Path]:
    found = []
    for p in map(Path, paths):
        found += [p] if (p / "expected.jsonl").exists() else sorted(
            e.parent for e in p.glob("*/expected.jsonl"))
    return found


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    cases = case_folders(argv)
    stopped = oracle_failures(cases)
    bad = livelocks = skipped = 0
    for case in cases:
        if case in stopped:
            if "exceeded --max-steps" not in stopped[case]:
                skipped += 1
                continue
            livelocks += 1
            for problem in livelock_problems(case):
                bad += 1
                print(f"{case.name}: {problem}", flush=True)
            continue
        expected = [json.loads(line) for line in (case / "expected.jsonl").read_text().splitlines()
                    if line]
        for fast_path in (True, False):
            try:
                diff = first_difference(expected, run_trace(case, fast_path))
            except Exception as exc:                 # a crash is a mismatch too: report it
                diff = f"raised {exc!r}"
            if diff:
                bad += 1
                print(f"{case.name} ({'skip-ahead' if fast_path else 'step-by-step'}): {diff}",
                      flush=True)
    extra = (f", {livelocks} livelocked in the oracle (kvsim must match their first "
             f"{LIVELOCK_HEAD:,} steps, then end them)" if livelocks else "")
    extra += f", {skipped} stopped in the oracle otherwise (skipped)" if skipped else ""
    compiled = kvsim.native.active()["compiled"]    # (kvsim native build; KVSIM_NATIVE=0: plain)
    code = f"{len(compiled)} hot modules compiled" if compiled else "the plain modules"
    print(f"{len(cases)} cases{extra}, {bad} mismatches (each case on both paths; {code})")
    return 1 if bad or not cases else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
