"""FLUID reports: the paper's Table 3 layout beside ours, rolling accuracy and update-strategy plots.

``PAPER`` holds the paper's numbers exactly as printed (Wallingford et al.,
"In the Wild: From ML Models to Pragmatic ML Systems"): Table 3 (sequence 5;
ResNet18 supervised rows, and the Conv-4 rows (a) and (b) for Prototypical
Networks and MAML, whose backbone ours matches), GMACs in units of 10^6
("cached / uncached" where the paper prints two); AUROC from Table 10 for the
detector our method uses by default. They are on ImageNet-22K sequences with a
ResNet18 (Conv-4 for (a), (b)): a different dataset and backbone from ours.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from cfsl_jax.runtime import plotting

# (column key, header); accuracies are printed in percent, like the paper.
COLUMNS = (("metrics.accuracy", "overall"), ("metrics.mean_per_class_accuracy", "mean/cls"),
           ("metrics.pretrain_head", "pre-head"), ("metrics.pretrain_tail", "pre-tail"),
           ("metrics.novel_head", "nov-head"), ("metrics.novel_tail", "nov-tail"),
           ("metrics.auroc", "AUROC"))
METRIC_KEYS = tuple(key for key, _ in COLUMNS)
_PAPER_FIELDS = ("overall", "mean/cls", "pre-head", "pre-tail", "nov-head", "nov-tail", "AUROC",
                 "GMACs")

# method: (overall, mean-per-class, pretrain head, pretrain tail, novel head, novel tail,
#          AUROC, GMACs x 10^6, source row)
PAPER: dict[str, tuple] = {
    "protonets": ("15.98", "11.13", "22.03", "13.26", "11.63", "6.90", None, "0.06",
                  "Table 3 (a), Conv-4"),
    "maml": ("3.64", "1.10", "2.02", "0.10", "2.86", "0.15", None, "0.06 / 2.20",
             "Table 3 (b), Conv-4"),
    "meta_baseline": ("47.62", "40.23", "67.03", "53.87", "40.47", "27.53", None, "0.16 / 5.73",
                      "Table 3 (d)"),
    "imprinting": ("48.51", "32.69", "67.46", "34.18", "40.32", "15.35", None, "0.16 / 5.73",
                   "Table 3 (e)"),
    "lwf": ("48.76", "31.02", "67.50", "56.96", "30.07", "7.23", None, "22.58 / 45.16",
            "Table 3 (f)"),
    "ewc": ("50.39", "34.89", "70.84", "47.18", "39.03", "16.59", None, "12.29", "Table 3 (g)"),
    "oltr": ("45.06", "27.77", "40.00", "13.85", "40.83", "17.27", "0.78", "0.16 / 6.39",
             "Table 3 (h); AUROC Table 10"),
    "finetune": ("53.80", "41.54", "77.29", "58.77", "43.41", "23.56", "0.68", "0.16 / 5.73",
                 "Table 3 (i); AUROC Table 10 (+Softmax)"),
    "standard": ("49.46", "33.99", "68.14", "43.25", "38.51", "16.90", "0.59", "11.29",
                 "Table 3 (j); AUROC Table 10 (+Softmax)"),
    "ncm": ("48.62", "43.44", "72.69", "56.17", "42.35", "31.72", "0.85", "0.15",
            "Table 3 (k); AUROC Table 10 (+MDT)"),
    "exemplar_tuning": ("58.16", "43.61", "75.70", "45.73", "48.85", "27.93", "0.92",
                        "0.16 / 5.73", "Table 3 (l); AUROC Table 10 (+MDT)"),
}


def lookup(result: dict, key: str):
    value: Any = result
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def auroc_text(value: float | None) -> str:
    """AUROC to 3 decimals (it is a rank statistic over ~10^3 positives)."""
    return "-" if value is None else f"{value:.3f}"


def _cell(entry: dict, key: str) -> str:
    value = entry.get(key, {})
    mean, std = value.get("mean"), value.get("std")
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "-"
    if key == "metrics.auroc":
        return f"{mean:.3f}" + (f"±{std:.3f}" if entry["streams"] > 1 else "")
    return f"{100 * mean:.2f}" + (f"±{100 * std:.2f}" if entry["streams"] > 1 else "")


def _gmacs(entry: dict) -> str:
    cached = entry["macs.total"]["mean"] / 1e9
    uncached = entry["macs.total_uncached"]["mean"] / 1e9
    if abs(uncached - cached) < 1e-9 * max(cached, 1.0):
        return f"{cached:.4g}"
    return f"{cached:.4g} / {uncached:.4g}"


def _render(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.rjust(w) if i else cell.ljust(w)
                       for i, (cell, w) in enumerate(zip(row, widths))) for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    return lines


def paper_table(summary: dict[str, dict], dataset: str, streams: str,
                new_class: dict[str, dict] | None = None) -> str:
    """Rows = methods (ours, then the paper's where it has them); Table 3's columns.
    ``new_class``: the methods counted K+1-way, with their threshold (``new_class``)."""
    header = ["method", "source", *(h for _, h in COLUMNS), "GMACs", "detector"]
    rows = [header]
    for name, entry in summary.items():
        detector = entry["detector"]
        if name in (new_class or {}):
            detector += f", 'new' above {new_class[name]['threshold']:.4g}"
        rows.append([name, f"ours ({dataset})", *(_cell(entry, key) for key, _ in COLUMNS),
                     _gmacs(entry), detector])
        if name in PAPER:
            *numbers, source = PAPER[name]
            rows.append(["", "paper", *(n or "-" for n in numbers), source])
    lines = [f"FLUID, Table 3 layout: ours on {dataset} ({streams}; mean±std in %, AUROC of "
             f"novel-class first appearances, GMACs cached / uncached)",
             "paper: ImageNet-22K sequence 5, ResNet18 unless noted, GMACs x 10^6 -- a "
             "different dataset and backbone, side by side for reading, not comparable",
             *_render(rows)]
    return "\n".join(lines)


def plot_rolling_accuracy(curves: dict[str, np.ndarray], window: int, path: str,
                          title: str = "FLUID: rolling accuracy") -> None:
    """One line per method: accuracy over the last ``window`` samples at each t; saved as PNG."""
    figure, axis = plotting.subplots(figsize=(7, 4))
    for name, curve in curves.items():
        axis.plot(np.arange(1, len(curve) + 1), curve, label=name, linewidth=1.2)
    axis.set_xlabel("samples seen")
    axis.set_ylabel(f"accuracy (last {window} samples)")
    axis.set_ylim(0.0, 1.0)
    _finish(figure, axis, title, path)


def plot_update_strategy(cells: list[dict], path: str, title: str) -> None:
    """The paper's Figure 6 layout: accuracy vs total GMACs, one point per (U, E) cell."""
    figure, axis = plotting.subplots(figsize=(6, 4))
    for epochs in sorted({c["epochs_per_update"] for c in cells}):
        row = sorted((c for c in cells if c["epochs_per_update"] == epochs),
                     key=lambda c: c["gmacs"])
        axis.plot([c["gmacs"] for c in row], [100 * c["accuracy"] for c in row], "o-",
                  label=f"{epochs} epochs")
        for c in row:
            axis.annotate(f"U={c['update_every']}", (c["gmacs"], 100 * c["accuracy"]),
                          fontsize=6)
    axis.set_xscale("log")
    axis.set_xlabel("total GMACs (uncached)")
    axis.set_ylabel("overall accuracy (%)")
    _finish(figure, axis, title, path)


def _finish(figure, axis, title: str, path: str) -> None:
    """Title, grid and legend on ``axis``; ``figure`` saved to ``path`` (PNG) and closed."""
    axis.set_title(title)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7)
    figure.tight_layout()
    plotting.save(figure, path)
