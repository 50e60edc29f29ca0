"""Compiled builds of the hot modules (kvsim/native): used only for their own sources.

A build is found by the fingerprint of every hot module's source, so an edit
makes kvsim run the plain modules again; a compiled run gives the plain run's
bytes. The build tests need Cython (the ``test`` extra) and a C compiler, and
compile two modules of a copy of the package (about ten seconds).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import kvsim
from kvsim import native

ROOT = Path(kvsim.__file__).resolve().parents[1]
SOME = ("kvsim.kv.hashing", "kvsim.sched.paged")      # small, and on every run's path


def _run(code: str, tree: Path, root: Path, **env) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PYTHONPATH": str(tree), "KVSIM_NATIVE_DIR": str(root),
               "KVSIM_NATIVE": "1", **env}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=environ, cwd=tree, timeout=300)
    assert out.returncode == 0, out.stderr
    return out


def _python(code: str, tree: Path, root: Path, **env) -> str:
    return _run(code, tree, root, **env).stdout


RUN = """
import json, kvsim
from kvsim import native
r = kvsim.simulate("scenarios/quickstart.yaml", overrides=["workload.num_requests=60"])
print(json.dumps({"compiled": native.active()["compiled"],
                  "requests": r.requests.to_csv(), "steps": r.steps.to_csv()}))
"""


def _can_compile() -> bool:
    try:
        import Cython  # noqa: F401
    except ImportError:
        return False
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(cc) is not None


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A copy of the package with two modules built (in a root of its own)."""
    if not _can_compile():
        pytest.skip("no Cython or no C compiler (pip install 'kvsim[native]'; apt-get install gcc)")
    tmp = tmp_path_factory.mktemp("native")
    tree = tmp / "tree"
    shutil.copytree(ROOT / "kvsim", tree / "kvsim",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copytree(ROOT / "scenarios", tree / "scenarios")
    root = tmp / "builds"
    _python(f"from kvsim.native.build import build; build({SOME!r}, jobs=2)", tree, root)
    return tree, root


def test_no_build_means_no_finder(tmp_path, monkeypatch):
    monkeypatch.setenv("KVSIM_NATIVE", "1")
    monkeypatch.setenv("KVSIM_NATIVE_DIR", str(tmp_path / "never-built"))
    assert native.install() is None
    assert not (tmp_path / "never-built").exists()


def test_the_fingerprint_reads_every_hot_source(tmp_path):
    shutil.copytree(ROOT / "kvsim", tmp_path / "kvsim", ignore=shutil.ignore_patterns("__pycache__"))
    before = native.fingerprint(tmp_path / "kvsim")
    assert before == native.fingerprint(ROOT / "kvsim")          # the same bytes, the same build
    for module in ("kvsim.sim.engine", "kvsim.workload.traces"):
        path = native.source_path(module, tmp_path / "kvsim")
        path.write_text(path.read_text() + "\n# edited\n")
        after = native.fingerprint(tmp_path / "kvsim")
        assert after != before
        before = after
    (tmp_path / "kvsim" / "sched" / "request.pxd").write_text("# declarations\n")
    assert native.fingerprint(tmp_path / "kvsim") != before


def test_a_build_runs_compiled_and_gives_the_plain_bytes(built):
    tree, root = built
    compiled = json.loads(_python(RUN, tree, root))
    plain = json.loads(_python(RUN, tree, root, KVSIM_NATIVE="0"))
    assert compiled["compiled"] == sorted(SOME)
    assert plain["compiled"] == []
    assert compiled["requests"] == plain["requests"] and compiled["steps"] == plain["steps"]


def test_after_an_edit_the_plain_modules_run(built, tmp_path):
    tree, root = built
    edited = tmp_path / "edited"
    shutil.copytree(tree, edited)
    # Not one of the compiled modules: any hot source names another build.
    path = native.source_path("kvsim.sched.chunked", edited / "kvsim")
    path.write_text(path.read_text() + "\n# edited\n")
    assert json.loads(_python(RUN, edited, root))["compiled"] == []
    assert json.loads(_python(RUN, tree, root))["compiled"] == sorted(SOME)


def test_a_build_that_does_not_load_runs_the_plain_modules(built, tmp_path):
    """A damaged extension module (here cut to nothing; or a build from another
    machine's libraries): one line on stderr, then the plain modules, the same bytes."""
    tree, root = built
    damaged = tmp_path / "damaged"
    shutil.copytree(root, damaged)
    next(damaged.rglob("paged" + native.EXT_SUFFIX)).write_bytes(b"")
    out = _run(RUN, tree, damaged)
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("kvsim: a compiled module does "
                                                                  "not load (")
    assert "the plain modules run from here on" in out.stderr
    run = json.loads(out.stdout)
    assert "kvsim.sched.paged" not in run["compiled"]
    plain = json.loads(_python(RUN, tree, root, KVSIM_NATIVE="0"))
    assert run["requests"] == plain["requests"] and run["steps"] == plain["steps"]
    # `kvsim native status` and the bench's Machine line say so too.
    status = _run("from kvsim.cli import main; main(['native', 'status'])", tree, damaged).stdout
    assert "built, but it does not load (" in status and "paged" in status
    code = _python("from kvsim.bench.render import engine_code; print(engine_code())", tree, damaged)
    assert code.startswith("the build of these sources does not load (")


def test_status_says_whether_these_sources_are_built(built):
    tree, root = built
    out = subprocess.run([sys.executable, "-m", "kvsim", "native", "status"], capture_output=True,
                         text=True, cwd=tree, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(tree), "KVSIM_NATIVE_DIR": str(root),
                              "KVSIM_NATIVE": "1"})
    assert out.returncode == 0 and "built: kvsim runs its hot path compiled" in out.stdout


def test_a_build_without_cython_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "Cython", None)         # import Cython fails
    monkeypatch.setenv("KVSIM_NATIVE_DIR", str(tmp_path))
    from kvsim.native.build import NativeError, build
    with pytest.raises(NativeError, match=r"needs Cython .* pip install 'kvsim\[native\]'"):
        build(SOME)


def test_only_hot_modules_are_built(tmp_path, monkeypatch):
    pytest.importorskip("Cython")
    monkeypatch.setenv("KVSIM_NATIVE_DIR", str(tmp_path))
    from kvsim.native.build import NativeError, build
    with pytest.raises(NativeError, match="kvsim.view is not a hot module"):
        build(("kvsim.view",))


def test_the_bench_says_which_code_ran(built, monkeypatch, tmp_path):
    from kvsim.bench.render import engine_code
    monkeypatch.setenv("KVSIM_NATIVE", "1")
    monkeypatch.setenv("KVSIM_NATIVE_DIR", str(tmp_path / "none"))
    assert engine_code() == "pure Python (no compiled build of these sources)"
    monkeypatch.setenv("KVSIM_NATIVE", "0")
    assert engine_code() == "pure Python (KVSIM_NATIVE=0)"
