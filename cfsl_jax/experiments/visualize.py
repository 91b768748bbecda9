"""Pictures and summaries of a sampled task (like Figure 2 of the paper)."""

from __future__ import annotations

import collections

import matplotlib
import numpy as np

from cfsl_jax.runtime import plotting
from cfsl_jax.runtime.errors import UserError
from cfsl_jax.protocol.sampler import TaskIndices
from cfsl_jax.protocol.spec import TaskSpec


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


def group_colour(group: int):
    """The colour of class group ``group`` (matplotlib's tab10 cycle)."""
    return matplotlib.colormaps["tab10"](group % 10)


def plot_task(support_x: np.ndarray, support_y: np.ndarray, target_x: np.ndarray,
              target_y: np.ndarray, spec: TaskSpec, target_group: np.ndarray | None = None,
              columns: int = 20, title: str | None = None):
    """Figure: the support sets packed several to a row, then the target set in rows.

    Every image is framed in its class group's colour (``group_colour``) and titled with its
    label; the first image of support set n also says ``S<n> g<group>``. support_x:
    [NSS, NC*KS, H, W, C] in [0, 1]; target_x: [T, H, W, C]; target_group: [T].
    """
    nss, per_set = support_y.shape
    cols = max(per_set, min(columns, max(len(target_y), per_set)))
    sets_per_row = max(1, cols // per_set)
    support_rows = -(-nss // sets_per_row)
    target_rows = -(-len(target_y) // cols)
    rows = support_rows + target_rows
    fig, axes = plotting.subplots(rows, cols, figsize=(0.62 * cols + 0.4, 0.72 * rows + 0.5),
                                  squeeze=False)
    for ax in axes.ravel():
        ax.set_visible(False)

    def show(ax, image, text, group):
        image = np.asarray(image)
        ax.set_visible(True)
        ax.imshow(image[..., 0] if image.shape[-1] == 1 else image, cmap="gray", vmin=0, vmax=1)
        ax.set_xticks([])
        ax.set_yticks([])
        for spine in ax.spines.values():
            spine.set_edgecolor(group_colour(group))
            spine.set_linewidth(2.0)
        ax.set_title(text, fontsize=6, pad=1, color=group_colour(group))

    for n in range(nss):
        row, first = n // sets_per_row, (n % sets_per_row) * per_set
        group = n // spec.cci
        for i in range(per_set):
            text = f"S{n} g{group}: {int(support_y[n, i])}" if i == 0 else str(int(support_y[n, i]))
            show(axes[row, first + i], support_x[n, i], text, group)
    groups = np.zeros(len(target_y), int) if target_group is None else np.asarray(target_group)
    for t in range(len(target_y)):
        text = f"target: {int(target_y[t])}" if t == 0 else str(int(target_y[t]))
        show(axes[support_rows + t // cols, t % cols], target_x[t], text, int(groups[t]))
    fig.suptitle((title or spec.name) + "  (frame colour = class group)", fontsize=9)
    fig.subplots_adjust(left=0.01, right=0.99, bottom=0.01, top=1 - 0.5 / (0.72 * rows + 0.5),
                        wspace=0.08, hspace=0.45)
    return fig


def show_task(dataset: str = "synthetic", split: str = "train", task: str = "D8", seed: int = 0,
              out: str | None = "task.png", data_dir: str | None = None,
              manual_dir: str | None = None, download: bool = False, **options) -> str:
    """Sample one task of ``dataset``/``split``, draw it to ``out``, return its summary.

    ``options`` are dataset options and ``download`` as in ``data.load_split``."""
    from cfsl_jax import data
    from cfsl_jax.runtime import seeding
    from cfsl_jax.protocol.sampler import check_split, sample_task

    spec = TaskSpec.parse(task)
    loaded = data.load_split(dataset, split, data_dir=data_dir, manual_dir=manual_dir,
                             download=download, **options)
    try:
        check_split(loaded.class_table, loaded.class_sizes, spec)
    except ValueError as error:
        raise UserError(f"--task={task} cannot be sampled from the {split} split of "
                        f"{loaded.info.dataset_variant}: {error}") from None
    indices = sample_task(seeding.purpose_key(seed, "show"), loaded.class_table,
                          loaded.class_sizes, spec)
    summary = task_summary(indices, spec, loaded.info.class_names)
    if out:
        # the images as stored, in [0, 1] (without a dataset's per-channel normalisation)
        fig = plot_task(data.gather_normalised(loaded.images, indices.support_idx),
                        np.asarray(indices.support_labels),
                        data.gather_normalised(loaded.images, indices.target_idx),
                        np.asarray(indices.target_labels), spec,
                        target_group=np.asarray(indices.target_group),
                        title=f"{dataset}/{split} {spec.name} seed={seed}")
        plotting.save(fig, out, dpi=110)
    return summary
