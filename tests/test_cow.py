"""Copy-on-write block sharing for parallel sampling and beam search (kv-semantics V5).

``KVCacheManager.fork(parent, child)`` lets the child share every block of
the parent by reference count. The first write into a shared, partially filled
block gives the writer its own copy and records ``(src, dst)`` in
``blocks_to_copy``; full shared blocks are never copied (new tokens go to a
new block). Block size 4, 11 blocks (10 usable, free queue ``[1..10]``).
"""

from __future__ import annotations

from kvsim.kv.hashing import block_hashes
from kvsim.kv.manager import KVCacheManager


class Seq:
    """The attributes the manager reads (see its docstring)."""

    def __init__(self, request_id: str, tokens, num_computed_tokens: int = 0) -> None:
        self.request_id = request_id
        self.all_token_ids = list(tokens)
        self.num_computed_tokens = num_computed_tokens
        self.private_keys = False

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def block_hashes(self):
        return block_hashes(self.all_token_ids, 4)


def prefilled(kv: KVCacheManager, rid: str, tokens) -> Seq:
    """Compute ``tokens`` in one step, then sample one more token (id 900)."""
    s = Seq(rid, tokens)
    assert kv.allocate_slots(s, len(tokens)) is not None
    s.num_computed_tokens = len(tokens)
    s.all_token_ids.append(900)
    return s


def fork(kv: KVCacheManager, parent: Seq, rid: str, token: int) -> Seq:
    """A second sample of the same sequence: shares every computed token."""
    child = Seq(rid, parent.all_token_ids[:-1] + [token], parent.num_computed_tokens)
    kv.fork(parent, child)
    return child


def decode(kv: KVCacheManager, s: Seq, next_token: int):
    """One decode step: a slot for the pending token, then sample the next."""
    new = kv.allocate_slots(s, 1)
    if new is not None:
        s.num_computed_tokens += 1
        s.all_token_ids.append(next_token)
    return new


def test_fork_shares_every_block_by_reference_count():
    kv = KVCacheManager(11, 4, max_model_len=64, debug=True)
    p = prefilled(kv, "p", range(1, 7))                  # 6 tokens: [full | 2 of 4]
    c = fork(kv, p, "c", 901)
    assert kv.get_blocks("p") == kv.get_blocks("c") == [1, 2]
    assert [kv.pool.ref_cnt[b] for b in (1, 2)] == [2, 2]
    assert kv.get_num_free_blocks() == 8                 # sharing takes no block
    assert kv.blocks_to_copy == [] and kv.num_cow_copies == 0
    assert c.num_computed_tokens == 6


def test_first_write_into_a_shared_partial_block_copies_it():
    kv = KVCacheManager(11, 4, max_model_len=64, debug=True)
    p = prefilled(kv, "p", range(1, 7))
    c = fork(kv, p, "c", 901)
    assert decode(kv, c, 902) == []                      # the copy is not a new slot block
    assert kv.get_blocks("c") == [1, 3]                  # block 3 popped from the free head
    assert kv.get_blocks("p") == [1, 2]
    assert kv.blocks_to_copy == [(2, 3)] and kv.num_cow_copies == 1
    assert [kv.pool.ref_cnt[b] for b in (1, 2, 3)] == [2, 1, 1]
    assert kv.get_num_free_blocks() == 7


def test_the_other_side_then_writes_in_place():
    kv = KVCacheManager(11, 4, max_model_len=64, debug=True)
    p = prefilled(kv, "p", range(1, 7))
    c = fork(kv, p, "c", 901)
    decode(kv, c, 902)
    assert decode(kv, p, 903) == []
    assert kv.get_blocks("p") == [1, 2]                  # now p is block 2's only holder
    assert kv.blocks_to_copy == [(2, 3)]                 # no second copy


def test_the_parent_writing_first_gets_the_copy():
    kv = KVCacheManager(11, 4, max_model_len=64, debug=True)
    p = prefilled(kv, "p", range(1, 7))
    c = fork(kv, p, "c", 901)
    decode(kv, p, 903)
    assert kv.get_blocks("p") == [1, 3] and kv.get_blocks("c") == [1, 2]
    assert kv.blocks_to_copy == [(2, 3)]
    decode(kv, c, 902)
    assert kv.blocks_to_copy == [(2, 3)]


def test_full_shared_blocks_are_not_copied():
    kv = KVCacheManager(11, 4, max_model_len=64, debug=True)
    p = prefilled(kv, "p", range(1, 9))                  # 8 tokens: two full blocks
    c = fork(kv, p, "c", 901)
    assert decode(kv, c, 902) == [3]                     # token 9 starts a new block
    assert decode(kv, p, 903) == [4]
    assert kv.get_blocks("c") == [1, 2, 3] and kv.get_blocks("p") == [1, 2, 4]
    assert kv.blocks_to_copy == [] and kv.num_cow_copies == 0
    assert [kv.pool.ref_cnt[b] for b in (1, 2, 3, 4)] == [2, 2, 1, 1]


def test_copied_blocks_are_hashed_with_their_own_tokens_when_full():
    kv = KVCacheManager(11, 4, max_model_len=64, debug=True)
    p = prefilled(kv, "p", range(1, 7))
    c = fork(kv, p, "c", 901)
    decode(kv, c, 902)                                   # c: 1..6, 901 in block 3
    decode(kv, c, 904)                                   # c: 1..6, 901, 902 fills block 3
    assert kv.pool.block_tokens[3] == (5, 6, 901, 902)
    assert kv.pool.block_hash[3] == c.block_hashes[1]
    assert kv.pool.block_hash[2] is None                 # p's partial block: no hash yet


def test_freeing_one_side_leaves_the_other_intact():
    kv = KVCacheManager(11, 4, max_model_len=64, debug=True)
    p = prefilled(kv, "p", range(1, 7))
    c = fork(kv, p, "c", 901)
    decode(kv, c, 902)
    kv.free(p)
    assert kv.get_blocks("c") == [1, 3]
    assert [kv.pool.ref_cnt[b] for b in (1, 2, 3)] == [1, 0, 1]
    assert kv.pool.is_free(2) and not kv.pool.is_free(1) and not kv.pool.is_free(3)
    # The unhashed partial block 2 goes to the head (B7); hashed ones would go to the tail.
    assert kv.pool.free_queue() == [2, 4, 5, 6, 7, 8, 9, 10]
    assert decode(kv, c, 905) == []                      # c still writes into its own block 3


def test_freeing_the_parent_before_any_write_makes_the_child_sole_owner():
    kv = KVCacheManager(11, 4, max_model_len=64, debug=True)
    p = prefilled(kv, "p", range(1, 7))
    c = fork(kv, p, "c", 901)
    kv.free(p)
    assert [kv.pool.ref_cnt[b] for b in (1, 2)] == [1, 1]
    assert decode(kv, c, 902) == []
    assert kv.get_blocks("c") == [1, 2] and kv.blocks_to_copy == []


def test_beam_of_three_copies_once_per_writer_but_not_for_the_last_holder():
    kv = KVCacheManager(11, 4, max_model_len=64, debug=True)
    p = prefilled(kv, "p", range(1, 7))
    b1 = fork(kv, p, "b1", 901)
    b2 = fork(kv, p, "b2", 902)
    assert kv.pool.ref_cnt[2] == 3
    decode(kv, b1, 911)
    decode(kv, b2, 912)
    assert kv.blocks_to_copy == [(2, 3), (2, 4)]
    assert kv.pool.ref_cnt[2] == 1 and kv.pool.ref_cnt[1] == 3
    decode(kv, p, 913)
    assert kv.get_blocks("p") == [1, 2] and kv.num_cow_copies == 2


def test_a_copy_needs_a_free_block_and_a_refused_write_changes_nothing():
    kv = KVCacheManager(3, 4, max_model_len=64, debug=True)   # 2 usable blocks
    p = prefilled(kv, "p", range(1, 7))
    c = fork(kv, p, "c", 901)
    assert kv.get_num_free_blocks() == 0
    assert kv.num_blocks_to_allocate(c, 7) == 1          # the copy counts as one block
    assert decode(kv, c, 902) is None
    assert kv.get_blocks("c") == [1, 2] and kv.blocks_to_copy == []
    assert [kv.pool.ref_cnt[b] for b in (1, 2)] == [2, 2]
    assert c.num_computed_tokens == 6
