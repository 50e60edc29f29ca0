#!/usr/bin/env python3
"""Run vllm_oracle.py on many golden cases in ONE interpreter.

Importing vLLM costs ~10 s (a minute on a loaded machine), the scheduling
itself well under a second per case, so ``regenerate.sh`` imports the oracle
module once and calls its own ``load_config`` / ``load_workload`` / ``run``
for every ``<case>/`` folder: the same code path as
``vllm_oracle.py --workload <case>/workload.jsonl --config <case>/config.json
--out <case>/expected.jsonl``, minus the repeated import.  Every case builds a
fresh Scheduler, so no state crosses cases (regenerate.sh --one-by-one runs
the plain CLI instead, to check that).

Must run under the oracle's virtualenv (it imports vllm), with the oracle
folder given by --oracle-dir.

A config that names knobs under ``"_knobs"`` (the pending vLLM 0.33 cases,
``make_cases.py --pending``) is run twice: ``expected.jsonl`` with its
``extra_scheduler_config``, and ``baseline.jsonl`` without those knobs, so a
test can check that the case exercises them.

``max_num_scheduled_tokens`` needs one step the oracle CLI cannot take: the
oracle checks that ``Scheduler.max_num_scheduled_tokens`` equals the config's
``max_num_batched_tokens`` (before 0.33 they were one knob). The scheduler
is then built without it and given it afterwards, as ``Scheduler.__init__``
assigns it (``self.max_num_scheduled_tokens = scheduler_config.max_num_
scheduled_tokens``; nothing else in ``__init__`` reads it).

Usage: run_cases.py --oracle-dir DIR CASE_DIR [CASE_DIR ...]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--oracle-dir", required=True, help="folder holding vllm_oracle.py")
    ap.add_argument("--max-steps", type=int, default=5_000_000,
                    help="stop a case after this many steps, as vllm_oracle.py --max-steps "
                         "(default 5,000,000; a livelocked case writes every step until then)")
    ap.add_argument("case_dirs", nargs="+")
    args = ap.parse_args()

    sys.path.insert(0, os.path.abspath(args.oracle_dir))
    import vllm_oracle  # noqa: E402  (path set just above)

    # PYTHONHASHSEED only works at interpreter start: re-exec this script once
    # with the oracle's environment, exactly as vllm_oracle.py does for itself.
    if os.environ.get("PYTHONHASHSEED") != "0":
        env = dict(os.environ)
        env.update(vllm_oracle._ENV)
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__)] + sys.argv[1:], env)
    for k, v in vllm_oracle._ENV.items():
        os.environ.setdefault(k, v)
    import logging
    logging.disable(logging.WARNING)
    import vllm

    install_scheduled_tokens_hook(vllm_oracle)
    failed = []
    for d in args.case_dirs:
        name = os.path.basename(os.path.normpath(d))
        with open(os.path.join(d, "config.json")) as f:
            knobs = json.load(f).get("_knobs", [])
        runs = [("expected.jsonl", ())] + ([("baseline.jsonl", tuple(knobs))] if knobs else [])
        for out_name, without in runs:
            t0 = time.time()
            try:
                cfg = vllm_oracle.load_config(os.path.join(d, "config.json"))
                for knob in without:
                    cfg["extra_scheduler_config"].pop(knob)
                workload = vllm_oracle.load_workload(os.path.join(d, "workload.jsonl"), cfg)
                totals = vllm_oracle.run(cfg, workload, os.path.join(d, out_name),
                                         args.max_steps, "per-request")
            except (SystemExit, Exception) as e:  # report and go on with the other cases
                failed.append(f"{name}/{out_name}")
                print(f"{name}/{out_name}: FAILED: {type(e).__name__}: {e}", file=sys.stderr)
                continue
            totals["wall_s"] = round(time.time() - t0, 2)
            print(f"{name}/{out_name}: vllm {vllm.__version__}: {json.dumps(totals)}", file=sys.stderr)
    if failed:
        print(f"failed cases: {failed}", file=sys.stderr)
        return 1
    return 0


def install_scheduled_tokens_hook(vllm_oracle) -> None:
    """Let ``extra_scheduler_config`` carry ``max_num_scheduled_tokens`` (see the docstring)."""
    build = vllm_oracle.build_scheduler

    def build_scheduler(cfg: dict, model_dir: str):
        extra = dict(cfg["extra_scheduler_config"])
        scheduled = extra.pop("max_num_scheduled_tokens", None)
        sched, *rest = build({**cfg, "extra_scheduler_config": extra}, model_dir)
        if scheduled is not None:
            sched.scheduler_config.max_num_scheduled_tokens = scheduled
            sched.max_num_scheduled_tokens = scheduled
        return (sched, *rest)

    vllm_oracle.build_scheduler = build_scheduler


if __name__ == "__main__":
    sys.exit(main())
