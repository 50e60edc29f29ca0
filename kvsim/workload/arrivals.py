"""Arrival times, drawn in chunks so a million-request workload stays lazy.

Conventions follow ``vllm bench serve``: the first request is sent at t=0 and
each later one after a random gap; with ``--burstiness`` the gaps are gamma
distributed with shape ``burstiness`` and mean ``1/rate`` (shape 1 is Poisson).
"""

from __future__ import annotations

import numpy as np

from kvsim.workload.config import (AllAtOnceArrival, ArrivalConfig, ClosedLoopArrival,
                                   ConstantArrival, GammaArrival, PoissonArrival)


class ArrivalClock:
    """Successive arrival times (seconds); ``next_times(k)`` continues where the last call ended."""

    def __init__(self, config: ArrivalConfig, rng: np.random.Generator) -> None:
        self._config = config
        self._rng = rng
        self._next_time_s = 0.0

    def next_times(self, count: int) -> np.ndarray:
        gaps = self._gaps_s(count)
        # times[i] = next + gaps[0] + ... + gaps[i-1]: the gap after request i is gaps[i].
        # (A running sum, not cumsum(gaps) - gaps, which can round to a decreasing time.)
        with np.errstate(over="ignore"):
            times = self._next_time_s + np.concatenate(([0.0], np.cumsum(gaps[:-1])))[:count]
        if count:
            self._next_time_s = float(times[-1] + gaps[-1])
            if not np.isfinite(times[-1]):
                # An infinite time would become an infinite duration (and NaN rates).
                raise ValueError(f"workload.arrival: {self._config.model_dump()} gives arrival "
                                 f"times that overflow to infinity; use a higher rate or a "
                                 f"shorter interval")
        return times

    def _gaps_s(self, count: int) -> np.ndarray:
        cfg = self._config
        if isinstance(cfg, PoissonArrival):
            return self._rng.exponential(1.0 / cfg.rate, size=count)
        if isinstance(cfg, GammaArrival):
            # vllm bench serve: theta = 1 / (rate * burstiness); gap ~ Gamma(burstiness, theta).
            return self._rng.gamma(cfg.burstiness, 1.0 / (cfg.rate * cfg.burstiness), size=count)
        if isinstance(cfg, ConstantArrival):
            return np.full(count, cfg.interval_s)
        if isinstance(cfg, (AllAtOnceArrival, ClosedLoopArrival)):
            # Closed loop: the engine releases requests as others finish; times are unused.
            return np.zeros(count)
        raise TypeError(f"unknown arrival config {cfg!r}")
