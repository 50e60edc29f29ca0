"""kvsim: a discrete-event simulator of KV-cache management in LLM serving engines.

    import kvsim
    result = kvsim.simulate("scenarios/quickstart.yaml")
    print(result.summary["p99_itl_ms"])
"""

__version__ = "0.1.0"

# A compiled build of these very sources, if one was made (kvsim native build),
# runs the hot path instead of the .py files; else nothing changes (kvsim/native).
from kvsim.native import install as _install_native

_install_native()

__all__ = ["load_scenario", "simulate", "Result", "ScenarioError"]


def __getattr__(name):
    # Imported lazily so `import kvsim` stays cheap for the CLI and for tools
    # that only need one folder (e.g. kvsim.specs).
    if name in __all__:
        import kvsim.scenario as scenario
        return getattr(scenario, name)
    raise AttributeError(f"module 'kvsim' has no attribute {name!r}")
