"""The shortcuts taken for speed outside the engine give exactly what the plain way gives.

Each test compares a fast path of the run's surroundings (loading, tables,
writing) with the straightforward code it replaced, value for value or byte
for byte.
"""

from __future__ import annotations

import pytest
import yaml

from kvsim.specs import catalog


@pytest.mark.parametrize("kind", ["gpus", "models"])
def test_catalogs_read_with_libyaml_equal_the_pure_python_parse(kind):
    catalog._catalog.cache_clear()
    entries, aliases = catalog._catalog(kind)
    text = (catalog.DATA_DIR / f"{kind}.yaml").read_text(encoding="utf-8")
    plain = yaml.safe_load(text)
    assert entries == plain[kind] and aliases == dict(plain.get("aliases") or {})
    # Same types too (an int read as a float, a date as a string, would compare equal or not show).
    assert repr(entries) == repr(plain[kind])


def test_a_scenario_without_vllm_command_lines_does_not_import_their_tables():
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    code = ("import sys, kvsim; kvsim.load_scenario('scenarios/quickstart.yaml'); "
            "print('kvsim.scenario.vllm_args' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(root)})
    assert out.stdout.strip() == "False"
