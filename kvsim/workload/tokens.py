"""Token ids for workloads without real text.

A prefix cache shares KV blocks exactly when token ids are equal, so the ids a
workload invents *are* its sharing structure. The rule is:

* shared content (a group's system prompt, a Mooncake ``hash_id`` block, the
  history a later session turn resends) is the *same* array of ids;
* everything else is taken from a counter, so it equals nothing else in the
  workload;
* no workload id is ever an id the engine makes for generated tokens
  (``kvsim.sched.request``: ``1_000_000_000 + index * 2**24 + j``).

Id space (int64)::

    0 ............................ 1e9 ........................ 2**62 ......... 2**63
    | workload ids (counter, or    | engine's fresh output ids    | workload ids  |
    | Mooncake h*512 + j)          | (never produced here)        | (overflow)    |

The counter starts at ``0`` and, once a request would cross ``1e9``, jumps to
``2**62``; the engine reaches ``2**62`` only after ~2.7e11 requests. Mooncake
blocks use ``h * 512 + j`` (``j < 512``), a pure function of ``h``; a Mooncake
workload takes no counter ids, so the two schemes never meet in one run.
"""

from __future__ import annotations

import numpy as np

# Must match kvsim.sched.request.FRESH_OUTPUT_ID_BASE (engine-generated ids start here).
FRESH_OUTPUT_ID_BASE = 1_000_000_000
# Where the counter continues once the range below FRESH_OUTPUT_ID_BASE is used up.
OVERFLOW_ID_BASE = 1 << 62

# Mooncake FAST'25 traces: one hash id per 512-token block (MOONCAKE_FAST25_README.md).
MOONCAKE_BLOCK_TOKENS = 512
MAX_MOONCAKE_HASH_ID = FRESH_OUTPUT_ID_BASE // MOONCAKE_BLOCK_TOKENS - 1


class TokenCounter:
    """Hands out runs of ids that equal no other id in the workload."""

    def __init__(self) -> None:
        self._next_id = 0

    def take(self, num_tokens: int) -> np.ndarray:
        """``num_tokens`` fresh consecutive ids (int64)."""
        start = self._reserve(num_tokens)
        return np.arange(start, start + num_tokens, dtype=np.int64)

    def take_starts(self, lengths: np.ndarray) -> np.ndarray:
        """Start ids of consecutive runs of the given lengths (vectorised ``take``)."""
        lengths = np.asarray(lengths, dtype=np.int64)
        total = int(lengths.sum())
        if self._next_id < FRESH_OUTPUT_ID_BASE < self._next_id + total:
            # The chunk crosses the boundary: place run by run (rare, once per workload).
            return np.array([self._reserve(int(n)) for n in lengths], dtype=np.int64)
        starts = self._next_id + np.cumsum(lengths) - lengths
        self._next_id += total
        return starts

    def _reserve(self, num_tokens: int) -> int:
        if self._next_id < FRESH_OUTPUT_ID_BASE < self._next_id + num_tokens:
            self._next_id = OVERFLOW_ID_BASE
        start = self._next_id
        self._next_id += num_tokens
        return start


def mooncake_block_tokens(hash_ids: np.ndarray, num_tokens: int) -> np.ndarray:
    """The first ``num_tokens`` ids of the blocks ``hash_ids`` (512 ids per block).

    Block ``h`` is ``h*512 + [0..511]``, so equal hash ids give identical blocks;
    a partial last block is the start of that block's content.
    """
    hash_ids = np.asarray(hash_ids, dtype=np.int64)
    blocks = hash_ids[:, None] * MOONCAKE_BLOCK_TOKENS + np.arange(MOONCAKE_BLOCK_TOKENS, dtype=np.int64)
    return blocks.reshape(-1)[:num_tokens]
