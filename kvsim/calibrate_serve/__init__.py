"""``kvsim calibrate serve``: fit the engine's time outside the GPU to real serving runs.

``results.py`` reads measured runs (``vllm bench serve`` JSON, LLMServingSim
request logs) and manifests; ``fit.py`` replays them through
``kvsim.simulate`` and fits engine-overhead terms; ``published.py`` holds the
published runs the project checks against; ``cli.py`` is the command.
Input formats: docs/calibrate_serve.md. This package sits above the
simulator (it calls ``kvsim.simulate``); ``kvsim.cost`` never imports it.
"""
