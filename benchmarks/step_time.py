"""Median ms per Adam train step: hloforge (xla, iree) vs jax.jit vs PyTorch eager, plus dispatch overhead.

    python benchmarks/step_time.py [--nets mnist-mlp,mnist-cnn] [--batch 128] [--json out.json]

The benchmark itself lives in `hloforge.bench` (also `python -m hloforge.bench`).
"""

import sys

from hloforge.bench import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
