"""The files of a fleet run (``kvsim run --out DIR`` of a scenario with ``cluster:``).

The same names as one engine's run, each holding the whole fleet:

* ``summary.json``: the fleet's summary (`vllm bench serve` keys as a client
  in front of the router measures them, goodput, ``slo_attainment``,
  imbalance; kvsim/metrics/fleet.py), then ``pools`` and ``replicas``: each
  one's own summary, by name;
* ``requests.csv``: one row per request, with the ``replica`` that served it;
* ``steps.csv``: every replica's steps with a ``replica`` column, grouped by
  replica in pool order (``step`` counts that replica's steps);
* ``metrics.csv``: what Prometheus scraping every replica's ``/metrics``
  would hold, one block of rows per replica (a ``replica`` column, the label
  a scrape of many servers carries), all on the same scrape times;
* ``bench_serve.json``: the fleet's `vllm bench serve` result (the client
  sees one endpoint).

Everything is written through kvsim/scenario/outputs.py: staged under
temporary names, then renamed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from kvsim.metrics.bench_json import BENCH_STEP_COLUMNS, bench_serve_result, per_request_itls
from kvsim.metrics.prometheus import prometheus_series
from kvsim.metrics.tables import write_csv
from kvsim.scenario.outputs import check_output_dir, strict_summary, write_files

RUN_FILES = ("summary.json", "requests.csv", "steps.csv")


def fleet_summary_json(result) -> str:
    """summary.json of a fleet: the fleet's keys, then ``pools`` and ``replicas`` (strict JSON)."""
    data = strict_summary(result.summary)
    data["pools"] = {name: strict_summary(s) for name, s in result.per_pool.items()}
    data["replicas"] = {name: strict_summary(s) for name, s in result.per_replica.items()}
    return json.dumps(data, indent=2, allow_nan=False) + "\n"


def write_fleet_run(result, out_dir) -> Path:
    """summary.json, requests.csv, steps.csv of a ``FleetResult``, atomically."""
    out = check_output_dir(out_dir, files=RUN_FILES)
    summary = fleet_summary_json(result)
    write_files({out / "summary.json": lambda path: path.write_text(summary, encoding="utf-8"),
                 out / "requests.csv": lambda path: write_csv(result.requests, path),
                 out / "steps.csv": lambda path: write_csv(result.steps, path)})
    return out


def fleet_prometheus(result, *, interval_s: float = 1.0) -> pd.DataFrame:
    """Every replica's scrape table, on one set of scrape times, with a ``replica`` column.

    A replica whose last step ended before the fleet's is scraped on until
    the fleet's last scrape: its counters and gauges stay as they were.
    """
    plans = {p.name: p for p in result.run.pools}
    tables = []
    for name, part, steps in _by_replica(result):
        config = plans[result.per_replica[name]["pool"]].sched_config
        tables.append((name, prometheus_series(part, steps, max_model_len=config.max_model_len,
                                               enable_prefix_caching=config.enable_prefix_caching,
                                               interval_s=interval_s)))
    length = max(len(t) for _, t in tables)
    times = interval_s * np.arange(length)
    frames = []
    for name, table in tables:
        if len(table) < length:                     # hold the last sample
            table = table.reindex(range(length), method="ffill")
        table = table.assign(time_s=times)
        frames.append(pd.concat([pd.DataFrame({"replica": [name] * length}), table], axis=1))
    return pd.concat(frames, ignore_index=True)


def write_fleet_vllm_outputs(result, out_dir, *, setup: dict, metrics_file: str, bench_file: str,
                             detailed: bool = False, interval_s: float = 1.0,
                             staged: list | None = None) -> list[str]:
    """``metrics_file`` and ``bench_file`` of a fleet run (kvsim/vllm_outputs.py names them and
    gives ``setup``, the command-line keys of `vllm bench serve`); returns notes."""
    out = Path(out_dir)
    sc = result.scenario
    series = fleet_prometheus(result, interval_s=interval_s)
    # The client sees one endpoint: the fleet's steps in the order they end
    # (the columns the result reads: W7's whole table reordered was ~350 MB).
    steps = result.steps[list(BENCH_STEP_COLUMNS)]
    order = np.argsort((steps["start_time_s"] + steps["duration_s"]).to_numpy(), kind="stable")
    data, notes = bench_serve_result(result.summary, result.requests, steps.iloc[order], result.itl_s,
                                     setup=setup,
                                     slo=sc.scenario.slo.as_dict() or None, detailed=detailed)
    if detailed:
        itls = fleet_itls(result)
        if itls is not None:                 # read replica by replica: exact after all
            notes = [n for n in notes if not n.startswith("itls left out")]
            data = _with_itls(data, itls)
    text = json.dumps(data) + "\n"
    write_files({out / metrics_file: lambda path: write_csv(series, path),
                 out / bench_file: lambda path: path.write_text(text, encoding="utf-8")},
                staged=staged)
    return notes


def fleet_itls(result) -> list | None:
    """Each request's inter-token gaps, read from its own replica's steps (None if not exact)."""
    position = {rid: i for i, rid in enumerate(result.requests["request_id"])}
    itls: list = [[] for _ in range(len(result.requests))]
    for (name, part, steps), itl in zip(_by_replica(result), result.replica_itls):
        gaps = per_request_itls(part.reset_index(drop=True), steps, itl)
        if gaps is None:
            return None
        for rid, g in zip(part["request_id"], gaps):
            itls[position[rid]] = g
    return itls


def _with_itls(data: dict, itls: list) -> dict:
    """``data`` with ``itls`` right after ``ttfts``, where vllm bench serve writes it."""
    out = {}
    for key, value in data.items():
        if key != "itls":
            out[key] = value
        if key == "ttfts":
            out["itls"] = itls
    return out


def _by_replica(result):
    """(name, its request rows, its step rows) per replica, in pool order.

    Each table's replica column is coded once (``pd.factorize``) and a replica's
    rows are those of its code, in table order: the rows ``table["replica"] ==
    name`` selects, without a comparison of the whole column of strings per
    replica (W7: 16 of 3.1 M step rows, ~2.2 s)."""
    requests, steps = result.requests, result.steps
    request_rows, step_rows = _rows_of(requests["replica"]), _rows_of(steps["replica"])
    empty = np.zeros(0, dtype=np.int64)
    for name in result.per_replica:
        part = requests.iloc[request_rows.get(name, empty)].drop(columns=["replica"])
        own = steps.iloc[step_rows.get(name, empty)].drop(columns=["replica"]).reset_index(drop=True)
        yield name, part, own


def _rows_of(column: pd.Series) -> dict:
    """Each value's row positions, ascending (a missing value's are left out)."""
    codes, values = pd.factorize(column)
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(values) + 1))
    return {value: order[bounds[k]:bounds[k + 1]] for k, value in enumerate(values)}
