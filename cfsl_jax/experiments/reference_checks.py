"""What the reference rows say of each learner: does it learn, and what each part adds.

    from cfsl_jax.experiments import reference, reference_checks, reference_report
    rows, found = reference_report.load("docs/reference")
    table = reference_checks.learns(rows, found)     # header first, a row per learner and cell
    table = reference_checks.components(found)       # pretraining, EWC, SCA's critic, paired

- ``learns``: a learner **learns** a cell when its test accuracy is above chance
  (1 / the cell's output classes) by a clear margin, the lower end of its 95 % CI at least
  ``CLEAR_MARGIN`` points above chance, and, where it trains (or pretrains), its validation
  accuracy ended above where it started. Init+Tune and EWC-Init train nothing: for them the
  test alone decides. Seeds of a cell are averaged (accuracy and CI half-width alike); the
  validation curve is the lowest seed's.
- ``components``: paired differences over the shared test tasks between learners that
  differ in one part (``PAIRS``): what pretraining adds to fine-tuning, what EWC adds, what
  SCA's critic adds to MAML++ H, each within one dataset, budget and cell
  (``report.per_task_accuracy``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from cfsl_jax.experiments import reference, report
from cfsl_jax.training.config import from_json

CLEAR_MARGIN = 5.0  # points between chance and the lower end of the test accuracy's 95 % CI

# (learner, against, the part that differs)
PAIRS: tuple[tuple[str, str, str], ...] = (
    ("pretrain_tune", "init_tune", "pretraining"),
    ("ewc_pretrain", "ewc_init", "pretraining, with EWC"),
    ("ewc_init", "init_tune", "EWC, from the init"),
    ("ewc_pretrain", "pretrain_tune", "EWC, pretrained"),
    ("sca", "maml_high", "SCA's critic"),
)


def by_budget(found: Sequence[dict]) -> list[tuple[str, str, list[dict]]]:
    """[(dataset, budget, its runs)] of ``load``'s results, sorted: the runs that pair."""
    return [(dataset, budget, [r for r in found if (r["dataset"], r["_budget"]) ==
                               (dataset, budget)])
            for dataset, budget in sorted({(r["dataset"], r["_budget"]) for r in found})]


def _groups(found: Sequence[dict]) -> dict[tuple, list[dict]]:
    """(dataset, budget, learner, cell) -> its complete runs' results, in report order."""
    groups: dict[tuple, list[dict]] = {}
    for result in found:
        key = (result["dataset"], result["_budget"], result["learner"], result["config"]["task"])
        groups.setdefault(key, []).append(result)
    cells = report._cell_order(key[3] for key in groups)
    learners = report._learner_order(key[2] for key in groups)
    return dict(sorted(groups.items(), key=lambda item: (
        item[0][0], item[0][1], learners.index(item[0][2]), cells.index(item[0][3]))))


def verdict(acc: float, ci95: float, chance: float, val: tuple[float, float] | None) -> str:
    """``learns`` or what it lacks; accuracies in points, ``val`` (first, last) or None for a
    learner that trains nothing."""
    lacks = []
    if acc - ci95 - chance < CLEAR_MARGIN:
        lacks.append(f"test within {CLEAR_MARGIN:g} points of chance")
    if val is not None and not val[1] > val[0]:
        lacks.append("validation did not rise")
    return "learns" if not lacks else "does not learn: " + "; ".join(lacks)


def learns(rows: Sequence[dict], found: Sequence[dict]) -> list[list[str]]:
    """Rows (header first): per dataset, budget, learner and cell, the test accuracy beside
    chance, the validation curve's first, best and last points, and the verdict."""
    out = [["dataset", "budget", "learner", "cell", "test (%)", "chance (%)",
            "validation first -> best -> last (%)", "verdict"]]
    for (dataset, budget, learner, cell), runs in _groups(found).items():
        chance = 100 / from_json(runs[0]["config"]).spec.num_outputs
        acc = 100 * float(np.mean([r["test"]["acc_mean"] for r in runs]))
        ci95 = 100 * float(np.mean([r["test"]["acc_ci95"] for r in runs]))
        seeds = [r for r in rows if r["status"] == "complete" and (
            r["dataset"], r["budget"], r["learner"], r["cell"]) == (dataset, budget, learner, cell)]
        row = min(seeds, key=lambda r: int(r["seed"]), default={})  # the lowest seed's curve
        val = None
        text = "trains nothing" if reference._training(learner) == "none" else \
            "no validation curve"
        if row.get("val_acc_first", "") != "":
            first, best, last = (100 * float(row[k]) for k in
                                 ("val_acc_first", "val_acc_best", "val_acc_last"))
            val = (first, last)
            text = f"{first:.1f} -> {best:.1f} -> {last:.1f}"
        out.append([dataset, budget, learner, cell, f"{acc:.2f} ± {ci95:.2f}",
                    f"{chance:.1f}", text, verdict(acc, ci95, chance, val)])
    return out


def components(found: Sequence[dict]) -> list[list[str]]:
    """Rows (header first): ``PAIRS``' paired differences, per dataset, budget and cell."""
    out = [["dataset", "budget", "cell", "what it adds", "learner", "against",
            "difference (points)", "95 % CI", "tasks"]]
    for dataset, budget, subset in by_budget(found):
        for cell, accuracy in report.per_task_accuracy(subset, dataset).items():
            for learner, against, part in PAIRS:
                if learner in accuracy and against in accuracy:
                    out.append([dataset, budget, cell, part, learner, against,
                                *report.difference_columns(accuracy[learner],
                                                           accuracy[against])])
    return out
