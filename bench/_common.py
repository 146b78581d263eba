"""What every bench script shares: where the repository and the results are, and ``mydecide`` imported from this
checkout (the repository root goes first on ``sys.path``).

A script runs with bench/ as its own directory on ``sys.path``, so it starts with ``from _common import ROOT, ...``
before it imports ``mydecide``.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"  # each bench writes RESULTS / "<name>.json"

sys.path.insert(0, str(ROOT))
