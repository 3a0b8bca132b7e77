"""`python -m hloforge`: the `hloforge` command, for an environment whose scripts directory is not on PATH."""

import sys

from hloforge.cli import main

sys.exit(main())
