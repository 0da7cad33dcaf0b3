"""One way to get matplotlib for the PNGs every layer and benchmark writes: headless (Agg), imported on demand."""
from __future__ import annotations

from typing import Any


def pyplot() -> Any:
    """`matplotlib.pyplot` on the Agg backend (no display; the backend must be chosen before pyplot is imported)."""
    # deferred: matplotlib only when a figure is drawn
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred: after the backend is chosen, as matplotlib requires

    return plt
