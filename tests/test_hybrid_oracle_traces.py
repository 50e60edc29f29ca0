"""The hybrid KV manager against golden traces of the real vLLM 0.33 scheduler.

Each folder in tests/golden/hybrid_oracle/ is a fake model whose layers mix
KV-cache types (``config.json`` ``layers``), a requests file, the KV-cache
groups vLLM made of the layers (``groups.json``) and the step trace the real
scheduler recorded (``expected.jsonl``; ``tests/golden/oracle/run_hybrid_cases.py``).
kvsim groups the same layers with ``kvsim.specs.kv_groups`` and must make the
same groups, then run the same trace, step by step and on the fast path.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import kvsim
from kvsim.scenario.loader import load_scenario
from kvsim.specs.kv_groups import CHUNKED, FULL, MAMBA, SLIDING, LayerKVSpec, get_kv_cache_groups
from test_oracle_traces import first_difference, scenario_for

GOLDEN = Path(__file__).parent / "golden" / "hybrid_oracle"
CASES = sorted(p.parent.name for p in GOLDEN.glob("*/expected.jsonl"))
VLLM_KIND = {"FullAttentionSpec": FULL, "SlidingWindowSpec": SLIDING,
             "ChunkedLocalAttentionSpec": CHUNKED, "MambaSpec": MAMBA}


def layer_specs(config: dict) -> list[LayerKVSpec]:
    """The driver's fake layers: 8 bytes of KV per token, Mamba states of one page."""
    bs = config["block_size"]
    page = 8 * bs
    mode = "align" if config.get("enable_prefix_caching", True) else "none"
    out = []
    for layer in config["layers"]:
        kind, _, arg = layer.partition(":")
        if kind == "full":
            out.append(LayerKVSpec(FULL, bs, page))
        elif kind == "sliding":
            out.append(LayerKVSpec(SLIDING, bs, page, sliding_window=int(arg)))
        elif kind == "chunked":
            out.append(LayerKVSpec(CHUNKED, bs, page, attention_chunk_size=int(arg)))
        else:
            out.append(LayerKVSpec(MAMBA, bs, page, mamba_cache_mode=mode))
    return out


def loaded(case: Path):
    config = json.loads((case / "config.json").read_text())
    groups = get_kv_cache_groups(layer_specs(config), config["disable_hybrid_kv_cache_manager"])
    sc = load_scenario(scenario_for(case))
    return sc, groups, dataclasses.replace(
        sc, sched_config=dataclasses.replace(sc.sched_config, kv_groups=groups))


def test_there_are_hybrid_cases():
    assert len(CASES) >= 8


@pytest.mark.parametrize("name", CASES)
def test_kvsim_groups_the_layers_as_vllm(name):
    _, groups, _ = loaded(GOLDEN / name)
    want = json.loads((GOLDEN / name / "groups.json").read_text())
    got = [{"layers": list(g.layers), "kind": g.kind} for g in groups.groups]
    assert got == [{"layers": w["layers"], "kind": VLLM_KIND[w["kind"]]} for w in want]


@pytest.mark.parametrize("fast_path", [False, True], ids=["step", "fast"])
@pytest.mark.parametrize("name", CASES)
def test_hybrid_manager_matches_vllm_step_by_step(name, fast_path):
    case = GOLDEN / name
    expected = [json.loads(line) for line in (case / "expected.jsonl").read_text().splitlines() if line]
    _, _, sc = loaded(case)
    steps: list[dict] = []
    kvsim.simulate(sc, trace=steps.append, fast_path=fast_path)
    assert first_difference(expected, steps) is None
