"""An example third-party hloforge plugin: the `groupNorm` layer and the `huber` loss.

Registered through entry points (see pyproject.toml); hloforge imports the modules named
there, `hloforge_groupnorm.layers` and `hloforge_groupnorm.losses`.
"""

from __future__ import annotations

import os

# The small conv net with group norm on 1×28×28 digits: `hloforge train <SPEC>`.
SPEC = os.path.join(os.path.dirname(__file__), "nets", "groupnorm_cnn.toml")
