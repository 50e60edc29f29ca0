"""SGLang's radix cache inside vLLM's chunked scheduler (kv/radix_manager.py).

Vectors run the real scheduler on the radix strategy step by step (helpers.Driver),
with exact slots and tree snapshots; a hypothesis run drives the facade the
way the scheduler does and checks the facade's contract after every call.
"""

from __future__ import annotations

import pytest
from helpers import Driver, spec
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.kv.radix_manager import RadixKVManager


def radix(**cfg) -> Driver:
    cfg.setdefault("prefix_cache", "radix")
    return Driver(**cfg)


def r(a, b):
    return list(range(a, b + 1))


def test_rv1_tv15_through_the_scheduler():
    """TV15's requests on 16 slots: A's prompt enters the tree after its prefill
    step, its output at its finish; B's lookup is read-only, its admission splits."""
    d = radix(num_gpu_blocks=5, block_size=4, max_num_batched_tokens=64)
    tree = d.kv.tree
    d.add(spec("A", r(1, 6), max_tokens=2, output_token_ids=[60, 61]))
    assert d.step()[0] == {"A": 6}
    assert d.blocks("A") == r(1, 6)
    assert tree.snapshot() == [[], [], 1, [[r(1, 6), r(1, 6), 1, []]]]     # locked by A
    assert d.step()[0] == {"A": 1}                                         # A finishes
    assert tree.snapshot() == [[], [], 1, [[r(1, 6), r(1, 6), 0, [[[60], [7], 0, []]]]]]
    assert tree.evictable_size() == 7

    d.add(spec("B", [1, 2, 3, 9, 9], max_tokens=1))
    hits, num_hit = d.kv.get_computed_blocks(d.reqs["B"])
    assert (num_hit, len(hits), hits.num_unlocked_pages) == (3, 3, 3)
    assert tree.snapshot()[3][0][0] == r(1, 6)                             # no split yet
    scheduled, plan, finished = d.step()
    assert scheduled == {"B": 2} and plan.prefix_hit_tokens == {"B": 3} and finished == ["B"]
    assert tree.snapshot() == [[], [], 1, [[[1, 2, 3], [1, 2, 3], 0, [
        [[4, 5, 6], [4, 5, 6], 0, [[[60], [7], 0, []]]],
        [[9, 9], [8, 9], 0, []]]]]]
    assert tree.evictable_size() == 9
    # evict(2): the oldest leaf [60] (1 token), then its parent [4, 5, 6]: whole leaves.
    assert tree.evict(2) == 4
    assert d.kv.allocator.free_slots() == r(10, 16) + [7, 4, 5, 6]


def test_rv2_hash_hits_in_the_same_step_radix_after_it():
    """Two equal prompts in one step: vLLM hashes A's blocks at schedule time, so
    B hits them (TV5); the tree takes A in after the step, so B misses, and its
    duplicate slots are freed when it is inserted."""
    hit = {}
    for cache in ("hash", "radix"):
        d = Driver(num_gpu_blocks=20, block_size=4, prefix_cache=cache)
        d.add(spec("A", r(1, 9), max_tokens=3), spec("B", r(1, 9), max_tokens=3))
        scheduled, plan, _ = d.step()
        hit[cache] = plan.prefix_hit_tokens
        if cache == "radix":
            assert scheduled == {"A": 9, "B": 9}
            assert d.blocks("A") == r(1, 9) and d.blocks("B") == r(1, 9)   # B re-pointed
            assert d.kv.get_num_free_blocks() == 76 - 9
            assert d.kv.allocator.free_slots()[-9:] == r(10, 18)           # B's own, freed
    assert hit == {"hash": {"A": 0, "B": 8}, "radix": {"A": 0, "B": 0}}


def test_rv3_a_later_turn_hits_every_token_but_the_last_one():
    """Turn 2 quotes turn 1's prompt and answer: the tree holds (prompt + output)[:-1]
    token for token; the hash cache only the full blocks of it."""
    answer = r(50, 55)
    turn2 = r(1, 10) + answer + [7, 8]
    hit = {}
    for cache in ("hash", "radix"):
        d = Driver(num_gpu_blocks=20, block_size=4, prefix_cache=cache)
        d.add(spec("A", r(1, 10), max_tokens=6, output_token_ids=answer))
        while d.step()[2] != ["A"]:
            pass
        d.add(spec("B", turn2, max_tokens=2))
        hit[cache] = d.step()[1].prefix_hit_tokens["B"]
    assert hit == {"hash": 12, "radix": 15}


def test_rv4_a_preempted_request_keeps_its_prompt_in_the_tree_not_its_outputs():
    d = radix(num_gpu_blocks=5, block_size=4, max_num_batched_tokens=64)
    d.add(spec("A", r(1, 6), max_tokens=5), spec("B", r(11, 16), max_tokens=6))
    assert d.step()[0] == {"A": 6, "B": 6}
    assert d.step()[0] == {"A": 1, "B": 1}
    assert d.step()[0] == {"A": 1, "B": 1}
    scheduled, plan, _ = d.step()                      # 16 slots used: B goes
    assert scheduled == {"A": 1} and [q.request_id for q in plan.preempted] == ["B"]
    assert d.blocks("A") == r(1, 6) + [13, 15, 14]      # A took B's freed decode slot
    assert d.kv.tree.evictable_size() == 6              # B's prompt, unlocked, kept
    assert d.step()[2] == ["A"]
    scheduled, plan, _ = d.step()
    # B holds 3 outputs; the KV of the 2 it had decoded was never inserted: only its prompt hits.
    assert plan.resume_hit_tokens == {"B": 6} and scheduled == {"B": 3}


def test_page_size_16_hits_whole_pages_only():
    d = radix(num_gpu_blocks=20, block_size=4, radix_page_size=4)
    d.add(spec("A", r(1, 10), max_tokens=1))
    d.step()
    d.add(spec("B", r(1, 10) + [99], max_tokens=1))
    assert d.step()[1].prefix_hit_tokens == {"B": 8}
    assert d.kv.num_usable_blocks == 19 and d.kv.block_size == 4


def test_free_counts_evictable_pages_and_usage_counts_held_ones():
    d = radix(num_gpu_blocks=5, block_size=4)
    d.add(spec("A", r(1, 6), max_tokens=1))
    d.step()                                            # A finished: 6 tokens cached, unlocked
    assert d.kv.allocator.available_size() == 10
    assert d.kv.get_num_free_blocks() == 16 and d.kv.usage == 0.0


def test_page_size_must_be_one_or_the_block_size():
    with pytest.raises(ValueError, match="page_size must be 1 or the block size"):
        RadixKVManager(10, 16, max_model_len=64, page_size=8)


# ------------------------------------------------------- the facade's contract


class _Req:
    """What the facade reads of a vLLM Request."""

    def __init__(self, rid, tokens, prompt_len):
        self.request_id = rid
        self.all_token_ids = tokens
        self.prompt_len = prompt_len
        self.final_num_tokens = len(tokens)
        self.num_output_tokens = 0
        self.num_computed_tokens = 0

    @property
    def num_tokens(self):
        return self.prompt_len + self.num_output_tokens


@settings(max_examples=60, deadline=None)
@given(data=st.data(), page_size=st.sampled_from([1, 4]), num_blocks=st.integers(3, 12))
def test_facade_contract_holds_after_every_call(data, page_size, num_blocks):
    """Random admissions, chunks, decodes, finishes and preemptions, as the chunked
    scheduler makes them: an allocation fails exactly when it needs more pages
    than are free (and then changes nothing), slots are conserved, and every
    lookup's hit is a prefix that some inserted sequence really shares."""
    kv = RadixKVManager(num_blocks, 4, max_model_len=64, page_size=page_size)
    alphabet = st.integers(0, 2)              # few token values: many shared prefixes
    running: list[_Req] = []
    inserted: list[list[int]] = []            # every sequence the tree took in
    pending: list = []                        # this step's (request, tokens, computed before)
    n = 0
    for _ in range(data.draw(st.integers(1, 40))):
        op = data.draw(st.sampled_from(["admit", "step", "step", "step", "preempt"]))
        if op == "admit":
            prompt = data.draw(st.lists(alphabet, min_size=1, max_size=14))
            out = data.draw(st.lists(alphabet, min_size=1, max_size=6))
            req = _Req(f"r{n}", prompt + out, len(prompt))
            n += 1
            hits, num_hit = kv.get_computed_blocks(req)
            key = req.all_token_ids[:req.num_tokens - 1]
            assert num_hit == len(hits) * page_size <= len(key)
            assert num_hit == 0 or any(s[:num_hit] == key[:num_hit] for s in inserted)
            chunk = data.draw(st.integers(1, req.num_tokens - num_hit))
            need = kv.num_blocks_to_allocate(req, num_hit + chunk, hits)
            free = kv.get_num_free_blocks()
            before = kv.tree.snapshot(), kv.allocator.available_size()
            got = kv.allocate_slots(req, chunk, num_hit, hits)
            assert (got is None) == (need > free)
            if got is None:
                assert (kv.tree.snapshot(), kv.allocator.available_size()) == before
            else:
                req.num_computed_tokens = num_hit + chunk
                running.append(req)
                pending.append((req, chunk, num_hit))
        elif op == "step":
            # The rest of a step: every running request not yet scheduled in it
            # gets its next chunk or decode token; then the forward pass.
            scheduled = [e[0] for e in pending]
            for req in list(running):
                c = req.num_computed_tokens
                if req in scheduled:
                    continue
                k = data.draw(st.integers(1, req.num_tokens - c))
                need = kv.num_blocks_to_allocate(req, c + k)
                free = kv.get_num_free_blocks()
                got = kv.allocate_slots(req, k)
                assert (got is None) == (need > free)
                if got is not None:
                    req.num_computed_tokens += k
                    pending.append((req, k, c))
            prefills = [(req, k, c) for req, k, c in pending if c < kv._held[req.request_id].fill_target]
            for req, _, _ in pending:
                if req.num_computed_tokens == req.num_tokens:
                    req.num_output_tokens += 1              # samples a token
            kv.cache_after_step(pending)
            for req, k, c in prefills:
                inserted.append(req.all_token_ids[:c + k])
            for req, _, _ in pending:
                if req.num_tokens >= req.final_num_tokens:  # finished: freed at once
                    running.remove(req)
                    kv.free(req)
                    inserted.append(req.all_token_ids[:req.final_num_tokens - 1])
            pending = []
        elif op == "preempt" and running:
            req = running.pop()                             # vLLM: the last running request
            pending = [e for e in pending if e[0] is not req]
            req.num_computed_tokens = 0
            kv.free(req)
        kv.check()
    for req in running:
        req.num_computed_tokens = 0
        kv.free(req)
    kv.check()
    assert kv.tree.protected_size() == 0
    assert kv.get_num_free_blocks() == kv.num_usable_blocks
