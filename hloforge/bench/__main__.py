"""`python -m hloforge.bench`: the benchmark's command line (the isolated measurements' child processes run it too)."""

import sys

from hloforge.bench.cli import main

sys.exit(main())
