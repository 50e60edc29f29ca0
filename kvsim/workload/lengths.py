"""Prompt and output length distributions (integers, clipped to ``[min, max]``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kvsim.workload.config import (EmpiricalLength, FixedLength, LengthConfig, LognormalLength,
                                   NormalLength, UniformLength, resolve_path)


# Cap when no max is given, so a wild sample (lognormal tail, huge mean) stays a valid int64.
MAX_LENGTH = 2**31 - 1


class LengthSampler:
    """Draws ``count`` lengths at a time; the empirical column is read once, here."""

    def __init__(self, config: LengthConfig, *, base_dir: Path | None, yaml_path: str) -> None:
        self._config = config
        self._values: np.ndarray | None = None
        if isinstance(config, EmpiricalLength):
            self._values = read_length_column(config, base_dir=base_dir, yaml_path=yaml_path)

    def sample(self, rng: np.random.Generator, count: int) -> np.ndarray:
        cfg = self._config
        if isinstance(cfg, FixedLength):
            raw = np.full(count, float(cfg.value))
        elif isinstance(cfg, UniformLength):
            raw = rng.integers(cfg.low, cfg.high, size=count, endpoint=True).astype(float)
        elif isinstance(cfg, NormalLength):
            raw = rng.normal(cfg.mean, cfg.std, size=count)
        elif isinstance(cfg, LognormalLength):
            raw = cfg.median * np.exp(cfg.sigma * rng.standard_normal(count))
        elif isinstance(cfg, EmpiricalLength):
            raw = self._values[rng.integers(0, len(self._values), size=count)]
        else:
            raise TypeError(f"unknown length config {cfg!r}")
        upper = MAX_LENGTH if cfg.max is None else cfg.max
        return np.clip(np.rint(raw), cfg.min, upper).astype(np.int64)


def read_length_column(config: EmpiricalLength, *, base_dir: Path | None, yaml_path: str) -> np.ndarray:
    """The column's values as floats (CSV, or JSON lines for ``.jsonl``/``.json``)."""
    path = resolve_path(config.file, base_dir, yaml_path=f"{yaml_path}.file")
    kind = "JSON lines" if path.suffix in (".jsonl", ".json") else "CSV"
    try:
        if path.suffix in (".jsonl", ".json"):
            table = pd.read_json(path, lines=path.suffix == ".jsonl")
        else:
            table = pd.read_csv(path)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{yaml_path}.file = {str(path)!r}: not a UTF-8 text file (byte "
                         f"{exc.start} cannot be decoded); expected a {kind} file") from None
    except pd.errors.EmptyDataError:
        raise ValueError(f"{yaml_path}.file = {str(path)!r}: the file is empty; expected a {kind} "
                         f"file with a column {config.column!r}") from None
    except ValueError as exc:                 # pandas' parser errors (ParserError is one)
        raise ValueError(f"{yaml_path}.file = {str(path)!r}: not a readable {kind} file "
                         f"({' '.join(str(exc).split())[:200]})") from None
    if config.column not in table.columns:
        raise ValueError(f"{yaml_path}.column = {config.column!r}: no such column in {path} "
                         f"(columns: {', '.join(map(str, table.columns))})")
    values = pd.to_numeric(table[config.column], errors="coerce").to_numpy(dtype=float)
    bad = ~np.isfinite(values)
    if bad.any():
        row = int(np.argmax(bad))
        raise ValueError(f"{yaml_path}.column = {config.column!r}: row {row} of {path} is "
                         f"{table[config.column].iloc[row]!r}; every value must be a number")
    if len(values) == 0:
        raise ValueError(f"{yaml_path}.file = {config.file!r}: column {config.column!r} is empty; "
                         "need at least one value")
    return values
