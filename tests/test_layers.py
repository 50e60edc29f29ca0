"""kvsim's layers point one way, and nothing in kvsim patches kvsim.

Every ``import`` inside ``kvsim/`` (function-level ones too) is read from the
source (an AST walk, nothing is imported) and checked against the layer table
of DESIGN.md:

    specs  <-  kv, workload, cost  <-  sched  <-  sim  <-  fleet  <-  metrics  <-  scenario
           <-  plots  <-  commands (cli, reports, plan, bench, and every cli.py / *_cli.py)

A module may import a module of a lower layer, or of its own unit (its folder
under kvsim/: ``kvsim.kv.manager`` may import ``kvsim.kv.block_pool``); units of
one layer do not import each other (kv, workload and cost know only specs),
except the commands, which may drive one another. A command module lives
next to the code it drives (``kvsim/specs/cli.py``) but sits in the commands
layer. No import cycle at all, and no import of ``calibration`` (the
measurement harness imports kvsim, never the other way).

A new module must be placed: add its unit to ``UNITS`` below.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

KVSIM = Path(__file__).resolve().parent.parent / "kvsim"

# unit (kvsim.<first name>) -> layer; higher layers may import lower ones
LAYER_NAMES = ["specs", "kv, workload, cost", "sched", "sim", "fleet", "metrics", "scenario",
               "plots", "commands"]
UNITS = {
    "kvsim.specs": 0,
    "kvsim.native": 0,               # the import finder of compiled builds: imports no kvsim module
    "kvsim.native.build": 8,         # `kvsim native build | status | clean`
    "kvsim.kv": 1, "kvsim.workload": 1, "kvsim.cost": 1,
    "kvsim.sched": 2,
    "kvsim.sim": 3,
    "kvsim.fleet": 4,
    "kvsim.metrics": 5,
    "kvsim.scenario": 6,
    "kvsim.plots": 7, "kvsim.vllm_outputs": 7,
    "kvsim.cli": 8, "kvsim.__main__": 8, "kvsim.plots_cli": 8, "kvsim.reports": 8,
    "kvsim.plan": 8, "kvsim.bench": 8, "kvsim.view": 8, "kvsim.schema_cli": 8,
    "kvsim.plots_serving": 8, "kvsim.plots_fleet": 8, "kvsim.calibrate_serve": 8,
}
COMMANDS = 8


def module_name(path: Path) -> str:
    parts = path.relative_to(KVSIM.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    path = KVSIM.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, imported module) for every import statement in the file, relative ones resolved."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    tree = ast.parse(path.read_text(), str(path))
    # Imports under `if TYPE_CHECKING:` are for type hints only, never run.
    type_only = {id(n) for block in ast.walk(tree)
                 if isinstance(block, ast.If) and getattr(block.test, "id", None) == "TYPE_CHECKING"
                 for stmt in block.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                # `from kvsim import plots` imports the module kvsim.plots
                target = f"{base}.{alias.name}"
                found.append((node.lineno, target if is_module(target) else base))
    return found


def unit_of(module: str) -> str:
    if module == "kvsim":            # kvsim/__init__.py re-exports the scenario layer's API
        return "kvsim.scenario"
    parts = module.split(".")
    if parts[-1] == "cli" or parts[-1].endswith("_cli"):
        return "commands:" + module
    for depth in range(len(parts), 0, -1):
        if ".".join(parts[:depth]) in UNITS:
            return ".".join(parts[:depth])
    raise KeyError(module)


def layer_of(module: str) -> int:
    unit = unit_of(module)
    return COMMANDS if unit.startswith("commands:") else UNITS[unit]


def allowed(importer: str, imported: str) -> bool:
    a, b = layer_of(importer), layer_of(imported)
    if b < a:
        return True
    return b == a and (a == COMMANDS or unit_of(importer) == unit_of(imported))


MODULES = sorted(KVSIM.rglob("*.py"))
GRAPH = {module_name(p): [(line, m) for line, m in imports_of(p) if m.split(".")[0] == "kvsim"]
         for p in MODULES}


def test_every_kvsim_module_has_a_layer():
    unplaced = []
    for module in GRAPH:
        try:
            layer_of(module)
        except KeyError:
            unplaced.append(module)
    assert unplaced == [], f"modules in no layer (add their unit to UNITS in {__file__}): {unplaced}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_imports_point_down_the_layers(path):
    importer = module_name(path)
    wrong = [f"{path.relative_to(KVSIM.parent)}:{line}: {importer} ({LAYER_NAMES[layer_of(importer)]}) "
             f"imports {imported} ({LAYER_NAMES[layer_of(imported)]})"
             for line, imported in GRAPH[importer] if not allowed(importer, imported)]
    assert wrong == []


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_kvsim_never_imports_calibration(path):
    found = [f"{path.relative_to(KVSIM.parent)}:{line}: imports {m}"
             for line, m in imports_of(path) if m.split(".")[0] == "calibration"]
    assert found == []


def test_there_is_no_import_cycle():
    edges = defaultdict(set)
    for module, targets in GRAPH.items():
        for _, target in targets:
            if target != module and target in GRAPH:
                edges[module].add(target)
    cycles = _strongly_connected(GRAPH, edges)
    assert [sorted(c) for c in cycles if len(c) > 1] == []


def _strongly_connected(nodes, edges) -> list[set]:
    """Tarjan's algorithm, iteratively (no recursion limit)."""
    index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                out.append(component)
    return out


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_nothing_in_kvsim_patches_an_imported_module(path):
    """No ``module.attr = ...`` or ``setattr(module, ...)`` on an imported module: the
    library offers what callers need (``Result.stats``, parameters), never a patched function."""
    tree = ast.parse(path.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            imported |= {a.asname or a.name for a in node.names
                         if is_module(f"{base}.{a.name}") or base.split(".")[0] != "kvsim"}
    patched = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in imported:
                patched.append(f"line {node.lineno}: {t.value.id}.{t.attr} = ...")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" \
                and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id in imported:
            patched.append(f"line {node.lineno}: setattr({node.args[0].id}, ...)")
    assert patched == []


# The checker itself, on made-up edges: it must be able to fail.

@pytest.mark.parametrize("importer, imported, ok", [
    ("kvsim.sched.chunked", "kvsim.kv.manager", True),          # down
    ("kvsim.kv.manager", "kvsim.sched.config", False),          # up
    ("kvsim.kv.manager", "kvsim.kv.block_pool", True),          # own unit
    ("kvsim.cost.fit", "kvsim.workload.config", False),         # a sibling of the same layer
    ("kvsim.cost.validation", "kvsim.scenario", False),         # the cycle issue #12 found
    ("kvsim.cost.cli", "kvsim.reports.calibration", True),      # a command drives a report
    ("kvsim.cost.fitted", "kvsim.cost.cli", False),             # nothing imports a command
    ("kvsim.reports.sharing", "kvsim.plots", True),
    ("kvsim.plots", "kvsim.reports", False),
    ("kvsim.bench.cli", "kvsim.cli", True),                     # commands drive each other
    ("kvsim.scenario.sweep", "kvsim.plan", False),
    ("kvsim", "kvsim.scenario", True),
])
def test_the_layer_rule(importer, imported, ok):
    assert allowed(importer, imported) == ok


def test_the_cycle_finder_finds_a_cycle():
    nodes = ["a", "b", "c", "d"]
    edges = defaultdict(set, {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
    assert sorted(sorted(c) for c in _strongly_connected(nodes, edges) if len(c) > 1) == [["a", "b", "c"]]
