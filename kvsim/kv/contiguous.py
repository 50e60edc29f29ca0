"""The pre-paging baseline: one contiguous KV slab per request, first fit.

Before PagedAttention, serving systems (FasterTransformer, Orca) reserved for
every request one contiguous chunk of KV memory big enough for its maximum
length. The vLLM paper (Kwon et al., SOSP'23, Fig. 2) names the three ways
that wastes memory, and :class:`ContiguousUsage` reports each of them::

    address space (token slots) ------------------------------------------->
    | A: used | A: reserved | A: int.frag |  gap  | B: used | B: reserved |free|
              '- future tokens of A      '- never used: A stops earlier
                                          '- external fragmentation if the
                                             next request does not fit in it

* ``used``: slots holding KV of tokens computed so far.
* ``reserved_unused`` ("reservation"): slots set aside for tokens the request
  will still produce (up to its final length, when that is known).
* ``internal_fragmentation``: slots of the slab the request will never fill
  (reserved maximum length minus the actual final length). Only known when
  the caller passes ``final_tokens``; otherwise the whole unused part of the
  slab counts as reservation.
* ``external_fragmentation``: free gaps too small for the next request
  (``next_request_tokens``); free gaps big enough count as ``free``.

The five add up to ``total_bytes``. Operations cost O(number of live slabs).

:func:`paged_usage` reports the same quantities for a paged cache, so plots
can put the two side by side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


class ContiguousAllocationError(RuntimeError):
    """No free gap is large enough for the requested slab."""


@dataclass(frozen=True)
class ContiguousUsage:
    """Where the KV bytes are at one moment; the fields add up to ``total_bytes``."""

    used_bytes: int
    reserved_unused_bytes: int
    internal_fragmentation_bytes: int
    external_fragmentation_bytes: int
    free_bytes: int
    total_bytes: int

    @property
    def wasted_bytes(self) -> int:
        """Everything allocated or stranded that holds no KV: the paper's waste."""
        return (self.reserved_unused_bytes + self.internal_fragmentation_bytes
                + self.external_fragmentation_bytes)

    @property
    def used_fraction(self) -> float:
        return self.used_bytes / self.total_bytes if self.total_bytes else 0.0


# Same quantities for a paged cache (paged_usage returns this type too).
KVUsage = ContiguousUsage


@dataclass
class _Slab:
    start: int
    reserved_tokens: int
    used_tokens: int = 0
    final_tokens: int | None = None

    @property
    def end(self) -> int:
        return self.start + self.reserved_tokens


class ContiguousAllocator:
    """First-fit allocation of contiguous token-slot slabs in one address space."""

    def __init__(self, capacity_tokens: int, bytes_per_token: int) -> None:
        _check_int("capacity_tokens", capacity_tokens, minimum=1)
        _check_int("bytes_per_token", bytes_per_token, minimum=1)
        self.capacity_tokens = capacity_tokens
        self.bytes_per_token = bytes_per_token
        self._slabs: dict[object, _Slab] = {}

    # ------------------------------------------------------------------ queries
    def __contains__(self, request_id) -> bool:
        return request_id in self._slabs

    @property
    def num_requests(self) -> int:
        return len(self._slabs)

    def slab(self, request_id) -> tuple[int, int]:
        """(start offset, reserved tokens) of a live request's slab."""
        s = self._get(request_id)
        return s.start, s.reserved_tokens

    def free_gaps(self) -> list[tuple[int, int]]:
        """Free ranges as (start, length), in address order."""
        gaps = []
        cursor = 0
        for s in sorted(self._slabs.values(), key=lambda s: s.start):
            if s.start > cursor:
                gaps.append((cursor, s.start - cursor))
            cursor = s.end
        if cursor < self.capacity_tokens:
            gaps.append((cursor, self.capacity_tokens - cursor))
        return gaps

    def can_allocate(self, num_tokens: int) -> bool:
        """Is there one free gap of at least ``num_tokens`` slots?"""
        _check_int("num_tokens", num_tokens, minimum=1)
        return self._first_fit(num_tokens) is not None

    # ------------------------------------------------------------------ mutations
    def allocate(self, request_id, reserved_tokens: int, final_tokens: int | None = None) -> int:
        """Reserve ``reserved_tokens`` contiguous slots (the request's maximum length).

        First fit: the lowest-addressed gap that is large enough. Returns the
        start offset. ``final_tokens`` (optional) is the length the request will
        actually reach; the slots beyond it are internal fragmentation.
        """
        if request_id in self._slabs:
            raise ValueError(f"request {request_id!r} already holds a slab")
        _check_int("reserved_tokens", reserved_tokens, minimum=1)
        if final_tokens is not None:
            _check_int("final_tokens", final_tokens, minimum=0)
            if final_tokens > reserved_tokens:
                raise ValueError(f"final_tokens ({final_tokens}) exceeds reserved_tokens "
                                 f"({reserved_tokens}) for request {request_id!r}")
        start = self._first_fit(reserved_tokens)
        if start is None:
            raise ContiguousAllocationError(
                f"no free gap of {reserved_tokens} token slots for request {request_id!r}; "
                f"largest gap is {max((g for _, g in self.free_gaps()), default=0)}")
        self._slabs[request_id] = _Slab(start, reserved_tokens, 0, final_tokens)
        return start

    def set_used(self, request_id, used_tokens: int) -> None:
        """Record how many slots of the slab hold KV so far."""
        s = self._get(request_id)
        _check_int("used_tokens", used_tokens, minimum=0)
        if used_tokens > s.reserved_tokens:
            raise ValueError(f"used_tokens ({used_tokens}) exceeds the {s.reserved_tokens} "
                             f"slots reserved for request {request_id!r}")
        s.used_tokens = used_tokens

    def free(self, request_id) -> None:
        """Release the request's whole slab."""
        self._get(request_id)
        del self._slabs[request_id]

    # ------------------------------------------------------------------ accounting
    def usage(self, next_request_tokens: int | None = None) -> ContiguousUsage:
        """Bytes by kind (module docstring). Without ``next_request_tokens`` every
        free gap counts as free (no external fragmentation is claimed)."""
        if next_request_tokens is not None:
            _check_int("next_request_tokens", next_request_tokens, minimum=1)
        used = reserved = internal = 0
        for s in self._slabs.values():
            used += s.used_tokens
            will_hold = s.reserved_tokens if s.final_tokens is None else max(s.final_tokens,
                                                                             s.used_tokens)
            reserved += will_hold - s.used_tokens
            internal += s.reserved_tokens - will_hold
        external = free = 0
        for _, length in self.free_gaps():
            if next_request_tokens is not None and length < next_request_tokens:
                external += length
            else:
                free += length
        bpt = self.bytes_per_token
        return ContiguousUsage(used * bpt, reserved * bpt, internal * bpt, external * bpt,
                               free * bpt, self.capacity_tokens * bpt)

    # ------------------------------------------------------------------ private
    def _first_fit(self, num_tokens: int) -> int | None:
        for start, length in self.free_gaps():
            if length >= num_tokens:
                return start
        return None

    def _get(self, request_id) -> _Slab:
        try:
            return self._slabs[request_id]
        except KeyError:
            raise ValueError(f"request {request_id!r} holds no slab") from None


def paged_usage(used_tokens_per_request, block_size: int, bytes_per_token: int,
                total_blocks: int) -> ContiguousUsage:
    """The same accounting for a paged KV cache.

    Each request holds ``ceil(used / block_size)`` blocks; the unused tail of
    its last block is internal fragmentation. Paging reserves nothing ahead
    (blocks are taken as tokens arrive, kv-semantics A5) and any free block
    serves any request, so reservation and external fragmentation are 0.
    ``total_blocks`` is the pool the requests draw from (for vLLM, the usable
    blocks: ``num_gpu_blocks - 1``).
    """
    _check_int("block_size", block_size, minimum=1)
    _check_int("bytes_per_token", bytes_per_token, minimum=1)
    _check_int("total_blocks", total_blocks, minimum=0)
    used = held = 0
    for n in used_tokens_per_request:
        _check_int("used tokens of a request", n, minimum=0)
        used += n
        held += math.ceil(n / block_size)
    if held > total_blocks:
        raise ValueError(f"requests hold {held} blocks but the pool has {total_blocks}")
    slot_bytes = bytes_per_token
    return ContiguousUsage(
        used_bytes=used * slot_bytes,
        reserved_unused_bytes=0,
        internal_fragmentation_bytes=(held * block_size - used) * slot_bytes,
        external_fragmentation_bytes=0,
        free_bytes=(total_blocks - held) * block_size * slot_bytes,
        total_bytes=total_blocks * block_size * slot_bytes,
    )


def _check_int(name: str, value, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
