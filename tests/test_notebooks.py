"""The teaching notebooks run top to bottom (small sizes) and their .ipynb twins match.

Each ``notebooks/NN_*.py`` (jupytext percent format) is the source; the paired
``.ipynb`` is generated from it (``jupytext --sync``). The test executes the
``.py`` read through jupytext with nbclient, in a kernel of this very
interpreter (``sys.executable -m ipykernel_launcher``), so it works in any
fresh virtual environment that has the test extra, with no kernel registered.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

jupytext = pytest.importorskip("jupytext")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("[0-9][0-9]_*.py"))
TIMEOUT_S = 120


def _kernel_manager():
    from jupyter_client.kernelspec import KernelSpec
    from jupyter_client.manager import KernelManager

    class ThisPythonKernel(KernelManager):
        """A kernel of the interpreter running the tests, whatever kernels are installed."""

        @property
        def kernel_spec(self):
            return KernelSpec(argv=[sys.executable, "-m", "ipykernel_launcher", "-f",
                                    "{connection_file}"],
                              display_name="python3 (tests)", language="python")

    return ThisPythonKernel


def test_there_are_five_notebooks():
    assert [p.name for p in NOTEBOOKS] == [
        "01_kv_cache_limits.py", "02_continuous_batching.py", "03_chunked_prefill.py",
        "04_prefix_caching.py", "05_kv_tiers.py", "06_routing.py"]


@pytest.mark.parametrize("source", NOTEBOOKS, ids=lambda p: p.stem)
def test_paired_ipynb_has_the_same_cells(source):
    paired = source.with_suffix(".ipynb")
    assert paired.exists(), f"{paired.name} missing: run jupytext --sync {source}"
    cells = [(c.cell_type, c.source) for c in jupytext.read(source).cells]
    paired_cells = [(c.cell_type, c.source) for c in jupytext.read(paired).cells]
    assert cells == paired_cells, f"{paired.name} is stale: run jupytext --sync {source}"


@pytest.mark.slow
@pytest.mark.parametrize("source", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(source, monkeypatch):
    monkeypatch.setenv("KVSIM_NOTEBOOK_FAST", "1")
    notebook = jupytext.read(source)
    client = nbclient.NotebookClient(
        notebook, timeout=TIMEOUT_S, kernel_manager_class=_kernel_manager(),
        resources={"metadata": {"path": str(source.parent)}})
    client.execute()   # raises CellExecutionError, with the cell and traceback, on any error
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "no figure was displayed"
