"""The episode protocol: the code that walks a task for evaluation and meta-training.

``run_task`` initialises a fresh adaptation state, ``lax.scan``s ``adapt``
over the support sets -- so ``adapt`` is traced once and only ever sees the
current support set -- and predicts the whole target set from the final
state. ``run_tasks`` maps it over a batch of tasks. Meta-training
differentiates the target loss of ``run_task`` with respect to ``params``
(``meta_loss``), unless the learner brings its own ``Recipe.meta_loss``:
MAML++ and SCA scan the support sets themselves there, to add the multi-step
loss and the critic step.
"""

from __future__ import annotations

import contextvars

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from cfsl_jax.runtime import backend, parallel
from cfsl_jax.protocol import metrics
from cfsl_jax.protocol.learner import Learner, Params, State

TARGET_CHUNK = 1000  # the most target samples predicted in one piece
# While MACs are counted the target set is predicted in one piece: XLA's cost analysis counts
# the body of a ``lax.map`` over chunks once, not once per chunk (``_meta_step_macs``).
_WHOLE_TARGET = contextvars.ContextVar("whole_target", default=False)
REMAT_MIN_NSS = 64  # target_loss rematerialises support-set steps from this NSS on


def adapt_all(learner: Learner, params: Params, support_x: jax.Array, support_y: jax.Array,
              key: jax.Array, unroll: int | bool | None = None, remat: bool = False) -> State:
    """The state after the learner has seen every support set, one at a time.

    ``unroll`` is ``lax.scan``'s (True: fully unrolled, so that XLA's cost
    analysis, which counts a loop body once, counts every support set; None:
    ``backend.scan_unroll(NSS)``, a rolled loop on CPU and short scans unrolled
    on accelerators); ``remat`` recomputes each step's activations in the
    backward pass.
    """
    spec = learner.spec
    chex.assert_shape(support_y, (spec.nss, spec.support_size))
    chex.assert_shape(support_x, (spec.nss, spec.support_size, None, None, None))
    state = learner.init(params, key, spec)

    def step(state, support_set):
        return learner.adapt(params, state, *support_set), None

    if remat:
        step = jax.checkpoint(step)
    if unroll is None:
        unroll = backend.scan_unroll(spec.nss)
    state, _ = jax.lax.scan(step, state, (support_x, support_y), unroll=unroll)
    return state


def target_chunks(size: int, chunk: int = TARGET_CHUNK) -> list[np.ndarray]:
    """Interleaved chunks of ``range(size)``, at most ``chunk`` long, grouped by length.

    ``c = ceil(size / chunk)`` chunks; chunk k holds k, k + c, k + 2c, ... Returns
    one int32 array [chunks, length] per distinct length (at most two).
    """
    count = -(-size // chunk)
    longer = size % count  # chunks 0..longer-1 hold one sample more
    base = size // count
    groups = [np.arange(0, longer)[:, None] + count * np.arange(base + 1),
              np.arange(longer, count)[:, None] + count * np.arange(base)]
    return [g.astype(np.int32) for g in groups if g.size]


def predict_target(learner: Learner, params: Params, state: State, target_x: jax.Array,
                   chunk: int | None = None, remat: bool = False) -> jax.Array:
    """``learner.predict`` on the whole target set, in interleaved chunks when it is long.

    ``chunk`` defaults to ``TARGET_CHUNK`` (the whole set while MACs are counted).
    """
    size = target_x.shape[0]
    chunk = chunk or (size if _WHOLE_TARGET.get() else TARGET_CHUNK)
    if size <= chunk:
        return learner.predict(params, state, target_x)

    def predict(x):
        return learner.predict(params, state, x)

    if remat:
        predict = jax.checkpoint(predict)
    groups = target_chunks(size, chunk)
    outputs = [jax.lax.map(predict, target_x[idx]) for idx in groups]
    logits = jnp.concatenate([out.reshape(-1, out.shape[-1]) for out in outputs])
    order = np.argsort(np.concatenate([idx.reshape(-1) for idx in groups]))
    return logits[order]


def run_task(learner: Learner, params: Params, support_x: jax.Array, support_y: jax.Array,
             target_x: jax.Array, key: jax.Array, unroll: int | bool | None = None,
             remat: bool = False) -> jax.Array:
    """Target logits [T, num_outputs] after adapting to support_x [NSS, NC*KS, H, W, C]."""
    state = adapt_all(learner, params, support_x, support_y, key, unroll, remat)
    logits = predict_target(learner, params, state, target_x, remat=remat)
    chex.assert_shape(logits, (target_x.shape[0], learner.spec.num_outputs))
    return logits


def target_loss(learner: Learner, params: Params, support_x: jax.Array, support_y: jax.Array,
                target_x: jax.Array, target_y: jax.Array, key: jax.Array,
                unroll: int | bool | None = None) -> tuple[jax.Array, jax.Array]:
    """(mean target cross-entropy, target logits) of one task: the meta-training objective.

    Rematerialised from ``NSS >= REMAT_MIN_NSS`` on (see the module docstring).
    """
    remat = learner.spec.nss >= REMAT_MIN_NSS
    logits = run_task(learner, params, support_x, support_y, target_x, key, unroll, remat)
    loss = metrics.cross_entropy(logits, target_y)
    return loss, logits


def meta_loss(learner: Learner, params: Params, support_x: jax.Array, support_y: jax.Array,
              target_x: jax.Array, target_y: jax.Array, key: jax.Array,
              progress: jax.Array, unroll: int | bool | None = None
              ) -> tuple[jax.Array, jax.Array]:
    """The learner's meta-training objective of one task: its own, or ``target_loss``.

    ``unroll`` applies to ``target_loss``'s scan; a learner's own ``meta_loss``
    has its own options (MAML++'s ``unroll``).
    """
    own = learner.recipe.meta_loss
    if own is not None:
        return own(params, support_x, support_y, target_x, target_y, key, progress)
    return target_loss(learner, params, support_x, support_y, target_x, target_y, key, unroll)


def sequential(mesh: Mesh | None = None, learner: Learner | None = None) -> bool:
    """Whether a batch of tasks runs one task at a time per device (not one vmap): on CPU
    (``mesh``'s devices, default ``backend.lowering_platform()``), for every learner but one
    that asks for a vmap there (``Recipe.vmap_on_cpu``: ProtoNets runs saved before its
    ``tasks_on_cpu`` option existed).

    On XLA:CPU one task at a time is the faster program: vmapping per-task weights turns
    convolutions into slow grouped ones, and even with shared weights (ProtoNets) one vmap of a
    batch of tasks ran 1.8-2.3x slower in evaluation and up to 1.6x slower in meta-training, and
    held the whole batch's activations (docs/results.md, "Tasks one at a time on CPU"). On an
    accelerator a vmap of the batch is what fills the device.
    """
    platform = mesh.devices.flat[0].platform if mesh is not None else None
    return not backend.is_accelerator(platform) and not (
        learner is not None and learner.recipe.vmap_on_cpu)


def run_tasks(learner: Learner, params: Params, support_x: jax.Array, support_y: jax.Array,
              target_x: jax.Array, keys: jax.Array, mesh: Mesh | None = None,
              in_turn: bool | None = None) -> jax.Array:
    """``run_task`` over a batch of tasks (leading axis B on every array but ``params``).

    The batch is laid along ``mesh`` (default: one device) with ``parallel.map_tasks``,
    one task at a time (``in_turn=True``) or as one vmap; default ``sequential(mesh, learner)``.
    """
    mesh = mesh or parallel.make_mesh(1)
    in_turn = sequential(mesh, learner) if in_turn is None else in_turn
    return parallel.map_tasks(lambda sx, sy, tx, k, p: run_task(learner, p, sx, sy, tx, k),
                              (support_x, support_y, target_x, keys), mesh, in_turn,
                              shared=params)


def meta_step_macs(learner, params, image_shape: tuple[int, ...], dtype=jnp.float32,
                   progress: float = 0.0) -> float:
    """MACs of one task's meta-training step: value and gradient of its meta-loss.

    The support-set scan is unrolled so that every support set is counted, and the target set
    predicted in one piece (a ``lax.map`` over chunks is counted once); a learner with its own
    ``meta_loss`` (MAML++, SCA) must be built with its ``unroll=True`` option for the same
    reason. The optimiser update is not included (it is per step, not per task).
    """
    return metrics.counted("meta_step", lambda: _meta_step_macs(
        learner, params, image_shape, dtype, progress), learner, params, tuple(image_shape),
        np.dtype(dtype), float(progress))


def _meta_step_macs(learner, params, image_shape: tuple[int, ...], dtype, progress: float
                    ) -> float:
    spec = learner.spec
    support_x = jnp.zeros((spec.nss, spec.support_size, *image_shape), dtype)
    support_y = jnp.zeros((spec.nss, spec.support_size), jnp.int32)
    target_x = jnp.zeros((spec.target_size, *image_shape), dtype)
    target_y = jnp.zeros((spec.target_size,), jnp.int32)

    # the task's arrays are arguments, as in a training step: closed over, they would be
    # constants that XLA folds (ProtoNets B3 counted 11 % under)
    def step(params, support_x, support_y, target_x, target_y, progress):
        return jax.value_and_grad(lambda p: meta_loss(
            learner, p, support_x, support_y, target_x, target_y, jax.random.key(0), progress,
            unroll=True)[0])(params)

    whole = _WHOLE_TARGET.set(True)  # counted unchunked: every target sample's MACs
    try:
        return metrics.xla_macs(step, params, support_x, support_y, target_x, target_y,
                                jnp.float32(progress))
    finally:
        _WHOLE_TARGET.reset(whole)
