"""Scenario YAML is read strictly: duplicate keys refused, scientific notation read as numbers."""

from __future__ import annotations

import pytest

import kvsim
from kvsim.scenario.schema import ScenarioError, parse_overrides
from kvsim.scenario.yamlio import YamlError, load_yaml, read_yaml_file


@pytest.mark.parametrize("text, value", [
    ("1e3", 1000), ("1E6", 1_000_000), ("1.5e3", 1500), ("1.0e+3", 1000), ("-2e2", -200),
    ("2.5e-1", 0.25), ("1e-3", 0.001), ("1.5", 1.5), ("2.0", 2.0), ("-.5", -0.5), ("12", 12),
    ("1e400", float("inf")), ("'1e3'", "1e3"), ("1e", "1e"), ("e3", "e3"), ("v1.2", "v1.2"),
])
def test_numbers_are_read_as_yaml_1_2_does(text, value):
    got = load_yaml(f"a: {text}", where="t")["a"]
    assert got == value and type(got) is type(value)


def test_a_whole_number_too_large_for_int64_stays_a_float():
    assert load_yaml("a: 1e19", where="t")["a"] == 1e19 and isinstance(load_yaml("a: 1e19", where="t")["a"], float)


def test_a_duplicate_key_names_the_file_line_and_key():
    with pytest.raises(YamlError) as info:
        load_yaml("name: a\nengine:\n  block_size: 16\n  block_size: 32\n", where="s.yaml")
    assert str(info.value) == ("s.yaml: not valid YAML: duplicate key 'block_size' (first given on "
                               "line 3); each key may appear once in a mapping (line 4, column 3)")


def test_a_duplicate_key_in_a_flow_mapping_is_refused():
    with pytest.raises(YamlError, match="duplicate key 'x'"):
        load_yaml("e: {x: 1, x: 2}", where="t")


def test_merge_keys_may_be_overridden():
    assert load_yaml("b: &d {c: 1, e: 2}\na: {<<: *d, c: 3}", where="t")["a"] == {"c": 3, "e": 2}


def test_a_binary_file_is_named(tmp_path):
    (tmp_path / "s.yaml").write_bytes(b"name: x\n\xff\xfe\x00garbage")
    with pytest.raises(YamlError, match=r"s.yaml: not a text file \(a NUL byte at offset 10\)"):
        read_yaml_file(tmp_path / "s.yaml")


def test_an_undecodable_file_is_named(tmp_path):
    (tmp_path / "s.yaml").write_bytes(b"name: \xff\xfe")
    with pytest.raises(YamlError, match=r"s.yaml: not a UTF-8 text file \(byte 6 cannot be decoded\)"):
        read_yaml_file(tmp_path / "s.yaml")


def test_an_empty_scenario_file_is_refused(tmp_path):
    (tmp_path / "s.yaml").write_text("# only a comment\n")
    with pytest.raises(ScenarioError, match=r"s.yaml: the scenario file is empty"):
        kvsim.load_scenario(tmp_path / "s.yaml")


def test_a_scenario_folder_is_refused(tmp_path):
    with pytest.raises(ScenarioError, match="is a folder; give a YAML file"):
        kvsim.load_scenario(tmp_path)


def test_num_requests_in_scientific_notation_is_a_count(tmp_path):
    (tmp_path / "s.yaml").write_text("workload: {num_requests: 1e3}\n")
    assert kvsim.load_scenario(tmp_path / "s.yaml").workload.num_requests == 1000


def test_set_values_are_read_the_same_way():
    assert parse_overrides(["workload.num_requests=2e3"]) == [("workload.num_requests", 2000)]


def test_malformed_set_value_is_one_line_naming_the_key():
    with pytest.raises(ScenarioError) as info:
        parse_overrides(["engine.block_size=[1,"])
    message = str(info.value)
    assert message.startswith("--set engine.block_size: not valid YAML: ") and "\n" not in message
