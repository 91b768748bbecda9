"""``launch.report --reference``'s "your runs": each run of a sweep beside the reference run of
the same dataset, dataset options, learner and cell.

    from cfsl_jax.experiments import reference_report, reference_yours
    rows, found = reference_report.load("docs/reference")
    table = reference_yours.beside_yours(found, report.load_results("/tmp/my_sweep"))

- A run is paired with the reference run of its seed where there is one, else with every
  seed; with the mean of the per-task differences and its 95 % CI where both were tested on
  the same tasks (the same fingerprint).
- Dataset options (Omniglot's ``class_split``) are part of the match, since the name and the
  task fingerprint leave them out: ``other_data`` names in one line the runs left out for them.
- The reference budget column names the reference run's setting (``reference_checks.setting``)
  where the reference holds more than one of its dataset, budget, learner and cell.

``reference_report`` re-exports ``beside_yours`` and ``other_data``.
"""

from __future__ import annotations

import json
from typing import Sequence

import numpy as np

from cfsl_jax.experiments import reference, reference_checks, report
from cfsl_jax.protocol.metrics import summarize
from cfsl_jax.training.config import from_json


def _percent(value: str | float) -> str:
    return f"{100 * float(value):.2f}" if value != "" else "-"


def _data_options(result: dict) -> str:
    """A run's dataset options (``class_split``, ``resize``...), as sorted JSON: what its test
    images are beyond the dataset's name and the task fingerprint, which ignore the class
    split (``evaluate.task_fingerprint``)."""
    return json.dumps(from_json(result["config"]).dataset_options, sort_keys=True)


def _references(found: Sequence[dict], mine: dict) -> tuple[list[dict], list[dict]]:
    """(the reference runs of ``mine``'s dataset, dataset options, learner and cell: the run of
    its seed where there is one, else every seed; those of other dataset options)."""
    same_run = [r for r in found if (r["dataset"], r["learner"], report.cell_of(r)) ==
                (mine["dataset"], mine["learner"], report.cell_of(mine))]
    options = _data_options(mine)
    same_data = [r for r in same_run if _data_options(r) == options]
    same_seed = [r for r in same_data if r["seed"] == mine["seed"]]
    return same_seed or same_data, [r for r in same_run if _data_options(r) != options]


def beside_yours(found: Sequence[dict], yours: Sequence[dict]) -> list[list[str]]:
    """Rows (header first): your runs beside the reference run of the same dataset, dataset
    options, learner and cell (``report.cell_of``), with the paired difference where both used
    the same test tasks (``other_data`` names the runs left out for their dataset options);
    the reference budget names the reference run's setting (``reference_checks.setting``)
    where the reference holds more than one of its dataset, budget, learner and cell."""
    out = [["dataset", "learner", "cell", "yours (%)", "your budget", "reference (%)",
            "reference budget", "yours - reference, paired (points, 95 % CI, tasks)"]]
    # the reference's settings of one dataset, budget, learner and cell, named where they differ
    labels = reference_checks.setting_labels(
        ((r["dataset"], r["_budget"], r["learner"], report.cell_of(r)),
         reference_checks.result_setting(r)) for r in found)
    for mine in sorted(yours, key=lambda r: (r["dataset"], r["learner"], report.cell_of(r),
                                             r["seed"])):
        cell = report.cell_of(mine)
        budget = reference.budget_name(from_json(mine["config"]))
        for ref in _references(found, mine)[0]:
            same = (ref["task_fingerprint"] == mine["task_fingerprint"]
                    and "per_task" in ref["test"] and "per_task" in mine["test"])
            text = "not the same test tasks"
            if same:
                stats = summarize(np.asarray(mine["test"]["per_task"]["acc"], np.float64)
                                  - np.asarray(ref["test"]["per_task"]["acc"], np.float64))
                text = (f"{100 * stats['mean']:+.2f} ± {100 * stats['ci95']:.2f} "
                        f"({len(mine['test']['per_task']['acc'])})")
            out.append([mine["dataset"], mine["learner"], f"{cell} seed {mine['seed']}",
                        _percent(mine["test"]["acc_mean"]), budget,
                        _percent(ref["test"]["acc_mean"]),
                        reference_checks.budget_label(ref["_budget"], labels[(
                            (ref["dataset"], ref["_budget"], ref["learner"], report.cell_of(ref)),
                            reference_checks.result_setting(ref))]) + f" seed {ref['seed']}",
                        text])
    return out


def other_data(found: Sequence[dict], yours: Sequence[dict]) -> str | None:
    """One line naming your runs that ``beside_yours`` leaves out: the reference has their
    dataset, learner and cell only on other dataset options (another class split: other test
    images under the same fingerprint); None where there is none."""
    left = [mine for mine in yours if not _references(found, mine)[0]
            and _references(found, mine)[1]]
    if not left:
        return None
    names = ", ".join(f"{r['dataset']} {r['learner']} {report.cell_of(r)} seed {r['seed']} "
                      f"({_data_options(r)})" for r in sorted(left, key=lambda r: (
                          r["dataset"], r["learner"], report.cell_of(r), r["seed"])))
    theirs = sorted({_data_options(ref) for mine in left for ref in _references(found, mine)[1]})
    return (f"Left out, not paired: {names}: the reference ran them on other dataset options "
            f"({'; '.join(theirs)}), so on other test images.")
