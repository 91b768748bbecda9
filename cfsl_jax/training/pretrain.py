"""Supervised pretraining of a learner's backbone on all classes of a split.

For learners with ``training == "pretrain"`` (Pretrain+Tune, EWC+Pretrain):
``params["embed"]`` is trained with ordinary softmax cross-entropy through the
recipe's ``embed_apply`` (``backbone``) and a temporary linear head over all
``split.class_table.shape[0]`` classes; the head is then thrown away and every
other entry of ``params`` (e.g. the learner's own head) is returned untouched.
Two ways (``TrainConfig.pretrain_data``):

``"tasks"`` (the default, as the authors' code: ``FineTuneFromPretrainedFewShotClassifier.
run_train_iter``, commit 5b814ac, ``few_shot_learning_system.py``), ``pretrain_on_tasks``:
- Step ``s`` samples ``meta_batch`` CFSL tasks of the run's spec from the training
  split with ``fold_in(data_key, s)`` (the same sampler as meta-training) and
  trains on every image of them (support sets and target set), each labelled with
  its class-table row.
- The schedule is the run's: ``epochs x iters_per_epoch`` steps. After every
  epoch the learner (fine-tuning from the current backbone) is validated on the
  run's fixed validation tasks; the best ``keep_best`` epochs are kept and the
  test uses their ensemble, exactly as for meta-learned learners.
- Resumable: the backbone, the temporary head and Adam's state are checkpointed
  at every epoch end (and every ``checkpoint_every`` steps).
- The authors' head has 2000 units indexed by global class id (only the training
  classes are ever targets); here it has one unit per training class.

``"uniform"``, ``pretrain``: ``steps`` batches of ``batch_size`` images drawn
uniformly, with replacement, from the valid entries of the class table; no
validation; the final backbone is used. FLUID's supervised pretraining
(``cfsl_jax.fluid.pretraining``) runs the same steps (``pretrained_state``) on the
stream's pretraining classes and keeps the head.

Rules shared by both:
- Step ``s`` draws with ``fold_in(data_key, s)``; the temporary head is
  initialised from ``head_key``, where ``head_key, data_key = split(key)``: the
  result is a pure function of the key.
- Images are gathered and normalised on device (``data.gather_normalised``)
  inside the jitted step, so a step is one XLA program that compiles once per
  (learner, split shapes, hyperparameters, mesh).
- Over a device mesh (``mesh``, as meta-training's: ``cfsl_jax.runtime.parallel``) the
  step's batch of images is laid along the mesh's task axis and everything else (params,
  optimiser state, the split: ``parallel.place_split``) is replicated; XLA partitions the
  program and reduces the gradients and the batch statistics of the backbone's norm layers
  across devices, so the result does not depend on the mesh beyond float summation order.
  The batch is not padded (padded images would enter the batch statistics): XLA splits a
  batch that does not divide the mesh unevenly.
- Optimiser: ``chain(add_decayed_weights(weight_decay), adam(learning_rate))``,
  i.e. PyTorch's ``Adam(weight_decay=...)`` (L2 added to the gradient, not
  AdamW), on the backbone and the temporary head.
- A line is logged (absl) every ``log_every`` steps: the mean loss and accuracy
  of the batches since the last line.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from cfsl_jax import data
from cfsl_jax.training import optimizers
from cfsl_jax.protocol import metrics, sampler
from cfsl_jax.runtime import parallel, seeding
from cfsl_jax.training.evaluate import evaluate
from cfsl_jax.training import checkpoints, loop, plain_loop, steps
from cfsl_jax.training.config import TrainConfig
from cfsl_jax.training.tracking import Tracking
from cfsl_jax.protocol.learner import Learner, Params
from cfsl_jax.models.conv4 import LinearHead
from jax.sharding import Mesh



class PretrainState(NamedTuple):
    params: Params  # {"embed": backbone variables, "head": temporary head over all C classes}
    opt_state: optax.OptState  # the optimiser's state for ``params``


class Pool(NamedTuple):
    """Every valid entry of a class table, flattened: what a batch is drawn from."""

    image_idx: jax.Array  # int32 [M] image indices
    labels: jax.Array  # int32 [M] class-table row of each image


def entry_pool(class_table) -> Pool:
    """The valid (>= 0) entries of ``class_table`` [C, S] and their rows."""
    table = np.asarray(class_table)
    rows, cols = np.nonzero(table >= 0)
    if rows.size == 0:
        raise ValueError(f"class_table of shape {table.shape} has no valid entries")
    return Pool(jnp.asarray(table[rows, cols], jnp.int32), jnp.asarray(rows, jnp.int32))


def optimizer(learning_rate: float, weight_decay: float) -> optax.GradientTransformation:
    """PyTorch's ``Adam(lr=learning_rate, weight_decay=weight_decay)``: L2 into the gradient."""
    return optimizers.optimizer("adam", learning_rate, weight_decay)


def backbone(learner: Learner) -> Callable[[Params, jax.Array], jax.Array]:
    """The ``embed_apply`` that pretraining trains: a CFSL learner's recipe's, or a FLUID
    ``Method``'s own field; ValueError when it has none."""
    recipe = getattr(learner, "recipe", learner)
    if recipe.embed_apply is None:
        raise ValueError(f"learner {learner.name!r} has no embed_apply to pretrain "
                         f"(training={recipe.training!r})")
    return recipe.embed_apply


@functools.partial(jax.jit, donate_argnums=0,
                   static_argnames=("learner", "num_classes", "batch_size", "learning_rate",
                                    "weight_decay", "mesh"))
def train_step(state: PretrainState, split: data.Split, pool: Pool, key: jax.Array, *,
               learner: Learner, num_classes: int, batch_size: int, learning_rate: float,
               weight_decay: float, mesh: Mesh | None = None
               ) -> tuple[PretrainState, jax.Array, jax.Array]:
    """One step on a batch drawn with ``key``: (new state, batch loss, batch accuracy); the
    batch is laid along ``mesh`` (default: one device)."""
    pick = jax.random.randint(key, (batch_size,), 0, pool.image_idx.shape[0])
    return _update(state, learner, num_classes, split, pool.image_idx[pick], pool.labels[pick],
                   learning_rate, weight_decay, mesh)


def _update(state: PretrainState, learner: Learner, num_classes: int, split: data.Split,
            idx: jax.Array, labels: jax.Array, learning_rate: float, weight_decay: float,
            mesh: Mesh | None) -> tuple[PretrainState, jax.Array, jax.Array]:
    """One optimiser step of cross-entropy on the images ``idx`` of ``split`` labelled
    ``labels``, the batch laid along ``mesh``: (state, loss, accuracy)."""
    images = data.gather_normalised(split, idx)
    if mesh is not None:
        images, labels = parallel.constrain((images, labels), mesh)
    head = LinearHead(num_classes)

    def loss_fn(params):
        logits = head.apply(params["head"], backbone(learner)(params["embed"], images))
        loss = metrics.cross_entropy(logits, labels)
        return loss, jnp.mean(jnp.argmax(logits, -1) == labels)

    (loss, accuracy), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = optimizer(learning_rate, weight_decay).update(
        grads, state.opt_state, state.params)
    return PretrainState(optax.apply_updates(state.params, updates), opt_state), loss, accuracy


def init_state(learner: Learner, params: Params, num_classes: int, image_shape: tuple[int, ...],
               key: jax.Array, learning_rate: float, weight_decay: float) -> PretrainState:
    """``params["embed"]`` with a fresh head over ``num_classes`` from ``key``, and Adam's state."""
    features = jax.eval_shape(backbone(learner), params["embed"],
                              jax.ShapeDtypeStruct((1, *image_shape), jnp.float32))
    head = LinearHead(num_classes).init(key, jnp.zeros((1, features.shape[-1]), jnp.float32))
    # Copy: train_step donates its state, which must not alias the caller's params.
    trainable = {"embed": jax.tree.map(jnp.copy, params["embed"]), "head": head}
    return PretrainState(trainable, optimizer(learning_rate, weight_decay).init(trainable))


def _check(name: str, value, minimum: float, integer: bool = False,
           strict: bool = False) -> None:
    bad = isinstance(value, bool) or not isinstance(value, int if integer else (int, float))
    if bad or not math.isfinite(value) or value < minimum or (strict and value == minimum):
        kind = "an integer" if integer else "a finite number"
        raise ValueError(f"{name} must be {kind} {'>' if strict else '>='} {minimum}, "
                         f"got {value!r}")


def pretrain(learner: Learner, params: Params, split: data.Split, key: jax.Array, *,
             steps: int = 2000, batch_size: int = 64, learning_rate: float = 1e-3,
             weight_decay: float = 1e-5, log_every: int = 100, mesh: Mesh | None = None
             ) -> Params:
    """``params`` with ``params["embed"]`` pretrained on all classes of ``split``, each batch
    laid along ``mesh`` (default: one device)."""
    backbone(learner)
    if not isinstance(params, dict) or "embed" not in params:
        raise ValueError(f"params must be a dict with the backbone under 'embed', got keys "
                         f"{sorted(params) if isinstance(params, dict) else type(params)}")
    for name, value in (("steps", steps), ("batch_size", batch_size), ("log_every", log_every)):
        _check(name, value, 1, integer=True)
    _check("learning_rate", learning_rate, 0, strict=True)
    _check("weight_decay", weight_decay, 0)

    state = pretrained_state(learner, params, split, key, steps=steps, batch_size=batch_size,
                             learning_rate=learning_rate, weight_decay=weight_decay,
                             log_every=log_every, mesh=mesh)
    return {**params, "embed": state.params["embed"]}


def pretrained_state(learner: Learner, params: Params, split: data.Split, key: jax.Array, *,
                     steps: int, batch_size: int, learning_rate: float, weight_decay: float,
                     log_every: int | None = None, mesh: Mesh | None = None,
                     what: str = "pretrain") -> PretrainState:
    """``pretrain``'s steps (unchecked; ``steps`` may be 0), its final state: the backbone and
    the temporary head over the split's classes (which FLUID keeps); progress lines say
    ``what``."""
    pool = entry_pool(split.class_table)
    num_classes = int(split.class_table.shape[0])
    head_key, data_key = jax.random.split(key)
    state = init_state(learner, params, num_classes, tuple(split.images.shape[1:]), head_key,
                       learning_rate, weight_decay)
    if mesh is not None:
        state, split = parallel.replicate(state, mesh), parallel.place_split(split, mesh)
    hyper = dict(learner=learner, num_classes=num_classes, batch_size=batch_size,
                 learning_rate=learning_rate, weight_decay=weight_decay, mesh=mesh)

    def one(state, key):
        state, loss, accuracy = train_step(state, split, pool, key, **hyper)
        return state, {"loss": loss, "acc": accuracy}

    return plain_loop.run_steps(what, "steps", steps, state, one, data_key, log_every)


# ---- pretraining on the images of sampled training tasks (the authors' way) ----------------


def image_classes(class_table) -> jax.Array:
    """int32 [N]: the class-table row of every image index (-1 for an index in no row)."""
    table = np.asarray(class_table)
    rows, cols = np.nonzero(table >= 0)
    out = np.full(int(table.max()) + 1, -1, np.int32)
    out[table[rows, cols]] = rows
    return jnp.asarray(out)


def task_images(key: jax.Array, split: data.Split, classes: jax.Array, spec, tasks: int
                ) -> tuple[jax.Array, jax.Array]:
    """Image indices [tasks * per-task images] of ``tasks`` tasks drawn with ``key`` (support
    sets and target set) and their class-table rows; jittable."""
    drawn = jax.vmap(sampler.sample_task, in_axes=(0, None, None, None))(
        jax.random.split(key, tasks), split.class_table, split.class_sizes, spec)
    idx = jnp.concatenate([drawn.support_idx.reshape(tasks, -1), drawn.target_idx], axis=1)
    idx = idx.reshape(-1)
    return idx, classes[idx]


def _task_update(state: PretrainState, split: data.Split, classes: jax.Array, key: jax.Array, *,
                 learner: Learner, num_classes: int, tasks: int, learning_rate, weight_decay,
                 mesh: Mesh | None = None) -> tuple[PretrainState, jax.Array, jax.Array]:
    """One step on every image of ``tasks`` training tasks of ``learner.spec`` drawn with
    ``key``, the images laid along ``mesh`` (default: one device); ``learning_rate`` and
    ``weight_decay`` may be traced (a pack's runs' own)."""
    idx, labels = task_images(key, split, classes, learner.spec, tasks)
    return _update(state, learner, num_classes, split, idx, labels, learning_rate,
                   weight_decay, mesh)


task_step = functools.partial(jax.jit, donate_argnums=0, static_argnames=(
    "learner", "num_classes", "tasks", "learning_rate", "weight_decay", "mesh"))(_task_update)


def packed_task_step(split: data.Split, classes: jax.Array, keys: jax.Array,
                     pack_axis: str = "auto", rates: dict[str, np.ndarray] | None = None,
                     **hyper):
    """``task_step`` of K runs as one function ``(params, opt_state, first) -> (params,
    opt_state, {"loss", "acc"})`` over the leading run axis of ``params``, ``opt_state`` and
    ``keys`` ([K] data keys): run k's step ``first`` trains on the tasks of
    ``fold_in(keys[k], first)``, as it does alone. ``pack_axis`` as meta-training's
    (``steps.resolve_pack_axis``: ``auto`` maps the runs one after another on CPU, vmaps them
    elsewhere). ``hyper``: ``task_step``'s keywords; ``rates`` (``pack_runs.hyper_parameters``):
    each run's ``learning_rate`` and ``weight_decay`` as [K] arrays, traced in place of
    ``hyper``'s constants (None: the constants for every run)."""
    def one(params, opt_state, key, first, run_rates):
        new, loss, accuracy = _task_update(PretrainState(params, opt_state), split, classes,
                                           jax.random.fold_in(key, first),
                                           **{**hyper, **run_rates})
        return new.params, new.opt_state, {"loss": loss, "acc": accuracy}

    def packed(params, opt_state, first):
        runs = (params, opt_state, keys, rates or {})
        if steps.resolve_pack_axis(pack_axis) == "map":
            return jax.lax.map(lambda run: one(*run[:3], first, run[3]), runs)
        return jax.vmap(one, in_axes=(0, 0, 0, None, 0))(*runs[:3], first, runs[3])
    return packed


def pretrain_on_tasks(config: TrainConfig, learner: Learner, params: Params, splits: dict[str, data.Split],
                      workdir: str, ckpt: checkpoints.Checkpoints,
                      stop_after_steps: int | None = None, mesh=None,
                      tracking: Tracking | None = None) -> Params:
    """Pretrain ``params["embed"]`` on sampled training tasks for the run's schedule over
    ``mesh`` (default: every device), selecting epochs on validation; returns the ensemble
    (stacked along a leading axis) of the best ``config.keep_best`` epochs' params. Resumes
    from ``ckpt``'s latest checkpoint; the epoch loop (stops, NaN check, validation,
    keep-best) is ``loop.run``. The result does not depend on the mesh beyond float
    summation order."""
    backbone(learner)
    mesh = mesh or parallel.make_mesh()
    train_split = splits["train"]
    sampler.check_split(train_split.class_table, train_split.class_sizes, learner.spec)
    num_classes = int(train_split.class_table.shape[0])
    head_key, data_key = jax.random.split(seeding.purpose_key(config.seed, "pretrain"))
    state = init_state(learner, params, num_classes, tuple(train_split.images.shape[1:]),
                       head_key, config.learning_rate, config.weight_decay)
    classes = parallel.replicate(image_classes(train_split.class_table), mesh)
    placed = parallel.place_split(train_split, mesh)
    hyper = dict(learner=learner, num_classes=num_classes, tasks=config.meta_batch,
                 learning_rate=config.learning_rate, weight_decay=config.weight_decay, mesh=mesh)

    def step(state, key, progress_):
        new, loss, accuracy = task_step(PretrainState(state.params, state.opt_state), placed,
                                        classes, key, **hyper)
        return loop.TrainState(*new), {"loss": loss, "acc": accuracy}

    def validate(epoch: int, state):
        current = {**params, "embed": state.params["embed"]}
        return evaluate(learner, current, splits["val"], num_tasks=config.val_tasks,
                        seed=config.task_seed, purpose="val", batch_size=config.eval_batch,
                        cost_metrics=False, mesh=mesh), current

    phase = loop.phase(config, "pretrain", "pretraining", data_key)
    step_fn = loop.per_step(data_key, step)
    loop.run(phase, loop.TrainState(*state), lambda epoch, state: step_fn, validate,
             loop.Outputs(workdir, ckpt, tracking or Tracking(None)),
             place=lambda s: parallel.replicate(s, mesh),
             stop_after_steps=stop_after_steps)
    return checkpoints.stack(ckpt.restore_best(params))
