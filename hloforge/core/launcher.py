"""Which process of a launched job this is, read from the launcher's environment alone (no MPI): the
command line asks it before it loads anything, and `hloforge.train.mpi` before it starts MPI."""

from __future__ import annotations

import os
from typing import Any

from hloforge.core.switches import whole_number

SIZE_ENVS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS")
RANK_ENVS = {"PMI_SIZE": "PMI_RANK", "OMPI_COMM_WORLD_SIZE": "OMPI_COMM_WORLD_RANK",
             "SLURM_STEP_NUM_TASKS": "SLURM_PROCID"}


def launched(environ: Any = None) -> tuple[int, int, str]:
    """(rank, size, the variable that said so) from a launcher's environment; (0, 1, "") for a plain run."""
    env = os.environ if environ is None else environ
    for var in SIZE_ENVS:
        size = whole_number(env.get(var, "").strip())
        if size is not None and size > 1:
            return whole_number(env.get(RANK_ENVS[var], "0").strip()) or 0, size, var
    return 0, 1, ""
