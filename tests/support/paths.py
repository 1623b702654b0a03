"""Where the tests find the checkout and the real data (`../shared/data` beside the checkout, or MM_DS_SHARED_DATA).

A module of its own, not conftest.py: tests/gpu has a conftest.py too, and `from conftest import ...` would take
whichever of the two was imported first."""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHARED_DATA = Path(os.environ.get("MM_DS_SHARED_DATA", ROOT.parent / "shared" / "data"))
