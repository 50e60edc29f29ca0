"""``kvsim schema``: the JSON Schema editors check scenario files with."""

import json
from pathlib import Path

import pytest
import yaml

from kvsim.cli import main
from kvsim.schema_cli import scenario_json_schema

jsonschema = pytest.importorskip("jsonschema")
# Every scenario file; `kvsim calibrate serve` manifests (*.manifest.yaml) are not scenarios.
SCENARIOS = sorted(p for p in (Path(__file__).resolve().parent.parent / "scenarios").rglob("*.yaml")
                   if not p.name.endswith(".manifest.yaml"))


def validator():
    schema = scenario_json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.name)
def test_every_example_scenario_is_valid_under_the_schema(path):
    errors = list(validator().iter_errors(yaml.safe_load(path.read_text()) or {}))
    assert not errors, [e.message for e in errors]


@pytest.mark.parametrize("data, message", [
    ({"engine": {"max_num_seq": 8}}, "Additional properties are not allowed ('max_num_seq'"),
    ({"workload": {"bench": {"request_rate": "fast"}}}, "{'request_rate': 'fast'} is not valid"),
    ({"workload": {"arrival": {"type": "burst", "rate": 1}}}, "'burst'"),
])
def test_the_schema_catches_what_the_loader_refuses(data, message):
    errors = [e.message for e in validator().iter_errors(data)]
    assert any(message in e for e in errors), errors


def test_serve_args_and_bench_args_are_known_keys():
    assert not list(validator().iter_errors({"engine": {"serve_args": "--max-num-seqs 8"},
                                              "workload": {"bench_args": "--num-prompts 5"}}))


def test_kvsim_schema_prints_json(capsys):
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["properties"]["workload"]["$ref"] == "#/$defs/WorkloadConfig"
