"""Paired differences: learners tested on the same tasks, compared task by task.

    rows = paired.paired_rows(results, "omniglot")  # [header, [cell, learner, best, ...]]

Runs record each test task's accuracy; learners tested on the same tasks (the same task
fingerprint, from a fixed ``--eval_seed``, and the same dataset options) are compared task by
task with the cell's most accurate one: the mean of the per-task differences and its 95 %
confidence half-width (Student's t over the tasks), a learner's seeds averaged task by task
first (with ``--eval_seed=seed``, each seed's tasks paired on their own, then pooled).
"""

from __future__ import annotations

import json
from typing import Any, Iterable

import numpy as np

from cfsl_jax.experiments.cells import cell_of, cell_order, check_same_experiment, learner_order
from cfsl_jax.protocol import metrics
from cfsl_jax.training.config import from_json


def per_task_accuracy(results: Iterable[dict[str, Any]], dataset: str
                      ) -> dict[str, list[dict[str, np.ndarray]]]:
    """{cell: [{learner: accuracy per test task}, one per set of test tasks]} of ``dataset``'s
    runs: runs on the same test tasks (task fingerprint and dataset options) together, a
    learner's seeds averaged task by task (with a fixed ``--eval_seed`` every seed tests the
    same tasks: one set; with ``--eval_seed=seed`` each seed its own); runs without per-task
    accuracies are left out; a cell whose runs differ in more than their seed is refused
    (ValueError)."""
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
    return {cell: [{name: np.mean(runs, axis=0) for name, runs in group.items()}
                   for group in cells[cell].values()]
            for cell in cell_order(cells)}


def shared_differences(groups: list[dict[str, np.ndarray]], mine: str, theirs: str
                       ) -> np.ndarray | None:
    """Per-task accuracy differences ``mine - theirs`` over every set of test tasks both were
    tested on, pooled (None: no such set)."""
    shared = [g[mine] - g[theirs] for g in groups if mine in g and theirs in g]
    return np.concatenate(shared) if shared else None


def difference_columns(differences: np.ndarray) -> list[str]:
    """[mean per-task difference (points, signed), ±its 95 % CI half-width (Student's t over
    the tasks, ``metrics.across_runs``), tasks] of per-task accuracy differences."""
    stats = metrics.across_runs(np.asarray(differences, np.float64))
    return [f"{100 * stats.mean:+.2f}", f"±{100 * stats.ci95:.2f}", str(stats.runs)]


def paired_rows(results: Iterable[dict[str, Any]], dataset: str) -> list[list[str]]:
    """Each learner against its cell's most accurate learner on the same test tasks.

    Tasks and seeds as ``per_task_accuracy``. The most accurate: the highest mean over its
    tasks. Entry: the mean of the per-task differences (learner - best, points) over every
    set of test tasks both were tested on (each seed's own set with ``--eval_seed=seed``), and
    its 95 % CI half-width (Student's t), over those tasks.
    """
    rows = [["cell", "learner", "against", "difference (points)", "95 % CI", "tasks"]]
    for cell, groups in per_task_accuracy(results, dataset).items():
        learners = learner_order({name for group in groups for name in group})
        mean = {name: np.mean(np.concatenate([g[name] for g in groups if name in g]))
                for name in learners}
        best = max(learners, key=lambda name: mean[name])
        for name in learners:
            differences = shared_differences(groups, name, best)
            if name != best and differences is not None:
                rows.append([cell, name, best, *difference_columns(differences)])
    return rows
