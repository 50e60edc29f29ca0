"""What every plan's searches share: the candidate check and the probe log (``OUT/probes.jsonl``).

Moved here from kvsim/plan/run.py unchanged, so that the rate plan (run.py)
and the fleet plan (fleet.py) use the same ones.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from kvsim.plan.spec import Candidate, Plan, PlanError, with_rate
from kvsim.scenario.executor import RunPoint
from kvsim.scenario.results_log import LockedError, OutLock, ResultsLog, code_version, read_log
from kvsim.scenario.sweep_points import canonical_json


def _check_candidate(plan: Plan, cand: Candidate) -> str | None:
    """None if the candidate loads, else a one-line reason (does not fit, bad name, ...)."""
    from kvsim.scenario import load_scenario
    try:
        load_scenario(with_rate(cand.apply(plan.base), plan.bounds.start_req_s, plan.seeds[0]),
                      base_dir=plan.base_dir)
    except ValueError as exc:
        return " ".join(str(exc).split())
    return None


class _ProbeLog:
    """``OUT/probes.jsonl``: each finished probe, keyed by what it simulated (a no-op without OUT)."""

    FILE = "probes.jsonl"

    def __init__(self, out_dir, plan: Plan, probe: RunPoint, log):
        self.out = Path(out_dir) if out_dir is not None else None
        self.path = self.out / self.FILE if self.out is not None else None
        self.base_dir = str(plan.base_dir)
        self.runner = f"{getattr(probe, '__module__', '?')}.{getattr(probe, '__qualname__', repr(probe))}"
        self.code = code_version()
        self.log = log
        self.records: dict[str, dict] = {}
        self.lock = self.file = None

    def __enter__(self) -> _ProbeLog:
        if self.out is None:
            return self
        self.out.mkdir(parents=True, exist_ok=True)
        self.lock = OutLock(self.out, what="plan", log=self.log)
        try:
            self.lock.__enter__()
        except LockedError as exc:
            raise PlanError(str(exc)) from None
        self.records = read_log(self.path, "probe_id")
        self.file = ResultsLog(self.path)
        return self

    def __exit__(self, *exc_info) -> None:
        if self.file is not None:
            self.file.close()
        if self.lock is not None:
            self.lock.__exit__(*exc_info)

    def lookup(self, scenario: dict) -> tuple[str, dict | None]:
        """The probe's id, and its logged ok result if there is one."""
        identity = {"scenario": scenario, "base_dir": self.base_dir, "probe": self.runner,
                    "code_version": self.code}
        probe_id = hashlib.sha256(canonical_json(identity).encode()).hexdigest()[:16]
        logged = self.records.get(probe_id)
        if logged is None or logged.get("summary") is None or logged.get("code_version") != self.code:
            return probe_id, None                  # not run, failed (retried), or other code
        return probe_id, logged

    def append(self, probe_id: str, cand: Candidate, seed: int, rate: float, result: dict) -> None:
        if self.file is None:
            return
        self.file.append({"probe_id": probe_id, "candidate": cand.label, "seed": seed,
                          "rate_req_s": rate, "summary": result.get("summary"),
                          "error": result.get("error", ""), "wall_time_s": result.get("wall_time_s"),
                          "code_version": self.code})
