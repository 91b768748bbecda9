"""The paper's figures: accuracy against NSS (Figure 3) and ATM / MACs against NSS (Figure 4).

    curves, skipped = figures.cost_curves(["protonets", "init_tune"], nss_values=(1, 10, 100))
    figures.plot_cost_curves(curves, "figure4.png")

Figure 3 plots a sweep's test accuracy (mean ± std across seeds) against NSS
for the CCI=1 cells, one panel without overwrite (type B) and one with (type
C), one line per learner: the cells of the paper's shape (NC=5, KS=1, KT=5;
how the paper-era code sampled and labelled aside, ``cells.PROTOCOL_FIELDS``),
whatever they are named, never a run of another shape (a B3 with ``--nc=3``
under B3's point); a sweep with none of the paper's shape but one other shape
(a small test sweep) is plotted in that shape, named in the title (``figure3_shape``).

Figure 4 needs no training: ATM comes from the shapes of a learner's state
(``metrics.atm``) and MACs from XLA's cost analysis of its compiled programs
(``metrics.learner_macs``), both at freshly initialised parameters (the
numbers depend on shapes, not on values). ``cost_curves`` computes them for
every learner at every NSS of one task type, with the paper's NC=5, KS=1,
KT=5 and ``per_class`` targets by default. Type C (CCI=1, overwrite: a fixed
NC output units) is the default: there the state of every learner has a
fixed size, so ATM falls as 1/NSS, while the support inputs grow as NSS.
Per-task MACs = init + adapt x NSS + predict, and the target set grows as
NSS, so they grow linearly in NSS. The adapt program of a type-C task does
not depend on NSS: with a persistent compilation cache configured
(``jax_compilation_cache_dir``; ``launch/report.py`` sets one) it is compiled
once per learner and loaded for the other NSS values.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from cfsl_jax.experiments.paper_results import FIGURE4_NSS
from cfsl_jax.runtime import files, plotting, progress
from cfsl_jax.training import results as results_io

COST_FIELDS: tuple[str, ...] = ("nss", "atm", "state_bytes", "support_bytes", "macs_adapt",
                                "macs_predict", "macs_per_task")
# Learners can coincide (e.g. init_tune and pretrain_tune cost the same): vary line and marker.
_STYLES = tuple((line, marker) for marker, line in zip("osD^vx+*", ("-", "--", ":", "-.") * 2))


def _style(index: int) -> dict[str, Any]:
    line, marker = _STYLES[index % len(_STYLES)]
    return {"linestyle": line, "marker": marker, "markersize": 4, "markerfacecolor": "none"}


def type_spec(task_type: str, nss: int, nc: int = 5, ks: int = 1, kt: int = 5,
              target_mode: str = "per_class"):
    """The TaskSpec of a task type at any NSS (A: CCI=NSS with overwrite; B: CCI=1; C: CCI=1
    with overwrite; D: CCI=2). At NSS=1 the types coincide (the design's rule), so no check of
    ``spec.task_type`` is made."""
    from cfsl_jax.protocol.spec import TaskSpec

    fields = {"A": (nss, True), "B": (1, False), "C": (1, True), "D": (2, False)}
    if task_type not in fields:
        raise ValueError(f"unknown task type {task_type!r}; valid: {tuple(fields)}")
    cci, overwrite = fields[task_type]
    return TaskSpec(nss=nss, nc=nc, ks=ks, kt=kt, cci=cci, overwrite=overwrite,
                    target_mode=target_mode)


def learner_costs(name: str, spec, image_shape: tuple[int, ...] = (28, 28, 1),
                  learner_options: Mapping[str, Any] | None = None) -> dict[str, float]:
    """ATM, state and support bytes, and MACs of learner ``name`` on ``spec`` (fresh params)."""
    import jax
    import jax.numpy as jnp

    from cfsl_jax.protocol import metrics
    from cfsl_jax.learners import get_learner

    learner = get_learner(name, spec, image_shape=tuple(image_shape),
                          **(learner_options or {})).evaluated  # what a run's test counts
    params = learner.init_params(jax.random.key(0), jnp.zeros((1, *image_shape), jnp.float32),
                                 spec)
    state = metrics.state_shapes(learner, params, image_shape)
    return {"nss": spec.nss, "atm": metrics.atm(learner, params, image_shape),
            "state_bytes": metrics.tree_bytes(state),
            "support_bytes": metrics.support_bytes(spec, image_shape),
            **metrics.learner_macs(learner, params, image_shape)}


def cost_curves(learners: Sequence[str], nss_values: Sequence[int] = FIGURE4_NSS,
                task_type: str = "C", image_shape: tuple[int, ...] = (28, 28, 1),
                learner_options: Mapping[str, Mapping[str, Any]] | None = None,
                log: Callable[[str], None] = print, **shape
                ) -> tuple[dict[str, list[dict[str, float]]], dict[str, str]]:
    """Figure 4's numbers: {learner: [costs at each NSS]}, and {learner: reason} for the
    learners that could not be built or measured (skipped, not fatal).

    ``learner_options`` maps a learner name to its factory options; ``shape``
    overrides nc/ks/kt/target_mode of the spec.
    """
    if not nss_values or min(nss_values) < 1:
        raise ValueError(f"nss_values must be positive integers, got {list(nss_values)}")
    curves, skipped = {}, {}
    bar = progress.tracker("figure 4", len(learners) * len(nss_values), "points")
    bar.update(0)
    for index, name in enumerate(learners):
        try:
            curves[name] = []
            for nss in sorted(nss_values):
                curves[name].append(learner_costs(name, type_spec(task_type, nss, **shape),
                                                  image_shape, (learner_options or {}).get(name)))
                bar.update(index * len(nss_values) + len(curves[name]), learner=name, nss=nss)
        except Exception as error:  # noqa: BLE001  (an unfinished learner is skipped)
            curves.pop(name, None)
            skipped[name] = f"{type(error).__name__}: {error}"
            log(f"skipping {name}: {skipped[name]}")
        else:
            last = curves[name][-1]
            log(f"{name}: ATM {curves[name][0]['atm']:.4g} .. {last['atm']:.4g}, MACs per task "
                f"{curves[name][0]['macs_per_task']:.4g} .. {last['macs_per_task']:.4g}")
    return curves, skipped


def write_cost_curves_csv(curves: Mapping[str, Sequence[Mapping[str, float]]], path: str
                          ) -> None:
    rows = [{"learner": name, **{k: point[k] for k in COST_FIELDS}}
            for name, points in curves.items() for point in points]
    files.write_atomic(path, results_io.csv_text(rows, ("learner", *COST_FIELDS)))


OVERLAP_RTOL = 0.01  # lines within 1 % of each other at every NSS lie on each other (log axes)


def coinciding(curves: Mapping[str, Sequence[Mapping[str, float]]], key: str,
               rtol: float = OVERLAP_RTOL) -> list[list[str]]:
    """Groups (2 or more) of learners whose ``key`` values are within ``rtol`` of the group's
    first learner's at every NSS: lines drawn on top of each other (init_tune and maml_low's
    MACs differ by under 0.4 %, which no log axis shows)."""
    groups: list[tuple[Sequence[Mapping[str, float]], list[str]]] = []
    for name, points in curves.items():
        for first, names in groups:
            if [p["nss"] for p in first] == [p["nss"] for p in points] and all(
                    abs(float(p[key]) - float(q[key])) <= rtol * abs(float(q[key]))
                    for p, q in zip(points, first)):
                names.append(name)
                break
        else:
            groups.append((points, [name]))
    return [names for _, names in groups if len(names) > 1]


def plot_cost_curves(curves: Mapping[str, Sequence[Mapping[str, float]]], path: str,
                     title: str = "ATM and MACs against NSS") -> str:
    """Figure 4: ATM and MACs per task against NSS (log-log), one line per learner; a PNG."""
    figure, (atm_axis, macs_axis) = plotting.subplots(1, 2, figsize=(11, 4.2))
    for index, (name, points) in enumerate(curves.items()):
        nss = [p["nss"] for p in points]
        atm_axis.plot(nss, [p["atm"] for p in points], label=name, **_style(index))
        macs_axis.plot(nss, [p["macs_per_task"] for p in points], label=name, **_style(index))
    for axis, label, key in ((atm_axis, "ATM (state bytes / support bytes)", "atm"),
                             (macs_axis, "MACs per task", "macs_per_task")):
        same = coinciding(curves, key)
        if same:  # every learner is drawn (its own marker); say which lines lie on each other
            axis.text(0.02, 0.98, f"overlapping (within {OVERLAP_RTOL:.0%}): "
                      + "; ".join(" = ".join(g) for g in same),
                      transform=axis.transAxes, va="top", fontsize=7, wrap=True)
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("NSS (support sets per task)")
        axis.set_ylabel(label)
        axis.grid(alpha=0.3, which="both")
    handles, labels = atm_axis.get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=min(len(labels), 8), fontsize=8,
                  frameon=False)  # one legend shared by both panels
    figure.suptitle(title)
    figure.tight_layout(rect=(0, 0.08, 1, 1))
    return plotting.save(figure, path)


PAPER_SHAPE = {"nc": 5, "ks": 1, "kt": 5}  # the TaskSpec fields of every cell of the grid


def figure3_shape(specs: Sequence[Mapping[str, Any]]) -> dict[str, int] | None:
    """The (NC, KS, KT) that Figure 3 plots, of the CCI=1 ``specs``: the paper's where one
    has it, else the one shape they have; None where they have none, or several others."""
    shapes = {tuple(spec[k] for k in PAPER_SHAPE) for spec in specs if spec["cci"] == 1}
    if tuple(PAPER_SHAPE.values()) in shapes:
        return dict(PAPER_SHAPE)
    return dict(zip(PAPER_SHAPE, shapes.pop())) if len(shapes) == 1 else None


def plot_accuracy_vs_nss(accuracy: Mapping[tuple[str, str, str], Any], path: str,
                         title: str = "Test accuracy against NSS, CCI=1") -> str | None:
    """Figure 3 from ``report.aggregate(..., "acc")`` of one dataset: a PNG, or None when no
    CCI=1 cell of one shape is there (``figure3_shape``: the paper's NC, KS and KT where a
    cell has them; a run of another shape is never drawn beside them)."""
    panels = {False: "without overwrite (B)", True: "with overwrite (C)"}
    lines: dict[bool, dict[str, list[tuple[int, float, float]]]] = {False: {}, True: {}}
    shape = figure3_shape([found.spec for found in accuracy.values()])
    if shape is None:
        return None
    if shape != PAPER_SHAPE:
        title += " (" + ", ".join(f"{k.upper()}={v}" for k, v in shape.items()) + ")"
    for (_, learner, _), found in accuracy.items():
        if found.spec["cci"] == 1 and all(found.spec[k] == v for k, v in shape.items()):
            lines[bool(found.spec["overwrite"])].setdefault(learner, []).append(
                (found.spec["nss"], 100 * found.mean, 100 * found.std))
    if not any(lines.values()):
        return None
    from cfsl_jax.learners import LEARNERS

    order = {name: i for i, name in enumerate(LEARNERS)}
    nss_values = sorted({p[0] for panel in lines.values() for pts in panel.values() for p in pts})
    figure, axes = plotting.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for axis, overwrite in zip(axes, (False, True)):
        for learner, points in sorted(lines[overwrite].items(),
                                      key=lambda item: (order.get(item[0], len(order)), item[0])):
            points.sort()
            axis.errorbar([p[0] for p in points], [p[1] for p in points],
                          yerr=[p[2] for p in points], capsize=3, label=learner,
                          **_style(order.get(learner, 0)))
        axis.set_title(panels[overwrite])
        axis.set_xticks(nss_values)
        axis.set_xlabel("NSS (support sets per task)")
        axis.grid(alpha=0.3)
        if lines[overwrite]:
            axis.legend(fontsize=8)
    axes[0].set_ylabel("test accuracy (%)")
    figure.suptitle(f"{title}\n(points: mean over seeds; error bars: ± one standard deviation "
                    f"over seeds, ddof=1)", fontsize=10)
    figure.tight_layout()
    return plotting.save(figure, path)
