"""What an installed kvsim finds inside its own package: the catalogs and the fitted profiles.

The profiles are package data (``kvsim/cost/profiles/*.json``, declared in
pyproject.toml), so a scenario names one by its stem and it resolves the same
from any working directory, with no checkout around it.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

import kvsim
from kvsim.cost import fitted
from kvsim.cost.fitted import PROFILE_DIR, load_profile, resolve_profile_path

REPO = Path(__file__).resolve().parent.parent


def test_the_profile_folder_is_inside_the_kvsim_package():
    from kvsim.cost.distserve import DATA_DIR
    package = Path(kvsim.__file__).resolve().parent
    assert PROFILE_DIR.resolve().is_relative_to(package)
    assert DATA_DIR.resolve().is_relative_to(package) and DATA_DIR.parent == PROFILE_DIR
    assert PROFILE_DIR == Path(fitted.__file__).with_name("profiles")


def test_pyproject_ships_every_data_file_the_package_reads():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    data = config["package-data"]
    # profiles/distserve/: DistServe's coefficient files and their licence (cost/distserve.py)
    assert data["kvsim.cost"] == ["profiles/*.json", "profiles/distserve/*"]
    assert data["kvsim.specs"] == ["data/*.yaml"]
    # calibration/ is a repository tool that imports kvsim; it is not installed with it
    assert config["packages"]["find"]["include"] == ["kvsim*"]


def test_a_profile_name_resolves_to_the_shipped_file_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = resolve_profile_path("a100-80gb-sxm_llama-3-8b_tp1")
    assert path == PROFILE_DIR / "a100-80gb-sxm_llama-3-8b_tp1.json"
    profile = load_profile("a100-80gb-sxm_llama-3-8b_tp1")
    assert (profile["gpu"], profile["model"], profile["tp"]) == ("a100-80gb-sxm", "llama-3-8b", 1)
    assert profile == json.loads(path.read_text())


def test_a_path_to_a_json_file_wins_over_a_shipped_name(tmp_path):
    mine = tmp_path / "mine.json"
    mine.write_text((PROFILE_DIR / "h100-sxm_llama-2-7b_tp1.json").read_text())
    assert resolve_profile_path(str(mine)) == mine


def test_an_unknown_profile_name_lists_the_shipped_ones():
    with pytest.raises(ValueError) as err:
        resolve_profile_path("h900_llama-9_tp1")
    message = str(err.value)
    assert message.startswith("cost_model.profile: 'h900_llama-9_tp1' is neither a JSON file nor a "
                              "shipped profile; available: a100-80gb-pcie_yi-34b_tp2, ")
    assert "h100-sxm_llama-2-7b_tp1" in message


def test_the_fitted_scenario_runs_from_another_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = kvsim.simulate(REPO / "scenarios" / "fitted_a100.yaml",
                            overrides=["workload.num_requests=5"])
    assert result.summary["completed"] == 5
    # the step times are the shipped profile's, not the roofline's
    from kvsim.cost.fitted import fitted_cost_model
    sc = result.scenario
    shipped = fitted_cost_model(load_profile("a100-80gb-sxm_llama-3-8b_tp1"), sc.model, sc.gpu)
    first = result.steps.iloc[0]
    assert first["num_decode_tokens"] == 0
    prompt = int(result.requests.sort_values("arrival_time_s")["num_prompt_tokens"].iloc[0])
    from kvsim.cost import BatchShape
    assert first["duration_s"] == shipped.step_time(BatchShape.from_lists([prompt], [0]))


AUDIT = """
import site, sys
import kvsim
from kvsim.scenario import load_scenario, simulate
opened = []
sys.addaudithook(lambda event, args: opened.append(str(args[0])) if event == "open" else None)
simulate(load_scenario(sys.argv[1])).write(sys.argv[2])
python = {sys.prefix, sys.base_prefix, *site.getsitepackages()}
for path in sorted(set(opened)):
    if not any(path.startswith(root) for root in python):
        print(path)
"""


@pytest.mark.parametrize("name", ["fitted_a100", "chunk_size_itl", "pd_distserve"])
def test_a_run_reads_no_file_but_the_packages_and_its_inputs(tmp_path, name):
    """At run time the library opens its own package files (catalogs, profiles), the
    scenario and the files it names, and what it writes: nothing else (an audit hook
    sees every open() of the simulation and the writing of its tables)."""
    import os
    import subprocess
    import sys
    scenario = REPO / "scenarios" / f"{name}.yaml"
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-c", AUDIT, str(scenario), str(out)], cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    package = str(Path(kvsim.__file__).resolve().parent)
    # /sys, /proc, /dev: the machine, as libraries probe it (numexpr reads the cgroup's CPU quota)
    outside = [p for p in run.stdout.splitlines()
               if not p.startswith((package, str(scenario.parent), str(out), "/sys/", "/proc/", "/dev/"))]
    assert outside == []
    assert str(scenario) in run.stdout.splitlines()
