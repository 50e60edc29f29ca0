"""Readers for real request traces, and their replay as requests.

Every reader returns a ``TraceTable`` in file order; ``select`` then sorts it by
time *stably* (equal timestamps keep file order), skips ``offset`` requests,
keeps ``max_requests``, shifts times so the first kept request arrives at t=0,
and multiplies them by ``time_scale`` (0.5 replays twice as fast).

Formats (files in ``../shared/data/traces/``, see its README):

* ``azure``: Azure LLM inference 2023 CSV ``TIMESTAMP,ContextTokens,GeneratedTokens``
  (Splitwise, ISCA 2024); timestamps are date-time strings.
* ``mooncake``: Mooncake FAST'25 JSONL ``timestamp`` (ms), ``input_length``,
  ``output_length``, ``hash_ids`` (one id per 512-token block, equal ids = equal content);
  rows with ``session_id`` (and ``delay``, ms) are turns that wait for the previous
  turn of their session (agents, tool calls), as in AIPerf's Mooncake format.
* ``vidur``: Vidur trace CSV with ``arrived_at`` (s), ``num_prefill_tokens``,
  ``num_decode_tokens`` (other columns are ignored).
* ``sharegpt``: ShareGPT JSON ``[{"id", "conversations": [{"from", "value"}, ...]}]``;
  as ``vllm bench serve``, message 0 is the prompt and message 1 the answer, and
  conversations with fewer than two messages are skipped. No timestamps.

Lengths below 1 become 1: the engine needs a prompt token and ``max_tokens >= 1``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from kvsim.workload.arrivals import ArrivalClock
from kvsim.workload.config import ArrivalConfig, PriorityChoice, TraceConfig, resolve_path
from kvsim.workload.request import RequestSpec
from kvsim.workload.synthetic import sample_priorities
from kvsim.workload.tokens import (MAX_MOONCAKE_HASH_ID, MOONCAKE_BLOCK_TOKENS, TokenCounter,
                                   mooncake_block_tokens, unrun_prompt)


@dataclass(frozen=True)
class TraceTable:
    """One row per request; ``hash_ids`` only for Mooncake (else ``None``).

    Session traces (Mooncake rows with ``session_id``) also give, per row, the
    row of the previous turn it waits for (``after``, -1 for none) and how long
    after that turn finishes it is sent (``delay_s``).
    """
    arrival_time_s: np.ndarray        # float64
    num_prompt_tokens: np.ndarray     # int64, >= 1
    num_output_tokens: np.ndarray     # int64, >= 1
    hash_ids: list[list[int]] | None = None   # turned into token ids only when yielded
    after: np.ndarray | None = None   # int64 row index, -1: sent at its arrival time
    delay_s: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.arrival_time_s)

    def take(self, rows: np.ndarray) -> "TraceTable":
        """The rows ``rows`` in that order; a turn whose previous turn is not kept is dropped too."""
        if self.after is not None:
            rows = _keep_whole_chains(rows, self.after)
        hash_ids = None if self.hash_ids is None else [self.hash_ids[i] for i in rows.tolist()]
        after = delay = None
        if self.after is not None:
            position = np.full(len(self.after), -1, dtype=np.int64)
            position[rows] = np.arange(len(rows))
            old = self.after[rows]
            after = np.where(old >= 0, position[np.maximum(old, 0)], -1)
            delay = self.delay_s[rows]
        return TraceTable(self.arrival_time_s[rows], self.num_prompt_tokens[rows],
                          self.num_output_tokens[rows], hash_ids, after, delay)


def _keep_whole_chains(rows: np.ndarray, after: np.ndarray) -> np.ndarray:
    """``rows`` less every turn whose previous turn is not among the kept ones (or comes later)."""
    kept = np.zeros(len(after), dtype=bool)
    keep = []
    for r in rows.tolist():
        previous = int(after[r])
        if previous < 0 or kept[previous]:
            kept[r] = True
            keep.append(r)
    return np.asarray(keep, dtype=np.int64)


def read_trace(config: TraceConfig, *, base_dir: Path | None, yaml_path: str = "workload.trace") -> TraceTable:
    path = resolve_path(config.path, base_dir, yaml_path=f"{yaml_path}.path")
    reader = {"azure": read_azure, "mooncake": read_mooncake,
              "vidur": read_vidur, "sharegpt": read_sharegpt}[config.format]
    try:
        table = _read_once(reader, path, config.format)
    except UnicodeDecodeError as exc:
        raise ValueError(not_text_error(f"{yaml_path}.path", path, exc, config.format)) from None
    except pd.errors.ParserError as exc:
        raise ValueError(f"{yaml_path}.path = {str(path)!r}: not a readable {config.format} "
                         f"CSV ({' '.join(str(exc).split())})") from None
    return select(table, config)


# A sweep reads the same trace at every point (W3: 100 reads of one CSV, ~3% of
# the sweep). The parsed tables of the last few files are kept for the process,
# keyed by the file's identity and version (path, inode, size, modification
# time: an edited file is read again), at most 32 MiB of files in all: a parsed
# table is up to ~4x its file (a Mooncake trace's block-id lists), so what is
# kept stays under ~130 MB, and a larger trace is read every time. ``select``
# copies the rows it keeps; the kept arrays are read-only, and nothing writes
# the kept block-id lists (requests hash them, ``kvsim.kv.hashing``).
_TABLES: dict[tuple, TraceTable] = {}
_MAX_TABLES = 4
_MAX_CACHED_BYTES = 32 << 20


def _read_once(reader, path: Path, fmt: str) -> TraceTable:
    try:
        st = path.stat()
    except OSError:
        return reader(path)                 # the reader names the file in its error
    if st.st_size > _MAX_CACHED_BYTES:
        return reader(path)
    key = (fmt, str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns)
    table = _TABLES.pop(key, None)
    if table is None:
        table = reader(path)
        for column in (table.arrival_time_s, table.num_prompt_tokens, table.num_output_tokens,
                       table.after, table.delay_s):
            if column is not None:
                column.flags.writeable = False
        # The least recently read go first (key[3]: the file's size).
        while _TABLES and (len(_TABLES) >= _MAX_TABLES or
                           sum(k[3] for k in _TABLES) + st.st_size > _MAX_CACHED_BYTES):
            del _TABLES[next(iter(_TABLES))]
    _TABLES[key] = table                            # now the most recent
    return table


def not_text_error(yaml_path: str, path: Path, exc: UnicodeDecodeError, what: str) -> str:
    """The message for a file that is not UTF-8 text (binary data given as a trace, a CSV)."""
    return (f"{yaml_path} = {str(path)!r}: not a UTF-8 text file (byte {exc.start} cannot be "
            f"decoded); a {what!r} trace must be a text file")


def select(table: TraceTable, config: TraceConfig) -> TraceTable:
    order = np.argsort(table.arrival_time_s, kind="stable")
    stop = None if config.max_requests is None else config.offset + config.max_requests
    table = table.take(order[config.offset:stop])
    times = table.arrival_time_s
    if len(times):
        with np.errstate(over="ignore"):
            times = (times - times[0]) * config.time_scale
        if not np.isfinite(times[-1]):
            raise ValueError(f"workload.trace.time_scale = {config.time_scale:g}: the trace spans "
                             f"{table.arrival_time_s[-1] - table.arrival_time_s[0]:g} s, which "
                             f"scaled overflows to an infinite time; use a smaller time_scale")
    delay = None if table.delay_s is None else table.delay_s * config.time_scale
    return TraceTable(times, table.num_prompt_tokens, table.num_output_tokens, table.hash_ids,
                      table.after, delay)


def read_azure(path: Path) -> TraceTable:
    columns = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]
    table = _read_csv(path, columns)
    try:
        stamps = pd.to_datetime(table["TIMESTAMP"], format="ISO8601")
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{path}: TIMESTAMP must be date-times like '2023-11-16 18:15:46.6805900' ({exc})") from None
    if stamps.isna().any():
        row = int(np.argmax(stamps.isna().to_numpy()))
        raise ValueError(f"{path}: TIMESTAMP in data row {row} is missing")
    ns = stamps.to_numpy(dtype="datetime64[ns]").astype(np.int64)
    # Subtract in integers first: absolute epoch nanoseconds do not fit a float exactly.
    seconds = (ns - ns.min()) / 1e9 if len(ns) else np.zeros(0)
    return TraceTable(seconds, _lengths(table, "ContextTokens", path), _lengths(table, "GeneratedTokens", path))


def read_vidur(path: Path) -> TraceTable:
    table = _read_csv(path, ["arrived_at", "num_prefill_tokens", "num_decode_tokens"])
    seconds = pd.to_numeric(table["arrived_at"], errors="coerce").to_numpy(dtype=float)
    _check_finite(seconds, path, "arrived_at")
    return TraceTable(seconds, _lengths(table, "num_prefill_tokens", path),
                      _lengths(table, "num_decode_tokens", path))


def read_mooncake(path: Path) -> TraceTable:
    """A Mooncake JSONL trace; rows with ``session_id`` are the turns of an agent or chat session.

    A session (AIPerf's Mooncake format, ``ai-dynamo/aiperf``
    ``dataset/loader/models.py`` ``MooncakeTrace``) is the rows sharing a
    ``session_id``, in file order: the first is sent at its ``timestamp`` (ms,
    default 0); each later one ``delay`` ms (default 0) after the previous turn
    of its session finishes, and carries no timestamp of its own. Its arrival
    time in the table is its session's start.
    """
    rows = _mooncake_rows(path)
    times = np.asarray([r[0] for r in rows], dtype=float) / 1000.0   # the trace's timestamps are ms
    after = np.asarray([r[4] for r in rows], dtype=np.int64)
    sessions = bool(len(after)) and bool((after >= 0).any())
    return TraceTable(times, np.asarray([r[1] for r in rows], dtype=np.int64),
                      np.maximum(np.asarray([r[2] for r in rows], dtype=np.int64), 1),
                      [r[3] for r in rows],
                      after=after if sessions else None,
                      delay_s=np.asarray([r[5] for r in rows], dtype=float) / 1000.0 if sessions else None)


def mooncake_timestamps(path: Path) -> np.ndarray:
    """The ``timestamp`` of every row as written (no unit change), for vLLM's timed_trace."""
    return np.asarray([r[0] for r in _mooncake_rows(path)], dtype=float)


def _mooncake_rows(path: Path) -> list[tuple]:
    """(timestamp, input_length, output_length, hash_ids, previous turn's row or -1, delay ms)."""
    with open(path, encoding="utf-8") as f:
        numbered = [(number, line) for number, line in enumerate(f, start=1) if line.strip()]
    try:
        # One json.loads for the whole file is several times faster than one per line.
        rows = json.loads("[" + ",".join(line for _, line in numbered) + "]")
    except json.JSONDecodeError:
        rows = [_mooncake_row(line, path, number) for number, line in numbered]
    out = []
    last_of_session: dict[str, int] = {}
    for i, ((number, _), row) in enumerate(zip(numbered, rows)):
        where = f"{path} line {number}"
        try:
            n_in, n_out, ids = row["input_length"], row["output_length"], row["hash_ids"]
            session = row.get("session_id")
            ts = row["timestamp"] if session is None else row.get("timestamp", 0)
        except (KeyError, TypeError, AttributeError):
            raise ValueError(f"{where}: expected a JSON object with timestamp, input_length, "
                             f"output_length, hash_ids; got {str(row)[:80]}") from None
        if not isinstance(n_in, int) or n_in < 1:
            raise ValueError(f"{where}: input_length = {n_in!r}; must be an integer >= 1")
        if not isinstance(ids, list) or not ids or not all(isinstance(h, int) for h in ids):
            raise ValueError(f"{where}: hash_ids must be a non-empty list of integers")
        num_blocks = len(ids)
        # The last block may be partial; any other mismatch means the row is broken.
        if not MOONCAKE_BLOCK_TOKENS * (num_blocks - 1) < n_in <= MOONCAKE_BLOCK_TOKENS * num_blocks:
            raise ValueError(f"{where}: input_length {n_in} does not fit {num_blocks} hash_ids of "
                             f"{MOONCAKE_BLOCK_TOKENS} tokens (need {MOONCAKE_BLOCK_TOKENS}*(k-1) < "
                             f"input_length <= {MOONCAKE_BLOCK_TOKENS}*k)")
        if min(ids) < 0 or max(ids) > MAX_MOONCAKE_HASH_ID:
            raise ValueError(f"{where}: hash_ids must be integers in 0..{MAX_MOONCAKE_HASH_ID}")
        previous, delay = -1, row.get("delay", 0) if isinstance(row, dict) else 0
        if session is not None:
            session = str(session)
            previous = last_of_session.get(session, -1)
            last_of_session[session] = i
            if previous >= 0:
                if "timestamp" in row:
                    raise ValueError(f"{where}: a later turn of session {session!r} is sent after the "
                                     f"previous turn finishes; give its delay (ms), not a timestamp")
                ts = out[previous][0]            # its session's start
        if not isinstance(delay, (int, float)) or isinstance(delay, bool) or delay < 0:
            raise ValueError(f"{where}: delay = {delay!r}; must be a number of milliseconds >= 0")
        if not isinstance(ts, (int, float)) or isinstance(ts, bool) or not isinstance(n_out, (int, float)):
            raise ValueError(f"{where}: timestamp and output_length must be numbers")
        out.append((ts, n_in, n_out, ids, previous, delay))
    return out


def _mooncake_row(line: str, path: Path, number: int) -> dict:
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} line {number}: not valid JSON ({exc})") from None


def read_sharegpt(path: Path) -> TraceTable:
    """Lengths are whitespace word counts, or a message's ``num_tokens`` when given."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of conversations, got {type(data).__name__}")
    prompts, outputs = [], []
    for i, item in enumerate(data):
        messages = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(messages, list):
            raise ValueError(f"{path}: entry {i} has no 'conversations' list")
        if len(messages) < 2:
            continue  # vllm bench serve skips these too
        prompts.append(_message_tokens(messages[0], path, i))
        outputs.append(_message_tokens(messages[1], path, i))
    count = len(prompts)
    return TraceTable(np.zeros(count), np.maximum(np.asarray(prompts, dtype=np.int64), 1),
                      np.maximum(np.asarray(outputs, dtype=np.int64), 1))


def trace_requests(table: TraceTable, *, arrival: ArrivalConfig | None, seed: int,
                   priority: int | PriorityChoice, cache_salt: str | None,
                   n: int, beam_width: int, max_prompt_len: int | None = None) -> Iterator[RequestSpec]:
    """Requests in time order; ``arrival`` (if given) replaces the trace's timestamps.

    A prompt longer than ``max_prompt_len`` is not spelled out (``unrun_prompt``).
    """
    rng = np.random.default_rng(seed)
    count = len(table)
    times = table.arrival_time_s if arrival is None else ArrivalClock(arrival, rng).next_times(count)
    priorities = sample_priorities(priority, rng, count)
    # Python lists: element access on numpy arrays is several times slower per request.
    times, priorities = np.asarray(times).tolist(), priorities.tolist()
    num_prompts, num_outputs = table.num_prompt_tokens.tolist(), table.num_output_tokens.tolist()
    starts = None if table.hash_ids is not None else TokenCounter().take_starts(table.num_prompt_tokens).tolist()
    limit = np.inf if max_prompt_len is None else max_prompt_len
    after = None if table.after is None else table.after.tolist()
    delays = None if table.delay_s is None else table.delay_s.tolist()
    followed = frozenset() if after is None else frozenset(after)     # rows a later turn names
    for i in range(count):
        if num_prompts[i] > limit:
            prompt = unrun_prompt(num_prompts[i])     # the engine refuses it unread
        elif starts is None:
            prompt = mooncake_block_tokens(table.hash_ids[i], num_prompts[i])
        else:
            prompt = np.arange(starts[i], starts[i] + num_prompts[i], dtype=np.int64)
        previous = -1 if after is None else after[i]
        yield RequestSpec(request_id=f"r{i}", arrival_time_s=times[i], prompt_token_ids=prompt,
                          max_tokens=num_outputs[i], priority=priorities[i],
                          cache_salt=cache_salt, n=n, beam_width=beam_width,
                          fresh_prompt_start=None if starts is None else starts[i],
                          prompt_block_ids=None if starts is not None else table.hash_ids[i],
                          after_request_id=f"r{previous}" if previous >= 0 else None,
                          think_time_s=delays[i] if previous >= 0 else 0.0,
                          may_be_followed=i in followed)


def _read_csv(path: Path, columns: list[str]) -> pd.DataFrame:
    try:
        table = pd.read_csv(path)
    except pd.errors.EmptyDataError:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in columns})
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise ValueError(f"{path}: missing column(s) {', '.join(missing)}; need {', '.join(columns)} "
                         f"(found: {', '.join(map(str, table.columns))})")
    return table


def _lengths(table: pd.DataFrame, column: str, path: Path) -> np.ndarray:
    values = pd.to_numeric(table[column], errors="coerce").to_numpy(dtype=float)
    _check_finite(values, path, column)
    if (values < 0).any():
        row = int(np.argmax(values < 0))
        raise ValueError(f"{path}: {column} in data row {row} is {values[row]:g}; must be >= 0")
    return np.maximum(np.rint(values).astype(np.int64), 1)


def _check_finite(values: np.ndarray, path: Path, column: str) -> None:
    bad = ~np.isfinite(values)
    if bad.any():
        row = int(np.argmax(bad))
        raise ValueError(f"{path}: {column} in data row {row} is not a number")


def _message_tokens(message, path: Path, index: int) -> int:
    if not isinstance(message, dict) or not isinstance(message.get("value", ""), str):
        raise ValueError(f"{path}: entry {index}: each message must be an object with a 'value' string")
    if "num_tokens" in message:
        tokens = message["num_tokens"]
        if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
            raise ValueError(f"{path}: entry {index}: num_tokens = {tokens!r}; must be an integer >= 0")
        return tokens
    return len(message.get("value", "").split())
