import sys

from kvsim.cli import main

sys.exit(main())
