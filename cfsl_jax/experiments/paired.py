"""Paired differences: learners tested on the same tasks, compared task by task.

    rows = paired.paired_rows(results, "omniglot")  # [header, [cell, learner, best, ...]]

Runs record each test task's accuracy; learners tested on the same tasks (the same task
fingerprint, from a fixed ``--eval_seed``, and the same dataset options) are compared task by
task with the cell's most accurate one: the mean of the per-task differences and its 95 %
confidence half-width (``metrics.summarize``), a learner's seeds averaged task by task first.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

import numpy as np

from cfsl_jax.experiments.cells import cell_of, cell_order, check_same_experiment, learner_order
from cfsl_jax.protocol import metrics
from cfsl_jax.training.config import from_json


def per_task_accuracy(results: Iterable[dict[str, Any]],
                      dataset: str) -> dict[str, dict[str, np.ndarray]]:
    """{cell: {learner: accuracy per test task}} of ``dataset``'s runs on each cell's most
    common test tasks (task fingerprint and dataset options), a learner's seeds averaged task
    by task (with a fixed ``--eval_seed`` every seed tests the same tasks); runs without
    per-task accuracies are left out; a cell whose runs differ in more than their seed is
    refused (ValueError)."""
    cells: dict[str, dict[str, dict[str, list]]] = {}  # cell -> fingerprint -> learner -> runs
    first: dict[tuple[str, str, str], dict] = {}
    for result in results:
        per_task = result["test"].get("per_task")
        if result["dataset"] != dataset or per_task is None:
            continue
        key = (dataset, result["learner"], cell_of(result))
        check_same_experiment(key, first.setdefault(key, result), result)
        cell = cells.setdefault(key[2], {})
        # the fingerprint hashes the tasks' indices in a split named by its variant, which a
        # dataset option such as Omniglot's class_split does not change: the options too
        same_tasks = (result["task_fingerprint"], json.dumps(
            from_json(result["config"]).dataset_options, sort_keys=True))
        cell.setdefault(same_tasks, {}).setdefault(
            result["learner"], []).append(np.asarray(per_task["acc"], np.float64))
    return {cell: {name: np.mean(runs, axis=0)
                   for name, runs in max(cells[cell].values(), key=len).items()}
            for cell in cell_order(cells)}


def difference_columns(mine: np.ndarray, theirs: np.ndarray) -> list[str]:
    """[mean per-task difference (points, signed), ±its 95 % CI half-width
    (``metrics.summarize``), tasks] of two per-task accuracy arrays on the same tasks."""
    stats = metrics.summarize(np.asarray(mine, np.float64) - np.asarray(theirs, np.float64))
    return [f"{100 * stats['mean']:+.2f}", f"±{100 * stats['ci95']:.2f}", str(np.size(mine))]


def paired_rows(results: Iterable[dict[str, Any]], dataset: str) -> list[list[str]]:
    """Each learner against its cell's most accurate learner on the same test tasks.

    Tasks and seeds as ``per_task_accuracy``. Entry: the mean of the per-task differences
    (learner - best, points) and its 95 % CI half-width (``metrics.summarize``), over the
    shared tasks.
    """
    rows = [["cell", "learner", "against", "difference (points)", "95 % CI", "tasks"]]
    for cell, accuracy in per_task_accuracy(results, dataset).items():
        best = max(accuracy, key=lambda name: accuracy[name].mean())
        for name in learner_order(accuracy):
            if name != best:
                rows.append([cell, name, best, *difference_columns(accuracy[name],
                                                                   accuracy[best])])
    return rows
