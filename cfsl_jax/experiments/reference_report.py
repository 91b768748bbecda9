"""``launch.report --reference``: the reference rows beside Table 1 and beside your own runs.

    from cfsl_jax.experiments import reference_report
    paths = reference_report.write("docs/reference", "/tmp/out", sweep_dir="/tmp/my_sweep")

Reads only ``docs/reference`` (``reference.export``'s results.csv and runs/), so it runs in
a fresh clone without training anything. Writes ``reference.md`` and
``reference_convergence.png``:

- **The grid** (``grid``): a table per dataset and kind of budget, a row per learner, our
  accuracy beside Table 1's per cell, paper-era cells marked (not on an ``--as_published``
  row that reproduces the cell's behaviour); also ``docs/reference/table.md``
  (``write_table``, after each ``reference.export``).
- **Beside Table 1**: per dataset, budget, learner and cell, the reference test accuracy
  (mean over its complete seeds, with the budget and training tasks), Table 1's number,
  and the difference; where Table 1's cell measures a paper-era behaviour
  (``paper_era.note``), the note and the closed-form prediction (where Table 1's numbers
  give one) stand in place of a bare difference (a difference of a row on full Omniglot's
  classes other than Table 1's, ``paper_results.other_classes``, marked ``†``), but on a row trained under
  ``--as_published`` (results.csv's ``preset``), which reproduces that behaviour on purpose:
  there the difference, with the preset, and what it leaves out where it reproduces only
  part (``paper_era.as_published``: an EWC row's re-copy, a D cell under ``feb2020``).
- **Paired differences**: within each (dataset, budget), each learner against its cell's
  most accurate one over the shared test tasks (``paired.paired_rows``); a learner's runs of
  two settings (other learner options) are two learners there, each named with its setting.
- **Does every learner learn, and what each part adds** (``reference_checks``): each
  learner's test accuracy beside chance with its validation curve and a verdict, and paired
  differences between learners that differ in one part (pretraining, EWC, SCA's critic);
  also in ``table.md``.
- **Your runs** (``sweep_dir``): each run of the sweep beside the reference run of the
  same dataset, dataset options (Omniglot's ``class_split``, which the name and the task
  fingerprint leave out), learner, cell and seed (every seed of it where the reference lacks
  that seed), and, where both were tested on the same tasks (the same fingerprint), the mean
  of the per-task differences with its 95 % CI; a line names the runs left out for their
  dataset options (``reference_yours``: ``beside_yours``, ``other_data``).
- **Convergence**: validation accuracy against training tasks, one panel per cell, one
  line per learner and budget (seed 0), partial runs included.
"""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

import numpy as np

from cfsl_jax.experiments import paper_era, paper_results, reference, reference_checks, report
from cfsl_jax.experiments.cells import cell_order, learner_order
from cfsl_jax.experiments.paired import paired_rows
# your runs beside the reference: also read as reference_report.X (launch.report, tests)
from cfsl_jax.experiments.reference_yours import beside_yours, other_data  # noqa: F401
from cfsl_jax.runtime import files, plotting
from cfsl_jax.runtime.errors import UserError
from cfsl_jax.training import results as results_io


def default_dir() -> str:
    """The checkout's ``docs/reference`` (beside the ``cfsl_jax`` package)."""
    import cfsl_jax
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(cfsl_jax.__file__))),
                        "docs", "reference")


def load(reference_dir: str) -> tuple[list[dict], list[dict]]:
    """(rows of results.csv, the results.json of every complete row, with its row's budget
    as ``"_budget"`` and its preset and options as ``"_setting"``,
    ``reference_checks.row_setting``). A complete row whose numbers are not its results.json's
    (``reference.row_differences``: an export killed between the run files and results.csv)
    is refused in one line naming both."""
    csv_path = files.join(reference_dir, "results.csv")
    if not files.exists(csv_path):
        raise FileNotFoundError(f"no reference results at {csv_path} (reference.export "
                                f"writes them)")
    rows = reference.read_rows(csv_path)
    found = []
    for row in rows:
        if row["status"] == "complete":
            path = files.join(reference_dir, row["run"], "results.json")
            result = results_io.read_json(path)
            differences = reference.row_differences(row, result)
            if differences:  # an export cut short between the run files and results.csv
                raise UserError(f"{csv_path}: the row of {row['run']} is not its {path} "
                                f"({differences[0]}): export the sweep again (python -m "
                                f"benchmarks.reference.export) to bring them in step")
            found.append({**result, "_budget": row["budget"],
                          "_setting": reference_checks.row_setting(row)})
    return rows, found


def _percent(value: str | float) -> str:
    return f"{100 * float(value):.2f}" if value != "" else "-"


def beside_table1(rows: Sequence[dict], paper: dict) -> list[list[str]]:
    """Rows (header first): the reference accuracy per (dataset, budget, setting, learner,
    cell) beside Table 1, the difference or the paper-era note; the setting (preset and
    options, ``reference_checks.setting``) is named beside the budget where rows differ in it."""
    groups: dict[tuple, list[dict]] = {}
    for row in reference.sorted_rows(rows):
        groups.setdefault((row["dataset"], row["budget"], reference_checks.row_setting(row),
                           row["learner"], row["cell"]), []).append(row)
    labels = reference_checks.setting_labels(((key[0], key[1], key[3]), key[2])
                                             for key in groups)
    out = [["dataset", "learner", "cell", "budget (training tasks)", "seeds", "ours (%)",
            "Table 1 (%)", "ours - Table 1 (points), or what the cell measures"]]
    for (dataset, budget, kind, learner, cell), group in groups.items():
        done = [float(r["test_acc_mean"]) for r in group if r["status"] == "complete"]
        ours = "partial: val " + _percent(group[0]["val_acc_last"]) if not done else (
            f"{100 * np.mean(done):.2f}" + (f" ± {100 * np.std(done, ddof=1):.2f}"
                                            if len(done) > 1 else ""))
        theirs = report.paper_value(paper, dataset, learner, cell)
        note, published = _paper_era(learner, cell, kind)
        if theirs is None:
            comparison = "-"
        elif note and published is None:
            guess = paper_era.predicted(learner, cell, paper_results.PAPER_DATASETS.get(
                dataset, dataset))
            predicts = (f"that alone predicts {guess:.2f} (docs/results.md)" if guess is not None
                        else "its closed form needs a number Table 1 does not give")
            comparison = f"paper-era cell: {note}; {predicts}, so no difference is shown"
        else:
            comparison = f"{100 * np.mean(done) - theirs['mean']:+.2f}" if done else "-"
            if note:  # an --as_published row: the paper-era behaviour on purpose
                comparison += (f" (as published: {kind[0]} reproduces this paper-era cell)"
                               if not published else
                               f" (as published, {kind[0]}, in part: {published})")
            if done and _other_classes(group[0]):
                comparison += f" {report.OTHER_CLASSES_MARK}"
        tasks = group[0]["training_tasks"]
        label = labels[((dataset, budget, learner), kind)]
        out.append([dataset, learner, cell,
                    f"{reference_checks.budget_label(budget, label)} ({int(tasks):,})",
                    str(len(done)),
                    ours, paper_results.printed(theirs) if theirs else "-", comparison])
    return out


def grid(rows: Sequence[dict], paper: dict) -> list[tuple[str, list[list[str]]]]:
    """The reference grid at a glance: per dataset and kind of budget (reduced, or the
    paper's), a table (header first) with a row per learner, budget and setting (preset and
    options, ``reference_checks.setting``: runs that differ in them are never averaged; the
    budget column names the setting where rows differ in it) and, per cell, our test
    accuracy beside Table 1's. Ours: mean ± 95 % CI over the test tasks for one seed, or
    mean ± std over seeds with the seed count; ``partial`` for a run still training. Table
    1's number carries ``†`` for a row on full Omniglot's classes other than Table 1's
    (``paper_results.other_classes``), and ``*`` where its cell measures a paper-era behaviour
    (``paper_era.note``) that the row's ``--as_published`` preset, if any, does not wholly
    reproduce (``paper_era.as_published``). [(title, table), ...]."""
    out = []
    ordered = reference.sorted_rows(rows)
    labels = reference_checks.setting_labels(
        ((r["dataset"], r["budget"], r["learner"]), reference_checks.row_setting(r))
        for r in ordered)
    for dataset, at_paper in dict.fromkeys((r["dataset"], r["paper_budget"] == "True")
                                           for r in ordered):
        subset = [r for r in ordered
                  if (r["dataset"], r["paper_budget"] == "True") == (dataset, at_paper)]
        cells = cell_order(r["cell"] for r in subset)
        table = [["learner", "budget", "training tasks",
                  *(f"{c} {who}" for c in cells for who in ("ours", "Table 1"))]]
        for learner in learner_order(r["learner"] for r in subset):
            for budget, kind in dict.fromkeys((r["budget"], reference_checks.row_setting(r))
                                              for r in subset if r["learner"] == learner):
                mine = [r for r in subset if (r["learner"], r["budget"]) == (learner, budget)
                        and reference_checks.row_setting(r) == kind]
                tasks = sorted({int(r["training_tasks"]) for r in mine
                                if r["status"] == "complete"})
                label = labels[((dataset, budget, learner), kind)]
                line = [learner, reference_checks.budget_label(budget, label),
                        "/".join(f"{t:,}" for t in tasks) or "-"]
                for cell in cells:
                    note, published = _paper_era(learner, cell, kind)
                    line += _grid_entry([r for r in mine if r["cell"] == cell],
                                        report.paper_value(paper, dataset, learner, cell),
                                        note if published != "" else None,
                                        bool(_other_classes(mine[0])))
                table.append(line)
        kind = "the paper's budget" if at_paper else "reduced budgets"
        out.append((f"{dataset}, {kind}", table))
    return out


def _paper_era(learner: str, cell: str, kind: reference_checks.Setting
               ) -> tuple[str | None, str | None]:
    """(``paper_era.note``, ``paper_era.as_published``) of a row of setting ``kind``: the
    paper-era behaviour Table 1's cell measures, and how far the row's ``--as_published``
    preset reproduces it ('' all of it; what it leaves out; None: no preset, or no note)."""
    return (paper_era.note(learner, cell),
            paper_era.as_published(learner, cell, kind[0], json.loads(kind[1])))


def _other_classes(row: dict) -> str | None:
    """The class split of a results.csv row on full Omniglot where it is not Table 1's
    (``paper_results.other_classes``: marked ``report.OTHER_CLASSES_MARK``), else None; None
    too for a row without the ``options`` column (written before it: its split is unknown)."""
    if row.get("options") is None:
        return None
    return paper_results.other_classes(row["dataset"], json.loads(row["options"] or "{}"))


def _grid_entry(runs: Sequence[dict], theirs: dict | None, era: str | None,
                other_classes: bool = False) -> list[str]:
    """[ours, Table 1's] for one learner, budget and cell."""
    done = [r for r in runs if r["status"] == "complete"]
    accs = [100 * float(r["test_acc_mean"]) for r in done]
    if len(done) == 1:
        ours = f"{accs[0]:.2f} ± {100 * float(done[0]['test_acc_ci95']):.2f}"
    elif done:
        ours = f"{np.mean(accs):.2f} ± {np.std(accs, ddof=1):.2f} ({len(done)} seeds)"
    else:
        ours = "partial" if runs else "-"
    if done and len(runs) > len(done):  # seeds still training
        ours += f" (+{len(runs) - len(done)} partial)"
    marks = ("*" if era else "") + (report.OTHER_CLASSES_MARK if other_classes else "")
    return [ours, paper_results.printed(theirs) + marks if theirs else "-"]


GRID_NOTE = ("Test accuracy (%) on the cell's shared test tasks (evaluation seed 0). Ours: "
             "mean ± 95 % CI over the tasks (one seed), or mean ± std over seeds. Table 1: "
             "mean ± standard deviation as printed; `*`: the cell measures a paper-era "
             "behaviour (only the last support set counts, or labels offset per support set), "
             "not the specification's task, so ours is not expected to match it "
             "(docs/results.md, \"Table 1's paper-era cells in closed form\"); not on an "
             "`--as_published` row whose preset reproduces that behaviour (beside Table 1 "
             "shows its difference, and what a preset leaves out). `†`: the row ran on "
             "other Omniglot classes than Table 1's (a `class_split` other than the authors'), "
             "so the comparison is indicative only (docs/fidelity.md).")


def grid_markdown(rows: Sequence[dict], paper: dict | None = None) -> str:
    """``grid`` as Markdown sections."""
    paper = paper if paper is not None else paper_results.TABLE1
    parts = [GRID_NOTE]
    for title, table in grid(rows, paper):
        parts += [f"### {title}", report.markdown(table)]
    return "\n\n".join(parts)


TABLE_FILE = "table.md"  # in docs/reference, beside results.csv


LEARNS_NOTE = ("A learner learns a cell when the lower end of its test accuracy's 95 % CI is "
               f"at least {reference_checks.CLEAR_MARGIN:g} points above chance (1 / the "
               "cell's output classes) and, where it trains, its validation accuracy ended "
               "above where it started (`reference_checks.learns`). Test: mean ± 95 % CI over "
               "the test tasks, both averaged over a cell's seeds; validation: the lowest "
               "seed's.")
PARTS_NOTE = ("Learners that differ in one part, paired on the same test tasks (same dataset, "
              "budget and cell): the mean per-task accuracy difference with its 95 % CI "
              "(`reference_checks.components`).")


def checks_markdown(rows: Sequence[dict], found: Sequence[dict]) -> list[str]:
    """The "does every learner learn" and "what each part adds" sections (Markdown parts)."""
    parts = ["## Does every learner learn?", LEARNS_NOTE,
             report.markdown(reference_checks.learns(rows, found))]
    pairs = reference_checks.components(found)
    if len(pairs) > 1:
        parts += ["## What each part adds", PARTS_NOTE, report.markdown(pairs)]
    return parts


def table_file_text(rows: Sequence[dict], found: Sequence[dict] = ()) -> str:
    """``docs/reference/table.md``: the grid of ``rows`` (results.csv's, as strings) and, with
    ``found`` (``load``'s results), the checks of each learner."""
    complete = sum(row["status"] == "complete" for row in rows)
    return "\n\n".join([
        "# The reference grid at a glance",
        f"Generated from `results.csv` ({len(rows)} runs: {complete} complete, "
        f"{len(rows) - complete} partial) by `python -m benchmarks.reference.export`; "
        f"`python -m launch.report --reference` adds the paired differences, the notes on "
        f"each paper-era cell and the convergence figure. Table 1: "
        f"{paper_results.TABLE1['source']}.",
        grid_markdown(rows), *(checks_markdown(rows, found) if found else [])]) + "\n"


def write_table(reference_dir: str) -> str:
    """Write ``reference_dir/table.md`` from ``reference_dir/results.csv`` and its runs as
    written; its path (``benchmarks/reference/export.py`` calls it after ``reference.export``)."""
    path = files.join(reference_dir, TABLE_FILE)
    files.write_atomic(path, table_file_text(*load(reference_dir)))
    return path


def paired(found: Sequence[dict]) -> list[list[str]]:
    """``paired.paired_rows`` within each (dataset, budget), with those two columns first; a
    learner with runs of more than one setting of a cell there is a learner per setting,
    ``learner [setting]`` (``reference_checks.by_learner_setting``), never averaged together."""
    out = [["dataset", "budget", *paired_rows([], "")[0]]]
    for dataset, budget, subset in reference_checks.by_budget(found):
        renamed = reference_checks.by_learner_setting(subset)
        out += [[dataset, budget, *row] for row in paired_rows(renamed, dataset)[1:]]
    return out


def curves(reference_dir: str, rows: Sequence[dict]) -> dict[str, dict[str, tuple]]:
    """{cell: {"learner (budget)": (training tasks, validation accuracy %)}}, seed 0 runs."""
    out: dict[str, dict[str, tuple]] = {}
    for row in reference.sorted_rows(rows):
        if int(row["seed"]) != 0:
            continue
        history = results_io.read_json(files.join(reference_dir, row["run"],
                                                  "val_history.json"), default=[])
        points = [(int(e["epoch"]) + 1, e["val_acc"]) for e in history if "val_acc" in e]
        if not points:
            continue
        per_epoch = int(row["iters_per_epoch"]) * int(row["meta_batch"]) \
            if int(row["training_tasks"]) or row["status"] == "partial" else 0
        x = np.array([epoch * per_epoch for epoch, _ in points])
        out.setdefault(row["cell"], {})[f"{row['learner']} ({row['budget']})"] = (
            x, 100 * np.array([acc for _, acc in points]))
    return out


def log_scale(xs: Sequence[np.ndarray]) -> bool:
    """A log axis for training tasks when the budgets differ by more than 20x (a paper-budget
    run beside the CPU grid's would squash the others against 0 on a linear one)."""
    positive = [x[x > 0] for x in xs if (x > 0).any()]
    return bool(positive) and max(p.max() for p in positive) > 20 * min(p.min() for p in positive)


def plot_convergence(data: dict[str, dict[str, tuple]], path: str) -> str | None:
    """Validation accuracy against training tasks, a panel per cell; None with no curve."""
    if not data:
        return None
    cells = cell_order(data)
    figure, axes = plotting.subplots(1, len(cells), figsize=(4.5 * len(cells), 4),
                                     squeeze=False)
    for axis, cell in zip(axes[0], cells):
        wide = log_scale([x for x, _ in data[cell].values()])
        for index, (name, (x, y)) in enumerate(sorted(data[cell].items())):
            shown = x > 0 if wide else np.ones_like(x, bool)  # a log axis has no 0
            axis.plot(x[shown], y[shown], marker="os^vD<>px*"[index % 10], label=name,
                      markevery=max(1, int(shown.sum()) // 12))
        axis.set(title=cell, xlabel="training tasks" + (" (log scale)" if wide else ""),
                 ylabel="validation accuracy (%)", xscale="log" if wide else "linear")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    figure.tight_layout()
    return plotting.save(figure, path)


def write(reference_dir: str, out_dir: str, sweep_dir: str | None = None,
          paper: dict | None = None) -> dict[str, Any]:
    """Write ``reference.md`` (and the convergence figure) to ``out_dir``; their paths."""
    rows, found = load(reference_dir)
    paper = paper if paper is not None else paper_results.TABLE1
    files.makedirs(out_dir)
    complete = sum(row["status"] == "complete" for row in rows)
    parts = ["# Reference results beside Table 1",
             f"{len(rows)} reference runs ({complete} complete, {len(rows) - complete} "
             f"partial) from {reference_dir}; every run of a dataset is tested on the same "
             f"tasks (evaluation seed 0). Table 1: {paper['source']}.",
             "## The grid", grid_markdown(rows, paper),
             "## Beside Table 1, cell by cell"]
    beside = beside_table1(rows, paper)
    parts.append(report.markdown(beside))
    if any(line[-1].endswith(report.OTHER_CLASSES_MARK) for line in beside[1:]):
        parts.append(f"({report.OTHER_CLASSES_MARK} Runs on Omniglot classes other than Table "
                     f"1's, which came from the authors' split (`--dataset_option=class_split="
                     f"{paper_results.PAPER_CLASS_SPLIT}`), so the difference is indicative "
                     f"only: docs/fidelity.md.)")
    pairs = paired(found)
    if len(pairs) > 1:
        parts += ["## Paired differences on the same test tasks",
                  "Each learner against its cell's most accurate one (same dataset and "
                  "budget): the mean per-task accuracy difference with its 95 % CI.",
                  report.markdown(pairs)]
    parts += checks_markdown(rows, found)
    if sweep_dir:
        yours = report.load_results(sweep_dir)
        parts += [f"## Your runs ({sweep_dir}) beside the reference",
                  report.markdown(beside_yours(found, yours)) if yours else
                  "No finished run in the sweep folder yet."]
        left_out = other_data(found, yours)
        if left_out:
            parts.append(left_out)
    figure = plot_convergence(curves(reference_dir, rows),
                              files.join(out_dir, "reference_convergence.png"))
    if figure:
        parts += ["## Convergence", f"Validation accuracy against training tasks: {figure}"]
    markdown_path = files.join(out_dir, "reference.md")
    files.write_atomic(markdown_path, "\n\n".join(parts) + "\n")
    return {"markdown": markdown_path, "figure": figure}
