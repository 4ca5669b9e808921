"""``python -m sim``: the same as the ``decodesim`` command."""

import sys

from sim.cli import main

sys.exit(main())
