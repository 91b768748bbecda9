"""The episode protocol: the only code that walks a task.

``run_task`` initialises a fresh adaptation state, ``lax.scan``s ``adapt``
over the support sets -- so ``adapt`` is traced once and only ever sees the
current support set -- and predicts the whole target set from the final
state. ``run_tasks`` maps it over a batch of tasks. Meta-training
differentiates the target loss of ``run_task`` with respect to ``params``.
"""

from __future__ import annotations

import chex
import jax
import optax

from cfsl_jax.learners.base import Learner, Params, State


def adapt_all(learner: Learner, params: Params, support_x: jax.Array, support_y: jax.Array,
              key: jax.Array, unroll: int | bool = 1) -> State:
    """The state after the learner has seen every support set, one at a time.

    ``unroll`` is ``lax.scan``'s (True: fully unrolled, so that XLA's cost
    analysis, which counts a loop body once, counts every support set).
    """
    spec = learner.spec
    chex.assert_shape(support_y, (spec.nss, spec.support_size))
    chex.assert_shape(support_x, (spec.nss, spec.support_size, None, None, None))
    state = learner.init(params, key, spec)

    def step(state, support_set):
        return learner.adapt(params, state, *support_set), None

    state, _ = jax.lax.scan(step, state, (support_x, support_y), unroll=unroll)
    return state


def run_task(learner: Learner, params: Params, support_x: jax.Array, support_y: jax.Array,
             target_x: jax.Array, key: jax.Array, unroll: int | bool = 1) -> jax.Array:
    """Target logits [T, num_outputs] after adapting to support_x [NSS, NC*KS, H, W, C]."""
    state = adapt_all(learner, params, support_x, support_y, key, unroll)
    logits = learner.predict(params, state, target_x)
    chex.assert_shape(logits, (target_x.shape[0], learner.spec.num_outputs))
    return logits


def target_loss(learner: Learner, params: Params, support_x: jax.Array, support_y: jax.Array,
                target_x: jax.Array, target_y: jax.Array, key: jax.Array,
                unroll: int | bool = 1) -> tuple[jax.Array, jax.Array]:
    """(mean target cross-entropy, target logits) of one task: the meta-training objective."""
    logits = run_task(learner, params, support_x, support_y, target_x, key, unroll)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, target_y).mean()
    return loss, logits


def meta_loss(learner: Learner, params: Params, support_x: jax.Array, support_y: jax.Array,
              target_x: jax.Array, target_y: jax.Array, key: jax.Array,
              progress: jax.Array, unroll: int | bool = 1) -> tuple[jax.Array, jax.Array]:
    """The learner's meta-training objective of one task: its own, or ``target_loss``.

    ``unroll`` applies to ``target_loss``'s scan; a learner's own ``meta_loss``
    has its own options (MAML++'s ``unroll``).
    """
    if learner.meta_loss is not None:
        return learner.meta_loss(params, support_x, support_y, target_x, target_y, key, progress)
    return target_loss(learner, params, support_x, support_y, target_x, target_y, key, unroll)


def map_tasks(fn, tasks, sequential: bool):
    """Apply ``fn`` to each task of a batch (leading axis): vmap, or lax.map when sequential."""
    if sequential:
        return jax.lax.map(lambda args: fn(*args), tasks)
    return jax.vmap(fn)(*tasks)


def run_tasks(learner: Learner, params: Params, support_x: jax.Array, support_y: jax.Array,
              target_x: jax.Array, keys: jax.Array, sequential: bool | None = None) -> jax.Array:
    """``run_task`` over a batch of tasks (leading axis B on every array but ``params``).

    ``sequential`` (default: per-task-weight learners on CPU) runs the tasks
    with ``lax.map`` instead of ``vmap``.
    """
    if sequential is None:
        sequential = learner.per_task_weights and jax.default_backend() == "cpu"
    return map_tasks(lambda sx, sy, tx, k: run_task(learner, params, sx, sy, tx, k),
                     (support_x, support_y, target_x, keys), sequential)

