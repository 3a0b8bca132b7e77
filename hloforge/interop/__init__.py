"""Weights from and to PyTorch model zoos (torchvision, timm), mapped by tensor name."""

from __future__ import annotations

from hloforge.interop.exporter import export_run, torch_state_dict
from hloforge.interop.importer import import_weights, map_state_dict, read_state_dict

__all__ = ["export_run", "import_weights", "map_state_dict", "read_state_dict", "torch_state_dict"]
