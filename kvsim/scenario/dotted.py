"""Dotted paths into a scenario's mapping: ``engine.block_size``, and an item of a
list by its index, ``cluster.pools[1].replicas`` (``--set`` and a sweep's keys).

A path is split into its keys (strings) and indices (ints); an index names an
item of a list already in the scenario (setting one never makes a list, nor
grows one). The two setters, ``schema.set_dotted`` (``--set``) and
``sweep_points.set_dotted`` (a sweep's keys, which create nothing new), walk
the parts themselves, with their own rules for a missing key, and ask
``list_item_problem`` at each index.
"""

from __future__ import annotations

import re
from typing import Any

_PIECE = re.compile(r"([^.\[\]]+)((?:\[[0-9]+\])*)")
_INDEX = re.compile(r"\[([0-9]+)\]")

EXAMPLE = "engine.block_size or cluster.pools[0].replicas"


def split_path(path: Any) -> list[str | int] | None:
    """``['cluster', 'pools', 1, 'replicas']`` for ``'cluster.pools[1].replicas'``;
    None if ``path`` is not a dotted path (an empty key, a bracket out of place)."""
    if not isinstance(path, str):
        return None
    parts: list[str | int] = []
    for piece in path.split("."):
        m = _PIECE.fullmatch(piece)
        if m is None:
            return None
        parts.append(m.group(1))
        parts.extend(int(i) for i in _INDEX.findall(m.group(2)))
    return parts


def join_path(parts: list[str | int]) -> str:
    """The path of ``parts`` as written: ``cluster.pools[1]``."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return out


def list_item_problem(node: Any, index: int, prefix: str) -> str | None:
    """Why ``prefix[index]`` names no item of ``node`` (the value at ``prefix``), or None."""
    if not isinstance(node, list):
        shown = "not in the scenario" if node is None else f"{node!r}, not a list"
        return f"{prefix} is {shown}; [{index}] names an item of a list the scenario holds"
    if index >= len(node):
        held = f"items 0-{len(node) - 1}" if node else "no items"
        return f"{prefix} has {held}; there is no [{index}]"
    return None
