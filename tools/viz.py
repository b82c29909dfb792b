#!/usr/bin/env python
"""Show an ONNX model: ``python tools/viz.py model.onnx [--format html -o model.html]``.

A thin wrapper around :func:`irkit.viz.cli.main` (also installed as ``irkit-viz``).
"""

import os
import sys

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from irkit.viz.cli import main

    sys.exit(main())
