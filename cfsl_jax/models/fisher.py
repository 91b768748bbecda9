"""The empirical diagonal Fisher of a classifier: EWC's importance weights.

``empirical_fisher(logits_fn, weights, x, y)`` is

    F = mean_i (d log p(y_i | x_i; weights) / d weights) ** 2     (elementwise)

with ``p = softmax(logits_fn(weights, x))``, the TRUE labels ``y_i`` (the
*empirical* Fisher; the "true" Fisher would sample ``y`` from the model) and
the MEAN over the ``n`` samples (a tree shaped like ``weights``).

Batch statistics: sample i's log-likelihood is row i of the network applied to
the whole batch ``x``, so a network that normalises with the statistics of the
batch it is given (``models.conv4.BatchStatNorm`` in "batch" mode) computes it
with the statistics of ``x`` -- for a learner that fine-tunes on a support set,
the statistics the set is adapted and predicted with. Each sample's gradient
then also flows through the batch statistics. ``jax.jacrev`` gives the n
gradients (n backward passes over the batch).

``independent=True`` is for networks whose row i depends on ``x_i`` alone (a
per-image normalised backbone, ``fluid.backbone``): the same quantity computed
as ``vmap`` of ``grad`` over batches of one (one backward pass per sample, not
per sample and batch). On such a network both paths agree to float rounding.

A convolution bias followed by batch-statistics normalisation has an exactly
zero gradient (the normalisation removes any constant shift); its Fisher is
float rounding (about 1e-13 in float32), so two programs that compute it
differ there by any factor while agreeing everywhere else.
"""

from __future__ import annotations

from typing import Any, Callable

import chex
import jax
import jax.numpy as jnp

Params = Any  # a pytree of weights
LogitsFn = Callable[[Params, jax.Array], jax.Array]  # (weights, x [n, ...]) -> logits [n, K]


def log_likelihood_grads(logits_fn: LogitsFn, weights: Params, x: jax.Array, y: jax.Array, *,
                         independent: bool = False) -> Params:
    """Per-sample gradients of ``log p(y_i | x_i)``: a tree of ``weights`` with leaves
    ``[n, *leaf.shape]`` (module doc: batch statistics, ``independent``)."""
    chex.assert_rank(y, 1)
    chex.assert_equal_shape_prefix([x, y], 1)
    if independent:
        def one(xi, yi):
            return jax.grad(lambda w: jax.nn.log_softmax(logits_fn(w, xi[None])[0])[yi])(weights)

        return jax.vmap(one)(x, y)

    def log_likelihoods(w):  # [n]
        log_probs = jax.nn.log_softmax(logits_fn(w, x))
        return jnp.take_along_axis(log_probs, y[:, None], axis=-1)[:, 0]

    return jax.jacrev(log_likelihoods)(weights)


def empirical_fisher(logits_fn: LogitsFn, weights: Params, x: jax.Array, y: jax.Array, *,
                     independent: bool = False) -> Params:
    """Mean over the batch of the squared per-sample log-likelihood gradients (module doc)."""
    grads = log_likelihood_grads(logits_fn, weights, x, y, independent=independent)
    return jax.tree.map(lambda g: jnp.mean(jnp.square(g), axis=0), grads)
