"""Evaluation: a learner on a fixed set of tasks -> accuracy, cross-entropy, ATM, MACs.

The evaluation tasks are a pure function of (split, spec, seed, purpose):
``task_keys(seed, purpose, n)`` gives the same keys every time, so validation
after every epoch uses identical tasks, and ``task_fingerprint`` -- a SHA-256
of every task's indices and labels -- lets two people check that they
evaluated on the same tasks.

Tasks are processed in chunks of ``batch_size`` by one jitted program that
samples the indices, gathers the images on device, runs every task and
reduces it to per-task metrics; the last chunk is padded with extra tasks
whose results are dropped, so nothing recompiles. ``params`` may carry a
leading ensemble axis (``ensemble=True``): the members' target logits are
averaged, as the paper tests with its best 5 checkpoints.
"""

from __future__ import annotations

import functools
import hashlib
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cfsl_jax import data, episode, metrics, seeding
from cfsl_jax.learners.base import Learner
from cfsl_jax.sampler import sample_task, sample_tasks
from cfsl_jax.spec import TaskSpec


def task_keys(seed: int, purpose: str, num_tasks: int) -> jax.Array:
    """Keys of the evaluation tasks: ``split(purpose_key(seed, purpose), num_tasks)``."""
    return jax.random.split(seeding.purpose_key(seed, purpose), num_tasks)


def task_fingerprint(split: data.Split, spec: TaskSpec, num_tasks: int, seed: int,
                     purpose: str = "eval") -> str:
    """SHA-256 of all evaluation tasks' support/target indices and labels (hex)."""
    tasks = sample_tasks(task_keys(seed, purpose, num_tasks), split.class_table,
                         split.class_sizes, spec)
    digest = hashlib.sha256()
    for field in (tasks.support_idx, tasks.support_labels, tasks.target_idx,
                  tasks.target_labels):
        digest.update(np.ascontiguousarray(np.asarray(field, np.int32)).tobytes())
    return digest.hexdigest()


@functools.partial(jax.jit, static_argnames=("learner", "ensemble"))
def _evaluate_chunk(learner: Learner, params: Any, split: data.Split, keys: jax.Array,
                    ensemble: bool) -> dict[str, jax.Array]:
    spec = learner.spec
    tasks = jax.vmap(lambda k: sample_task(k, split.class_table, split.class_sizes, spec))(keys)
    support_x = data.gather_normalised(split, tasks.support_idx)
    target_x = data.gather_normalised(split, tasks.target_idx)
    run_keys = jax.vmap(lambda k: jax.random.fold_in(k, 1))(keys)

    def logits_of(member_params):
        return episode.run_tasks(learner, member_params, support_x, tasks.support_labels,
                                 target_x, run_keys)

    if ensemble:
        logits = jax.lax.map(logits_of, params).mean(axis=0)
    else:
        logits = logits_of(params)
    return {
        "acc": metrics.accuracy(logits, tasks.target_labels),
        "ce": metrics.cross_entropy(logits, tasks.target_labels),
        "group_acc": metrics.group_accuracy(logits, tasks.target_labels, tasks.target_group,
                                            spec.num_groups),
    }


def evaluate(learner: Learner, params: Any, split: data.Split, spec: TaskSpec | None = None,
             num_tasks: int = 600, seed: int = 0, purpose: str = "eval",
             batch_size: int = 50, ensemble: bool = False,
             cost_metrics: bool = True) -> dict[str, Any]:
    """Evaluate ``learner`` on ``num_tasks`` tasks of ``split``.

    Returns a dict with acc_mean/std/ci95, ce_mean/std/ci95, group_acc (mean
    accuracy per class group), atm, macs_adapt, macs_predict, macs_per_task
    (unless ``cost_metrics=False``), num_tasks, task_fingerprint, seconds and
    tasks_per_s.
    """
    spec = spec or learner.spec
    if spec != learner.spec:
        raise ValueError(f"spec {spec.name} differs from the learner's {learner.spec.name}")
    if num_tasks < 1 or batch_size < 1:
        raise ValueError(f"num_tasks and batch_size must be >= 1, got {num_tasks}, {batch_size}")
    sample_tasks(task_keys(seed, purpose, 1), split.class_table, split.class_sizes, spec)
    batch_size = min(batch_size, num_tasks)
    num_chunks = -(-num_tasks // batch_size)
    keys = task_keys(seed, purpose, num_chunks * batch_size)  # padded; extras dropped below
    start = time.perf_counter()
    chunks = [_evaluate_chunk(learner, params, split, keys[i * batch_size:(i + 1) * batch_size],
                              ensemble) for i in range(num_chunks)]
    per_task = {name: np.concatenate([np.asarray(c[name]) for c in chunks])[:num_tasks]
                for name in chunks[0]}
    seconds = time.perf_counter() - start
    report: dict[str, Any] = {}
    for name in ("acc", "ce"):
        for stat, value in metrics.summarize(per_task[name]).items():
            report[f"{name}_{stat}"] = value
    report["group_acc"] = per_task["group_acc"].mean(axis=0).tolist()
    report["num_tasks"] = num_tasks
    report["task_fingerprint"] = task_fingerprint(split, spec, num_tasks, seed, purpose)
    report["seconds"] = seconds
    report["tasks_per_s"] = num_tasks / seconds
    if cost_metrics:
        member = jax.tree.map(lambda x: x[0], params) if ensemble else params
        image_shape = tuple(split.images.shape[1:])
        report["atm"] = metrics.atm(learner, member, image_shape)
        report.update(metrics.learner_macs(learner, member, image_shape))
    return report
