"""A stack of offload tiers, fastest first, and the prefix lookup across them.

``OffloadTiers`` holds the tiers of one replica (a shared tier may sit in
several replicas' stacks) with one of two lookups:

* ``vllm`` (``TieringOffloadingManager``): every chunk stored in the first
  tier is cascaded to all the others; a lookup walks the chunks and takes
  each from the first tier that has it; a chunk found only in a lower tier
  must first be promoted into the first tier, so the hit is *pending* (the
  request retries) until that copy completes;
* ``lmcache`` (``StorageManager.batched_put`` / ``async_lookup_and_prefetch``):
  puts go to every backend; the prefix is served tier by tier (the first tier
  covers chunks 0..t1, the next continues from t1, and so on) and chunks read
  from a lower tier are written back to the first (CPU) tier.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kvsim.kv.offload import HIT, MISS, PENDING, OffloadTier, StoreResult

SEMANTICS = ("vllm", "lmcache")


@dataclass(frozen=True)
class PrefixHit:
    """Leading chunks found, and which tier serves each run of them.

    ``tiers`` lists ``(tier name, chunks)`` in prefix order, e.g.
    ``(("cpu", 3), ("disk", 2))``: chunks 0-2 from the CPU, 3-4 from disk.
    ``pending``: some of them cannot be read yet (a store in flight, or with
    ``vllm`` semantics a promotion into the first tier); vLLM then defers the
    request (``get_num_new_matched_tokens`` returns None) and asks again.
    """

    num_chunks: int
    tiers: tuple[tuple[str, int], ...]
    pending: bool = False

    def chunks_from(self, name: str) -> int:
        return sum(n for t, n in self.tiers if t == name)


@dataclass
class LoadPlan:
    """The reads a hit needs, per tier, and the write-backs into the first tier."""

    reads: dict[str, list[int]] = field(default_factory=dict)
    promotions: list[int] = field(default_factory=list)


class OffloadTiers:
    """Tiers stacked fastest first, with ``vllm`` or ``lmcache`` lookups (module doc)."""

    def __init__(self, tiers: Sequence[OffloadTier], *, semantics: str = "vllm") -> None:
        if not tiers:
            raise ValueError("kv_offload needs at least one tier")
        if semantics not in SEMANTICS:
            raise ValueError(f"semantics: {semantics!r} is not one of {', '.join(SEMANTICS)}")
        names = [t.name for t in tiers]
        if len(set(names)) != len(names):
            raise ValueError(f"tier names must differ, got {names}")
        if len({t.chunk_bytes for t in tiers}) != 1:
            raise ValueError("every tier must use the same chunk size")
        self.tiers = list(tiers)
        self.semantics = semantics
        self.by_name = {t.name: t for t in tiers}

    @property
    def first(self) -> OffloadTier:
        return self.tiers[0]

    def lookup(self, keys: Sequence[int], start: int = 0) -> PrefixHit:
        """The longest run of chunks ``keys[start:]`` the tiers can serve, by tier."""
        if self.semantics == "lmcache":
            return self._lookup_lmcache(keys, start)
        return self._lookup_vllm(keys, start)

    def plan_load(self, keys: Sequence[int], start: int, hit: PrefixHit) -> LoadPlan:
        """Which chunks each tier reads for ``hit``; lower-tier chunks are also written to the first."""
        plan = LoadPlan()
        i = start
        for name, n in hit.tiers:
            plan.reads.setdefault(name, []).extend(keys[i:i + n])
            if name != self.first.name:
                plan.promotions.extend(keys[i:i + n])
            i += n
        return plan

    def store(self, keys: Sequence[int], request_id=None,
              positions: Sequence[int] | None = None) -> dict[str, StoreResult | None]:
        """Write-through: offer the chunks to every tier (vLLM cascades, LMCache puts to all)."""
        return {t.name: t.prepare_store(keys, request_id, positions) for t in self.tiers}

    def complete_store(self, keys: Iterable[int], tier: str | None = None, success: bool = True) -> None:
        keys = list(keys)
        for t in ([self.by_name[tier]] if tier else self.tiers):
            t.complete_store(keys, success)

    def request_finished(self, request_id) -> None:
        for t in self.tiers:
            t.request_finished(request_id)

    # ------------------------------------------------------------ private

    def _lookup_vllm(self, keys: Sequence[int], start: int) -> PrefixHit:
        runs: list[list] = []
        pending = False
        for k in keys[start:]:
            where = None
            state = self.first.lookup(k)
            if state != MISS:
                where, pending = self.first.name, pending or state == PENDING
            else:
                for t in self.tiers[1:]:
                    s = t.lookup(k)
                    if s != MISS:
                        # Found below the first tier: promoted before it can be
                        # loaded, so the lookup asks to retry (LookupResult.RETRY).
                        where, pending = t.name, True
                        break
            if where is None:
                break
            if runs and runs[-1][0] == where:
                runs[-1][1] += 1
            else:
                runs.append([where, 1])
        return PrefixHit(sum(n for _, n in runs), tuple((t, n) for t, n in runs), pending)

    def _lookup_lmcache(self, keys: Sequence[int], start: int) -> PrefixHit:
        runs = []
        i = start
        for t in self.tiers:
            n = 0
            while i + n < len(keys) and t.lookup(keys[i + n]) == HIT:
                n += 1
            if n:
                runs.append((t.name, n))
            i += n
        return PrefixHit(i - start, tuple(runs), False)
