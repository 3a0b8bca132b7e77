"""`python -m hloforge.cli`: the `hloforge` command."""

import sys

from hloforge.cli import main

sys.exit(main())
