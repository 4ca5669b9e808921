"""The measuring harness, moved into the package (sim/calibrate/harness.py) so that
`decodesim calibrate` and these scripts time alike; this file keeps ``from harness import ...``
working for the scripts in calibration/ and validation/, run from a checkout."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.calibrate.harness import *  # noqa: E402,F401,F403
from sim.calibrate.harness import _run  # noqa: E402,F401
