"""Token ids for workloads without real text.

A prefix cache shares KV blocks exactly when token ids are equal, so the ids a
workload invents *are* its sharing structure. The rule is:

* shared content (a group's system prompt, a Mooncake ``hash_id`` block, the
  history a later session turn resends) is the *same* array of ids;
* everything else is taken from a counter, so it equals nothing else in the
  workload;
* every workload id is >= 0, and the engine's fresh ids for generated tokens
  are negative (``kvsim.sched.request``: ``-(index * 2**32 + k + 1)``), so a
  prompt never holds a generated id by accident.

Mooncake blocks use ``h * 512 + j`` (``j < 512``), a pure function of ``h``; a
Mooncake workload takes no counter ids, so the two schemes never meet in a run.
(Requests files give their own ids and generated ids, see ``requests_file``.)

A prompt longer than the engine can ever run is not spelled out at all
(``unrun_prompt``); the counter still advances past its ids, so every other
request gets the same ids as without the limit.
"""

from __future__ import annotations

import numpy as np

# Mooncake FAST'25 traces: one hash id per 512-token block (MOONCAKE_FAST25_README.md).
MOONCAKE_BLOCK_TOKENS = 512
# Keeps h * 512 + j far inside int64.
MAX_MOONCAKE_HASH_ID = 2**53


class TokenCounter:
    """Hands out runs of ids that equal no other id in the workload."""

    def __init__(self) -> None:
        self._next_id = 0

    def take(self, num_tokens: int) -> np.ndarray:
        """``num_tokens`` fresh consecutive ids (int64)."""
        start = self._next_id
        self._next_id += num_tokens
        return np.arange(start, start + num_tokens, dtype=np.int64)

    def skip(self, num_tokens: int) -> int:
        """Reserve ``num_tokens`` ids without spelling them out; returns the first."""
        start = self._next_id
        self._next_id += num_tokens
        return start

    def take_starts(self, lengths: np.ndarray) -> np.ndarray:
        """Start ids of consecutive runs of the given lengths (vectorised ``take``)."""
        lengths = np.asarray(lengths, dtype=np.int64)
        starts = self._next_id + np.cumsum(lengths) - lengths
        self._next_id += int(lengths.sum())
        return starts


def mooncake_block_tokens(hash_ids: np.ndarray, num_tokens: int) -> np.ndarray:
    """The first ``num_tokens`` ids of the blocks ``hash_ids`` (512 ids per block).

    Block ``h`` is ``h*512 + [0..511]``, so equal hash ids give identical blocks;
    a partial last block is the start of that block's content.
    """
    hash_ids = np.asarray(hash_ids, dtype=np.int64)
    blocks = hash_ids[:, None] * MOONCAKE_BLOCK_TOKENS + np.arange(MOONCAKE_BLOCK_TOKENS, dtype=np.int64)
    return blocks.reshape(-1)[:num_tokens]


def unrun_prompt(num_tokens: int) -> np.ndarray:
    """A stand-in for the ids of a prompt the engine will refuse (longer than max_model_len).

    A read-only array of ``num_tokens`` zeros that takes no memory (stride 0):
    the request fails on arrival with its true length and nothing reads its
    ids (the engine checks a request's lengths before it builds and hashes
    it, ``Engine.submit``), so a prompt of 2e9 tokens costs nothing.
    """
    return np.broadcast_to(np.zeros(1, dtype=np.int64), (num_tokens,))
