"""A one-line progress report for long runs, on a terminal only, at most once a second.

    simulated 812.4 s | 41,200 of 1,000,000 requests done | 3,950 req/s | ETA 4m03s

``ProgressLine(stream)`` is a callable ``progress(sim_time_s, count, total)``
that any loop may call as often as it likes: it reads the wall clock (that is
all it does when no line is due) and redraws the line in place (``\\r``) when
``interval_s`` has passed, first after ``first_after_s`` (a short run prints
nothing). ``close()`` erases the line. The wall clock only decides *when* to
print; nothing the run computes depends on it.

``kvsim.simulate(progress=...)`` passes it to the engine's progress hook
(``Engine(progress=)``, called every 256 loop turns with the simulated time
and the number of requests done).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO


class ProgressLine:
    """Redraws ``simulated T s | N of M requests <counting> | rate | ETA`` on a terminal."""

    def __init__(self, stream: TextIO, *, counting: str = "done",
                 clock: Callable[[], float] = time.monotonic, interval_s: float = 1.0,
                 first_after_s: float = 1.0) -> None:
        self.stream = stream
        self.counting = counting
        self.clock = clock
        self.interval_s = interval_s
        self.start_s = clock()
        self._next_s = self.start_s + first_after_s
        self._width = 0                  # characters of the line on screen now

    def __call__(self, sim_time_s: float | None, count: int, total: int | None = None) -> None:
        now = self.clock()
        if now < self._next_s:
            return
        self._next_s = now + self.interval_s
        self._draw(self.render(sim_time_s, count, total, now - self.start_s))

    def render(self, sim_time_s: float | None, count: int, total: int | None,
               elapsed_s: float) -> str:
        parts = []
        if sim_time_s is not None:
            parts.append(f"simulated {sim_time_s:,.1f} s")
        of = f" of {total:,}" if total is not None else ""
        parts.append(f"{count:,}{of} requests {self.counting}")
        if elapsed_s > 0 and count:
            rate = count / elapsed_s
            parts.append(f"{rate:,.0f} req/s")
            if total is not None and total >= count:
                parts.append(f"ETA {format_duration((total - count) / rate)}")
        return " | ".join(parts)

    def close(self) -> None:
        """Erase the line (the summary follows on a clean line)."""
        if self._width:
            self._write("\r" + " " * self._width + "\r")
            self._width = 0

    def _draw(self, text: str) -> None:
        pad = max(self._width - len(text), 0)
        self._write("\r" + text + " " * pad)
        self._width = len(text)

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):    # a closed or broken terminal: stop reporting
            self._next_s = float("inf")


def format_duration(seconds: float) -> str:
    """``42s``, ``4m03s``, ``2h05m``, ``3d04h``."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, s = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{s:02d}s"
    hours, m = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{m:02d}m"
    days, h = divmod(hours, 24)
    return f"{days}d{h:02d}h"


def terminal_progress(*, stream: TextIO | None = None, counting: str = "done") -> ProgressLine | None:
    """A ``ProgressLine`` on ``stream`` (stderr) if it is a terminal, else ``None``."""
    stream = sys.stderr if stream is None else stream
    try:
        is_tty = stream.isatty()
    except (AttributeError, ValueError):
        is_tty = False
    return ProgressLine(stream, counting=counting) if is_tty else None

