"""A requests file: JSON lines, one request each, given as ``workload: {requests_file: PATH}``.

    {"id": "r0", "arrival_time": 0.0, "prompt_token_ids": [1, 2, 3], "max_tokens": 16, "priority": 0}

The file format of the vLLM oracle (``shared/tools/vllm-oracle``): a workload
file the oracle replays is read here unchanged. ``id`` is a string or an
integer (read as its decimal string); ``prompt_token_ids`` is required; keys
left out take the oracle's defaults: ``arrival_time`` 0.0, ``max_tokens`` 16,
``priority`` 0.

Optional keys: ``output_token_ids`` (the ids the request generates, so a later
prompt can quote them and hit their cached blocks: at most ``max_tokens`` ids,
and fewer when the request stops early at ``max_model_len``, the oracle's
"tokens actually generated"; if it generates more than are listed, the rest
get the default ids below), ``cache_salt``, ``n``, ``beam_width``,
``after_request_id`` and ``think_time_s`` (release this request that long
after an earlier request of the file finishes). Token ids must be >= 0.
Requests are ordered by ``(arrival_time, line order)``.

Without ``output_token_ids``, the request on the i-th (0-based, non-blank)
line generates ids ``1_000_000 * (i + 1) + k``, the default of the vLLM oracle
(``--gen-token-mode per-request``), so a later prompt can quote an earlier
answer by those ids and the golden traces replay exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kvsim.workload.config import format_validation_error
from kvsim.workload.request import RequestSpec

# vLLM oracle, --gen-token-mode per-request: output k of line i is 1_000_000 * (i + 1) + k.
ORACLE_OUTPUT_ID_STRIDE = 1_000_000


# vllm_oracle.py load_workload: d.get("max_tokens", 16), d.get("arrival_time", 0.0).
ORACLE_DEFAULT_MAX_TOKENS = 16


class RequestLine(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    id: str | int
    arrival_time: float = Field(0.0, ge=0, allow_inf_nan=False)
    prompt_token_ids: list[int] = Field(min_length=1)
    max_tokens: int = Field(ORACLE_DEFAULT_MAX_TOKENS, ge=1)
    priority: int = 0
    output_token_ids: list[int] | None = None
    cache_salt: str | None = None
    n: int = Field(1, ge=1)
    beam_width: int = Field(1, ge=1)
    after_request_id: str | int | None = None
    think_time_s: float = Field(0.0, ge=0, allow_inf_nan=False)

    @field_validator("id")
    @classmethod
    def _id_not_empty(cls, v):
        if v == "":
            raise ValueError("must not be empty")
        return v


def read_requests_file(path: Path, *, yaml_path: str = "workload.requests_file") -> list[RequestSpec]:
    """All requests of the file, validated and sorted by (arrival_time, line order)."""
    specs: list[RequestSpec] = []
    arrival_of: dict[str, float] = {}
    with open(path, "rb") as lines:
        for number, raw in enumerate(lines, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError(f"{yaml_path} = {str(path)!r}: not a UTF-8 text file (line {number} "
                                 f"cannot be decoded); expected JSON lines, one request each") from None
            if text.strip():
                specs.append(_read_line(text, f"{yaml_path} ({path} line {number})",
                                        len(specs), arrival_of))
    # sorted() is stable: equal arrival times keep line order.
    return sorted(specs, key=lambda spec: spec.arrival_time_s)


def _read_line(text: str, where: str, index: int, arrival_of: dict[str, float]) -> RequestSpec:
    """The request of one non-blank line (the ``index``-th); ``arrival_of`` holds the earlier ids."""
    try:
        line = RequestLine.model_validate(json.loads(text))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON ({exc})") from None
    except ValidationError as exc:
        raise ValueError(format_validation_error(exc, prefix=where, root=RequestLine)) from None
    request_id = str(line.id)                  # the oracle's str(d["id"])
    after = None if line.after_request_id is None else str(line.after_request_id)
    prompt = _token_array(line.prompt_token_ids, f"{where}.prompt_token_ids")
    output = None
    if line.output_token_ids is not None:
        output = _token_array(line.output_token_ids, f"{where}.output_token_ids")
        if len(output) > line.max_tokens:
            raise ValueError(f"{where}.output_token_ids: has {len(output)} ids but max_tokens is "
                             f"{line.max_tokens}; give at most max_tokens ids")
    if request_id in arrival_of:
        raise ValueError(f"{where}.id = {line.id!r}: used twice; ids must be unique")
    if after is not None:
        if after not in arrival_of:
            raise ValueError(f"{where}.after_request_id = {line.after_request_id!r}: no earlier line "
                             "has that id; it must name a request above this one")
        if arrival_of[after] > line.arrival_time:
            # Keeps the request after the one it waits for once sorted by arrival time.
            raise ValueError(f"{where}.arrival_time = {line.arrival_time}: earlier than that of "
                             f"{after!r} ({arrival_of[after]}), which it follows; must be >= it")
    arrival_of[request_id] = line.arrival_time
    return RequestSpec(
        request_id=request_id, arrival_time_s=line.arrival_time, prompt_token_ids=prompt,
        max_tokens=line.max_tokens, priority=line.priority, output_token_ids=output,
        cache_salt=line.cache_salt, n=line.n, beam_width=line.beam_width,
        after_request_id=after, think_time_s=line.think_time_s,
        # Generated ids follow the vLLM oracle: 1_000_000 * (line index + 1) + k
        # (also for the outputs beyond a shorter output_token_ids).
        output_id_base=ORACLE_OUTPUT_ID_STRIDE * (index + 1))


def _token_array(ids: list[int], where: str) -> np.ndarray:
    try:
        array = np.asarray(ids, dtype=np.int64)
    except OverflowError:
        i = next(i for i, t in enumerate(ids) if not -2**63 <= t < 2**63)
        raise ValueError(f"{where}[{i}] = {ids[i]}: token ids must be >= 0 and fit in int64") from None
    if len(array) and array.min() < 0:
        # Negative ids are the engine's fresh generated tokens (kvsim.sched.request).
        i = int(np.argmax(array < 0))
        raise ValueError(f"{where}[{i}] = {ids[i]}: token ids must be >= 0")
    return array

