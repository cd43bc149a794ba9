"""The engines a profile reports on, and their display names (trainium-hardware.md §2)."""
from __future__ import annotations

COMPUTE_ENGINES = ("tensor", "vector", "scalar", "gpsimd")
ENGINES = COMPUTE_ENGINES + ("dma",)
ENGINE_NAMES = {"tensor": "TensorE", "vector": "VectorE", "scalar": "ScalarE",
                "gpsimd": "GpSimdE", "dma": "DMA"}
