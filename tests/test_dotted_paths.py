"""Dotted paths with list items (kvsim/scenario/dotted.py): ``--set cluster.pools[1].replicas=3``
and a sweep's ``cluster.pools[0].replicas: [1, 2]`` set an item of a list the scenario holds,
and name the path, the list's size and the index when they cannot."""

import copy

import pytest
from pydantic import BaseModel

from kvsim.scenario.dotted import join_path, split_path
from kvsim.scenario.loader import load_scenario
from kvsim.scenario.schema import ScenarioError, parse_overrides
from kvsim.scenario.sweep import SweepError, expand_sweep, schema_path_error, validate_sweep

PD = {
    "name": "pd", "seed": 0, "model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm"},
    "engine": {"max_num_batched_tokens": 512, "max_model_len": 2048},
    "cost_model": {"type": "roofline"},
    "workload": {"num_requests": 10, "arrival": {"type": "poisson", "rate": 5.0},
                 "prompt_len": {"type": "fixed", "value": 100},
                 "output_len": {"type": "fixed", "value": 8}},
    "cluster": {"pools": [{"name": "prefill", "role": "prefill", "replicas": 1},
                          {"name": "decode", "role": "decode", "replicas": 1}],
                "link": "roce-400g"},
}


@pytest.mark.parametrize("path, parts", [
    ("engine.block_size", ["engine", "block_size"]),
    ("cluster.pools[1].replicas", ["cluster", "pools", 1, "replicas"]),
    ("a.b[0][12].c", ["a", "b", 0, 12, "c"]),
    ("cluster.pools[0]", ["cluster", "pools", 0]),
])
def test_a_path_splits_into_keys_and_indices_and_joins_back(path, parts):
    assert split_path(path) == parts
    assert join_path(parts) == path


@pytest.mark.parametrize("path", ["", "engine..x", "a.[0]", "a[0]x", "a[-1]", "a[x]", "a]", "[0]", 3, None])
def test_what_is_not_a_path(path):
    assert split_path(path) is None


def test_set_enters_an_item_of_a_list():
    sc = load_scenario(copy.deepcopy(PD), overrides=parse_overrides(
        ["cluster.pools[1].replicas=3", "cluster.pools[0].engine.max_num_seqs=64"]))
    pools = sc.scenario.cluster["pools"]
    assert [p["replicas"] for p in pools] == [1, 3]
    assert pools[0]["engine"] == {"max_num_seqs": 64} and "engine" not in pools[1]


@pytest.mark.parametrize("item, message", [
    ("cluster.pools[2].replicas=3", "cluster.pools[2].replicas: cluster.pools has items 0-1; there is no [2]"),
    ("cluster.link[0]=x", "cluster.link[0]: cluster.link is 'roce-400g', not a list; [0] names an item"),
    ("cluster.router[0].x=1", "cluster.router[0].x: cluster.router is not in the scenario; [0] names an item"),
    ("cluster.pools[0].name.x=1", "cluster.pools[0].name.x: cannot set inside 'name', which is 'prefill', "
                                  "not a mapping"),
    ("cluster.pools[0]x=1", "cluster.pools[0]x: not a dotted path like engine.block_size or "
                            "cluster.pools[0].replicas"),
])
def test_set_names_what_is_wrong(item, message):
    with pytest.raises(ScenarioError) as err:
        load_scenario(copy.deepcopy(PD), overrides=parse_overrides([item]))
    assert message in str(err.value)


def test_a_sweep_over_a_pools_replicas_loads_every_point():
    data = {**copy.deepcopy(PD), "sweep": {"grid": {"cluster.pools[0].replicas": [1, 2],
                                                    "cluster.pools[1].replicas": [1, 3]}}}
    points = validate_sweep(data)
    assert [[p["replicas"] for p in pt.scenario["cluster"]["pools"]] for pt in points] == \
        [[1, 1], [1, 3], [2, 1], [2, 3]]
    assert PD["cluster"]["pools"][0]["replicas"] == 1           # (the base is not changed)


@pytest.mark.parametrize("grid, message", [
    ({"cluster.pools[2].replicas": [1]}, "sweep.grid.cluster.pools[2].replicas: cluster.pools has items 0-1"),
    ({"cluster.link[0]": [1]}, "sweep.grid.cluster.link[0]: cluster.link is 'roce-400g', not a list"),
    ({"cluster.pools": [[]], "cluster.pools[0].replicas": [1]},
     "sweep.grid.cluster.pools[0].replicas: overlaps sweep.grid.cluster.pools"),
    ({"cluster.pools[0].name.x": [1]}, "cluster.pools[0].name is 'prefill', not a mapping"),
])
def test_a_sweep_names_what_is_wrong(grid, message):
    with pytest.raises(SweepError) as err:
        expand_sweep({**copy.deepcopy(PD), "sweep": {"grid": grid}})
    assert message in str(err.value)


class Item(BaseModel):
    x: int = 0


class Root(BaseModel):
    items: list[Item] | None = None
    sizes: list[int] = []


def test_the_schema_check_goes_into_a_list_of_models():
    assert schema_path_error(Root, "items[0].x") is None
    assert schema_path_error(Root, "items[3].nope") == "items[3] has no key 'nope'; allowed: x"
    assert schema_path_error(Root, "sizes[1]") is None           # (not a model: the loader judges)
    assert schema_path_error(Root, "nope[0]") == "the scenario has no key 'nope'; allowed: items, sizes"
