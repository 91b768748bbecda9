"""Reports of a sweep: the paper's Table 1 (and the same for CE, ATM, MACs), vs the paper.

    from cfsl_jax.experiments import report
    paths = report.write_report("/tmp/sweep", "/tmp/sweep/report")
    print(files.read_text(paths["markdown"]["synthetic"]))

Rules:

- Input: every ``results.json`` under the sweep directory (any depth), grouped
  by (dataset, learner, cell); a cell is the run config's ``task`` (``B3``,
  ``D8``, ...), or the run's own spec name (results.json's ``spec_name``) where spec
  overrides (``--nss``, ``--overwrite``, ...) made its task another (``cell_of``): such a
  run is never compared with Table 1's cell of its config's name. Runs without results
  (unfinished, failed) are not counted. The
  runs of a cell must differ only in their seed (``SEED_FIELDS``): a cell whose
  runs differ in a learner option (but those that change only the rounding,
  ``config.COMPUTATION_OPTIONS``), the budget or anything else is refused (runs of one
  spec reached by other task names and overrides are one experiment).
- Statistic: per run, the test metric's mean over its test tasks; then the
  mean, the sample standard deviation (ddof=1) and a Student-t 95% interval of
  those values across the seeds of a cell (``metrics.across_runs``).
- Metrics (``METRICS``): test accuracy (shown in percent, as the paper),
  cross-entropy (nats), ATM and MACs per task. An entry shows no ``± std``
  where the std is 0 (one seed; ATM and MACs, which every seed shares).
- Table 1 layout: rows = learners (registry order), columns = cells (the
  paper's grid order, then others), entries ``mean ± std``. Markdown (one file
  per dataset with the four tables and the comparison with the paper) and a
  long-format CSV per metric (numbers, one row per learner and cell).
- The paper's published accuracy (``paper_results.TABLE1`` or a JSON file of
  the same layout) is put side by side where a cell has one, with the
  difference ours - paper in percentage points; a difference marked ``†`` compares runs
  on other Omniglot classes than Table 1's (``paper_results.other_classes``: the
  default ``class_split=ordered``; Table 1 came from the authors' split).
- Files: the sweep directory and the report folder may be local or ``gs://``; every file is
  written atomically (``files.write_atomic``), so shards finishing at once each leave whole
  files (the last one's report).
- Paired differences (``paired.paired_rows``): runs record each test task's accuracy;
  learners tested on the same tasks (the same task fingerprint: a fixed
  ``--eval_seed``) are compared task by task with the cell's most accurate one.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Iterable, NamedTuple, Sequence

from cfsl_jax.experiments import figures, paper_results
# cell_of, PROTOCOL_FIELDS, SEED_FIELDS: also read as report.X (reference_report, tests)
from cfsl_jax.experiments.cells import (PROTOCOL_FIELDS, SEED_FIELDS,  # noqa: F401
                                        _resolved_spec, cell_of, cell_order,
                                        check_same_experiment, learner_order)
from cfsl_jax.experiments.paired import paired_rows
from cfsl_jax.protocol import metrics
from cfsl_jax.runtime import files
from cfsl_jax.training import results as results_io
from cfsl_jax.runtime.errors import UserError
from cfsl_jax.training.records import EvalRecord
from cfsl_jax.experiments.sweep_plan import safe_name
from cfsl_jax.training.config import from_json

# name -> (key in results.json's "test", title, scale for display, format)
METRICS: dict[str, tuple[str, str, float, str]] = {
    "acc": ("acc_mean", "test accuracy (%)", 100.0, "{:.2f}"),
    "ce": ("ce_mean", "test cross-entropy (nats)", 1.0, "{:.3f}"),
    "atm": ("atm", "ATM (state bytes / support bytes)", 1.0, "{:.4g}"),
    "macs": ("macs_per_task", "MACs per task", 1.0, "{:.4g}"),
}


class Aggregate(NamedTuple):
    """One (dataset, learner, cell) of a sweep: a metric across seeds."""

    mean: float
    std: float  # sample std across seeds (ddof=1; 0.0 for one seed)
    values: tuple[float, ...]  # per seed, in seed order
    seeds: tuple[int, ...]
    spec: dict  # the TaskSpec fields (nss, cci, overwrite, ...): results.json's, or its config's
    # task and overrides for a hand-made or older record without them (cells._resolved_spec)
    ci95: float = 0.0  # Student-t 95% half-width across seeds (metrics.across_runs)


Key = tuple[str, str, str]  # (dataset, learner, cell)

# Folders under a sweep directory that hold no run results (searched by nothing).
SKIPPED_FOLDERS = ("checkpoints", "xla_cache", "tensorboard")


def load_results(sweep_dir: str) -> list[dict[str, Any]]:
    """Every results.json under ``sweep_dir``, sorted by path."""
    if not files.isdir(sweep_dir):
        raise FileNotFoundError(f"sweep directory {sweep_dir!r} does not exist")
    found = []
    for root, _, names in files.walk(sweep_dir, skip=SKIPPED_FOLDERS):
        if "results.json" in names:
            found.append(results_io.read_json(files.join(root, "results.json")))
    return found


def aggregate(results: Iterable[dict[str, Any]], metric: str) -> dict[Key, Aggregate]:
    """``metric`` (a key of METRICS) of every (dataset, learner, cell) across its seeds."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; valid: {tuple(METRICS)}")
    field = METRICS[metric][0]
    grouped: dict[Key, list[tuple[int, float, dict]]] = {}
    first: dict[Key, dict] = {}  # the first result of each cell: the others must match it
    for result in results:
        key = (result["dataset"], result["learner"], cell_of(result))
        value = EvalRecord.from_json(result["test"]).get(field)
        if value is not None:
            check_same_experiment(key, first.setdefault(key, result), result)
            grouped.setdefault(key, []).append((result["seed"], float(value),
                                                 _resolved_spec(result)))
    out = {}
    for key, runs in grouped.items():
        runs.sort(key=lambda run: run[0])
        seeds = tuple(run[0] for run in runs)
        if len(set(seeds)) != len(seeds):
            raise UserError(f"{'/'.join(key)} has two results for one seed ({seeds}); one "
                            f"sweep directory must hold one run per (dataset, learner, cell, "
                            f"seed)")
        spread = metrics.across_runs([run[1] for run in runs])
        out[key] = Aggregate(spread.mean, spread.std, tuple(run[1] for run in runs), seeds,
                             runs[0][2], spread.ci95)
    return out


def _pretraining(budget: dict) -> str:
    """How the run's config (read by ``config.from_json``) pretrains."""
    if budget["pretrain_data"] == "tasks":
        return "pretraining: the same schedule on the images of training tasks"
    return f"pretraining: {_count(budget['pretrain_steps'], 'step')} of uniformly drawn images"


@functools.lru_cache(maxsize=None)
def _pretrains(learner: str) -> bool:
    """Whether ``learner`` is pretrained (Pretrain+Tune, EWC-Pretrain): only then does a
    report say how."""
    from cfsl_jax.learners import LEARNERS, get_learner
    from cfsl_jax.protocol.spec import TaskSpec
    return learner in LEARNERS and get_learner(learner, TaskSpec.preset("B3")).recipe.training == \
        "pretrain"


def _count(number: int, noun: str) -> str:
    """'1 epoch', '3 epochs'."""
    return f"{number} {noun}{'' if number == 1 else 's'}"


def format_value(metric: str, mean: float, std: float | None = None) -> str:
    """``mean ± std`` in the metric's display unit; no std when it is None or 0."""
    _, _, scale, fmt = METRICS[metric]
    text = fmt.format(mean * scale)
    if std:
        text += " ± " + fmt.format(std * scale)
    return text


def table(aggregates: dict[Key, Aggregate], dataset: str, metric: str) -> list[list[str]]:
    """Table 1 of one dataset: a header row, then one row per learner (cells as columns)."""
    keys = [key for key in aggregates if key[0] == dataset]
    cells = cell_order(key[2] for key in keys)
    rows = [["learner", *cells]]
    for learner in learner_order(key[1] for key in keys):
        row = [learner]
        for cell in cells:
            found = aggregates.get((dataset, learner, cell))
            row.append(format_value(metric, found.mean, found.std) if found else "-")
        rows.append(row)
    return rows


def markdown(rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table; the first row is the header."""
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(row) + " |" for row in rows[1:]]
    return "\n".join(lines)


# ---- the paper's numbers ---------------------------------------------------------------------


def load_paper_table(path: str | None = None) -> dict:
    """The paper's table: ``paper_results.TABLE1``, or a JSON file of the same layout."""
    if path is None:
        return paper_results.TABLE1
    table_ = results_io.read_json(path)
    missing = {"source", "values"} - set(table_)
    if missing:
        raise ValueError(f"{path}: a paper table needs the keys {sorted(missing)} "
                         f"(layout in cfsl_jax/experiments/paper_results.py)")
    return table_


def paper_value(paper: dict, dataset: str, learner: str, cell: str) -> dict | None:
    """{"mean", "std"} in percent, or None where the paper has no number for it."""
    paper_dataset = paper_results.PAPER_DATASETS.get(dataset, dataset)
    return paper["values"].get(paper_dataset, {}).get(learner, {}).get(cell)


OTHER_CLASSES_MARK = "†"


def paper_comparison(accuracy: dict[Key, Aggregate], dataset: str, paper: dict,
                     other_classes: Iterable[tuple[str, str]] = ()) -> list[list[str]]:
    """Rows (header first): learner, cell, ours, paper, ours - paper (points), for the cells
    that the paper has a number for; the difference of a (learner, cell) in
    ``other_classes`` (runs on other classes than the paper's) carries ``OTHER_CLASSES_MARK``."""
    other_classes = set(other_classes)
    rows = [["learner", "cell", "ours (%)", "paper (%)", "difference (points)"]]
    keys = [key for key in accuracy if key[0] == dataset]
    for learner in learner_order(key[1] for key in keys):
        for cell in cell_order(key[2] for key in keys if key[1] == learner):
            ours = accuracy[(dataset, learner, cell)]
            theirs = paper_value(paper, dataset, learner, cell)
            if theirs is None:
                continue
            difference = 100.0 * ours.mean - theirs["mean"]
            mark = f" {OTHER_CLASSES_MARK}" if (learner, cell) in other_classes else ""
            rows.append([learner, cell, format_value("acc", ours.mean, ours.std),
                         paper_results.printed(theirs), f"{difference:+.2f}{mark}"])
    return rows


# ---- files -----------------------------------------------------------------------------------


def long_rows(aggregates: dict[Key, Aggregate], dataset: str, metric: str,
              paper: dict | None = None) -> list[dict[str, Any]]:
    """One dict per (learner, cell) with numbers (the CSV rows); accuracy rows also carry the
    paper's mean/std and the difference (percent) where the paper has them."""
    rows = []
    keys = [key for key in aggregates if key[0] == dataset]
    for learner in learner_order(key[1] for key in keys):
        for cell in cell_order(key[2] for key in keys if key[1] == learner):
            found = aggregates[(dataset, learner, cell)]
            row = {"dataset": dataset, "learner": learner, "cell": cell,
                   "nss": found.spec["nss"], "cci": found.spec["cci"],
                   "overwrite": found.spec["overwrite"], "seeds": len(found.seeds),
                   "mean": found.mean, "std": found.std, "ci95": found.ci95}
            if metric == "acc" and paper is not None:
                theirs = paper_value(paper, dataset, learner, cell)
                row["paper_mean"] = theirs["mean"] / 100.0 if theirs else ""
                row["paper_std"] = theirs["std"] / 100.0 if theirs else ""
                row["difference"] = found.mean - theirs["mean"] / 100.0 if theirs else ""
            rows.append(row)
    return rows


def write_csv(path: str, rows: Sequence[dict[str, Any]]) -> None:
    if not rows:
        raise ValueError(f"no rows to write to {path}")
    files.write_atomic(path, results_io.csv_text(rows))


def _budget_text(budget: dict) -> str:
    return (f"{_count(budget['test_tasks'], 'test task')}, {_count(budget['epochs'], 'epoch')} x "
            f"{_count(budget['iters_per_epoch'], 'iteration')}, meta-batch "
            f"{budget['meta_batch']}")


def dataset_markdown(results: Sequence[dict], dataset: str, paper: dict) -> str:
    """The Markdown report of one dataset: Table 1 for each metric, then the paper's numbers."""
    runs = [r for r in results if r["dataset"] == dataset]
    seeds = max(len(a.seeds) for a in aggregate(runs, "acc").values()) if runs else 0
    spread = ("one seed per cell, so no ± on accuracy and cross-entropy" if seeds <= 1 else
              "mean ± sample std (ddof=1) across seeds; no ± where the seeds agree; the CSV "
              "also gives a Student-t 95% interval")
    # each budget with its learners (a folder that two sweeps of other budgets wrote: each said)
    budgets: dict[str, list[str]] = {}
    pretraining = ""
    for r in runs:
        config = from_json(r["config"]).to_json()
        text = _budget_text(config)
        if r["learner"] not in budgets.setdefault(text, []):
            budgets[text].append(r["learner"])
        if _pretrains(r["learner"]) and not pretraining:
            pretraining = f" ({_pretraining(config)})"
    said = ("Budget per run: " + next(iter(budgets)) + pretraining + "." if len(budgets) <= 1
            else "**Budgets differ between runs**, so their numbers are not comparable: "
            + "; ".join(f"{', '.join(names)}: {text}" for text, names in budgets.items())
            + pretraining + ".")
    parts = [f"# Table 1 on {dataset}",
             f"{_count(len(runs), 'run')}; each run's mean over its test tasks ({spread}). "
             + (said if runs else "")]
    renamed = sorted({f"`{cell_of(r)}` ({r['config']['task']} with "
                      f"{json.dumps(r['config'].get('spec_overrides', {}), sort_keys=True)})"
                      for r in runs if cell_of(r) != r["config"]["task"]})
    if renamed:
        parts.append(f"Runs whose spec overrides make another task than the cell their config "
                     f"names are reported under their own spec name, and compared with no "
                     f"Table 1 cell: {', '.join(renamed)}.")
    for metric, (_, title, _, _) in METRICS.items():
        parts += [f"## {title}", markdown(table(aggregate(runs, metric), dataset, metric))]
    parts.append(f"## Test accuracy vs the paper ({paper.get('table', 'table')}, "
                 f"{paper['source']})")
    paper_dataset = paper_results.PAPER_DATASETS.get(dataset, dataset)
    split = {(r["learner"], cell_of(r)): paper_results.other_classes(
        dataset, from_json(r["config"]).dataset_options) for r in runs}
    comparison = paper_comparison(aggregate(runs, "acc"), dataset, paper,
                                  [key for key, other in split.items() if other])
    if len(comparison) > 1:
        parts.append(markdown(comparison))
        marked = sorted({split[(row[0], row[1])] for row in comparison[1:]
                         if row[-1].endswith(OTHER_CLASSES_MARK)})
        if marked:
            parts.append(
                f"({OTHER_CLASSES_MARK} Runs on Omniglot's class_split="
                f"{'/'.join(marked)}: other training, validation and test characters than "
                f"Table 1's, which came from the authors' split "
                f"(`--dataset_option=class_split={paper_results.PAPER_CLASS_SPLIT}`), so the "
                f"difference is indicative only: docs/fidelity.md.)")
        if any(row[1].startswith("D") and cell_of(r) == row[1]
               and _resolved_spec(r)["label_offset"] != "per_support_set"
               for row in comparison[1:] for r in runs):
            parts.append("(Table 1's D cells come from code that labelled each support set "
                         "on its own, which caps a D cell below 50 %; these runs label each "
                         "class group, as the specification says. `--as_published=apr2020` "
                         "runs the published rule: docs/fidelity.md.)")
        if dataset not in paper_results.SAME_DATA:
            parts.append(f"(The paper used {paper_dataset}; the comparison with {dataset} is "
                         f"indicative only.)")
    elif dataset not in paper_results.PAPER_DATASETS and paper_dataset not in paper["values"]:
        parts.append(f"The paper reports no numbers on {dataset}.")
    else:
        parts.append("No published number for these cells. " + paper.get("note", ""))
    paired = paired_rows(runs, dataset)
    if len(paired) > 1:
        parts += ["## Paired differences on the same test tasks",
                  "Each learner against its cell's most accurate one: the mean over the "
                  "shared test tasks of the per-task accuracy difference, with its 95 % CI "
                  "(Student's t over the tasks; seeds averaged per task first, or with "
                  "--eval_seed=seed each seed's tasks paired on their own, then pooled).",
                  markdown(paired)]
    return "\n\n".join(parts) + "\n"


def write_report(sweep_dir: str, out_dir: str | None = None, paper: dict | None = None,
                 figure3: bool = True) -> dict[str, Any]:
    """Write the Markdown and CSV tables (and Figure 3) of every dataset of a sweep.

    Returns {"markdown": {dataset: path}, "csv": {dataset: {metric: path}},
    "figure3": {dataset: path or None}}.
    """
    results = load_results(sweep_dir)
    if not results:
        raise FileNotFoundError(f"no results.json under {sweep_dir!r}: has the sweep run?")
    out_dir = out_dir or files.join(sweep_dir, "report")
    files.makedirs(out_dir)
    paper = paper if paper is not None else load_paper_table()
    paths: dict[str, Any] = {"markdown": {}, "csv": {}, "figure3": {}}
    for dataset in sorted({r["dataset"] for r in results}):
        stem = files.join(out_dir, f"table1_{safe_name(dataset)}")
        files.write_atomic(stem + ".md", dataset_markdown(results, dataset, paper))
        paths["markdown"][dataset] = stem + ".md"
        paths["csv"][dataset] = {}
        for metric in METRICS:
            rows = long_rows(aggregate(results, metric), dataset, metric, paper)
            write_csv(f"{stem}_{metric}.csv", rows)
            paths["csv"][dataset][metric] = f"{stem}_{metric}.csv"
        if figure3:
            path = files.join(out_dir, f"figure3_{safe_name(dataset)}.png")
            accuracy = {k: v for k, v in aggregate(results, "acc").items() if k[0] == dataset}
            paths["figure3"][dataset] = figures.plot_accuracy_vs_nss(
                accuracy, path, title=f"Test accuracy vs NSS, CCI=1 ({dataset})")
    return paths
