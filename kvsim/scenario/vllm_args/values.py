"""vLLM's value rules for the flags kvsim maps: argparse types, choices, config bounds.

A value is refused here exactly when vLLM would refuse it: argparse's type
conversion (``int``, ``float``, ``human_readable_int`` of
``vllm/utils/argparse_utils.py``), its ``choices``, and the bounds of the
pydantic config field the flag fills (``Field(gt=0, le=1)`` on
``CacheConfig.gpu_memory_utilization`` ...). The message names the flag, the
value and what vLLM allows.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from kvsim.scenario.vllm_args.parse import Given, VllmArgsError

_HUMAN = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def human_readable_int(text: str) -> int:
    """vLLM ``human_readable_int``: ``25.6k`` = 25,600, ``1K`` = 1,024, else ``int``."""
    text = text.strip()
    match = _HUMAN.fullmatch(text)
    if match:
        number, suffix = match.groups()
        if suffix in _DECIMAL:
            return int(float(number) * _DECIMAL[suffix])
        if "." in number:
            raise ValueError(f"Decimals are not allowed with binary suffixes like {suffix}. "
                             f"Did you mean to use {number}{suffix.lower()} instead?")
        return int(number) * _BINARY[suffix]
    return int(text)


def human_readable_int_or_auto(text: str) -> int:
    """vLLM ``human_readable_int_or_auto``: ``-1`` or ``auto`` is -1 (fit to memory)."""
    text = text.strip()
    if text == "-1" or text.lower() == "auto":
        return -1
    return human_readable_int(text)


TYPES: dict[str, Callable[[str], object]] = {
    "int": int, "float": float, "str": str,
    "human_readable_int": human_readable_int,
    "human_readable_int_or_auto": human_readable_int_or_auto,
}


@dataclass(frozen=True)
class Rule:
    """How vLLM reads one flag: argparse ``type`` and ``choices``, then the config field's bounds.

    ``source`` names the config field whose pydantic bounds these are (for
    the message); ``type`` is a key of :data:`TYPES` or ``"switch"`` for an
    on/off flag, ``"raw"`` for the value(s) as given, ``"int_list"`` for
    ``type=int, nargs='+'``, ``"json"`` for a JSON-object flag read with
    ``json.loads`` (given whole, not key by key).
    """

    type: str = "str"
    choices: tuple = ()
    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    source: str = ""

    def read(self, given: Given):
        if self.type == "switch":
            return bool(given.value)
        if self.type == "raw":             # the value(s) as given, for a converter to read
            return given.value
        if self.type == "int_list":
            return [self._one(given, "int", v) for v in
                    (given.value if isinstance(given.value, list) else [given.value])]
        if self.type == "json":
            return _json_object(given)
        raw = given.value
        if isinstance(raw, list):          # nargs='+' other than int_list: read as one
            raw = " ".join(raw)
        value = self._one(given, self.type, raw)
        if self.choices and value not in self.choices:
            raise VllmArgsError(f"argument {given.option}: invalid choice: {value!r} "
                                f"(choose from {', '.join(map(str, self.choices))})")
        self._check_bounds(given.option, value)
        return value

    @staticmethod
    def _one(given: Given, type_name: str, raw):
        try:
            return TYPES[type_name](raw)
        except (TypeError, ValueError) as exc:
            detail = f" ({exc})" if type_name.startswith("human") else ""
            raise VllmArgsError(f"argument {given.option}: invalid {type_name} value: "
                                f"{raw!r}{detail}") from None

    def _check_bounds(self, option: str, value) -> None:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return
        failed = [(op, bound) for op, bound, ok in (
            (">", self.gt, lambda b: value > b), (">=", self.ge, lambda b: value >= b),
            ("<", self.lt, lambda b: value < b), ("<=", self.le, lambda b: value <= b))
            if bound is not None and not ok(bound)]
        if failed:
            op, bound = failed[0]
            where = f" ({self.source})" if self.source else ""
            raise VllmArgsError(f"{option} {value!r}: vLLM refuses it: must be {op} {bound}{where}")


def _json_object(given: Given) -> dict:
    """A JSON config flag (``--speculative-config '{...}'``) as vLLM reads it: ``json.loads``."""
    if "." in given.option.lstrip("-"):
        raise VllmArgsError(f"argument {given.option}: kvsim reads {given.option.split('.')[0]} "
                            f"as one JSON object ('{{\"key\": value, ...}}'), not key by key")
    try:
        value = json.loads(given.value)
    except (TypeError, json.JSONDecodeError) as exc:
        raise VllmArgsError(f"argument {given.option}: invalid loads value: {given.value!r} "
                            f"({exc})") from None
    if not isinstance(value, dict):
        raise VllmArgsError(f"argument {given.option}: {given.value!r} is not a JSON object")
    return value
