"""Synthetic requests: arrivals, lengths, shared system prompts, multi-turn sessions.

Generated lazily in chunks of sessions, in arrival order, so only the chunk's
small per-request arrays and the requests the engine still holds are in memory.

Layout of a request's prompt (``L = prefix.shared_prompt_tokens``)::

    turn 1:  [ system prompt of group g (L) | user message 1 ]
    turn 2:  [ system prompt of group g (L) | user message 1 | answer 1 | user message 2 ]
    ...

The system prompt of a group is the same ids for every request of that group;
user messages and answers are fresh counter ids (``tokens.TokenCounter``), so
two requests share exactly the system prompt, and a later turn shares exactly
its whole previous turn (prompt and answer) with it. ``prompt_len`` is the
length of each *user message*; ``output_len`` is ``max_tokens`` of each turn.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from kvsim.workload.arrivals import ArrivalClock
from kvsim.workload.config import ArrivalConfig, PriorityChoice, WorkloadConfig
from kvsim.workload.lengths import LengthSampler
from kvsim.workload.request import RequestSpec
from kvsim.workload.tokens import TokenCounter, unrun_prompt

# Sessions drawn per chunk: large enough to amortise numpy calls, small enough to stay lazy.
CHUNK_SESSIONS = 1024


def sample_priorities(priority: int | PriorityChoice, rng: np.random.Generator, count: int) -> np.ndarray:
    if isinstance(priority, int):
        return np.full(count, priority, dtype=np.int64)
    weights = None
    if priority.weights is not None:
        weights = np.asarray(priority.weights, dtype=float)
        weights = weights / weights.sum()
    return rng.choice(np.asarray(priority.values, dtype=np.int64), size=count, p=weights)


def session_turn_counts(num_requests: int, turns: int, first: int, count: int) -> np.ndarray:
    """Turns of sessions ``first .. first+count-1``: full sessions, the last one cut to fit ``num_requests``."""
    num_sessions = math.ceil(num_requests / turns)
    counts = np.full(max(0, min(count, num_sessions - first)), turns, dtype=np.int64)
    if len(counts) and first + len(counts) == num_sessions:
        counts[-1] = num_requests - (num_sessions - 1) * turns
    return counts


def synthetic_requests(config: WorkloadConfig, arrival: ArrivalConfig, seed: int,
                       prompt_len: LengthSampler, output_len: LengthSampler, *,
                       max_prompt_len: int | None = None) -> Iterator[RequestSpec]:
    """The requests, lazily; prompts over ``max_prompt_len`` are not spelled out (``unrun_prompt``)."""
    rng = np.random.default_rng(seed)
    counter = TokenCounter()
    limit = math.inf if max_prompt_len is None else max_prompt_len
    group_prompts = [_group_prompt(counter, config.prefix.shared_prompt_tokens, limit)
                     for _ in range(config.prefix.num_groups)]
    clock = ArrivalClock(arrival, rng)
    num_sessions = math.ceil(config.num_requests / config.sessions.turns)
    think_time_s = config.sessions.think_time_s
    next_index = 0
    for first in range(0, num_sessions, CHUNK_SESSIONS):
        turns = session_turn_counts(config.num_requests, config.sessions.turns, first, CHUNK_SESSIONS)
        num_in_chunk = int(turns.sum())
        # Draw order is fixed (arrivals, groups, lengths, priorities): same seed, same requests.
        start_times = clock.next_times(len(turns))
        groups = rng.integers(0, config.prefix.num_groups, size=len(turns))
        user_lens = prompt_len.sample(rng, num_in_chunk)
        out_lens = output_len.sample(rng, num_in_chunk)
        priorities = sample_priorities(config.priority, rng, num_in_chunk)
        # Only a turn that another turn follows needs its answer spelled out.
        is_last = np.zeros(num_in_chunk, dtype=bool)
        is_last[np.cumsum(turns) - 1] = True
        user_starts = counter.take_starts(user_lens)
        out_starts = counter.take_starts(np.where(is_last, 0, out_lens))

        # Python lists: indexing numpy arrays element by element is several times slower.
        start_times, groups = start_times.tolist(), groups.tolist()
        user_starts, user_lens = user_starts.tolist(), user_lens.tolist()
        out_starts, out_lens, priorities = out_starts.tolist(), out_lens.tolist(), priorities.tolist()

        j = 0  # request position inside the chunk
        for s, num_turns in enumerate(turns.tolist()):
            history = group_prompts[groups[s]]
            previous_id = None
            for t in range(num_turns):
                answer = None
                unrun = len(history) + user_lens[j] > limit
                if unrun:
                    # The engine refuses it (and every later turn, which is longer).
                    prompt = unrun_prompt(len(history) + user_lens[j])
                else:
                    user = np.arange(user_starts[j], user_starts[j] + user_lens[j], dtype=np.int64)
                    prompt = np.concatenate((history, user)) if len(history) else user
                    if t < num_turns - 1:
                        answer = np.arange(out_starts[j], out_starts[j] + out_lens[j], dtype=np.int64)
                request_id = f"r{next_index}"
                yield RequestSpec(
                    request_id=request_id,
                    # A later turn is released by after_request_id; its arrival time is the session's.
                    arrival_time_s=start_times[s],
                    prompt_token_ids=prompt,
                    max_tokens=out_lens[j],
                    priority=priorities[j],
                    output_token_ids=answer,
                    cache_salt=config.cache_salt,
                    n=config.n,
                    beam_width=config.beam_width,
                    after_request_id=previous_id,
                    think_time_s=think_time_s if previous_id is not None else 0.0,
                    # A prompt of only its own user message that no later turn quotes.
                    fresh_prompt_start=(user_starts[j] if not unrun and not len(history)
                                        and answer is None else None),
                    may_be_followed=t < num_turns - 1,
                )
                if unrun:
                    history = unrun_prompt(len(prompt) + out_lens[j])
                elif answer is not None:
                    history = np.concatenate((prompt, answer))
                previous_id = request_id
                next_index += 1
                j += 1


def _group_prompt(counter: TokenCounter, num_tokens: int, limit: float) -> np.ndarray:
    """A group's system prompt; one no request can run with is reserved, not spelled out."""
    if num_tokens <= limit:
        return counter.take(num_tokens)
    counter.skip(num_tokens)
    return unrun_prompt(num_tokens)
