"""A progress line for long commands (``kvsim sweep``, ``kvsim plan``): done/total, failures, rate, ETA.

Drawn only on a terminal (:func:`auto_progress`); nothing in CI or when piped.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Callable


def _format_eta(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m"


class ProgressBar:
    """One redrawn line on a terminal: points done/total, failures, rate, ETA.

    Called as ``bar(done, failed, total)``; the first call starts the clock.
    Redraws at most every ``min_interval_s`` except the last, which ends the line.
    """

    def __init__(self, stream=None, *, width: int = 24, min_interval_s: float = 0.1,
                 clock: Callable[[], float] = time.monotonic):
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.min_interval_s = min_interval_s
        self.clock = clock
        self.start_s: float | None = None
        self.last_draw_s = -math.inf
        self.last_len = 0

    def render(self, done: int, failed: int, total: int, elapsed_s: float) -> str:
        filled = self.width * done // total if total else self.width
        rate = done / elapsed_s if elapsed_s > 0 else 0.0
        eta = (total - done) / rate if rate > 0 else math.inf
        failures = f", {failed} failed" if failed else ""
        return (f"sweep [{'#' * filled}{'.' * (self.width - filled)}] {done}/{total} points"
                f"{failures}, {rate:.1f} points/s, ETA {_format_eta(eta)}")

    def __call__(self, done: int, failed: int, total: int) -> None:
        now = self.clock()
        if self.start_s is None:
            self.start_s = now
        final = done >= total
        if not final and now - self.last_draw_s < self.min_interval_s:
            return
        self.last_draw_s = now
        line = self.render(done, failed, total, now - self.start_s)
        padded = line.ljust(self.last_len)  # blank out the rest of a longer previous line
        self.last_len = len(line)
        self.stream.write("\r" + padded + ("\n" if final else ""))
        self.stream.flush()


def auto_progress(stream=None) -> ProgressBar | None:
    """A progress bar when ``stream`` (stderr) is a terminal; nothing in CI or when piped."""
    stream = stream if stream is not None else sys.stderr
    isatty = getattr(stream, "isatty", None)
    return ProgressBar(stream) if isatty is not None and isatty() else None
