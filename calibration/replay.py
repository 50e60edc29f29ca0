"""``python -m calibration.replay [--data DIR]``: replay the published vLLM serving runs.

The replay itself is part of kvsim (``kvsim/reports/replay.py``, also run by
``kvsim calibrate report``); this entry point refits the two serving-run
profiles into ``kvsim/cost/profiles/`` and prints the comparison table.
``--data`` is the folder of published tables (default ``$KVSIM_PROFILE_DATA``,
else ``../shared/data/profiles`` seen from the repository root).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from kvsim.cost.published import data_root
from kvsim.cost.published_runs import RTX4090, RTXPRO6000, RUNS  # noqa: F401  (re-exported)
from kvsim.reports.replay import markdown, run_all


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m calibration.replay", description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=None, metavar="DIR", help="folder of published tables")
    args = parser.parse_args(argv)
    root = data_root(args.data)
    with tempfile.TemporaryDirectory() as tmp:
        summary = run_all(Path(tmp), root=root)
    print(markdown(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
