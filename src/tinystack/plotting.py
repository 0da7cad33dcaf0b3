"""One way to get matplotlib for the PNGs every layer and benchmark writes: headless (Agg), imported on demand."""
from __future__ import annotations

from typing import Any


def pyplot() -> Any:
    """`matplotlib.pyplot` on the Agg backend (no display; the backend must be chosen before pyplot is imported)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
