"""Supervised pretraining of a learner's backbone on all classes of a split.

For learners with ``training == "pretrain"`` (Pretrain+Tune, EWC+Pretrain, and
the FLUID methods): ``params["embed"]`` is trained with ordinary softmax
cross-entropy through ``learner.embed_apply`` and a temporary linear head over
all ``split.class_table.shape[0]`` classes; the head is then thrown away and
every other entry of ``params`` (e.g. the learner's own head) is returned
untouched.

Rules:
- A batch is ``batch_size`` entries drawn uniformly, with replacement, from
  the valid (non-padding) entries of the class table; the label of an image is
  its class-table row. Step ``s`` draws with ``fold_in(data_key, s)``, and the
  temporary head is initialised from ``head_key``, where
  ``head_key, data_key = split(key)``: the result is a pure function of the key.
- Images are gathered and normalised on device (``data.gather_normalised``)
  inside the jitted ``train_step``, so a step is one XLA program. The learner
  and hyperparameters are static arguments: the step compiles once per
  (learner, split shapes, hyperparameters), however many steps run.
- Optimiser: ``chain(add_decayed_weights(weight_decay), adam(learning_rate))``,
  i.e. PyTorch's ``Adam(weight_decay=...)`` (L2 added to the gradient, not
  AdamW), on the backbone and the temporary head.
- A line is logged (absl) every ``log_every`` steps: the mean loss and accuracy
  of the batches since the last line.
"""

from __future__ import annotations

import functools
import math
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging

from cfsl_jax import data
from cfsl_jax.learners.base import Learner, Params
from cfsl_jax.models.conv4 import LinearHead


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
    return optax.chain(optax.add_decayed_weights(weight_decay), optax.adam(learning_rate))


@functools.partial(jax.jit, donate_argnums=0,
                   static_argnames=("learner", "num_classes", "batch_size", "learning_rate",
                                    "weight_decay"))
def train_step(state: PretrainState, split: data.Split, pool: Pool, key: jax.Array, *,
               learner: Learner, num_classes: int, batch_size: int, learning_rate: float,
               weight_decay: float) -> tuple[PretrainState, jax.Array, jax.Array]:
    """One step on a batch drawn with ``key``: (new state, batch loss, batch accuracy)."""
    pick = jax.random.randint(key, (batch_size,), 0, pool.image_idx.shape[0])
    images = data.gather_normalised(split, pool.image_idx[pick])
    labels = pool.labels[pick]
    head = LinearHead(num_classes)

    def loss_fn(params):
        logits = head.apply(params["head"], learner.embed_apply(params["embed"], images))
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        return loss, jnp.mean(jnp.argmax(logits, -1) == labels)

    (loss, accuracy), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = optimizer(learning_rate, weight_decay).update(
        grads, state.opt_state, state.params)
    return PretrainState(optax.apply_updates(state.params, updates), opt_state), loss, accuracy


def init_state(learner: Learner, params: Params, num_classes: int, image_shape: tuple[int, ...],
               key: jax.Array, learning_rate: float, weight_decay: float) -> PretrainState:
    """``params["embed"]`` with a fresh head over ``num_classes`` from ``key``, and Adam's state."""
    features = jax.eval_shape(learner.embed_apply, params["embed"],
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
             weight_decay: float = 1e-5, log_every: int = 100) -> Params:
    """``params`` with ``params["embed"]`` pretrained on all classes of ``split``."""
    if learner.embed_apply is None:
        raise ValueError(f"learner {learner.name!r} has no embed_apply to pretrain "
                         f"(training={learner.training!r})")
    if not isinstance(params, dict) or "embed" not in params:
        raise ValueError(f"params must be a dict with the backbone under 'embed', got keys "
                         f"{sorted(params) if isinstance(params, dict) else type(params)}")
    for name, value in (("steps", steps), ("batch_size", batch_size), ("log_every", log_every)):
        _check(name, value, 1, integer=True)
    _check("learning_rate", learning_rate, 0, strict=True)
    _check("weight_decay", weight_decay, 0)

    pool = entry_pool(split.class_table)
    num_classes = int(split.class_table.shape[0])
    head_key, data_key = jax.random.split(key)
    state = init_state(learner, params, num_classes, tuple(split.images.shape[1:]), head_key,
                       learning_rate, weight_decay)
    hyper = dict(learner=learner, num_classes=num_classes, batch_size=batch_size,
                 learning_rate=learning_rate, weight_decay=weight_decay)

    window: list[tuple[jax.Array, jax.Array]] = []
    start = time.perf_counter()
    for step in range(steps):
        state, loss, accuracy = train_step(state, split, pool,
                                           jax.random.fold_in(data_key, step), **hyper)
        window.append((loss, accuracy))
        if (step + 1) % log_every == 0 or step + 1 == steps:
            losses, accuracies = np.asarray(window).T  # one host sync per log line
            logging.info("pretrain step %d/%d: loss %.4f accuracy %.4f (%.1f steps/s)",
                         step + 1, steps, losses.mean(), accuracies.mean(),
                         (step + 1) / (time.perf_counter() - start))
            window.clear()
    return {**params, "embed": state.params["embed"]}

