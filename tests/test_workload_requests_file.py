"""The requests file: JSON lines, validated, ordered by (arrival_time, line order)."""

import json
from pathlib import Path

import numpy as np
import pytest

from kvsim.workload import build_workload

DATA = Path(__file__).parent / "data"


def load(name: str = "workload_requests.jsonl", base_dir: Path = DATA):
    return build_workload({"requests_file": name}, rng=np.random.default_rng(0), base_dir=base_dir)


def write(tmp_path: Path, *lines) -> Path:
    path = tmp_path / "reqs.jsonl"
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def error_of(tmp_path: Path, *lines) -> str:
    write(tmp_path, *lines)
    with pytest.raises(ValueError) as info:
        load("reqs.jsonl", tmp_path)
    return str(info.value)


GOOD = {"id": "a", "arrival_time": 0.0, "prompt_token_ids": [1, 2, 3], "max_tokens": 2}


def test_requests_are_ordered_by_arrival_time_then_line_order():
    specs = list(load().requests())
    assert [s.request_id for s in specs] == ["first", "quote", "late"]
    assert load().num_requests == 3 and load().concurrency is None


def test_fields_map_onto_request_spec():
    first, quote, late = load().requests()
    assert first.prompt_token_ids.tolist() == [1, 2, 3, 4] and first.prompt_token_ids.dtype == np.int64
    assert first.output_token_ids.tolist() == [50, 51] and (first.max_tokens, first.priority) == (2, 1)
    assert (quote.after_request_id, quote.think_time_s, quote.max_tokens) == ("first", 0.5, 16)
    assert (late.arrival_time_s, late.output_token_ids, late.priority, late.n) == (2.0, None, 0, 1)


def test_a_later_prompt_quotes_an_earlier_answer_exactly():
    first, quote, _ = load().requests()
    quoted = np.concatenate((first.prompt_token_ids, first.output_token_ids))
    assert np.array_equal(quote.prompt_token_ids[:len(quoted)], quoted)


def test_empty_file_has_zero_requests(tmp_path):
    (tmp_path / "reqs.jsonl").write_text("")
    w = load("reqs.jsonl", tmp_path)
    assert (w.num_requests, list(w.requests())) == (0, [])


def test_single_request(tmp_path):
    write(tmp_path, GOOD)
    assert [s.request_id for s in load("reqs.jsonl", tmp_path).requests()] == ["a"]


def test_unknown_key_is_rejected_with_its_line(tmp_path):
    message = error_of(tmp_path, GOOD, {**GOOD, "id": "b", "max_token": 3})
    assert message.startswith(f"workload.requests_file ({tmp_path / 'reqs.jsonl'} line 2).max_token: unknown key (allowed: ")


def test_wrong_type_is_rejected_with_value(tmp_path):
    assert error_of(tmp_path, {**GOOD, "max_tokens": "2"}) == \
        f"workload.requests_file ({tmp_path / 'reqs.jsonl'} line 1).max_tokens = '2': Input should be a valid integer"


def test_missing_key_is_named(tmp_path):
    bad = dict(GOOD)
    del bad["prompt_token_ids"]
    assert error_of(tmp_path, bad).endswith(".prompt_token_ids: missing (required)")


def test_empty_prompt_is_rejected(tmp_path):
    assert "prompt_token_ids = []: List should have at least 1 item" in error_of(tmp_path, {**GOOD, "prompt_token_ids": []})


def test_output_ids_may_not_outnumber_max_tokens(tmp_path):
    assert error_of(tmp_path, {**GOOD, "output_token_ids": [5, 6, 7]}).endswith(
        ".output_token_ids: has 3 ids but max_tokens is 2; give at most max_tokens ids")


def test_output_ids_may_list_only_the_generated_tokens(tmp_path):
    # The oracle's form for a request that stops at max_model_len before max_tokens.
    write(tmp_path, {**GOOD, "output_token_ids": [5]})
    (spec,) = load("reqs.jsonl", tmp_path).requests()
    assert spec.output_token_ids.tolist() == [5] and spec.max_tokens == 2


def test_integer_ids_are_read_as_their_decimal_strings(tmp_path):
    # vllm_oracle.py load_workload: str(d["id"]).
    write(tmp_path, {**GOOD, "id": 7}, {**GOOD, "id": 8, "after_request_id": 7})
    first, second = load("reqs.jsonl", tmp_path).requests()
    assert (first.request_id, second.request_id, second.after_request_id) == ("7", "8", "7")


def test_an_integer_id_and_its_string_are_the_same_id(tmp_path):
    assert "used twice" in error_of(tmp_path, {**GOOD, "id": 7}, {**GOOD, "id": "7"})


def test_omitted_keys_take_the_oracle_defaults(tmp_path):
    # vllm_oracle.py: arrival_time 0.0, max_tokens 16, priority 0.
    write(tmp_path, {"id": "x", "prompt_token_ids": [1, 2]})
    (spec,) = load("reqs.jsonl", tmp_path).requests()
    assert (spec.arrival_time_s, spec.max_tokens, spec.priority) == (0.0, 16, 0)


def test_a_boolean_id_is_refused(tmp_path):
    assert ".id = True" in error_of(tmp_path, {**GOOD, "id": True})


def test_binary_garbage_names_the_file(tmp_path):
    (tmp_path / "reqs.jsonl").write_bytes(json.dumps(GOOD).encode() + b"\n" + bytes(range(128, 256)))
    with pytest.raises(ValueError) as info:
        load("reqs.jsonl", tmp_path)
    assert str(info.value) == (f"workload.requests_file = {str(tmp_path / 'reqs.jsonl')!r}: not a "
                               f"UTF-8 text file (line 2 cannot be decoded); expected JSON lines, "
                               f"one request each")


def test_generated_ids_follow_the_vllm_oracle_line_scheme():
    # Line i (0-based, blank lines skipped) generates 1_000_000 * (i + 1) + k unless output_token_ids is given.
    bases = {s.request_id: s.output_id_base for s in load().requests()}
    assert bases == {"late": 1_000_000, "first": 2_000_000, "quote": 3_000_000}


def test_large_token_ids_are_allowed(tmp_path):
    write(tmp_path, {**GOOD, "prompt_token_ids": [5, 3_000_000_000]})
    assert next(load("reqs.jsonl", tmp_path).requests()).prompt_token_ids.tolist() == [5, 3_000_000_000]


def test_token_id_beyond_int64_is_rejected(tmp_path):
    assert error_of(tmp_path, {**GOOD, "prompt_token_ids": [1, 2**64]}).endswith(
        f".prompt_token_ids[1] = {2**64}: token ids must be >= 0 and fit in int64")


def test_negative_token_id_is_rejected(tmp_path):
    assert error_of(tmp_path, {**GOOD, "prompt_token_ids": [-1]}).endswith(".prompt_token_ids[0] = -1: token ids must be >= 0")


def test_duplicate_id_is_rejected(tmp_path):
    assert error_of(tmp_path, GOOD, GOOD).endswith("line 2).id = 'a': used twice; ids must be unique")


def test_after_request_id_must_name_an_earlier_line(tmp_path):
    assert error_of(tmp_path, {**GOOD, "after_request_id": "zz"}).endswith(
        ".after_request_id = 'zz': no earlier line has that id; it must name a request above this one")


def test_follower_may_not_arrive_before_its_predecessor(tmp_path):
    message = error_of(tmp_path, {**GOOD, "arrival_time": 3.0},
                       {**GOOD, "id": "b", "arrival_time": 1.0, "after_request_id": "a"})
    assert message.endswith(".arrival_time = 1.0: earlier than that of 'a' (3.0), which it follows; must be >= it")


def test_broken_json_names_its_line(tmp_path):
    assert error_of(tmp_path, GOOD, "{nope").startswith(
        f"workload.requests_file ({tmp_path / 'reqs.jsonl'} line 2): not valid JSON")


def test_negative_arrival_time_is_rejected(tmp_path):
    assert error_of(tmp_path, {**GOOD, "arrival_time": -1.0}).endswith(
        ".arrival_time = -1.0: Input should be greater than or equal to 0")
