"""The workload: section is validated before any simulation, with errors naming path, value, allowed."""

from pathlib import Path

import numpy as np
import pytest

from kvsim.workload import WorkloadConfig, build_workload, parse_workload_config
from kvsim.workload.config import (AllAtOnceArrival, LognormalLength, PoissonArrival, FixedLength,
                                   resolve_path)

DATA = Path(__file__).parent / "data"


def error_of(data) -> str:
    with pytest.raises(ValueError) as info:
        parse_workload_config(data)
    return str(info.value)


def test_defaults_are_documented_values():
    config = parse_workload_config({})
    assert config.kind == "synthetic"
    assert config.num_requests == 1000
    assert config.arrival_or_default() == PoissonArrival(type="poisson", rate=4.0)
    assert config.prompt_len == LognormalLength(type="lognormal", median=512, sigma=0.8, min=1, max=4096)
    assert config.output_len == FixedLength(type="fixed", value=128)
    assert (config.prefix.shared_prompt_tokens, config.prefix.num_groups) == (0, 1)
    assert (config.sessions.turns, config.sessions.think_time_s) == (1, 0.0)
    assert (config.n, config.beam_width, config.priority, config.cache_salt) == (1, 1, 0, None)


def test_out_of_range_value_names_path_value_and_bound():
    assert error_of({"arrival": {"type": "poisson", "rate": -1}}) == \
        "workload.arrival.rate = -1: Input should be greater than 0"


def test_wrong_type_names_path_and_value():
    assert error_of({"arrival": {"type": "poisson", "rate": "4"}}) == \
        "workload.arrival.rate = '4': Input should be a valid number"


def test_bool_is_not_an_integer():
    assert error_of({"n": True}) == "workload.n = True: Input should be a valid integer"


def test_unknown_key_lists_allowed_keys():
    assert error_of({"arival": {"type": "poisson", "rate": 1}}) == (
        "workload.arival: unknown key (allowed: arrival, beam_width, bench, cache_salt, n, num_requests, "
        "output_len, prefix, priority, prompt_len, requests_file, sessions, trace)")


def test_unknown_key_inside_a_typed_section_lists_that_type_s_keys():
    assert error_of({"prompt_len": {"type": "fixed", "value": 5, "mx": 4}}) == \
        "workload.prompt_len.mx: unknown key (allowed: max, min, type, value)"


def test_unknown_arrival_type_lists_the_types():
    assert error_of({"arrival": {"type": "burst"}}) == (
        "workload.arrival.type = 'burst': unknown type (allowed: 'poisson', 'gamma', 'constant', "
        "'closed_loop', 'all_at_once')")


def test_missing_arrival_type_lists_the_types():
    assert error_of({"arrival": {"rate": 3}}) == (
        "workload.arrival.type: missing (allowed: 'poisson', 'gamma', 'constant', 'closed_loop', "
        "'all_at_once')")


def test_missing_required_key_is_named():
    assert error_of({"arrival": {"type": "closed_loop"}}) == "workload.arrival.concurrency: missing (required)"


def test_clip_max_below_min_is_rejected():
    assert error_of({"output_len": {"type": "normal", "mean": 5, "std": 1, "min": 4, "max": 2}}) == \
        "workload.output_len.max: max = 2 is below min = 4; need min <= max"


def test_uniform_high_below_low_is_rejected():
    assert error_of({"prompt_len": {"type": "uniform", "low": 5, "high": 2}}) == \
        "workload.prompt_len.high: high = 2 is below low = 5; need low <= high"


def test_lengths_below_one_are_rejected():
    assert error_of({"output_len": {"type": "fixed", "value": 0}}) == \
        "workload.output_len.value = 0: Input should be greater than or equal to 1"


def test_infinite_rate_is_rejected():
    assert "workload.arrival.rate = inf" in error_of({"arrival": {"type": "poisson", "rate": float("inf")}})


def test_priority_weights_must_match_values():
    assert error_of({"priority": {"values": [0, 1], "weights": [1.0]}}) == \
        "workload.priority.weights: 1 weights for 2 values; give one weight per value"


def test_priority_must_be_int_or_choice():
    assert error_of({"priority": "high"}) == "workload.priority = 'high': Input should be a valid integer"


def test_list_element_error_names_its_index():
    assert error_of({"priority": {"values": [1, "a"]}}) == \
        "workload.priority.values[1] = 'a': Input should be a valid integer"


def test_synthetic_keys_are_rejected_with_a_trace():
    assert error_of({"trace": {"format": "azure", "path": "x.csv"}, "prompt_len": {"type": "fixed", "value": 3}}) == (
        "workload.prompt_len: not allowed with trace (the trace gives lengths and count; use "
        "trace.max_requests); allowed with trace: arrival, n, beam_width, priority, cache_salt")


def test_other_keys_are_rejected_with_a_requests_file():
    assert error_of({"requests_file": "r.jsonl", "n": 2}) == \
        "workload.n: not allowed with requests_file (the file gives every request); remove it or remove requests_file"


def test_sessions_with_closed_loop_are_rejected():
    assert error_of({"sessions": {"turns": 2}, "arrival": {"type": "closed_loop", "concurrency": 2}}) == \
        "workload.sessions.turns = 2 with arrival closed_loop is not supported; use turns: 1 or an open-loop arrival"


def test_sessions_with_parallel_samples_are_rejected():
    assert error_of({"sessions": {"turns": 3}, "n": 2}) == \
        "workload.sessions.turns = 3 needs n: 1 and beam_width: 1 (a later turn quotes exactly one answer)"


def test_unknown_trace_format_lists_formats():
    assert error_of({"trace": {"format": "csv", "path": "x"}}) == \
        "workload.trace.format = 'csv': Input should be 'azure', 'mooncake', 'vidur' or 'sharegpt'"


def test_several_problems_are_all_reported():
    message = error_of({"n": 0, "beam_width": 0})
    assert message == ("workload.n = 0: Input should be greater than or equal to 1; "
                       "workload.beam_width = 0: Input should be greater than or equal to 1")


def test_not_a_mapping_is_rejected():
    assert error_of([1, 2]) == "workload: expected a mapping, got [1, 2]"


def test_build_workload_rejects_bad_config_before_reading_anything():
    with pytest.raises(ValueError, match=r"^workload\.num_requests = -5: "):
        build_workload({"num_requests": -5}, rng=np.random.default_rng(0))


def test_sharegpt_defaults_to_all_at_once_and_other_traces_replay_timestamps():
    sharegpt = parse_workload_config({"trace": {"format": "sharegpt", "path": "x.json"}})
    azure = parse_workload_config({"trace": {"format": "azure", "path": "x.csv"}})
    assert sharegpt.arrival_or_default() == AllAtOnceArrival(type="all_at_once")
    assert azure.arrival_or_default() is None


def test_config_object_is_accepted_as_is():
    config = WorkloadConfig(num_requests=3)
    assert parse_workload_config(config) is config


def test_relative_path_resolves_against_base_dir():
    assert resolve_path("sharegpt_small.json", DATA, yaml_path="x") == DATA / "sharegpt_small.json"


def test_missing_file_error_names_yaml_path_and_base_dir(tmp_path):
    with pytest.raises(ValueError) as info:
        resolve_path("nope.csv", tmp_path, yaml_path="workload.trace.path")
    assert str(info.value) == (f"workload.trace.path = 'nope.csv': file not found: {tmp_path / 'nope.csv'} "
                               f"(relative paths resolve against {tmp_path})")


def test_environment_variables_are_expanded_in_paths(monkeypatch):
    monkeypatch.setenv("KVSIM_TEST_DATA", str(DATA))
    assert resolve_path("$KVSIM_TEST_DATA/workload_vidur.csv", None, yaml_path="x") == DATA / "workload_vidur.csv"
