"""The cyclic garbage collector paused while a simulation runs.

A simulation allocates millions of small containers (requests, their token
times, step records, SimPy events) that nearly all live until the run ends
or die by reference counting; the collector's generation scans find almost
no cycles in them (W1: 10 objects collected in a whole run) but cost 12-18%
of ``simulate()``'s CPU time. So the engine loop runs with automatic
collection off; the caller's setting is restored afterwards, also on an
error. Nothing simulated depends on it: results are the same bytes either
way.

The pause pays only if the collector never traces those objects later
either. So ``simulate()`` keeps it until the tables are built, and the run
leaves no reference cycles: ``Engine.close`` lets go of its process and of
its callbacks into the front end and closes its scheduler (the radix cache
unlinks its tree's parent links, ``kv/radix.py``), ``Fleet._close`` lets go
of the fleet's back references, so a finished engine is freed by reference
counting the moment its caller drops it (tests/test_gc_pause.py). Before
that, the first collection after the pause traced every request of the run,
and so did the older generations' later on (~4% of a W3 sweep point). What
remains for the collector is SimPy's own (an environment and its bound event
classes, a finished process and its last event).

``kvsim run`` goes further (kvsim/cli.py ``COLLECTOR_OFF``): the collector is
off from the command's first import to its exit. Its collections while
pandas, numpy, pydantic and kvsim are imported cost ~30 ms, 1% of W1's
whole process, and a run leaves nothing for them to find.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager


@contextmanager
def collector_paused():
    """Run the body with automatic garbage collection off (restored after)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
