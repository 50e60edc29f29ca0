"""Fleets: replicas and pools of engines in one simulation, routers, the P/D KV link.

Layer: above ``sim`` (it drives engines), below ``metrics``/``scenario``.

* ``config``   the scenario's ``cluster:`` section (pydantic), cross-pool checks
* ``state``    what routers read of a replica (``ReplicaState``) and of a request
* ``routers``  round robin, random, least loaded, KV utilisation, prefix-aware
               (SGLang), session affinity, weighted llm-d scorers, Dynamo's KV router
* ``scorers``  llm-d's scorers; ``prefix_tree`` SGLang's approximate radix tree
* ``links``    KV-transfer links (data/links.yaml) and the transfer-time model
* ``replica``, ``runner``  replicas in one SimPy environment behind a router

docs/fleet.md describes the whole; kvsim/scenario/cluster.py runs a scenario.
"""
