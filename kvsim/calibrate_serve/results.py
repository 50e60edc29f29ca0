"""Measured serving runs: ``vllm bench serve`` result files, LLMServingSim's request logs, manifests.

A run is what one server did with one workload, one row per request::

    arrival_s  input_len  output_len  ttft_s  e2e_s  tpot_s

read from either

* a ``vllm bench serve --save-result --save-detailed`` JSON file
  (``vllm/benchmarks/serve.py``): per-request lists ``start_times`` (when
  the client sent it, ``time.perf_counter``), ``input_lens``,
  ``output_lens``, ``ttfts``, ``latencies`` (first token / last token after
  sending, s), ``errors`` (empty string when it succeeded). Without
  ``--save-detailed`` vLLM writes only aggregates, which cannot be replayed;
* or an LLMServingSim ``vllm_serving_bench`` ``requests.jsonl`` (one object a
  line: ``arrival_time`` wall clock, ``input_toks``, ``output_toks``,
  ``queued_ts``, ``first_token_ts``, ``last_token_ts`` engine clock):
  arrival gaps from ``arrival_time``, latencies from ``queued_ts``, when the
  engine core took the request in (its ``QUEUED`` event), which the replay
  compares with kvsim's ``queued_time_s`` (``measured.attrs["latency_origin"]``).

TPOT is ``vllm bench serve``'s: ``(e2e - ttft) / (output_len - 1)`` for
requests of more than one output token. Failed requests are left out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

RUN_COLUMNS = ("arrival_s", "input_len", "output_len", "ttft_s", "e2e_s", "tpot_s")
BENCH_KEYS = ("start_times", "input_lens", "output_lens", "ttfts", "latencies")
LLMSERVINGSIM_KEYS = ("arrival_time", "input_toks", "output_toks", "queued_ts", "first_token_ts",
                      "last_token_ts")
MANIFEST_KEYS = ("engine_preset", "fit", "runs")
RUN_KEYS = ("name", "scenario", "results", "split")


def _frame(arrival, input_len, output_len, ttft, e2e) -> pd.DataFrame:
    df = pd.DataFrame({"arrival_s": np.asarray(arrival, float), "input_len": np.asarray(input_len, int),
                       "output_len": np.asarray(output_len, int), "ttft_s": np.asarray(ttft, float),
                       "e2e_s": np.asarray(e2e, float)})
    df["arrival_s"] -= df["arrival_s"].min()
    df["tpot_s"] = np.where(df["output_len"] > 1,
                            (df["e2e_s"] - df["ttft_s"]) / (df["output_len"] - 1).clip(lower=1), np.nan)
    return df.sort_values("arrival_s", kind="stable").reset_index(drop=True)


def read_bench_serve(path: Path, data: dict) -> pd.DataFrame:
    for key in BENCH_KEYS:
        if key not in data:
            raise ValueError(f"{path}: no {key!r} list; run `vllm bench serve --save-result "
                             f"--save-detailed` (without --save-detailed vLLM keeps only the "
                             f"aggregates, which cannot be replayed); needs {', '.join(BENCH_KEYS)}")
        if not isinstance(data[key], list):
            raise ValueError(f"{path}: {key!r} is {type(data[key]).__name__}, not a list")
    n = len(data["start_times"])
    for key in BENCH_KEYS:
        if len(data[key]) != n:
            raise ValueError(f"{path}: {key!r} has {len(data[key])} entries, start_times {n}")
    errors = data.get("errors") or [""] * n
    ok = [not e and lat is not None and lat > 0 for e, lat in zip(errors, data["latencies"])]
    pick = lambda key: [v for v, good in zip(data[key], ok) if good]  # noqa: E731
    if not any(ok):
        raise ValueError(f"{path}: no successful request (each has an 'errors' entry or no "
                         f"positive latency)")
    return _frame(pick("start_times"), pick("input_lens"), pick("output_lens"), pick("ttfts"),
                  pick("latencies"))


def read_llmservingsim(path: Path) -> pd.DataFrame:
    rows = []
    for number, line in enumerate(_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} line {number}: not valid JSON ({exc})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path} line {number}: expected a JSON object, got {type(row).__name__}")
        for key in LLMSERVINGSIM_KEYS:
            if key not in row:
                raise ValueError(f"{path} line {number}: no {key!r}; an LLMServingSim requests.jsonl "
                                 f"line has {', '.join(LLMSERVINGSIM_KEYS)}")
        rows.append(row)
    df = pd.DataFrame(rows)
    out = _frame(df["arrival_time"], df["input_toks"], df["output_toks"],
                 df["first_token_ts"] - df["queued_ts"], df["last_token_ts"] - df["queued_ts"])
    out.attrs["latency_origin"] = "queued"
    return out


def read_results(path: str | Path) -> pd.DataFrame:
    """One measured run (format by content: a bench-serve JSON object or JSON lines)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"results file {str(path)!r} does not exist")
    text = _text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        first = text.lstrip().splitlines()[0] if text.strip() else ""
        try:
            json.loads(first)
        except json.JSONDecodeError:
            raise ValueError(f"{path}: neither a vllm bench serve JSON file nor JSON lines") from None
        return read_llmservingsim(path)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a vllm bench serve result is a JSON object, got "
                         f"{type(data).__name__}")
    return read_bench_serve(path, data)


def _text(path: Path) -> str:
    """A results file's text; undecodable content is an error naming it."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not a UTF-8 text file (byte {exc.start} cannot be decoded); "
                         f"expected vllm bench serve JSON or JSON lines") from None


def _yaml(path: Path, what: str):
    """A YAML file read as scenarios are (kvsim.scenario.yamlio: duplicate keys,
    binary content and syntax errors are one line naming the file)."""
    from kvsim.scenario.yamlio import read_yaml_file
    return read_yaml_file(path, what=what)


@dataclass(frozen=True)
class ServingRun:
    """A measured run and the settings of the server that served it (a kvsim scenario mapping)."""

    name: str
    scenario: dict[str, Any]
    measured: pd.DataFrame
    split: str = "train"          # "train": fitted on; "test": predicted only


def _scenario_mapping(value, base: Path, where: str) -> dict:
    if isinstance(value, dict):
        return dict(value, base_dir=str(base))
    if isinstance(value, str):
        path = Path(value) if Path(value).is_absolute() else base / value
        if not path.is_file():
            raise ValueError(f"{where}: scenario file {str(path)!r} does not exist")
        data = _yaml(path, "scenario file") or {}
        if not isinstance(data, dict):
            raise ValueError(f"{where}: {path} is not a YAML mapping")
        return dict(data, base_dir=str(path.parent))
    raise ValueError(f"{where}: expected a scenario file or mapping, got {value!r}")


def read_manifest(path: str | Path) -> tuple[list[ServingRun], dict]:
    """The runs of a manifest (docs/calibrate_serve.md) and its options (engine_preset, fit)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"manifest {str(path)!r} does not exist")
    data = _yaml(path, "manifest")
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a manifest is a YAML mapping with {', '.join(MANIFEST_KEYS)}")
    for key in data:
        if key not in MANIFEST_KEYS:
            raise ValueError(f"{path}: {key}: unknown key; allowed: {', '.join(MANIFEST_KEYS)}")
    if not isinstance(data.get("runs"), list) or not data["runs"]:
        raise ValueError(f"{path}: runs: expected a list of runs ({', '.join(RUN_KEYS)})")
    runs = []
    for i, item in enumerate(data["runs"]):
        where = f"{path}: runs.{i}"
        if not isinstance(item, dict):
            raise ValueError(f"{where}: expected a mapping with {', '.join(RUN_KEYS)}")
        for key in item:
            if key not in RUN_KEYS:
                raise ValueError(f"{where}.{key}: unknown key; allowed: {', '.join(RUN_KEYS)}")
        for key in ("scenario", "results"):
            if key not in item:
                raise ValueError(f"{where}.{key}: missing")
        split = item.get("split", "train")
        if split not in ("train", "test"):
            raise ValueError(f"{where}.split: {split!r}; allowed: train, test")
        results = Path(item["results"])
        results = results if results.is_absolute() else path.parent / results
        runs.append(ServingRun(str(item.get("name", f"run{i}")),
                               _scenario_mapping(item["scenario"], path.parent, f"{where}.scenario"),
                               read_results(results), split))
    options = {k: data[k] for k in ("engine_preset", "fit") if k in data}
    return runs, options
