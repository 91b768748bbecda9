"""The meta-training step: one XLA program per meta-batch, and S steps per program.

    step = make_train_step(learner, optimizer, meta_batch)          # one step per call
    steps = make_steps(learner, optimizer, meta_batch, steps=10)    # lax.scan over 10 steps
    packed = make_steps(learner, optimizer, meta_batch, steps=10, runs=True)  # vmapped over K runs
    mapped = make_steps(..., runs=True, pack_axis="map")  # K runs one after another, one program
    rates = make_steps(..., runs=True, per_run=train.pack_optimizer)  # runs' own learning rates

Step ``s`` of a run draws its tasks from ``fold_in(key, s)`` whichever program runs it, so a
run trained S steps per call, or packed with other runs (a leading run axis on the params,
the optimiser state and the keys, vmapped), samples exactly the tasks it samples alone.
"""

from __future__ import annotations

from typing import Protocol

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from cfsl_jax import data
from cfsl_jax.models.norm import absorb
from cfsl_jax.protocol import episode, metrics
from cfsl_jax.protocol.learner import Learner
from cfsl_jax.protocol.sampler import sample_task
from cfsl_jax.runtime import parallel
from cfsl_jax.training.pack_runs import PACK_AXES  # defined there, without JAX (the flags')


def make_train_step(learner: Learner, optimizer: optax.GradientTransformation, meta_batch: int,
                    mesh: Mesh | None = None, in_turn: bool | None = None):
    """``train_step_fn`` jitted."""
    return jax.jit(train_step_fn(learner, optimizer, meta_batch, mesh, in_turn))


def train_step_fn(learner: Learner, optimizer: optax.GradientTransformation, meta_batch: int,
                  mesh: Mesh | None = None, in_turn: bool | None = None):
    """``step(params, opt_state, split, key, progress) -> (params, opt_state, metrics)``.

    The meta-batch's tasks are laid along ``mesh`` (default: one device) and
    padded to a multiple of its size with masked copies; each device samples,
    gathers and differentiates its own tasks (``parallel.map_tasks``: a vmap,
    or one task at a time: ``in_turn``, default ``episode.sequential``, on CPU), and the
    mean gradient over the ``meta_batch`` real tasks is reduced by XLA.
    """
    spec = learner.spec
    mesh = mesh or parallel.make_mesh(1)
    in_turn = episode.sequential(mesh, learner) if in_turn is None else in_turn
    padded = parallel.padded(meta_batch, mesh)

    def task_loss(params, task, progress):  # task: support x, y, target x, y, key
        loss, logits = episode.meta_loss(learner, params, *task, progress)
        return loss, metrics.accuracy(logits, task[3])

    grad_fn = jax.value_and_grad(task_loss, has_aux=True)

    def task_grads(params, split, progress, key):
        task = sample_task(key, split.class_table, split.class_sizes, spec)
        args = (data.gather_normalised(split, task.support_idx), task.support_labels,
                data.gather_normalised(split, task.target_idx), task.target_labels,
                jax.random.fold_in(key, 1))
        (loss, acc), grads = grad_fn(params, args, progress)
        running_bn = learner.recipe.running_bn
        moments = running_bn.moments(params, args[0], args[2]) if running_bn else None
        return loss, acc, grads, moments

    def step(params, opt_state, split, key, progress):
        keys = jax.random.split(key, meta_batch)
        keys = keys[jnp.arange(padded) % meta_batch]  # padding: repeated tasks, weighted 0
        weights = (jnp.arange(padded) < meta_batch).astype(jnp.float32) / meta_batch
        loss, acc, grads, moments = parallel.map_tasks(
            lambda k, shared: task_grads(*shared, k), (keys,), mesh,
            in_turn, shared=(params, split, progress))
        loss, acc, grads = jax.tree.map(lambda x: jnp.tensordot(weights, x, axes=1),
                                        (loss, acc, grads))
        updates, opt_state = optimizer.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        running_bn = learner.recipe.running_bn
        if running_bn is not None:  # the real tasks' forward passes, task after task
            moments = jax.tree.map(lambda m: m[:meta_batch].reshape(-1, *m.shape[2:]), moments)
            # the running averages are the previous ones with the moments folded in: the
            # optimiser's update of them (weight decay) is discarded
            new_params = {**new_params,
                          running_bn.key: absorb(params[running_bn.key], moments)}
        return new_params, opt_state, {"loss": loss, "acc": acc}

    return step


def resolve_pack_axis(pack_axis: str, platform: str | None = None) -> str:
    """``"vmap"`` or ``"map"`` for ``pack_axis`` (``PACK_AXES``): ``"auto"`` is ``"map"`` on
    CPU, where the runs' work is compute-bound: vmap's batched kernels do the same work there
    in K runs' memory, map in one run's (docs/results.md, "Packing runs"), and ``"vmap"`` on
    GPU/TPU, where batching the runs fills the device."""
    if pack_axis not in PACK_AXES:
        raise ValueError(f"pack_axis must be one of {PACK_AXES}, got {pack_axis!r}")
    if pack_axis == "auto":
        return "map" if (platform or jax.default_backend()) == "cpu" else "vmap"
    return pack_axis


def make_steps(learner: Learner, optimizer: optax.GradientTransformation, meta_batch: int,
               steps: int, runs: bool = False, mesh: Mesh | None = None,
               pack_axis: str = "vmap", per_run: PerRunOptimizer | None = None):
    """A jitted ``multi(params, opt_state, split, key, first, progress) -> (params, opt_state,
    {"loss": [steps], "acc": [steps]})``: ``steps`` training steps in one program
    (``lax.scan``), step ``first + i`` drawing with ``fold_in(key, first + i)`` at
    ``progress[i]`` (float32, computed by the caller as the one-step loop does).

    ``runs``: a pack; ``params``, ``opt_state`` and ``key`` have a leading run axis [K] (each
    run its own key), and so do the metrics ([K, steps]); ``split``, ``first`` and
    ``progress`` are shared. ``pack_axis`` (``resolve_pack_axis``): ``"vmap"`` batches the
    runs' computations; ``"map"`` runs them one after another in the same program
    (``lax.map``), each the computation it is alone. Not part of a run's config: like packing
    itself, it changes how a run is computed, not what.

    ``per_run`` (a pack of runs that differ in scalar hyper-parameters, e.g. the learning
    rate): ``multi`` takes a trailing ``hyper``, a dict of float32 [K] arrays, and run k steps
    with ``per_run(**{name: hyper[name][k]})`` instead of ``optimizer`` (its state has the same
    structure, so a run's checkpoints are the solo run's).
    """
    def alone(params, opt_state, split, key, first, progress, hyper=None):
        if (hyper is None) != (per_run is None or not runs):
            raise TypeError("make_steps(per_run=...) takes the runs' hyper-parameters as its "
                            "last argument, and only then")
        body = train_step_fn(learner, optimizer if hyper is None else per_run(**hyper),
                             meta_batch, mesh)

        def one(carry, xs):
            i, at = xs
            params, opt_state, out = body(*carry, split, jax.random.fold_in(key, first + i), at)
            return (params, opt_state), out

        (params, opt_state), outs = jax.lax.scan(one, (params, opt_state),
                                                 (jnp.arange(steps), progress))
        return params, opt_state, outs

    if not runs:
        def multi(params, opt_state, split, key, first, progress):
            return alone(params, opt_state, split, key, first, progress)
    elif resolve_pack_axis(pack_axis) == "map":
        def multi(params, opt_state, split, key, first, progress, *hyper):
            return jax.lax.map(lambda run: alone(*run[:2], split, run[2], first, progress,
                                                 *run[3:]), (params, opt_state, key, *hyper))
    else:
        multi = jax.vmap(alone, in_axes=(0, 0, None, 0, None, None)
                         + ((0,) if per_run is not None else ()))
    return jax.jit(multi)


class PerRunOptimizer(Protocol):
    """``per_run(learning_rate=..., weight_decay=...)``: the optimiser of one run of a pack,
    from its (traced) hyper-parameters, e.g. ``train.pack_optimizer``."""

    def __call__(self, **hyper: jax.Array) -> optax.GradientTransformation: ...
