"""What the cost model's plots share: a matplotlib figure on the non-interactive Agg backend,
one look (font sizes, grid) and saving by suffix.

Matplotlib is imported lazily: the cost model itself never needs it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["is_png", "new_axes", "save_figure"]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

#: Font sizes used by every plot (points).
STYLE: dict[str, float] = {"font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10,
                           "xtick.labelsize": 9, "ytick.labelsize": 9, "legend.fontsize": 8.5}


def new_axes(width_in: float, height_in: float) -> tuple[Any, Any]:
    """A new ``(figure, axes)`` of ``width_in × height_in`` inches in the shared style."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(STYLE)
    fig, ax = plt.subplots(figsize=(width_in, height_in))
    ax.set_axisbelow(True)
    return fig, ax


def save_figure(fig: Any, path: str | Path, dpi: int = 130) -> Path:
    """Write ``fig`` to ``path`` (format from the suffix, e.g. ``.png``/``.svg``), close it."""
    import matplotlib.pyplot as plt

    out = Path(path)
    fig.tight_layout()
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    return out



def is_png(path: str | Path) -> bool:
    """Whether ``path`` holds a PNG: the 8-byte signature followed by an ``IHDR`` chunk."""
    head = Path(path).read_bytes()[:16]
    return head[:8] == PNG_SIGNATURE and head[12:16] == b"IHDR"
