"""Synthetic workloads: arrivals, lengths, shared prefixes, sessions, determinism."""

from pathlib import Path

import numpy as np
import pytest

from kvsim.workload import build_workload
from kvsim.workload.config import parse_workload_config
from kvsim.workload.lengths import LengthSampler
from kvsim.workload.tokens import TokenCounter

DATA = Path(__file__).parent / "data"


def requests_of(config: dict, seed: int = 0, base_dir: Path | None = None):
    return list(build_workload(config, rng=np.random.default_rng(seed), base_dir=base_dir).requests())


def lengths(config: dict, count: int = 20000, seed: int = 1) -> np.ndarray:
    section = parse_workload_config({"prompt_len": config}).prompt_len
    sampler = LengthSampler(section, base_dir=DATA, yaml_path="workload.prompt_len")
    return sampler.sample(np.random.default_rng(seed), count)


def gaps_of(arrival: dict, count: int = 20000) -> np.ndarray:
    specs = requests_of({"num_requests": count, "arrival": arrival,
                         "prompt_len": {"type": "fixed", "value": 1}, "output_len": {"type": "fixed", "value": 1}})
    return np.diff([s.arrival_time_s for s in specs])


# --- arrivals ---------------------------------------------------------------------------

def test_first_request_arrives_at_time_zero():
    assert requests_of({"num_requests": 3})[0].arrival_time_s == 0.0


def test_poisson_gaps_have_mean_one_over_rate_and_unit_cv():
    gaps = gaps_of({"type": "poisson", "rate": 4.0})
    assert gaps.mean() == pytest.approx(0.25, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.03)


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_gamma_gaps_keep_the_rate_and_have_cv_one_over_sqrt_burstiness(burstiness):
    gaps = gaps_of({"type": "gamma", "rate": 2.0, "burstiness": burstiness})
    assert gaps.mean() == pytest.approx(0.5, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(burstiness ** -0.5, rel=0.05)


def test_constant_interval_arrivals_are_exact():
    specs = requests_of({"num_requests": 4, "arrival": {"type": "constant", "interval_s": 0.5}})
    assert [s.arrival_time_s for s in specs] == [0.0, 0.5, 1.0, 1.5]


def test_all_at_once_puts_every_request_at_zero():
    specs = requests_of({"num_requests": 5, "arrival": {"type": "all_at_once"}})
    assert [s.arrival_time_s for s in specs] == [0.0] * 5


def test_closed_loop_sets_concurrency_and_zero_times():
    workload = build_workload({"num_requests": 6, "arrival": {"type": "closed_loop", "concurrency": 3}},
                              rng=np.random.default_rng(0))
    assert (workload.concurrency, workload.num_requests) == (3, 6)
    assert [s.arrival_time_s for s in workload.requests()] == [0.0] * 6


def test_open_loop_has_no_concurrency():
    assert build_workload({"num_requests": 2}, rng=np.random.default_rng(0)).concurrency is None


def test_arrivals_continue_across_generation_chunks():
    gaps = gaps_of({"type": "constant", "interval_s": 0.1}, count=3000)
    assert np.allclose(gaps, 0.1)


# --- lengths ----------------------------------------------------------------------------

def test_fixed_length_is_exact():
    assert set(lengths({"type": "fixed", "value": 77}).tolist()) == {77}


def test_uniform_covers_low_to_high_inclusive_with_the_right_mean():
    values = lengths({"type": "uniform", "low": 10, "high": 20})
    assert (values.min(), values.max()) == (10, 20)
    assert values.mean() == pytest.approx(15.0, rel=0.01)


def test_normal_has_its_mean_and_std():
    values = lengths({"type": "normal", "mean": 1000, "std": 100})
    assert values.mean() == pytest.approx(1000, rel=0.005)
    assert values.std() == pytest.approx(100, rel=0.03)


def test_lognormal_has_its_median_and_log_sigma():
    values = lengths({"type": "lognormal", "median": 512, "sigma": 0.8})
    assert np.median(values) == pytest.approx(512, rel=0.03)
    assert np.log(values).std() == pytest.approx(0.8, rel=0.03)


def test_empirical_draws_only_file_values_with_their_frequencies():
    values = lengths({"type": "empirical", "file": "workload_lengths.csv", "column": "tokens"})
    assert set(values.tolist()) == {10, 20, 50}
    assert np.mean(values == 20) == pytest.approx(0.5, abs=0.02)


def test_clipping_caps_samples_at_max():
    values = lengths({"type": "lognormal", "median": 512, "sigma": 1.0, "max": 600})
    assert values.max() == 600
    # P(Z > ln(600/512)) for Z standard normal is about 0.437.
    assert np.mean(values == 600) == pytest.approx(0.437, abs=0.015)


def test_clipping_raises_samples_to_min():
    values = lengths({"type": "normal", "mean": 10, "std": 50, "min": 5})
    assert values.min() == 5
    assert np.mean(values == 5) == pytest.approx(0.46, abs=0.015)  # P(N(10,50) < 5.5) ~ 0.466


def test_samples_without_max_are_capped_to_a_valid_length():
    assert lengths({"type": "normal", "mean": 1e30, "std": 1}, count=3).tolist() == [2**31 - 1] * 3


def test_normal_never_goes_below_one_token():
    assert lengths({"type": "normal", "mean": 0, "std": 10}).min() == 1


def test_empirical_unknown_column_is_an_error_naming_the_columns():
    with pytest.raises(ValueError) as info:
        lengths({"type": "empirical", "file": "workload_lengths.csv", "column": "len"})
    assert str(info.value) == (f"workload.prompt_len.column = 'len': no such column in "
                               f"{DATA / 'workload_lengths.csv'} (columns: name, tokens)")


def test_empirical_non_numeric_value_is_an_error():
    with pytest.raises(ValueError, match=r"workload.prompt_len.column = 'name': row 0 .* is 'a'; every value must be a number"):
        lengths({"type": "empirical", "file": "workload_lengths.csv", "column": "name"})


def test_requests_use_sampled_lengths_for_prompt_and_max_tokens():
    specs = requests_of({"num_requests": 50, "prompt_len": {"type": "uniform", "low": 3, "high": 9},
                         "output_len": {"type": "fixed", "value": 11}})
    assert all(3 <= s.num_prompt_tokens <= 9 for s in specs)
    assert {s.max_tokens for s in specs} == {11}
    assert all(s.output_token_ids is None for s in specs)


# --- token ids and sharing --------------------------------------------------------------

def test_prompts_without_a_shared_prefix_share_no_token():
    specs = requests_of({"num_requests": 200})
    all_ids = np.concatenate([s.prompt_token_ids for s in specs])
    assert len(np.unique(all_ids)) == len(all_ids)
    assert all_ids.dtype == np.int64
    assert all_ids.min() >= 0  # the engine's generated ids are negative


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.nonzero(a[:n] != b[:n])[0]
    return int(differ[0]) if len(differ) else n


def test_requests_of_one_group_share_exactly_the_system_prompt():
    specs = requests_of({"num_requests": 60, "prefix": {"shared_prompt_tokens": 64, "num_groups": 3}})
    firsts = {}
    for spec in specs:
        group = int(spec.prompt_token_ids[0])
        if group in firsts:
            assert common_prefix(firsts[group].prompt_token_ids, spec.prompt_token_ids) == 64
        firsts.setdefault(group, spec)
    assert len(firsts) == 3
    heads = [s.prompt_token_ids[0] for s in firsts.values()]
    assert all(common_prefix(a.prompt_token_ids, b.prompt_token_ids) == 0
               for a in firsts.values() for b in firsts.values() if a is not b), heads


def test_prompt_length_is_system_prompt_plus_user_message():
    specs = requests_of({"num_requests": 5, "prefix": {"shared_prompt_tokens": 30},
                         "prompt_len": {"type": "fixed", "value": 7}})
    assert {s.num_prompt_tokens for s in specs} == {37}


def test_only_the_system_prompt_is_shared_between_groups_members():
    specs = requests_of({"num_requests": 40, "prefix": {"shared_prompt_tokens": 16, "num_groups": 2}})
    tails = np.concatenate([s.prompt_token_ids[16:] for s in specs])
    heads = np.concatenate([s.prompt_token_ids[:16] for s in specs])
    assert len(np.unique(tails)) == len(tails)
    assert len(np.intersect1d(heads, tails)) == 0


def test_counter_runs_are_consecutive_and_never_reused():
    counter = TokenCounter()
    assert counter.take(3).tolist() == [0, 1, 2]
    assert counter.take_starts(np.array([2, 0, 4])).tolist() == [3, 5, 5]
    assert counter.take(1).tolist() == [9]


# --- sessions ---------------------------------------------------------------------------

SESSIONS = {"num_requests": 9, "sessions": {"turns": 3, "think_time_s": 2.5},
            "prefix": {"shared_prompt_tokens": 8}, "prompt_len": {"type": "fixed", "value": 5},
            "output_len": {"type": "uniform", "low": 2, "high": 6}}


def test_only_unquoted_prompts_without_a_system_prompt_say_they_are_fresh_runs():
    single = requests_of({"num_requests": 5, "prompt_len": {"type": "fixed", "value": 5}})
    assert [s.fresh_prompt_start for s in single] == [int(s.prompt_token_ids[0]) for s in single]
    assert all(s.fresh_prompt_start is None for s in requests_of(SESSIONS))
    quoted = requests_of({**SESSIONS, "prefix": {"shared_prompt_tokens": 0}})
    assert all(s.fresh_prompt_start is None for s in quoted)    # later turns quote them
    shared = requests_of({"num_requests": 5, "prefix": {"shared_prompt_tokens": 8}})
    assert all(s.fresh_prompt_start is None for s in shared)


def test_each_turn_resends_the_previous_prompt_and_answer():
    specs = requests_of(SESSIONS)
    for before, after in zip(specs, specs[1:]):
        if after.after_request_id is None:
            continue
        quoted = np.concatenate((before.prompt_token_ids, before.output_token_ids))
        assert after.after_request_id == before.request_id
        assert np.array_equal(after.prompt_token_ids[:len(quoted)], quoted)
        assert after.num_prompt_tokens == len(quoted) + 5


def test_a_turn_s_answer_has_exactly_max_tokens_fresh_ids():
    specs = requests_of(SESSIONS)
    for spec in specs:
        if spec.output_token_ids is not None:
            assert len(spec.output_token_ids) == spec.max_tokens
            assert spec.output_token_ids.min() >= 0


def test_session_structure_ids_and_think_times():
    specs = requests_of(SESSIONS)
    assert [s.after_request_id for s in specs] == [None, "r0", "r1", None, "r3", "r4", None, "r6", "r7"]
    assert [s.think_time_s for s in specs] == [0.0, 2.5, 2.5] * 3
    assert [s.output_token_ids is None for s in specs] == [False, False, True] * 3


def test_later_turns_carry_their_session_s_start_time():
    specs = requests_of(SESSIONS)
    times = [s.arrival_time_s for s in specs]
    assert times[0] == times[1] == times[2] and times[3] == times[4] == times[5]
    assert times == sorted(times)


def test_num_requests_counts_turns_and_cuts_the_last_session():
    specs = requests_of({**SESSIONS, "num_requests": 7})
    assert [s.after_request_id for s in specs] == [None, "r0", "r1", None, "r3", "r4", None]
    assert specs[-1].output_token_ids is None


def test_different_sessions_share_only_the_system_prompt():
    specs = requests_of(SESSIONS)
    assert common_prefix(specs[0].prompt_token_ids, specs[3].prompt_token_ids) == 8


# --- other per-request fields -----------------------------------------------------------

def test_n_beam_width_salt_and_priority_are_set_on_every_request():
    specs = requests_of({"num_requests": 4, "n": 3, "beam_width": 2, "cache_salt": "tenant-a", "priority": 5})
    assert {(s.n, s.beam_width, s.cache_salt, s.priority) for s in specs} == {(3, 2, "tenant-a", 5)}


def test_priority_choice_follows_weights():
    specs = requests_of({"num_requests": 4000, "priority": {"values": [0, 9], "weights": [3, 1]},
                         "prompt_len": {"type": "fixed", "value": 1}})
    share = np.mean([s.priority == 9 for s in specs])
    assert share == pytest.approx(0.25, abs=0.02)


# --- determinism and edge cases ---------------------------------------------------------

def fingerprint(specs):
    return [(s.request_id, s.arrival_time_s, s.prompt_token_ids.tolist(), s.max_tokens, s.priority,
             None if s.output_token_ids is None else s.output_token_ids.tolist(), s.after_request_id)
            for s in specs]


def test_same_config_and_seed_give_identical_requests():
    config = {**SESSIONS, "prefix": {"shared_prompt_tokens": 8, "num_groups": 3},
              "prompt_len": {"type": "lognormal", "median": 20, "sigma": 0.5}}
    assert fingerprint(requests_of(config, seed=7)) == fingerprint(requests_of(config, seed=7))


def test_a_different_seed_gives_different_requests():
    assert fingerprint(requests_of({"num_requests": 5}, seed=1)) != fingerprint(requests_of({"num_requests": 5}, seed=2))


def test_requests_can_be_iterated_again_with_the_same_result():
    workload = build_workload({"num_requests": 20}, rng=np.random.default_rng(3))
    assert fingerprint(workload.requests()) == fingerprint(workload.requests())


def test_generation_is_lazy():
    workload = build_workload({"num_requests": 10**9}, rng=np.random.default_rng(0))
    first = next(iter(workload.requests()))
    assert workload.num_requests == 10**9 and first.request_id == "r0"


def test_zero_requests_yield_nothing():
    workload = build_workload({"num_requests": 0}, rng=np.random.default_rng(0))
    assert (workload.num_requests, list(workload.requests())) == (0, [])


def test_a_single_request_arrives_at_zero():
    specs = requests_of({"num_requests": 1, "output_len": {"type": "fixed", "value": 3}})
    assert [(s.request_id, s.arrival_time_s, s.max_tokens) for s in specs] == [("r0", 0.0, 3)]


def test_arrival_times_never_decrease():
    specs = requests_of({"num_requests": 3000, "arrival": {"type": "gamma", "rate": 50, "burstiness": 0.1}})
    times = [s.arrival_time_s for s in specs]
    assert times == sorted(times)


def test_empirical_reads_a_json_lines_column():
    values = lengths({"type": "empirical", "file": "workload_mooncake_small.jsonl", "column": "input_length"})
    assert set(values.tolist()) == {1024, 1100, 600}


def test_streaming_holds_only_a_chunk_in_memory():
    import tracemalloc

    workload = build_workload({"num_requests": 4000, "prefix": {"shared_prompt_tokens": 128, "num_groups": 4}},
                              rng=np.random.default_rng(0))
    tracemalloc.start()
    num_tokens = sum(spec.num_prompt_tokens for spec in workload.requests())
    _, peak_bytes = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # All prompts at once would be num_tokens * 8 bytes (~26 MB); a lazy stream holds one chunk.
    assert num_tokens * 8 > 20e6
    assert peak_bytes < 2e6
