"""Pictures and summaries of a sampled task (like Figure 2 of the paper)."""

from __future__ import annotations

import collections

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from cfsl_jax.sampler import TaskIndices  # noqa: E402
from cfsl_jax.spec import TaskSpec  # noqa: E402


def task_summary(task: TaskIndices, spec: TaskSpec, class_names=None) -> str:
    """A few readable lines: the spec, the class groups, each support set's labels."""
    task = TaskIndices(*map(np.asarray, task))
    lines = [f"task {spec.name}: {spec.num_groups} class group(s) of sizes "
             f"{list(spec.group_lengths)}, {spec.num_outputs} output unit(s), "
             f"support sets of {spec.support_size}, target set of {spec.target_size}"]
    for g, classes in enumerate(task.classes):
        names = [class_names[c] if class_names is not None else str(c) for c in classes]
        lines.append(f"  group {g}: classes {', '.join(names)}")
    for n, labels in enumerate(task.support_labels):
        lines.append(f"  support set {n} (group {n // spec.cci}): labels {sorted(labels.tolist())}")
    counts = collections.Counter(task.target_labels.tolist())
    lines.append("  target set: " + ", ".join(f"label {k} x{v}" for k, v in sorted(counts.items())))
    return "\n".join(lines)


def plot_task(support_x: np.ndarray, support_y: np.ndarray, target_x: np.ndarray,
              target_y: np.ndarray, spec: TaskSpec, target_per_row: int = 25,
              title: str | None = None):
    """Figure: one row per support set with labels, then the target set in rows.

    support_x: [NSS, NC*KS, H, W, C] in [0, 1]; target_x: [T, H, W, C].
    """
    nss, per_set = support_y.shape
    target_rows = -(-len(target_y) // target_per_row)
    cols = max(per_set, min(len(target_y), target_per_row))
    rows = nss + target_rows
    fig, axes = plt.subplots(rows, cols, figsize=(0.7 * cols + 1.2, 0.8 * rows + 0.6),
                             squeeze=False)
    for ax in axes.ravel():
        ax.axis("off")

    def show(ax, image, label):
        image = np.asarray(image)
        ax.imshow(image[..., 0] if image.shape[-1] == 1 else image, cmap="gray", vmin=0, vmax=1)
        ax.set_title(str(int(label)), fontsize=7, pad=1)

    for n in range(nss):
        axes[n, 0].text(-0.4, 0.5, f"S{n} g{n // spec.cci}", transform=axes[n, 0].transAxes,
                        ha="right", va="center", fontsize=7)
        for i in range(per_set):
            show(axes[n, i], support_x[n, i], support_y[n, i])
    for t in range(len(target_y)):
        show(axes[nss + t // target_per_row, t % target_per_row], target_x[t], target_y[t])
    axes[nss, 0].text(-0.4, 0.5, "target", transform=axes[nss, 0].transAxes, ha="right",
                      va="center", fontsize=7)
    fig.suptitle(title or spec.name, fontsize=9)
    return fig


def show_task(dataset: str = "synthetic", split: str = "train", task: str = "D8", seed: int = 0,
              out: str | None = "task.png", data_dir: str | None = None,
              manual_dir: str | None = None) -> str:
    """Sample one task of ``dataset``/``split``, draw it to ``out``, return its summary."""
    from cfsl_jax import data, seeding
    from cfsl_jax.sampler import sample_task

    spec = TaskSpec.parse(task)
    loaded = data.load_split(dataset, split, data_dir=data_dir, manual_dir=manual_dir)
    indices = sample_task(seeding.purpose_key(seed, "show"), loaded.class_table,
                          loaded.class_sizes, spec)
    summary = task_summary(indices, spec, loaded.info.class_names)
    if out:
        fig = plot_task(data.gather_normalised(loaded, indices.support_idx),
                        np.asarray(indices.support_labels),
                        data.gather_normalised(loaded, indices.target_idx),
                        np.asarray(indices.target_labels), spec,
                        title=f"{dataset}/{split} {spec.name} seed={seed}")
        fig.savefig(out, dpi=110, bbox_inches="tight")
        plt.close(fig)
    return summary
