"""``kvsim native build | status | clean``: making, listing and removing builds (kvsim/native/__init__.py)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from kvsim.native import (DIRECTIVES, EXT_SUFFIX, HOT_MODULES, PACKAGE_DIR, _manifest, fingerprint,
                          load_problem, native_root, source_path, status)


class NativeError(Exception):
    """A build that cannot be made here: one line for the user."""


def build(modules: tuple[str, ...] = HOT_MODULES, *, jobs: int | None = None,
          package_dir: Path = PACKAGE_DIR, log=print) -> Path:
    """Compile ``modules`` of ``package_dir`` into ``native_root() / fingerprint``; its folder."""
    try:
        import Cython
        from Cython.Build import cythonize
        from setuptools import Distribution, Extension
        from setuptools.command.build_ext import build_ext
    except ImportError as exc:
        raise NativeError(f"kvsim native build needs Cython and setuptools ({exc.name} is not "
                          f"installed): pip install 'kvsim[native]'") from None
    unknown = [m for m in modules if m not in HOT_MODULES]
    if unknown:
        raise NativeError(f"kvsim native build: {', '.join(unknown)} is not a hot module (kvsim.native.HOT_MODULES)")
    missing = [m for m in modules if not source_path(m, package_dir).is_file()]
    if missing:
        raise NativeError(f"kvsim native build: no source for {', '.join(missing)} under {package_dir}")
    fp = fingerprint(package_dir)
    dest = native_root() / fp
    if (made := _manifest(dest)) is not None and sorted(made["modules"]) == sorted(modules):
        log(f"already built: {dest}")
        return dest
    jobs = jobs or len(os.sched_getaffinity(0))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kvsim-native-") as tmp:
        tree = Path(tmp) / "src"
        # The modules (and their declarations) in a package tree of their own,
        # so each gets its dotted name and nothing beside them is compiled.
        for module in modules:
            parts = module.split(".")
            for i in range(1, len(parts)):
                init = tree.joinpath(*parts[:i], "__init__.py")
                init.parent.mkdir(parents=True, exist_ok=True)
                init.touch()
            src = source_path(module, package_dir)
            shutil.copy2(src, tree.joinpath(*parts).with_suffix(".py"))
            if src.with_suffix(".pxd").is_file():
                shutil.copy2(src.with_suffix(".pxd"), tree.joinpath(*parts).with_suffix(".pxd"))
        # Without debug information (Python's flags ask for -g): the same code, a
        # quarter less compile time, 6 MB of modules instead of 32.
        flags = ["-g0"] if os.name == "posix" else []
        exts = [Extension(m, [str(tree.joinpath(*m.split(".")).with_suffix(".py"))],
                          extra_compile_args=flags) for m in modules]
        cwd = os.getcwd()
        os.chdir(tmp)                                # (setuptools reads no project file of ours)
        try:
            exts = cythonize(exts, compiler_directives=DIRECTIVES, include_path=[str(tree)],
                             nthreads=jobs, quiet=True)
            dist = Distribution({"name": "kvsim-native", "ext_modules": exts})
            cmd = build_ext(dist)
            cmd.build_lib = str(Path(tmp) / "out")
            cmd.build_temp = str(Path(tmp) / "obj")
            cmd.parallel = jobs
            cmd.ensure_finalized()
            cmd.run()
        except Exception as exc:                     # Cython's or the compiler's failure
            raise NativeError(f"kvsim native build failed: {type(exc).__name__}: "
                              f"{str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}") from exc
        finally:
            os.chdir(cwd)
        native_root().mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{fp}-", dir=native_root()))
        for m in modules:
            name = m.rsplit(".", 1)[1] + EXT_SUFFIX
            built = Path(tmp, "out", *m.split(".")[:-1], name)
            target = staging.joinpath(*m.split(".")[:-1], name)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(built, target)
        (staging / "manifest.json").write_text(json.dumps({
            "modules": list(modules), "fingerprint": fp, "cython": Cython.__version__,
            "python": sys.version.split()[0], "ext_suffix": EXT_SUFFIX, "directives": DIRECTIVES,
            "sources": str(package_dir), "built": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        }, indent=1) + "\n")
        if dest.exists():                            # a build of other modules of these sources
            shutil.rmtree(dest)
        try:
            staging.rename(dest)                     # whole, or not at all
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            if _manifest(dest) is None:
                raise
    log(f"built {len(modules)} modules in {time.perf_counter() - started:.0f} s: {dest}")
    return dest


def clean() -> int:
    """Remove every build under the root; how many there were."""
    root = native_root()
    if not root.is_dir():
        return 0
    n = 0
    for p in root.iterdir():
        if p.is_dir():
            shutil.rmtree(p)
            n += 1
    return n


# ---------------------------------------------------------------- command line

def add_parser(sub) -> None:
    p = sub.add_parser("native", help="compile the engine's hot modules with Cython (optional), "
                                      "or show / remove builds",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=["build", "status", "clean"], nargs="?", default="status")
    p.add_argument("--jobs", type=int, default=None, help="compiler processes (default: every core)")
    p.set_defaults(func=_main)


def _main(args) -> int:
    from kvsim.cli import UserError
    if args.action == "build":
        try:
            build(jobs=args.jobs)
        except NativeError as exc:
            raise UserError(str(exc)) from None
        return 0
    if args.action == "clean":
        print(f"removed {clean()} build(s) under {native_root()}")
        return 0
    s = status()
    problem = load_problem() if s["built"] and not s["disabled"] else None
    state = ("disabled (KVSIM_NATIVE=0)" if s["disabled"] else
             f"built, but it does not load ({problem}): kvsim native clean && kvsim native build"
             if problem else
             "built: kvsim runs its hot path compiled" if s["built"] else
             "not built for these sources: kvsim runs pure Python (kvsim native build)")
    print(f"sources {s['fingerprint']}: {state}")
    print(f"builds under {s['root']}: {len(s['other_builds']) + s['built']}"
          + (f" ({len(s['other_builds'])} of other sources: kvsim native clean)" if s["other_builds"] else ""))
    return 0
