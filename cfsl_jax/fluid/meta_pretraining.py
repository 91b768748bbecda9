"""Episodic (meta-) pretraining for the FLUID few-shot methods, on the pretrain classes.

Episodes: ``way`` classes drawn uniformly from the pretrain classes, ``shot``
support and ``query`` query images per class, drawn without replacement from
each class's pretraining images. Strategies (the paper's Appendix E: 5-shot
30-way, MAML 5-shot 5-way):

- ``protonets`` (Snell et al.): prototypes = mean support features, logits =
  minus squared Euclidean distances, CE on the queries; from a random backbone.
- ``meta_baseline`` (Chen et al.): after supervised pretraining, logits =
  ``tau * cos(query, prototype)``, the prototype the mean of the raw support
  features, with a learned temperature ``tau`` (init 10, kept as
  ``params["temperature"]``); the stream classifies the same way, cosine to
  the mean raw feature of each class (``heads.ncm(centroid="mean")``).
- ``maml``: first-order MAML (Finn et al.; the paper's Appendix D writes the
  second-order update -- first order keeps the CPU cost bounded; the paper's
  own MAML row is a Conv-4 that scores near chance, Table 3-b): a zero-init
  ``way``-way head and the backbone adapted by ``inner_steps`` SGD steps on
  the support set, the query loss's gradient at the adapted weights applied
  to the initial ones.

Optimiser: Adam at ``learning_rate`` (the paper: 100 epochs at 0.01, halved
every 40; here a step budget).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax

from cfsl_jax import data
from cfsl_jax.protocol import metrics
from cfsl_jax.training import plain_loop
from cfsl_jax.data import Split
from cfsl_jax.fluid import classifiers as cls
from cfsl_jax.fluid.protocol import Method, Params
from cfsl_jax.training.optimizers import optimizer

EPISODES = {"protonets": (30, 5, 5), "meta_baseline": (30, 5, 5), "maml": (5, 5, 5)}


def episode(key: jax.Array, split: Split, way: int, shot: int, query: int):
    """(support images [way*shot,...], support labels, query images, query labels)."""
    class_key, sample_key = jax.random.split(key)
    num_classes = split.class_table.shape[0]
    chosen = jax.random.choice(class_key, num_classes, (way,), replace=False)
    rows = split.class_table[chosen]  # [way, S]
    noise = jax.random.uniform(sample_key, rows.shape)
    order = jnp.argsort(jnp.where(rows >= 0, noise, 2.0), axis=1)[:, :shot + query]
    picked = jnp.take_along_axis(rows, order, axis=1)
    labels = jnp.broadcast_to(jnp.arange(way)[:, None], picked.shape)
    images = data.gather_normalised(split, jnp.maximum(picked, 0))
    flat = lambda x: x.reshape(-1, *x.shape[2:])  # noqa: E731
    return (flat(images[:, :shot]), flat(labels[:, :shot]), flat(images[:, shot:]),
            flat(labels[:, shot:]))


def _prototype_loss(method, trainable, support_x, support_y, query_x, query_y, way, cosine):
    support = method.embed_apply(trainable["embed"], support_x)
    query = method.embed_apply(trainable["embed"], query_x)
    prototypes = jax.ops.segment_sum(support, support_y, way) / (support.shape[0] / way)
    logits = (cls.cosine_logits(query, prototypes, trainable["temperature"]) if cosine
              else metrics.neg_sq_euclidean(query, prototypes))
    return metrics.cross_entropy(logits, query_y)


def _maml_loss(method, trainable, support_x, support_y, query_x, query_y, way, inner_steps,
               inner_lr):
    def loss(weights, x, y):
        logits = method.embed_apply(weights["embed"], x) @ weights["kernel"] + weights["bias"]
        return metrics.cross_entropy(logits, y)

    dim = jax.eval_shape(method.embed_apply, trainable["embed"], support_x[:1]).shape[-1]
    weights = {"embed": trainable["embed"], "kernel": jnp.zeros((dim, way)),
               "bias": jnp.zeros((way,))}
    for _ in range(inner_steps):
        grads = jax.lax.stop_gradient(jax.grad(loss)(weights, support_x, support_y))  # 1st order
        weights = jax.tree.map(lambda w, g: w - inner_lr * g, weights, grads)
    return loss(weights, query_x, query_y)


def meta_train(method: Method, params: Params, split: Split, key: jax.Array, strategy: str, *,
               steps: int, learning_rate: float = 1e-3, inner_steps: int = 5,
               inner_lr: float = 0.01) -> Params:
    """``params`` after ``steps`` episodes of ``strategy`` (module doc)."""
    way, shot, query = EPISODES[strategy]
    way = min(way, int(split.class_table.shape[0]))
    trainable = {"embed": jax.tree.map(jnp.copy, params["embed"])}
    if strategy == "meta_baseline":
        trainable["temperature"] = jnp.float32(10.0)
    if strategy == "maml":
        loss_fn = functools.partial(_maml_loss, method, way=way, inner_steps=inner_steps,
                                    inner_lr=inner_lr)
    else:
        loss_fn = functools.partial(_prototype_loss, method, way=way,
                                    cosine=strategy == "meta_baseline")
    opt = optimizer("adam", learning_rate)

    @jax.jit
    def step(trainable, opt_state, key):
        batch = episode(key, split, way, shot, query)
        loss, grads = jax.value_and_grad(loss_fn)(trainable, *batch)
        updates, opt_state = opt.update(grads, opt_state, trainable)
        return optax.apply_updates(trainable, updates), opt_state, loss

    def one(state, episode_key):
        trainable, opt_state, loss = step(*state, episode_key)
        return (trainable, opt_state), {"loss": loss}

    trainable, _ = plain_loop.run_steps(f"FLUID {strategy} meta-training", "episodes", steps,
                                  (trainable, opt.init(trainable)), one, key)
    return {**params, **trainable}
