"""What a decode run does to each group's table, counted in closed form.

The planning half of :mod:`kvsim.kv.hybrid_runs`: for one request of one
KV-cache group decoding one token per step, the steps at which it drops
blocks (``remove_skipped_blocks``) and allocates one (a full table), as
:mod:`kvsim.kv.single_type` and :mod:`kvsim.kv.mamba` would do them. Tests
check these counts against what applying the steps does
(``tests/test_hybrid_fast_path.py``).
"""

from __future__ import annotations

from kvsim.kv.single_type import NULL, cdiv
from kvsim.specs.kv_groups import CHUNKED, MAMBA, SLIDING


def decode_counts(m, rid: str, c0: int, max_steps: int) -> list[tuple[int, list[int], int]]:
    """(step, blocks dropped, blocks allocated) of steps 1..max_steps of one group
    of one request, where either happens; the request decodes one token per step
    from ``c0``. Dropped blocks are ids; ``-1`` stands for one the run itself
    allocated (only this request holds it). A dropped block returns to the free
    queue only when no other request holds it (``HybridDecodeRuns._plan``)."""
    blocks = m.req_to_blocks.get(rid, ())
    return ids_of(blocks, index_counts(m, rid, c0, max_steps, blocks))


def ids_of(blocks, events):
    n = len(blocks)
    return [(s, [blocks[i] if i < n else -1 for i in dropped], a) for s, dropped, a in events]


def table_shape(m, rid: str, blocks) -> tuple:
    """What a group's table looks like to ``index_counts`` (groups alike share its result)."""
    if m.kind == MAMBA and m.align:
        live = tuple(i for i, b in enumerate(blocks) if b != NULL)
        return (m.spec, len(blocks), m.num_retired_blocks.get(rid, 0),
                m.last_state_block_idx.get(rid), live)
    if m.kind in (SLIDING, CHUNKED):
        return (m.spec, len(blocks), m.num_dropped.get(rid, 0))
    return (m.spec, len(blocks))


def index_counts(m, rid: str, c0: int, max_steps: int, blocks) -> list[tuple[int, list[int], int]]:
    """``decode_counts`` with dropped blocks as table indices."""
    if m.kind == MAMBA and m.align:
        return _mamba_counts(m, rid, c0, max_steps, blocks)
    bs = m.block_size
    length = len(blocks)
    out: dict[int, list] = {}
    s = length * bs - c0 + 1                  # c reaches the end of the table (A5)
    while s <= max_steps:
        out.setdefault(max(s, 1), [[], 0])[1] += 1
        s += bs
    if m.kind in (SLIDING, CHUNKED):
        a = m.num_dropped.get(rid, 0)
        c = c0
        while True:
            k = m.get_num_skipped_tokens(c) // bs
            if k > a:
                # remove_skipped_blocks frees [a, k) from the back
                out.setdefault(c - c0 + 1, [[], 0])[0].extend(range(k - 1, a - 1, -1))
                a = k
            # the next c at which more than a blocks are out of the window
            if m.kind == SLIDING:
                c = max(c + 1, (a + 1) * bs + m.sliding_window - 1)
            else:
                size = m.attention_chunk_size
                c = max(c // size + 1, -(-(a + 1) * bs // size)) * size
            if c - c0 + 1 > max_steps:
                break
    return sorted((s, f, n) for s, (f, n) in out.items())


def _mamba_counts(m, rid: str, c0: int, max_steps: int, blocks) -> list[tuple[int, list[int], int]]:
    """MambaManager in "align" mode, stepped on its own state (kv/mamba.py)."""
    bs = m.block_size
    live = {i for i, b in enumerate(blocks) if b != NULL}
    length = len(blocks)
    retired = m.num_retired_blocks.get(rid, 0)
    lsi = m.last_state_block_idx.get(rid)
    out = []
    s = 1
    while s <= max_steps:
        c = c0 + s - 1
        dropped: list[int] = []
        allocated = 0
        k = min((c - 1) // bs, length) if c > 1 else 0
        if retired < k:
            gone = sorted((i for i in live if retired <= i < k), reverse=True)
            dropped.extend(gone)
            live.difference_update(gone)
            retired = k
        if lsi is not None and lsi < cdiv(c, bs) - 1 and lsi in live:
            dropped.append(lsi)
            live.discard(lsi)
        if cdiv(c + 1, bs) > length:
            lsi = length - 1
            live.add(length)
            length += 1
            allocated = 1
        if dropped or allocated:
            out.append((s, dropped, allocated))
        # next candidate: c one past, or on, a block boundary
        nxt = c + 1
        r = nxt % bs
        if r > 1:
            nxt += bs - r
        s = nxt - c0 + 1
    return out


def first_drop_step(m, rid: str, c0: int) -> int:
    """The first step (from 1) at which a group may drop a block of a request that
    decodes from ``c0`` (a lower bound for Mamba: one past a block boundary)."""
    blocks = m.req_to_blocks.get(rid, ())
    bs = m.block_size
    if m.kind == MAMBA:
        if not m.align:
            return 1 << 62
        k = min((c0 - 1) // bs, len(blocks)) if c0 > 1 else 0
        lsi = m.last_state_block_idx.get(rid)
        if m.num_retired_blocks.get(rid, 0) < k or (lsi is not None and lsi < cdiv(c0, bs) - 1):
            return 1
        return (1 - c0) % bs + 1              # c one past a block boundary
    a = m.num_dropped.get(rid, 0)
    if m.get_num_skipped_tokens(c0) // bs > a:
        return 1
    if m.kind == SLIDING:
        return (a + 1) * bs + m.sliding_window - 1 - c0 + 1
    size = m.attention_chunk_size
    return max(c0 // size + 1, -(-(a + 1) * bs // size)) * size - c0 + 1
