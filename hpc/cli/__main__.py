"""``python -m hpc.cli``: the same entry point as the ``spoolrl`` console script (the package loads once)."""

from __future__ import annotations

import sys

from hpc.cli import main

sys.exit(main())
