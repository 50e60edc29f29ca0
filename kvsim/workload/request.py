"""The request a workload hands to the engine."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(slots=True)
class RequestSpec:
    """One request as it arrives at the engine (read, never changed: a request
    of n samples is copied with ``dataclasses.replace``).

    Token ids are real content: two requests share a cached prefix exactly when
    their leading token ids are equal (and their ``cache_salt`` is the same).
    ``output_token_ids``, when given, are the tokens the request generates (so a
    later turn can quote them and hit their cached blocks); otherwise the
    engine makes fresh ids that collide with nothing.

    Fresh ids are negative (no prompt holds them) unless ``output_id_base`` is
    set: requests files use ``1_000_000 * (line index + 1)``, the scheme of the
    vLLM oracle, so a later prompt can quote an earlier answer by its ids.

    A request with ``after_request_id`` is released ``think_time_s`` after that
    request finishes (multi-turn sessions, closed-loop clients) instead of at
    ``arrival_time_s``.

    ``fresh_prompt_start`` promises that the prompt is the run of ids
    ``start, start + 1, ..., start + len - 1`` and that no other request's
    tokens contain any of them (only copies of this request, n > 1, share
    them): traces without content, single-turn synthetic prompts. The engine
    then names the prompt's blocks by ``(start, length)`` instead of hashing
    its ids (``kvsim.kv.hashing.fresh_block_hashes``); prefix hits are the same.

    ``prompt_block_ids`` says the prompt is the Mooncake blocks with these ids
    (``kvsim.workload.tokens.mooncake_block_tokens``); the engine then hashes
    the block ids instead of the tokens
    (``kvsim.kv.hashing.content_block_id_hashes``). Every request of a run that
    holds such tokens must say so (a Mooncake trace does), and its outputs
    must be the engine's fresh ids.

    ``may_be_followed`` says whether a later request may name this one in
    ``after_request_id``. The front end must remember the finish time of such
    a request until the run ends (the later turn may be read after it
    finished); a workload that knows no request follows this one sets False,
    so a run of 10 million single-turn requests keeps no per-request record
    (``kvsim.sim.frontend``). The default, True, is always correct.

    Not a frozen dataclass: a frozen one's ``__init__`` sets each of the 15
    fields through ``object.__setattr__`` (4.5 us a spec against 1.7 us here,
    measured), and a workload of millions builds one per request.
    """

    request_id: str
    arrival_time_s: float
    prompt_token_ids: np.ndarray          # int64, length >= 1
    max_tokens: int                       # exact number of tokens generated (EOS ignored)
    priority: int = 0
    output_token_ids: np.ndarray | None = None
    cache_salt: str | None = None
    n: int = 1                            # parallel samples sharing the prompt (copy-on-write)
    beam_width: int = 1                   # beam search width (copy-on-write)
    after_request_id: str | None = None
    think_time_s: float = 0.0
    output_id_base: int | None = None     # generated token k gets id base + k (see below)
    fresh_prompt_start: int | None = None # the prompt is a run of ids no other request holds
    prompt_block_ids: list[int] | None = None  # the prompt is these Mooncake blocks
    may_be_followed: bool = True          # a later request may name it (see above)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)
