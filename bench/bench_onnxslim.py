"""Alias: ``python bench/bench_onnxslim.py`` is ``python bench/bench_optimize.py --against onnxslim``.

The comparison with onnxslim lives in bench/bench_optimize.py (its second table).
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.argv = [sys.argv[0], "--against", "onnxslim", *sys.argv[1:]]
    runpy.run_path(str(Path(__file__).with_name("bench_optimize.py")), run_name="__main__")
