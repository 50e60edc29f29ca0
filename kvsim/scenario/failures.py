"""Why requests failed, grouped for a terminal: ``48 requests: prompt of 5000..9000 tokens ...``.

Failure reasons name per-request numbers (a prompt length, a block count), so
grouping by exact text would print one line per request. Reasons are grouped
by their text with every number taken out; each number of a group is then
shown as its one value or as the range ``low..high`` it took in that group.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def group_failures(reasons: Iterable[str]) -> list[tuple[int, str]]:
    """``(count, reason)`` per kind of reason, most frequent first (ties: by text)."""
    groups: dict[str, tuple[list[int], list[list[str]]]] = {}
    for reason in reasons:
        reason = str(reason or "no reason recorded")
        numbers = _NUMBER.findall(reason)
        template = _NUMBER.sub("\0", reason)
        count, columns = groups.setdefault(template, ([0], [[] for _ in numbers]))
        count[0] += 1
        for column, number in zip(columns, numbers):
            column.append(number)
    lines = []
    for template, (count, columns) in groups.items():
        pieces = template.split("\0")
        text = pieces[0]
        for column, piece in zip(columns, pieces[1:]):
            text += _span(column) + piece
        lines.append((count[0], text))
    return sorted(lines, key=lambda item: (-item[0], item[1]))


def failure_report(reasons: list[str], *, num_requests: int, limit: int = 5) -> list[str]:
    """Lines for stderr: a heading, then the ``limit`` most frequent kinds of reason."""
    groups = group_failures(reasons)
    noun = "request" if len(reasons) == 1 else "requests"
    lines = [f"{len(reasons)} of {num_requests} {noun} failed:"]
    for count, text in groups[:limit]:
        lines.append(f"  {count} x {text}")
    rest = sum(count for count, _ in groups[limit:])
    if rest:
        lines.append(f"  {rest} x other reasons (see the fail_reason column of requests.csv)")
    return lines


def _span(values: list[str]) -> str:
    unique = sorted(set(values), key=float)
    return unique[0] if len(unique) == 1 else f"{unique[0]}..{unique[-1]}"
