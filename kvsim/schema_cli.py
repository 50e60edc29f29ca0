"""``kvsim schema``: the scenario file's JSON Schema, for editors (docs/scenarios.md).

    kvsim schema > kvsim-scenario.schema.json

The schema is pydantic's (``Scenario.model_json_schema()``), with the
``workload:`` section's own models (``kvsim/workload/config.py``) filled in,
so an editor completes and checks every key, including ``workload.bench``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def scenario_json_schema() -> dict:
    """The JSON Schema (draft 2020-12) of a scenario file."""
    from kvsim.scenario.schema import Scenario
    from kvsim.workload.config import WorkloadConfig

    schema = Scenario.model_json_schema()
    workload = WorkloadConfig.model_json_schema()
    defs = schema.setdefault("$defs", {})
    for name, definition in workload.pop("$defs", {}).items():
        if name in defs and defs[name] != definition:
            raise RuntimeError(f"scenario and workload schemas both define {name!r}")
        defs[name] = definition
    # Expanded when the file is read (kvsim/scenario/vllm_args), so not a model field.
    workload["properties"]["bench_args"] = {
        "type": "string", "description": "vllm bench serve flags; the whole workload (docs/vllm.md)"}
    workload["title"] = "WorkloadConfig"
    defs["WorkloadConfig"] = workload
    schema["properties"]["workload"] = {"$ref": "#/$defs/WorkloadConfig",
                                        "description": "what arrives at the engine (docs/workloads.md)"}
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema,
            "title": "kvsim scenario"}


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "schema", help="print the scenario JSON Schema (for editors)",
        description="Print the JSON Schema of a scenario file, e.g. for VS Code's YAML extension "
                    "(docs/scenarios.md, 'Editor support').")
    p.add_argument("--out", type=Path, metavar="FILE.json", help="write it here instead of stdout")
    p.set_defaults(func=schema_command)


def schema_command(args: argparse.Namespace) -> int:
    text = json.dumps(scenario_json_schema(), indent=2) + "\n"
    if args.out:
        args.out.write_text(text)
        print(args.out)
    else:
        print(text, end="")
    return 0
