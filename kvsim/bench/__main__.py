"""``python -m kvsim.bench``: the benchmark's child runners, or ``kvsim bench`` itself."""

import sys

from kvsim.bench.cli import main

sys.exit(main())
