"""Import time by package, from the ``python -X importtime`` log of a child.

``-X importtime`` prints one line per module when its import ends:
``import time: SELF | CUMULATIVE | NAME``, the name indented two spaces per
level of nesting, a module's nested imports printed before it. The self
times add up to the time spent importing; each one is charged to an owner:

* a module of a third-party package (``numpy.linalg``) belongs to that
  package (``numpy``), and so does everything it imports that was not
  loaded yet, standard library included (``pandas`` pulls in ``decimal``,
  ``pytz``, ``dateutil``: all charged to ``pandas``);
* a ``kvsim`` module belongs to ``kvsim``;
* a standard-library module imported by kvsim or at the top belongs to
  ``stdlib``.

So "pandas" reads "what importing pandas cost, given what was loaded
before it". The charge depends on the import order, which is the program's.
"""

from __future__ import annotations

import re
import sys

_LINE = re.compile(r"^import time:\s+(\d+)\s+\|\s+(\d+)\s+\|( *)(\S+)\s*$")
STDLIB = "stdlib"


def parse_importtime(text: str) -> list[tuple[int, str, float, float]]:
    """``(depth, module, self_s, cumulative_s)`` per line of an ``-X importtime`` log."""
    rows = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:                                  # the header line has no numbers
            self_us, cum_us, indent, name = m.groups()
            rows.append(((len(indent) - 1) // 2, name, int(self_us) / 1e6, int(cum_us) / 1e6))
    return rows


def import_time_by_owner(text: str, *, after: str | None = None) -> dict[str, float]:
    """Seconds of import time per owner (see the module docstring), largest first.

    ``after``: count only the imports that end after the top-level import of
    that module (a child's own module: what the interpreter imported to
    start it is not the workload's).
    """
    rows = parse_importtime(text)
    if after is not None:
        cut = next((i for i, (depth, name, *_) in enumerate(rows) if depth == 0 and name == after), None)
        rows = rows[cut + 1:] if cut is not None else rows
    # Rebuild the nesting: a line at depth d adopts the pending lines at d + 1.
    pending: dict[int, list[int]] = {}
    parent = [-1] * len(rows)
    for i, (depth, *_rest) in enumerate(rows):
        for child in pending.pop(depth + 1, []):
            parent[child] = i
        pending.setdefault(depth, []).append(i)
    owner = [""] * len(rows)
    totals: dict[str, float] = {}
    for i in reversed(range(len(rows))):       # parents come after their children
        owner[i] = _owner(rows[i][1], owner[parent[i]] if parent[i] >= 0 else None)
    for (_, _, self_s, _), who in zip(rows, owner):
        totals[who] = totals.get(who, 0.0) + self_s
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def _owner(module: str, parent_owner: str | None) -> str:
    if parent_owner not in (None, STDLIB, "kvsim"):
        return parent_owner                     # pulled in by a third-party package
    root = module.split(".")[0]
    if root == "kvsim":
        return "kvsim"
    if root in sys.stdlib_module_names:
        return STDLIB
    return root
