"""``python -m irkit.cli …``: the same as the ``irkit`` command."""

from __future__ import annotations

import sys

from irkit.cli import main

if __name__ == "__main__":
    sys.exit(main())
