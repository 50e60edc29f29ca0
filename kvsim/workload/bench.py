"""The requests ``vllm bench serve`` would send, as lengths and shared prefixes.

One function per dataset of ``vllm/benchmarks/datasets/datasets.py`` turns a
:class:`BenchConfig` into a :class:`BenchTable` (per request: its lengths and
which shared prefix it starts with); :func:`bench_arrival_times` is
``serve.py``'s ``get_request``; :func:`bench_requests` makes the
``RequestSpec``\\ s. Where vLLM draws from a seeded generator, kvsim makes the
same draws from the same seed, so the lengths (random, sharegpt, burstgpt,
prefix_repetition order) and the send times (random, sharegpt, burstgpt,
timed_trace) are vLLM's own:

* random: ``np.random.default_rng(seed)`` draws the input lengths, then the
  output lengths (``utils.get_sampling_params``);
* sharegpt: ``random.seed(seed)``, ``random.shuffle`` of the conversations,
  vLLM's length filter (``is_valid_sequence``), ``random.choice`` to oversample;
* burstgpt: ``DataFrame.sample(n, random_state=seed)`` of the GPT-4 rows;
* prefix_repetition: ``random.shuffle`` of the prompts after ``random.seed(seed)``;
* send times: ``np.random.seed(seed)`` then one ``np.random.gamma`` per request.
  (vLLM's prefix_repetition draws its prompt tokens from that same global
  generator first; kvsim has no tokens to draw, so there the times differ.)

What kvsim cannot reproduce without a tokenizer: prompt lengths are the
dataset's token counts (``num_tokens`` of a ShareGPT message, else its word
count), and the decode/re-encode adjustment vLLM makes to random prompts is
not made.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from kvsim.workload.bench_config import INF, BenchConfig
from kvsim.workload.config import resolve_path
from kvsim.workload.request import RequestSpec
from kvsim.workload.tokens import TokenCounter, mooncake_block_tokens
from kvsim.workload.traces import mooncake_timestamps, read_mooncake


@dataclass(frozen=True)
class BenchTable:
    """One row per request, in the order vLLM sends them.

    A prompt is ``[shared prefix of group g (prefix_lens[g]) | own tokens
    (own_lens[i])]``; ``group[i] = -1`` means no shared prefix. ``timestamps``
    (seconds) only for a self-timed trace; ``hash_ids`` only for timed_trace.
    """

    own_lens: np.ndarray
    output_lens: np.ndarray
    group: np.ndarray
    prefix_lens: list[int]
    timestamps: np.ndarray | None = None
    hash_ids: list[list[int]] | None = None
    prompt_lens: np.ndarray | None = None     # timed_trace: input_length

    def __len__(self) -> int:
        return len(self.output_lens)


def bench_table(cfg: BenchConfig, *, seed: int, base_dir: Path | None) -> BenchTable:
    path = None
    if cfg.dataset_path is not None:
        path = resolve_path(cfg.dataset_path, base_dir, yaml_path="workload.bench.dataset_path")
    reader = {"random": _random, "sharegpt": _sharegpt, "burstgpt": _burstgpt,
              "prefix_repetition": _prefix_repetition, "timed_trace": _timed_trace,
              "sonnet": _sonnet}[cfg.dataset_name]
    return reader(cfg, seed, path)


def bench_arrival_times(cfg: BenchConfig, count: int, seed: int,
                        timestamps: np.ndarray | None = None) -> np.ndarray:
    """When each request is sent (s after the benchmark starts): ``serve.py get_request``.

    Gap ``i`` is ``Gamma(burstiness, 1 / (rate_i * burstiness))`` (``1/rate_i``
    if burstiness is inf, 0 if the rate is inf), the send time of request ``i``
    is the sum of gaps ``0..i`` (so the first request waits one gap), and with
    a fixed rate every time is rescaled so the last one is ``count / rate``.
    A ramp-up moves ``rate_i`` from start to end RPS over the request index.
    """
    if cfg.is_self_timed:
        return np.asarray(timestamps, dtype=float)
    if count == 0:
        return np.zeros(0)
    rates = _request_rates(cfg, count)
    rs = np.random.RandomState(seed)          # vLLM: np.random.seed(args.seed)
    delays = np.zeros(count)
    finite = np.isfinite(rates)
    if cfg.burstiness == INF:
        delays[finite] = 1.0 / rates[finite]
    else:
        # vLLM draws one np.random.gamma per request with a finite rate, in order;
        # one vectorised call makes the same draws (tests/test_workload_bench.py).
        scale = 1.0 / (rates[finite] * cfg.burstiness)
        delays[finite] = rs.gamma(shape=cfg.burstiness, scale=scale)
    times = np.cumsum(delays)
    if cfg.ramp_up_strategy is None and times[-1] != 0:
        # vLLM rescales so that the run spans exactly count / rate seconds.
        times = times * ((count / cfg.request_rate) / times[-1])
    return times


def bench_requests(cfg: BenchConfig, table: BenchTable, times: np.ndarray) -> Iterator[RequestSpec]:
    counter = TokenCounter()
    prefixes = [counter.take(n) for n in table.prefix_lens]
    starts = counter.take_starts(table.own_lens).tolist()
    own, out, group = table.own_lens.tolist(), table.output_lens.tolist(), table.group.tolist()
    times = np.asarray(times, dtype=float).tolist()
    for i in range(len(table)):
        block_ids = None
        if table.hash_ids is not None:
            block_ids = table.hash_ids[i]
            prompt = mooncake_block_tokens(block_ids, int(table.prompt_lens[i]))
            fresh = None
        else:
            tail = np.arange(starts[i], starts[i] + own[i], dtype=np.int64)
            g = group[i]
            prompt = np.concatenate((prefixes[g], tail)) if g >= 0 else tail
            fresh = starts[i] if g < 0 else None
        yield RequestSpec(request_id=f"r{i}", arrival_time_s=times[i], prompt_token_ids=prompt,
                          max_tokens=max(1, out[i]), fresh_prompt_start=fresh,
                          prompt_block_ids=block_ids, may_be_followed=False)


# --------------------------------------------------------------------------- datasets

def _request_rates(cfg: BenchConfig, count: int) -> np.ndarray:
    """serve.py ``_get_current_request_rate`` for every request index."""
    if cfg.ramp_up_strategy is None:
        return np.full(count, cfg.request_rate)
    start, end = cfg.ramp_up_start_rps, cfg.ramp_up_end_rps
    progress = np.arange(count) / max(count - 1, 1)
    if cfg.ramp_up_strategy == "linear":
        return start + (end - start) * progress
    return start * (end / start) ** progress


def _with_special(cfg: BenchConfig, own: np.ndarray, prefix: int) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """The tokenizer's special tokens (BOS) lead every prompt: shared, like a prefix."""
    shared = cfg.num_special_tokens + prefix
    group = np.full(len(own), 0 if shared else -1, dtype=np.int64)
    return own, group, [shared] if shared else []


def _random(cfg: BenchConfig, seed: int, path) -> BenchTable:
    """RandomDataset: uniform integer lengths around the means (``get_sampling_params``)."""
    input_len, output_len = cfg.input_and_output
    r_in, r_out = cfg.range_ratios
    real_input = max(0, input_len - cfg.num_special_tokens)
    in_low, in_high = math.floor(real_input * (1 - r_in)), math.ceil(real_input * (1 + r_in))
    out_low = max(math.floor(output_len * (1 - r_out)), 1)
    out_high = max(math.ceil(output_len * (1 + r_out)), 1)
    rng = np.random.default_rng(seed)
    own = rng.integers(in_low, in_high + 1, size=cfg.num_prompts)
    out = rng.integers(out_low, out_high + 1, size=cfg.num_prompts)
    own, group, prefixes = _with_special(cfg, own.astype(np.int64), cfg.random_prefix_len)
    return BenchTable(own, out.astype(np.int64), group, prefixes)


def _sonnet(cfg: BenchConfig, seed: int, path) -> BenchTable:
    """vLLM 0.10's sonnet dataset as lengths: a shared prefix, the rest of the input fresh."""
    n = cfg.num_prompts
    own = np.full(n, cfg.sonnet_input_len - cfg.sonnet_prefix_len, dtype=np.int64)
    own, group, prefixes = _with_special(cfg, own, cfg.sonnet_prefix_len)
    return BenchTable(own, np.full(n, cfg.sonnet_output_len, dtype=np.int64), group, prefixes)


def _prefix_repetition(cfg: BenchConfig, seed: int, path) -> BenchTable:
    """PrefixRepetitionRandomDataset: ``num_prefixes`` prefixes, each leading an equal share."""
    per_prefix = cfg.num_prompts // cfg.prefix_repetition_num_prefixes
    groups = [g for g in range(cfg.prefix_repetition_num_prefixes) for _ in range(per_prefix)]
    if not cfg.disable_shuffle:
        random.Random(seed).shuffle(groups)      # vLLM: random.seed(seed); random.shuffle(requests)
    n = len(groups)
    prefix = cfg.num_special_tokens + cfg.prefix_repetition_prefix_len
    return BenchTable(np.full(n, cfg.prefix_repetition_suffix_len, dtype=np.int64),
                      np.full(n, cfg.prefix_repetition_output_len, dtype=np.int64),
                      np.asarray(groups, dtype=np.int64) if prefix else np.full(n, -1, dtype=np.int64),
                      [prefix] * cfg.prefix_repetition_num_prefixes if prefix else [])


def _sharegpt(cfg: BenchConfig, seed: int, path: Path) -> BenchTable:
    """ShareGPTDataset: shuffle, keep valid lengths in order, oversample to num_prompts."""
    lengths = _sharegpt_lengths(path)
    order = list(range(len(lengths)))
    rand = random.Random(seed)
    if not cfg.disable_shuffle:
        rand.shuffle(order)
    output_len = cfg.output_len if cfg.output_len is not None else cfg.sharegpt_output_len
    chosen: list[tuple[int, int]] = []
    for i in order:
        if len(chosen) >= cfg.num_prompts:
            break
        prompt_len, completion_len = lengths[i]
        new_output = completion_len if output_len is None else output_len
        if _valid_sequence(prompt_len, new_output, skip_min_output=output_len is not None):
            chosen.append((prompt_len, new_output))
    if not chosen:
        raise ValueError(f"workload.bench.dataset_path: {path}: no conversation passes vLLM's "
                         f"length filter (prompt and answer >= 4 tokens, prompt <= 1024, "
                         f"prompt + answer <= 2048)")
    chosen = _oversample(chosen, cfg, seed)
    prompts, outputs = (np.asarray(v, dtype=np.int64) for v in zip(*chosen))
    own, group, prefixes = _with_special(cfg, prompts, 0)
    return BenchTable(own, outputs, group, prefixes)


def _burstgpt(cfg: BenchConfig, seed: int, path: Path) -> BenchTable:
    """BurstGPTDataset: GPT-4 rows with a positive response, sampled with pandas."""
    try:
        df = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise ValueError(f"workload.bench.dataset_path: {path}: not a readable CSV ({exc})") from None
    need = ["Model", "Request tokens", "Response tokens"]
    missing = [c for c in need if c not in df.columns]
    if missing or list(df.columns[2:4]) != need[1:]:
        raise ValueError(f"workload.bench.dataset_path: {path}: not a BurstGPT CSV; need the columns "
                         f"Timestamp, Model, Request tokens, Response tokens, ... in that order "
                         f"(found: {', '.join(map(str, df.columns))})")
    gpt4 = df[df["Model"] == "GPT-4"]
    gpt4 = gpt4[gpt4["Response tokens"] > 0]
    if gpt4.empty:
        raise ValueError(f"workload.bench.dataset_path: {path}: no GPT-4 row with Response tokens "
                         f"> 0 (vLLM keeps only those)")
    replace = cfg.num_prompts > len(gpt4)
    data = gpt4.sample(n=cfg.num_prompts, random_state=seed, replace=replace).values.tolist()
    prompts = np.asarray([int(row[2]) for row in data], dtype=np.int64)
    outputs = np.asarray([int(row[3]) for row in data], dtype=np.int64)
    own, group, prefixes = _with_special(cfg, np.maximum(prompts, 1), 0)
    return BenchTable(own, outputs, group, prefixes)


def _timed_trace(cfg: BenchConfig, seed: int, path: Path) -> BenchTable:
    """TimedTrace over a Mooncake-format JSONL: file order, timestamps x sec_multiplier."""
    table = read_mooncake(path)               # validates every line
    if table.after is not None:
        raise ValueError(f"workload.bench.dataset_path: {path}: rows with session_id are not part of "
                         f"vLLM's timed_trace (it needs a timestamp on every row); replay the file "
                         f"with workload.trace {{format: mooncake}}")
    n = min(cfg.num_prompts, len(table))
    # vLLM reads the timestamps as they are and multiplies them by --timed-trace-sec-multiplier.
    stamps = mooncake_timestamps(path)[:n] * cfg.timed_trace_sec_multiplier
    zeros = np.zeros(n, dtype=np.int64)
    return BenchTable(zeros, table.num_output_tokens[:n].copy(), np.full(n, -1, dtype=np.int64), [],
                      timestamps=stamps, hash_ids=table.hash_ids[:n],
                      prompt_lens=table.num_prompt_tokens[:n].copy())


# --------------------------------------------------------------------------- helpers

def _valid_sequence(prompt_len: int, output_len: int, *, skip_min_output: bool) -> bool:
    """vLLM ``is_valid_sequence`` with its defaults (min 4, prompt <= 1024, total <= 2048)."""
    return not (prompt_len < 4 or (not skip_min_output and output_len < 4)
                or prompt_len > 1024 or prompt_len + output_len > 2048)


def _oversample(chosen: list, cfg: BenchConfig, seed: int) -> list:
    """BenchmarkDataset.maybe_oversample_requests: ``random.seed(seed)``, then random.choice."""
    if cfg.no_oversample or len(chosen) >= cfg.num_prompts:
        return chosen
    rand = random.Random(seed)
    return chosen + [rand.choice(chosen) for _ in range(cfg.num_prompts - len(chosen))]


def _sharegpt_lengths(path: Path) -> list[tuple[int, int]]:
    """(prompt, completion) token counts of every conversation with at least two messages."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"workload.bench.dataset_path: {path}: not valid JSON ({exc})") from None
    if not isinstance(data, list):
        raise ValueError(f"workload.bench.dataset_path: {path}: expected a JSON list of "
                         f"conversations, got {type(data).__name__}")
    lengths = []
    for i, entry in enumerate(data):
        messages = entry.get("conversations") if isinstance(entry, dict) else None
        if messages is None:
            continue                           # vLLM drops entries without conversations
        if not isinstance(messages, list):
            raise ValueError(f"workload.bench.dataset_path: {path}: entry {i}: 'conversations' "
                             f"must be a list of messages")
        if len(messages) >= 2:
            lengths.append((_tokens(messages[0], path, i), _tokens(messages[1], path, i)))
    return lengths


def _tokens(message, path: Path, index: int) -> int:
    if not isinstance(message, dict) or not isinstance(message.get("value", ""), str):
        raise ValueError(f"workload.bench.dataset_path: {path}: entry {index}: each message must "
                         f"be an object with a 'value' string")
    count = message.get("num_tokens")
    if count is not None:
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ValueError(f"workload.bench.dataset_path: {path}: entry {index}: num_tokens = "
                             f"{count!r}; must be an integer >= 0")
        return count
    return len(message.get("value", "").split())


__all__ = ["BenchTable", "bench_arrival_times", "bench_requests", "bench_table"]
