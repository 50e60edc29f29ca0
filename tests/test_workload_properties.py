"""Invariants of every synthetic workload, over random configurations (hypothesis)."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.workload import build_workload

arrivals = st.one_of(
    st.builds(lambda r: {"type": "poisson", "rate": r}, st.floats(0.1, 100)),
    st.builds(lambda r, b: {"type": "gamma", "rate": r, "burstiness": b}, st.floats(0.1, 100), st.floats(0.05, 10)),
    st.builds(lambda i: {"type": "constant", "interval_s": i}, st.floats(0, 5)),
    st.just({"type": "all_at_once"}),
)


@st.composite
def configs(draw):
    low = draw(st.integers(1, 40))
    turns = draw(st.integers(1, 4))
    return {
        "num_requests": draw(st.integers(0, 25)),
        "arrival": draw(arrivals),
        "prompt_len": {"type": "uniform", "low": low, "high": low + draw(st.integers(0, 40)),
                       "max": low + draw(st.integers(0, 20))},
        "output_len": {"type": "lognormal", "median": draw(st.floats(1, 50)), "sigma": draw(st.floats(0, 1.5)),
                       "max": 64},
        "prefix": {"shared_prompt_tokens": draw(st.integers(0, 40)), "num_groups": draw(st.integers(1, 4))},
        "sessions": {"turns": turns, "think_time_s": draw(st.floats(0, 3))},
    }


@settings(max_examples=60, deadline=None)
@given(config=configs(), seed=st.integers(0, 2**32))
def test_synthetic_workload_invariants(config, seed):
    specs = list(build_workload(config, rng=np.random.default_rng(seed)).requests())
    shared = config["prefix"]["shared_prompt_tokens"]
    clip_max = config["prompt_len"]["max"]

    assert len(specs) == config["num_requests"]
    times = [s.arrival_time_s for s in specs]
    assert times == sorted(times) and times[:1] in ([], [0.0])

    by_id = {}
    own_tokens, group_tokens = [], []
    for spec in specs:
        assert spec.prompt_token_ids.dtype == np.int64
        assert spec.prompt_token_ids.min() >= 0  # the engine's generated ids are negative
        assert 1 <= spec.max_tokens <= 64
        if spec.after_request_id is None:
            quoted = shared
            group_tokens.append(spec.prompt_token_ids[:shared])
        else:
            before = by_id[spec.after_request_id]  # always a request yielded earlier
            history = np.concatenate((before.prompt_token_ids, before.output_token_ids))
            assert np.array_equal(spec.prompt_token_ids[:len(history)], history)
            quoted = len(history)
        assert 1 <= spec.num_prompt_tokens - quoted <= clip_max
        own_tokens.append(spec.prompt_token_ids[quoted:])
        if spec.output_token_ids is not None:
            assert len(spec.output_token_ids) == spec.max_tokens
            own_tokens.append(spec.output_token_ids)
        by_id[spec.request_id] = spec

    # Everything but the system prompts and quoted history is unique to its request.
    own = np.concatenate(own_tokens) if own_tokens else np.zeros(0, dtype=np.int64)
    assert len(np.unique(own)) == len(own)
    groups = np.unique(np.concatenate(group_tokens)) if group_tokens else np.zeros(0, dtype=np.int64)
    assert len(np.intersect1d(own, groups)) == 0
    assert len(groups) <= shared * config["prefix"]["num_groups"]
