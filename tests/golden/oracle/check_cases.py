#!/usr/bin/env python3
"""kvsim's ``chunked`` scheduler against the real scheduler's trace of each case folder.

Runs every ``<case>/`` given (or every case under a folder given) that holds
``expected.jsonl`` through kvsim on the skip-ahead path and on the step path,
as ``tests/test_oracle_traces.py`` does for the committed cases, and prints
the first difference of each mismatch. Exits 1 if any case differs (or
fails to run), 0 otherwise; ``differential.sh`` calls it on a scratch folder.

Usage: check_cases.py DIR [DIR ...]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

# This tree's kvsim, not an installed one (a campaign checks the tree it runs from),
# and its tests/ (the comparisons of the golden tests).
sys.path[:0] = [str(Path(__file__).resolve().parents[3]), str(Path(__file__).resolve().parents[2])]
from test_oracle_traces import first_difference, run_trace  # noqa: E402


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
    bad = 0
    for case in cases:
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
    print(f"{len(cases)} cases, {bad} mismatches (each case on both paths)")
    return 1 if bad or not cases else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
