"""Compiled copies of the engine's hot modules (optional: Cython and a C compiler).

``kvsim native build`` compiles the modules of ``HOT_MODULES`` (the engine's
loop, the schedulers, the KV manager and block pool, the step cost model:
what W1's ``simulate()`` spends its time in) with Cython, as they are: the
same Python source, turned into C by Cython and into extension modules by the
compiler Python was built with. Nothing is written into the package: the
extension modules go to a folder of their own, named by one fingerprint of
every source they were made from (``native_root() / fingerprint``)::

    ~/.cache/kvsim/native/3f2a.../manifest.json
                                   kvsim/sched/paged.cpython-311-x86_64-linux-gnu.so
                                   ...

On ``import kvsim`` (``install()``, from ``kvsim/__init__.py``), the sources'
fingerprint is computed (about a millisecond: they are hashed, not parsed) and,
when a build of exactly these sources exists, a finder placed in front of the
import system loads its extension modules instead of the ``.py`` files. Edit
any one of them and the fingerprint names a build that does not exist: kvsim
runs the plain modules again, all of them, until the next build. Stale
compiled code never runs, and a module is never compiled against another
module's older copy. ``KVSIM_NATIVE=0`` turns the finder off; nothing is
looked up when no build was ever made. A module of the build that does not
load (a damaged file, another machine's build in a shared cache) is said in
one line on stderr, and the plain modules run from then on.

The plain modules are the reference. The tests run them (and
tests/test_native.py builds a few modules and checks a run gives the same bytes),
the exactness suites check them against vLLM, and a compiled build is the same
rules executed by another machine: W1's outputs are the same bytes either way.
What it buys is CPU time, and how much depends on the host (docs/bench.md,
"Compiled modules").
"""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
from pathlib import Path

# The modules of W1's hot path (reports/performance.md, the profiles): the
# engine and its process helpers, every scheduler, the paged KV manager with
# its run and hashing helpers, the step cost model, the trace reader.
HOT_MODULES = (
    "kvsim.sim.admission", "kvsim.sim.client", "kvsim.sim.costing", "kvsim.sim.engine",
    "kvsim.sim.frontend", "kvsim.sim.gc_pause", "kvsim.sim.inbox", "kvsim.sim.records",
    "kvsim.sim.run", "kvsim.sim.steplog",
    "kvsim.sched.async_finish", "kvsim.sched.base", "kvsim.sched.budget", "kvsim.sched.cadence",
    "kvsim.sched.chunked", "kvsim.sched.chunked_connector", "kvsim.sched.chunked_runs",
    "kvsim.sched.config", "kvsim.sched.connector", "kvsim.sched.continuous", "kvsim.sched.errors",
    "kvsim.sched.multistep", "kvsim.sched.orca", "kvsim.sched.paged", "kvsim.sched.queues",
    "kvsim.sched.request", "kvsim.sched.simple_chunking", "kvsim.sched.spec_decode",
    "kvsim.sched.static",
    "kvsim.kv.block_pool", "kvsim.kv.chunk_runs", "kvsim.kv.decode_runs", "kvsim.kv.hashing",
    "kvsim.kv.manager",
    "kvsim.cost.decode_run_costs", "kvsim.cost.roofline", "kvsim.cost.step_model",
    "kvsim.workload.traces",
)

# Cython's reading of the sources: Python 3 semantics, functions that behave
# as Python's (introspection, pickling by name), and the annotations left as
# documentation (typed as C they would refuse a numpy integer where an ``int`` is
# annotated).
DIRECTIVES = {"language_level": 3, "binding": True, "annotation_typing": False}

PACKAGE_DIR = Path(__file__).resolve().parent.parent      # kvsim/
EXT_SUFFIX = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
OFF_VALUES = {"0", "off", "false", "no"}


def native_root() -> Path:
    """Where builds live: ``KVSIM_NATIVE_DIR``, else the user's cache folder."""
    if os.environ.get("KVSIM_NATIVE_DIR"):
        return Path(os.environ["KVSIM_NATIVE_DIR"])
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "kvsim" / "native"


def source_path(module: str, package_dir: Path = PACKAGE_DIR) -> Path:
    return package_dir.joinpath(*module.split(".")[1:]).with_suffix(".py")


def fingerprint(package_dir: Path = PACKAGE_DIR) -> str:
    """One hash of the interpreter's extension ABI and every byte a build may read:
    each hot module's source and its ``.pxd`` declarations, if any. (A build of
    some of them, as the tests make, is named by all of them too: it runs only
    while none of them has changed.)"""
    import hashlib
    h = hashlib.sha256(EXT_SUFFIX.encode())
    for module in HOT_MODULES:
        h.update(b"\0" + module.encode())
        src = source_path(module, package_dir)
        for path in (src, src.with_suffix(".pxd")):
            try:
                h.update(b"\1" + path.read_bytes())
            except FileNotFoundError:
                h.update(b"\2")
    return h.hexdigest()[:24]


# Why this process stopped loading its build (``_NativeFinder.give_up``), if it did.
_failure: str | None = None


class _NativeFinder:
    """Finds the compiled copy of each module of one build (no other module)."""

    def __init__(self, folder: Path, modules: list[str]) -> None:
        self.folder = folder
        self.modules = set(modules)

    def find_spec(self, name, path=None, target=None):
        if name not in self.modules:
            return None
        so = self.folder.joinpath(*name.split(".")).with_name(name.rsplit(".", 1)[1] + EXT_SUFFIX)
        import importlib.util
        loader = _loader_class()(self, name, str(so))
        return importlib.util.spec_from_file_location(name, so, loader=loader)

    def give_up(self, exc: ImportError) -> None:
        """A module of the build does not load (a damaged file, a build from another
        machine): say so once, and let the plain modules run from here on."""
        global _failure
        if self in sys.meta_path:
            sys.meta_path.remove(self)
            _failure = str(exc)
            print(f"kvsim: a compiled module does not load ({exc}); the plain modules run "
                  f"from here on (to rebuild: kvsim native clean && kvsim native build)",
                  file=sys.stderr)


@functools.cache
def _loader_class():
    # Made on first use: ``import kvsim`` without a build imports no importlib module.
    import importlib.machinery
    import importlib.util

    class CompiledLoader(importlib.machinery.ExtensionFileLoader):
        """An extension module's loader that loads the plain module instead when the
        extension does not load (the same source, so the same results: a process
        may then run some modules compiled and the rest plain)."""

        def __init__(self, finder: _NativeFinder, name: str, path: str) -> None:
            super().__init__(name, path)
            self.finder = finder
            self.plain = None

        def create_module(self, spec):
            try:
                return super().create_module(spec)
            except ImportError as exc:
                self.finder.give_up(exc)
            self.plain = importlib.util.find_spec(spec.name)     # the finder is gone: the .py
            return importlib.util.module_from_spec(self.plain)

        def exec_module(self, module):
            if self.plain is None:
                return super().exec_module(module)
            module.__spec__, module.__loader__ = self.plain, self.plain.loader
            return self.plain.loader.exec_module(module)

    return CompiledLoader


def _manifest(folder: Path) -> dict | None:
    import json
    try:
        return json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        return None


def install() -> _NativeFinder | None:
    """Put the finder of the build of these sources in front, if there is one (kvsim/__init__)."""
    if os.environ.get("KVSIM_NATIVE", "").strip().lower() in OFF_VALUES:
        return None
    root = native_root()
    if not root.is_dir():
        return None                               # never built: one stat, nothing hashed
    for finder in sys.meta_path:
        if isinstance(finder, _NativeFinder):
            return finder
    folder = root / fingerprint()
    manifest = _manifest(folder)
    if manifest is None:
        return None
    finder = _NativeFinder(folder, manifest["modules"])
    sys.meta_path.insert(0, finder)
    return finder


def active() -> dict:
    """Which modules of the hot path run compiled in this process, from which build,
    and why the build stopped loading (``failed``), if it did."""
    compiled = sorted(m for m in HOT_MODULES
                      if getattr(sys.modules.get(m), "__file__", "").endswith(EXT_SUFFIX))
    finder = next((f for f in sys.meta_path if isinstance(f, _NativeFinder)), None)
    return {"compiled": compiled, "build": str(finder.folder) if finder else None,
            "failed": _failure}


def status() -> dict:
    """The build of these sources (if any) and every other build under the root."""
    root = native_root()
    current = fingerprint()
    builds = sorted(p.name for p in root.iterdir() if (p / "manifest.json").is_file()) if root.is_dir() else []
    return {"root": str(root), "fingerprint": current, "built": current in builds,
            "disabled": os.environ.get("KVSIM_NATIVE", "").strip().lower() in OFF_VALUES,
            "other_builds": [b for b in builds if b != current]}


def load_problem() -> str | None:
    """Why the build of these sources does not load, or None when every module of
    it loads compiled (each imported in a fresh process, as a run would)."""
    made = _manifest(native_root() / fingerprint())
    if made is None:
        return "no build of these sources"
    code = ("import importlib, json, sys\n"
            "from kvsim import native\n"
            "for m in sys.argv[1:]:\n"
            "    importlib.import_module(m)\n"
            "print(json.dumps(native.active()))")
    import json
    import subprocess
    out = subprocess.run([sys.executable, "-c", code, *made["modules"]], capture_output=True,
                         text=True, env={**os.environ, "KVSIM_NATIVE": "1"},
                         cwd=str(PACKAGE_DIR.parent))
    if out.returncode != 0:
        return (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1]
    ran = json.loads(out.stdout.splitlines()[-1])
    plain = sorted(set(made["modules"]) - set(ran["compiled"]))
    return ran["failed"] or (f"{', '.join(plain)} loaded plain" if plain else None)
