"""The label counts per split as a small grouped bar chart (PNG bytes for an ipywidgets Image)."""

from __future__ import annotations

import io
from typing import Any


def label_chart_png(counts: dict[str, dict[Any, int]], max_labels: int = 30) -> bytes:
    """A small grouped bar chart of label counts per split, as PNG bytes."""
    from matplotlib.figure import Figure  # no pyplot: no global figure state in the kernel

    labels = sorted({k for c in counts.values() for k in c}, key=str)[:max_labels]
    fig = Figure(figsize=(4.8, 2.4), dpi=100)
    ax = fig.add_subplot()
    width = 0.8 / max(1, len(counts))
    for i, (split, c) in enumerate(counts.items()):
        xs = [j + i * width for j in range(len(labels))]
        ax.bar(xs, [c.get(k, 0) for k in labels], width=width, label=split)
    ax.set_xticks([j + width * (len(counts) - 1) / 2 for j in range(len(labels))])
    ax.set_xticklabels([str(k) for k in labels], rotation=30 if len(labels) > 6 else 0, fontsize=8)
    ax.set_ylabel("rows")
    if counts:
        ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
