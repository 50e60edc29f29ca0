#!/usr/bin/env python3
"""kvsim's hybrid KV manager against the real scheduler's traces of a campaign folder.

``DIR`` holds ``<case>/`` folders and ``oracle.log``, what
``tests/golden/oracle/run_hybrid_cases.py`` printed for them
(``differential.sh --hybrid`` writes both). For each case:

* vLLM refused the layers (``rejected the config``): kvsim's
  ``get_kv_cache_groups`` must refuse them too, or the scenario loader
  must (a uniform-type group, which vLLM plans but cannot schedule);
* vLLM ran it: kvsim must make the same groups and the same step trace on
  the step path and on the skip-ahead path
  (``tests/test_hybrid_oracle_traces.py``'s comparison);
* the oracle stopped otherwise (its scheduler stalled: a request that can
  never fit) is counted and skipped.

Exits 1 on any mismatch. Usage: check_cases.py DIR
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

# This tree's kvsim, not an installed one (a campaign checks the tree it runs from),
# and its tests/ (the comparisons of the golden tests).
sys.path[:0] = [str(Path(__file__).resolve().parents[3]), str(Path(__file__).resolve().parents[2])]
import kvsim  # noqa: E402
from kvsim.specs.kv_groups import get_kv_cache_groups  # noqa: E402
from test_hybrid_oracle_traces import VLLM_KIND, layer_specs, loaded  # noqa: E402
from test_oracle_traces import first_difference  # noqa: E402

STATUS = re.compile(r"^(\S+): (FAILED: .*|vllm .*)$")


def refused_by_kvsim(config: dict) -> bool:
    try:
        groups = get_kv_cache_groups(layer_specs(config), config["disable_hybrid_kv_cache_manager"])
    except ValueError:
        return True
    return any(g.uniform_type for g in groups.groups)     # the loader refuses it (kvsim/scenario/loader.py)


def check(case: Path) -> list[str]:
    expected = [json.loads(line) for line in (case / "expected.jsonl").read_text().splitlines()
                if line]
    _, groups, sc = loaded(case)
    want = json.loads((case / "groups.json").read_text())
    got = [{"layers": list(g.layers), "kind": g.kind} for g in groups.groups]
    if got != [{"layers": w["layers"], "kind": VLLM_KIND[w["kind"]]} for w in want]:
        return [f"groups {got} != vLLM's {want}"]
    out = []
    for fast_path in (False, True):
        steps: list[dict] = []
        kvsim.simulate(sc, trace=steps.append, fast_path=fast_path)
        diff = first_difference(expected, steps)
        if diff:
            out.append(f"{'skip-ahead' if fast_path else 'step-by-step'}: {diff}")
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    root = Path(argv[0])
    status = {m.group(1): m.group(2) for line in (root / "oracle.log").read_text().splitlines()
              if (m := STATUS.match(line))}
    ran = refused = stalled = bad = 0
    for case in sorted((p.parent for p in root.glob("*/config.json")), key=lambda p: p.name):
        st = status.get(case.name, "FAILED: no line in oracle.log")
        config = json.loads((case / "config.json").read_text())
        if "rejected the config" in st:
            refused += 1
            if not refused_by_kvsim(config):
                bad += 1
                print(f"{case.name}: vLLM refuses {config['layers']} ({st[8:]}); kvsim runs it",
                      flush=True)
            continue
        if not st.startswith("vllm"):
            stalled += 1
            continue
        ran += 1
        try:
            problems = check(case)
        except Exception as exc:                 # a crash is a mismatch too: report it
            problems = [f"raised {exc!r}"]
        bad += len(problems)
        for p in problems:
            print(f"{case.name}: {p}", flush=True)
    compiled = kvsim.native.active()["compiled"]    # (kvsim native build; KVSIM_NATIVE=0: plain)
    code = f"{len(compiled)} hot modules compiled" if compiled else "the plain modules"
    print(f"{ran} cases run, {refused} refused by vLLM, {stalled} stopped in the oracle; "
          f"{bad} mismatches ({code})")
    return 1 if bad or not ran else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
