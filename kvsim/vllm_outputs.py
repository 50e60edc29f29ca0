"""The files a vLLM user compares with: ``metrics.csv`` and ``bench_serve.json`` of a run.

``kvsim run --out DIR`` writes, next to summary.json, requests.csv and steps.csv:

* ``DIR/metrics.csv``: what Prometheus would have scraped from vLLM's
  ``/metrics`` every ``interval_s`` simulated seconds, under vLLM's series
  names (``kvsim/metrics/prometheus.py``);
* ``DIR/bench_serve.json``: the file ``vllm bench serve --save-result``
  writes (``--save-detailed`` with ``detailed``), ``kvsim/metrics/bench_json.py``.

This module knows the scenario (model, engine knobs, workload) the metrics
modules must not; it only gathers what they need.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from kvsim.metrics.bench_json import bench_serve_result
from kvsim.metrics.prometheus import prometheus_series
from kvsim.metrics.tables import write_csv
from kvsim.scenario.outputs import FilesApart, write_files

METRICS_FILE = "metrics.csv"
BENCH_FILE = "bench_serve.json"
VLLM_FILES = (METRICS_FILE, BENCH_FILE)


def vllm_outputs_apart(result, out_dir: str | Path, *, detailed: bool = False,
                       interval_s: float = 1.0) -> FilesApart:
    """``write_vllm_outputs`` in a forked child while the caller writes the run's
    own files (``kvsim run --out``); ``join()`` returns what it returns."""
    out = Path(out_dir)
    # A streaming run writes neither file (it keeps no tables): no child to fork.
    return FilesApart(lambda staged: write_vllm_outputs(result, out, detailed=detailed,
                                                        interval_s=interval_s, staged=staged),
                      targets=[out / name for name in VLLM_FILES], apart=not _streaming(result))


def write_vllm_outputs(result, out_dir: str | Path, *, detailed: bool = False,
                       interval_s: float = 1.0, staged: list | None = None) -> tuple[list[str], list[str]]:
    """Write both files for a ``kvsim.Result``; returns (file names written, notes).

    ``staged``: left under temporary names, as ``write_files`` does with it."""
    if getattr(result, "per_replica", None):     # a fleet: kvsim/scenario/cluster_outputs.py
        from kvsim.scenario.cluster_outputs import write_fleet_vllm_outputs
        notes = write_fleet_vllm_outputs(result, out_dir, setup=bench_setup(result.scenario, len(result.requests)),
                                         metrics_file=METRICS_FILE, bench_file=BENCH_FILE,
                                         detailed=detailed, interval_s=interval_s, staged=staged)
        return [METRICS_FILE, BENCH_FILE], notes
    out = Path(out_dir)
    sc = result.scenario
    if _streaming(result):
        return [], ["metrics.csv and bench_serve.json need the per-request and per-step tables, "
                    "which metrics: {streaming: true} does not keep"]
    series = prometheus_series(result.requests, result.steps, max_model_len=sc.sched_config.max_model_len,
                               enable_prefix_caching=sc.sched_config.enable_prefix_caching,
                               interval_s=interval_s)
    data, notes = bench_serve_result(result.summary, result.requests, result.steps, result.itl_s,
                                     setup=bench_setup(sc, len(result.requests)),
                                     slo=sc.scenario.slo.as_dict() or None, detailed=detailed)
    # As vLLM: json.dump of the mapping (an infinite burstiness is written Infinity).
    text = json.dumps(data) + "\n"
    # Staged under temporary names, then renamed (scenario/outputs.py).
    write_files({out / METRICS_FILE: lambda path: write_csv(series, path),
                 out / BENCH_FILE: lambda path: path.write_text(text, encoding="utf-8")},
                staged=staged)
    return [METRICS_FILE, BENCH_FILE], notes


def _streaming(result) -> bool:
    """A single engine's result with streaming metrics (or no scenario): no tables kept."""
    sc = result.scenario
    return not getattr(result, "per_replica", None) and (sc is None or sc.scenario.metrics.streaming)


def bench_setup(sc, num_requests: int) -> dict:
    """The keys ``vllm bench serve`` copies from its command line into the result file."""
    workload = sc.workload
    setup = {"endpoint_type": "kvsim", "backend": "kvsim", "label": sc.name, "model_id": sc.model.name,
             "tokenizer_id": None, "num_prompts": num_requests}
    if workload.kind == "bench":
        b = workload.bench
        setup.update(num_prompts=b.num_prompts, request_rate=_rate(b.request_rate),
                     burstiness=b.burstiness, max_concurrency=b.max_concurrency)
        if b.ramp_up_strategy is not None:
            setup.update(ramp_up_strategy=b.ramp_up_strategy, ramp_up_start_rps=b.ramp_up_start_rps,
                         ramp_up_end_rps=b.ramp_up_end_rps)
        return setup
    arrival = workload.arrival_or_default()
    kind = getattr(arrival, "type", None)
    rate = {"poisson": lambda a: a.rate, "gamma": lambda a: a.rate,
            "constant": lambda a: 1.0 / a.interval_s if a.interval_s > 0 else math.inf,
            "all_at_once": lambda a: math.inf, "closed_loop": lambda a: math.inf}
    setup.update(request_rate=_rate(rate[kind](arrival)) if kind in rate else None,
                 burstiness=getattr(arrival, "burstiness", 1.0),
                 max_concurrency=getattr(arrival, "concurrency", None))
    return setup


def _rate(value: float):
    return "inf" if value == math.inf else value      # vLLM writes an infinite rate as "inf"
