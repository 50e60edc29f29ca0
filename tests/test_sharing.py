"""Copy-on-write block sharing (kvsim/kv/sharing.py) on the real KV manager."""

import numpy as np
import pytest

from kvsim.kv.sharing import beam_search, measure_sharing, parallel_sampling


def test_two_samples_of_a_32_token_prompt_share_its_2_full_blocks():
    # 2 samples x 3 output tokens: 2 decode steps, each sample writes 1 token per step.
    # Step 1: 2 shared prompt blocks + 1 own block each = 4 in use; unshared 2 x 3 = 6.
    c = parallel_sampling(32, [3, 3], block_size=16)
    assert (c.steps, c.shared, c.unshared, c.copies) == (2, 8, 12, 0)


def test_first_write_into_a_shared_partial_block_copies_it():
    # A 20-token prompt: block 0 full, block 1 holds 4 tokens and is shared.
    # The first sample to write copies block 1; the second then owns the original.
    c = parallel_sampling(20, [2, 2], block_size=16)
    assert c.copies == 1
    assert (c.steps, c.shared, c.unshared) == (1, 3, 4)


def test_one_sample_shares_nothing():
    c = parallel_sampling(40, [10], block_size=16)
    assert c.shared == c.unshared and c.copies == 0


def test_samples_of_different_lengths_free_their_own_blocks():
    # The 2-token sample finishes after step 1; afterwards only the long one counts.
    c = parallel_sampling(16, [2, 4], block_size=16)
    assert c.steps == 3
    # step 1: prompt block + 2 own = 3; steps 2-3: the long sample's 2 blocks (prompt + own).
    assert c.shared == 3 + 2 + 2
    assert c.unshared == 4 + 2 + 2


def test_beam_width_one_is_a_plain_decode():
    rng = np.random.default_rng(0)
    c = beam_search(20, 30, 1, rng, block_size=16)
    assert c.shared == c.unshared and c.copies == 0


def test_beams_all_from_one_parent_share_everything_but_their_last_block():
    # Width 2, first step: both beams extend the 16-token prompt: 1 shared + 1 own each.
    rng = np.random.default_rng(0)
    c = beam_search(16, 2, 2, rng, block_size=16)
    assert (c.steps, c.shared, c.unshared) == (1, 3, 4)


def test_beam_search_saves_more_than_parallel_sampling():
    prompts, outputs = [20, 40, 15], [60, 80, 30]
    par = measure_sharing("parallel", 4, prompts, outputs, seed=1)
    beam = measure_sharing("beam", 4, prompts, outputs, seed=1)
    assert 0 < par.saving < beam.saving < 1


def test_same_seed_gives_the_same_beam_saving():
    a = measure_sharing("beam", 3, [30, 50], [40, 70], seed=7)
    b = measure_sharing("beam", 3, [30, 50], [40, 70], seed=7)
    assert a == b


@pytest.mark.parametrize("kw, msg", [
    ({"mode": "greedy"}, "mode"),
    ({"width": 0}, "width"),
    ({"prompt_lens": [1, 2]}, "prompt lengths"),
])
def test_bad_arguments_name_what_is_wrong(kw, msg):
    args = {"mode": "beam", "width": 2, "prompt_lens": [10], "output_lens": [5], **kw}
    with pytest.raises(ValueError, match=msg):
        measure_sharing(args.pop("mode"), args.pop("width"), args.pop("prompt_lens"),
                        args.pop("output_lens"))
