"""The one exception a simulation raises when the simulated engine stops."""

from __future__ import annotations


class EngineError(RuntimeError):
    """The engine stopped mid-run, as vLLM's would (swap space exhausted, a
    request waiting on one that never arrives): the run has no result.

    A bug in kvsim raises anything else; ``kvsim run`` reports only this one
    as a one-line error, and a sweep records it as a failed point.
    """
