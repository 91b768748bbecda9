"""Prototypical networks, continual: running per-label prototype sums and counts.

Only the sums [num_outputs, D] and counts [num_outputs] cross support sets (the
ATM); the Conv-4 embedding (64 filters) is meta-trained episodically. Labels
not yet seen in the task are masked out of the prediction.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from cfsl_jax.learners.base import Learner, check_image_shape, embedding_dim
from cfsl_jax.models.conv4 import Conv4
from cfsl_jax.spec import TaskSpec


class ProtoState(NamedTuple):
    sums: jax.Array  # float [num_outputs, D] sum of embeddings per label
    counts: jax.Array  # int32 [num_outputs] support samples seen per label


def protonets(spec: TaskSpec, image_shape: tuple[int, int, int] = (28, 28, 1),
              filters: int = 64, activation: str = "relu",
              state_dtype: jnp.dtype = jnp.float32) -> Learner:
    """A ProtoNets learner for ``spec`` and inputs of ``image_shape``.

    ``state_dtype`` is the dtype of the carried sums (bf16 halves their bytes); counts are int32.
    """
    embed = Conv4(filters=filters, activation=activation)

    def init_params(key, example_x, spec):
        check_image_shape(example_x, image_shape)
        return embed.init(key, example_x)

    def init(params, key, spec):
        del key
        dim = embedding_dim(embed, params, image_shape)
        return ProtoState(jnp.zeros((spec.num_outputs, dim), state_dtype),
                          jnp.zeros((spec.num_outputs,), jnp.int32))

    def adapt(params, state, support_x, support_y):
        features = embed.apply(params, support_x)
        one_hot = jax.nn.one_hot(support_y, spec.num_outputs, dtype=features.dtype)
        return ProtoState((state.sums + (one_hot.T @ features)).astype(state_dtype),
                          state.counts + jnp.sum(support_y[:, None] == jnp.arange(
                              spec.num_outputs), axis=0, dtype=jnp.int32))

    def predict(params, state, target_x):
        features = embed.apply(params, target_x)
        prototypes = (state.sums.astype(jnp.float32) / jnp.maximum(state.counts, 1)[:, None]
                      ).astype(features.dtype)
        distances = (jnp.sum(features**2, -1, keepdims=True) - 2 * features @ prototypes.T
                     + jnp.sum(prototypes**2, -1))
        return jnp.where(state.counts > 0, -distances, jnp.finfo(features.dtype).min)

    return Learner("protonets", spec, init_params, init, adapt, predict)

