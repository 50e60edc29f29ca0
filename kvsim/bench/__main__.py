"""``python -m kvsim.bench``: the benchmark's child runners, or ``kvsim bench`` itself."""

import sys

if len(sys.argv) > 1 and sys.argv[1] in ("_child", "_attribute", "_profile"):
    # A child imports only what it measures (kvsim/bench/child.py stamps its start).
    from kvsim.bench.child import main as child_main
    child_main(sys.argv[1:])

from kvsim.bench.cli import main  # noqa: E402

sys.exit(main())
