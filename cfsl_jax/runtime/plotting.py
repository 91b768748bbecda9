"""Figures drawn with matplotlib's object API: importing the package never changes the user's
matplotlib backend (no ``pyplot``, no ``matplotlib.use``).

    figure, axis = plotting.subplots(figsize=(6, 4))
    axis.plot(x, y)
    plotting.save(figure, "gs://bucket/curve.png")   # rendered by Agg; nothing to close
"""

from __future__ import annotations

import io
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from cfsl_jax.runtime import files


def subplots(nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float] | None = None,
             **subplot_options: Any) -> tuple[Figure, Any]:
    """A ``Figure`` on an Agg canvas and its axes, as ``pyplot.subplots`` returns them."""
    figure = Figure(figsize=figsize)
    FigureCanvasAgg(figure)
    return figure, figure.subplots(nrows, ncols, **subplot_options)


def save(figure: Figure, path: str, dpi: int = 120) -> str:
    """``figure`` saved at ``path`` (local or gs://; the format from its extension, PNG without
    one), written atomically (``files.write_atomic``); returns ``path``."""
    buffer = io.BytesIO()
    extension = files.basename(path).rpartition(".")[2] if "." in files.basename(path) else ""
    figure.savefig(buffer, format=extension.lower() or "png", dpi=dpi)
    files.write_atomic(path, buffer.getvalue())
    return path
