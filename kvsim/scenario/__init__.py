"""Scenarios: the YAML schema, loading and validation, sweeps, and running one."""

from kvsim.scenario.loader import LoadedScenario, load_scenario
from kvsim.scenario.schema import Scenario, ScenarioError
from kvsim.scenario.simulate import Result, simulate

__all__ = ["LoadedScenario", "Result", "Scenario", "ScenarioError", "load_scenario", "simulate"]
