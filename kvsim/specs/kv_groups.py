"""vLLM's KV-cache groups: how a model's layers share one block pool.

vLLM (0.33, ``vllm/v1/core/kv_cache_planning.py``) gives every attention
layer a KV-cache spec (``FullAttentionSpec``, ``SlidingWindowSpec``,
``ChunkedLocalAttentionSpec``, ``MambaSpec`` for linear-attention state) and
splits the layers into groups; each group has its own block table, all groups
draw block ids from one pool of ``num_blocks`` blocks::

    layers   F S S F S S          (F full, S sliding; same page size)
    groups   (F0 F3) (S1 S4) (S2 S5)          group_size 2 = fewest layers of a type
    block    [F0 F3]  one block id = one page in each layer of its group
    bytes_per_block = group_size x page          num_blocks = available // bytes_per_block

The steps, each a function here, in vLLM's order (``get_kv_cache_groups``):

1. ``disable_hybrid_kv_cache_manager`` promotes sliding-window and chunked
   layers to full attention when full layers exist
   (``unify_hybrid_kv_cache_specs`` / ``_promote_local_kv_cache_specs``);
   every layer then keeps KV for every token, in one group.
2. One spec for all layers -> one group (``_get_kv_cache_groups_uniform_spec``).
3. One *type* (same token slots per request, e.g. all full attention with
   different head sizes) -> one group whose page is the sum of the layers'
   pages (``UniformTypeKVCacheSpecs``).
4. Otherwise unify the page sizes (``unify_kv_cache_spec_page_size``: a
   smaller page's block size is multiplied up when it divides the largest
   page; Mamba and other attention pages are padded) and group by type
   (``_get_kv_cache_groups_uniform_page_size``): the group size is the
   fewest layers of any type (the most, when that is under 1.5x the fewest),
   each type is cut into ``ceil(n / group_size)`` groups, layer ``i`` of a
   type going to group ``i % num_groups``.

Blocks one request holds at most, per group (``max_memory_usage_bytes``)::

    full attention     ceil(len / block_size)
    sliding window     ceil(min(window - 1 + in_flight, len) / block_size) + 1
    chunked local      ceil(min(chunk + in_flight, len) / block_size)
    Mamba state        1 + speculative blocks  ("align" cache mode: 2 + ...)

``in_flight`` is ``VllmConfig.max_in_flight_tokens``: ``max_num_batched_tokens``
times 2 with async scheduling (the 0.33 default), 1 without. vLLM's logged
"Maximum concurrency for L tokens per request" is ``num_blocks`` over the sum.

Not modelled: the block-outermost packed layout for mixed page sizes
(``_get_packed_kv_cache_groups``, used by backends that declare it, e.g.
DeepSeek-V4), hidden-state cache layers, HiSparse, pipeline parallelism.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

FULL = "full_attention"
SLIDING = "sliding_window"
CHUNKED = "chunked_local_attention"
MAMBA = "mamba"
SPEC_KINDS = (FULL, SLIDING, CHUNKED, MAMBA)
MAMBA_CACHE_MODES = ("none", "align")
# vLLM FlashAttentionBackend.get_supported_kernel_block_sizes: MultipleOf(16).
KERNEL_BLOCK_ALIGNMENT = 16


@dataclass(frozen=True)
class LayerKVSpec:
    """One layer's KV-cache spec (vLLM ``KVCacheSpec``), in bytes.

    ``page_size_bytes`` is one block of this layer: ``block_size x bytes per
    token`` for attention, the (padded) state for Mamba. A full-attention spec
    may carry ``sliding_window`` / ``attention_chunk_size``: a layer promoted
    by ``disable_hybrid_kv_cache_manager`` computes locally but keeps every
    token's KV.
    """

    kind: str
    block_size: int
    page_size_bytes: int
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    mamba_cache_mode: str = "none"
    num_speculative_blocks: int = 0

    def __post_init__(self) -> None:
        if self.kind not in SPEC_KINDS:
            raise ValueError(f"KV spec kind {self.kind!r}; allowed: {', '.join(SPEC_KINDS)}")
        if self.kind == SLIDING and not self.sliding_window:
            raise ValueError("a sliding_window spec needs sliding_window")
        if self.kind == CHUNKED and not self.attention_chunk_size:
            raise ValueError("a chunked_local_attention spec needs attention_chunk_size")
        if self.mamba_cache_mode not in MAMBA_CACHE_MODES:
            raise ValueError(f"mamba_cache_mode {self.mamba_cache_mode!r}; allowed: "
                             f"{', '.join(MAMBA_CACHE_MODES)}")

    def max_blocks_per_request(self, seq_len: int, max_in_flight_tokens: int) -> int:
        """Blocks of this layer's group one request of ``seq_len`` tokens holds at most."""
        if self.kind == FULL:
            return math.ceil(seq_len / self.block_size)
        if self.kind == SLIDING:
            # +1: the window need not start on a block boundary (vLLM's comment).
            tokens = min(self.sliding_window - 1 + max_in_flight_tokens, seq_len)
            return math.ceil(tokens / self.block_size) + 1
        if self.kind == CHUNKED:
            tokens = min(self.attention_chunk_size + max_in_flight_tokens, seq_len)
            return math.ceil(tokens / self.block_size)
        base = 2 if self.mamba_cache_mode == "align" else 1
        return base + self.num_speculative_blocks


@dataclass(frozen=True)
class KVCacheGroup:
    """Layers that share one block table (vLLM ``KVCacheGroupSpec``)."""

    layers: tuple[int, ...]
    spec: LayerKVSpec
    layer_page_bytes: tuple[int, ...]   # each layer's page (differs inside a uniform-type group)
    # Layers of one type whose specs do not merge (vLLM UniformTypeKVCacheSpecs): vLLM 0.33
    # plans such a group, but its scheduler has no KV manager for it (the loader refuses it).
    uniform_type: bool = False

    @property
    def kind(self) -> str:
        return self.spec.kind

    @property
    def page_size_bytes(self) -> int:
        return sum(self.layer_page_bytes)

    def max_blocks_per_request(self, seq_len: int, max_in_flight_tokens: int) -> int:
        return self.spec.max_blocks_per_request(seq_len, max_in_flight_tokens)


@dataclass(frozen=True)
class KVCacheGroups:
    """The groups and the bytes one block id costs in every group together."""

    groups: tuple[KVCacheGroup, ...]
    bytes_per_block: int

    @property
    def is_hybrid(self) -> bool:
        return len(self.groups) > 1

    def num_blocks(self, available_bytes: int) -> int:
        """vLLM get_kv_cache_config_from_groups: ``available // bytes_per_block``."""
        return available_bytes // self.bytes_per_block

    def blocks_per_request(self, seq_len: int, max_in_flight_tokens: int) -> list[int]:
        return [g.max_blocks_per_request(seq_len, max_in_flight_tokens) for g in self.groups]

    def max_concurrency(self, num_blocks: int, seq_len: int, max_in_flight_tokens: int) -> float:
        """vLLM get_max_concurrency_for_kv_cache_config (null block included, as vLLM logs it)."""
        return num_blocks / sum(self.blocks_per_request(seq_len, max_in_flight_tokens))

    def kv_cache_size_tokens(self, num_blocks: int, max_model_len: int,
                             max_in_flight_tokens: int) -> int:
        """vLLM get_kv_cache_capacity: what it logs as "GPU KV cache size: N tokens"."""
        return int(self.max_concurrency(num_blocks, max_model_len, max_in_flight_tokens)
                   * max_model_len)


# ---------------------------------------------------------------------- grouping
def get_kv_cache_groups(specs: list[LayerKVSpec],
                        disable_hybrid_kv_cache_manager: bool = False) -> KVCacheGroups:
    """vLLM get_kv_cache_groups + the bytes per block of get_kv_cache_config_from_groups."""
    if not specs:
        raise ValueError("a model without KV-cache layers is not supported")
    specs = list(specs)
    if disable_hybrid_kv_cache_manager:
        specs = promote_local_specs(specs)
    indices = list(range(len(specs)))
    if _is_uniform(specs):
        groups = [KVCacheGroup(tuple(indices), _merged(specs), tuple(s.page_size_bytes for s in specs))]
    elif _is_uniform_type(specs):
        groups = [KVCacheGroup(tuple(indices), specs[0], tuple(s.page_size_bytes for s in specs),
                               uniform_type=True)]
    else:
        specs = unify_page_sizes(specs)
        groups = _group_uniform_page_size(specs)
    return KVCacheGroups(tuple(groups), max(g.page_size_bytes for g in groups))


def promote_local_specs(specs: list[LayerKVSpec]) -> list[LayerKVSpec]:
    """``disable_hybrid_kv_cache_manager``: sliding/chunked layers become full attention
    when full layers exist (vLLM _promote_local_kv_cache_specs); all-sliding stays."""
    kinds = {s.kind for s in specs}
    if _is_uniform(specs) or _is_uniform_type(specs):
        return specs
    if FULL in kinds and kinds & {SLIDING, CHUNKED}:
        full_sizes = {s.block_size for s in specs if s.kind == FULL}
        full_bs = next(iter(full_sizes)) if len(full_sizes) == 1 else None
        out = []
        for s in specs:
            if s.kind in (SLIDING, CHUNKED):
                bs = full_bs or s.block_size
                s = replace(s, kind=FULL, block_size=bs,
                            page_size_bytes=s.page_size_bytes * bs // s.block_size)
            out.append(s)
        specs = out
        # The promoted layers keep their window (chunk) for the one group's
        # FullAttentionSpec.merge, which takes at most one of each: vLLM raises
        # (from is_kv_cache_spec_uniform) for two windows or two chunk sizes.
        windows = {s.sliding_window for s in specs} - {None}
        chunks = {s.attention_chunk_size for s in specs} - {None}
        if len(windows) > 1 or len(chunks) > 1:
            what, sizes = (("sliding windows", windows) if len(windows) > 1
                           else ("chunk sizes", chunks))
            raise ValueError(f"disable_hybrid_kv_cache_manager: vLLM cannot put these layers in "
                             f"one group: their layers promoted to full attention have different "
                             f"{what} ({', '.join(map(str, sorted(sizes)))}; vLLM: 'All attention "
                             f"layers in the same KV cache group must have the same window "
                             f"size.'); leave the hybrid manager on")
    if not (_is_uniform(specs) or _is_uniform_type(specs)):
        raise ValueError("disable_hybrid_kv_cache_manager: vLLM cannot put these layers in one "
                         "group (Mamba/linear-attention state needs the hybrid KV cache "
                         "manager); allowed only for models whose layers are all attention")
    return specs


def unify_page_sizes(specs: list[LayerKVSpec]) -> list[LayerKVSpec]:
    """vLLM unify_kv_cache_spec_page_size: scale block sizes, or pad, to the largest page."""
    pages = {s.page_size_bytes for s in specs}
    if len(pages) <= 1:
        return specs
    top = max(pages)
    out = []
    for s in specs:
        if s.page_size_bytes != top:
            if s.kind != MAMBA and top % s.page_size_bytes == 0:
                ratio = top // s.page_size_bytes
                s = replace(s, block_size=s.block_size * ratio, page_size_bytes=top)
            else:
                s = replace(s, page_size_bytes=top)  # padded page (Mamba, or non-dividing)
        out.append(s)
    return out


def _group_uniform_page_size(specs: list[LayerKVSpec]) -> list[KVCacheGroup]:
    """vLLM _get_kv_cache_groups_uniform_page_size (see the module docstring)."""
    by_spec: dict[LayerKVSpec, list[int]] = {}
    for i, s in enumerate(specs):
        by_spec.setdefault(s, []).append(i)
    buckets: list[tuple[list[LayerKVSpec], list[int]]] = []
    for spec, layers in by_spec.items():
        for bucket_specs, bucket_layers in buckets:
            if _mergeable([*bucket_specs, spec]):
                bucket_specs.append(spec)
                bucket_layers.extend(layers)
                break
        else:
            buckets.append(([spec], list(layers)))
    sizes = [len(layers) for _, layers in buckets]
    group_size = min(sizes)
    if max(sizes) < group_size * 1.5:
        group_size = max(sizes)   # e.g. 12 sliding + 13 full: pad to 13 + 13, not 12 + 24
    groups = []
    for bucket_specs, layers in buckets:
        num_groups = math.ceil(len(layers) / group_size)
        for g in range(num_groups):
            members = tuple(layers[g::num_groups])
            groups.append(KVCacheGroup(members, _merged(bucket_specs),
                                       tuple(specs[i].page_size_bytes for i in members)))
    return groups


def _is_uniform(specs: list[LayerKVSpec]) -> bool:
    """vLLM is_kv_cache_spec_uniform: every spec equal, or full specs that merge."""
    return all(s == specs[0] for s in specs) or _mergeable(specs)


def _mergeable(specs: list[LayerKVSpec]) -> bool:
    """FullAttentionSpec.merge: same block layout, at most one window / chunk size."""
    if not all(s.kind == FULL for s in specs):
        return all(s == specs[0] for s in specs)
    first = specs[0]
    if any((s.block_size, s.page_size_bytes) != (first.block_size, first.page_size_bytes)
           for s in specs):
        return False
    windows = {s.sliding_window for s in specs} - {None}
    chunks = {s.attention_chunk_size for s in specs} - {None}
    return len(windows) <= 1 and len(chunks) <= 1 and not (windows and chunks)


def _merged(specs: list[LayerKVSpec]) -> LayerKVSpec:
    if len(specs) == 1:
        return specs[0]
    windows = {s.sliding_window for s in specs} - {None}
    chunks = {s.attention_chunk_size for s in specs} - {None}
    return replace(specs[0], sliding_window=next(iter(windows), None),
                   attention_chunk_size=next(iter(chunks), None))


def _is_uniform_type(specs: list[LayerKVSpec]) -> bool:
    """vLLM UniformTypeKVCacheSpecs.is_uniform_type: same block size, same slots per token."""
    first = specs[0]
    if any(s.block_size != first.block_size for s in specs):
        return False
    if first.kind == FULL:
        return all(s.kind == FULL for s in specs)
    if first.kind == SLIDING:
        return all(s.kind == SLIDING and s.sliding_window == first.sliding_window for s in specs)
    if first.kind == CHUNKED:
        return all(s.kind == CHUNKED and s.attention_chunk_size == first.attention_chunk_size
                   for s in specs)
    return all(s.kind == MAMBA and s.page_size_bytes == first.page_size_bytes
               and s.num_speculative_blocks == first.num_speculative_blocks for s in specs)


# ---------------------------------------------------------------------- from a model
def model_layer_specs(model, block_size: int, kv_cache_dtype: str = "auto", tp: int = 1,
                      mamba_cache_mode: str = "none",
                      num_speculative_tokens: int = 0) -> tuple[list[LayerKVSpec], int]:
    """Each layer's spec as vLLM's model runner makes it, and the attention block size.

    Attention layers (``Attention.get_kv_cache_spec``): a page of
    ``block_size x kv_bytes_per_token_layer``; sliding layers keep the primary
    block size (the FlashAttention kernel runs it unsplit). Linear-attention
    layers (``MambaBase.get_kv_cache_spec``) hold the Gated DeltaNet state.
    For a model with both, vLLM first raises the attention block size until
    one attention page holds a state, then pads the state to that page
    (``Platform._align_hybrid_block_size``): Qwen3-Next at tp=1 gets
    544-token blocks.
    """
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    per_token = model.kv_bytes_per_token_layer(kv_cache_dtype, tp)
    state = model.linear_state_bytes(tp)
    if state:
        align = max(KERNEL_BLOCK_ALIGNMENT, block_size)
        needed = align * math.ceil(state / (align * per_token))
        needed = KERNEL_BLOCK_ALIGNMENT * math.ceil(needed / KERNEL_BLOCK_ALIGNMENT)
        block_size = max(block_size, needed)
    page = block_size * per_token
    specs = []
    for kind in model.layer_types:
        if kind == "full_attention":
            specs.append(LayerKVSpec(FULL, block_size, page))
        elif kind == "sliding_attention":
            specs.append(LayerKVSpec(SLIDING, block_size, page,
                                     sliding_window=model.sliding_window))
        elif kind == "chunked_attention":
            specs.append(LayerKVSpec(CHUNKED, block_size, page,
                                     attention_chunk_size=model.attention_chunk_size))
        else:
            specs.append(LayerKVSpec(MAMBA, block_size, max(page, state),
                                     mamba_cache_mode=mamba_cache_mode,
                                     num_speculative_blocks=num_speculative_tokens))
    return specs, block_size
