import os
import sys
from pathlib import Path

from hypothesis import settings

# The tests check the plain modules, the reference, even where a compiled build
# of these sources exists (kvsim native build); KVSIM_NATIVE=1 runs them on it.
os.environ.setdefault("KVSIM_NATIVE", "0")

sys.path.insert(0, str(Path(__file__).parent))

# In CI the property tests explore a fixed, derandomised set of examples, so a
# submission's result does not depend on luck; locally they explore anew.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
