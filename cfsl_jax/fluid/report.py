"""FLUID reports: a readable table of methods and a PNG of rolling accuracy over the stream."""

from __future__ import annotations

import math
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from cfsl_jax.fluid.metrics import CROSS_SECTIONS  # noqa: E402

COLUMNS = (("accuracy", "acc"), ("mean_per_class_accuracy", "mpc_acc"),
           *((name, name.replace("pretrain", "pre").replace("novel", "nov"))
             for name in CROSS_SECTIONS),
           ("auroc", "auroc"))


def _number(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.3f}"


def table(results: dict[str, dict[str, Any]]) -> str:
    """One row per method: accuracies, AUROC, detector, compute (total GMACs; MMACs of
    updates + training), training steps and seconds."""
    header = (["method"] + [short for _, short in COLUMNS]
              + ["detector", "GMACs", "upd+train_MMACs", "train_steps", "seconds"])
    rows = [header]
    for name, result in results.items():
        rows.append([name] + [_number(result["metrics"].get(key)) for key, _ in COLUMNS]
                    + [result["detector"], f"{result['macs']['total'] / 1e9:.3f}",
                       f"{(result['macs']['updates'] + result['macs']['training']) / 1e6:.1f}",
                       str(result["train_steps"]), f"{result['seconds']:.1f}"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(w) if i else cell.ljust(w)
                       for i, (cell, w) in enumerate(zip(row, widths))) for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def plot_rolling_accuracy(curves: dict[str, np.ndarray], window: int, path: str,
                          title: str = "FLUID: rolling accuracy") -> None:
    """One line per method: accuracy over the last ``window`` samples at each t; saved as PNG."""
    figure, axis = plt.subplots(figsize=(7, 4))
    for name, curve in curves.items():
        axis.plot(np.arange(1, len(curve) + 1), curve, label=name, linewidth=1.2)
    axis.set_xlabel("samples seen")
    axis.set_ylabel(f"accuracy (last {window} samples)")
    axis.set_ylim(0.0, 1.0)
    axis.set_title(title)
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
