"""The FLUID backbone: the project's Conv-4, normalising each image on its own.

A stream shows one image at a time, so the Conv-4's ``BatchStatNorm`` (which
uses the statistics of the batch it is given) sees a batch of one: per-image,
per-channel statistics over the spatial positions, like instance norm.
``per_image_apply`` makes that the rule everywhere -- a batch of n images is
n batches of one (``vmap``; XLA still runs one batched convolution) -- so
features do not depend on which other images share a batch: pretraining,
streaming prediction and batch training all compute the same features for an
image. (After the 4th block's 3x3 convolution the statistics cover 9
positions per channel; that is the smallest set of positions normalised.)

Features are L2-normalised by the methods (``classifiers.normalise``), not here:
pretraining trains the raw backbone output with a linear head.
"""

from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from cfsl_jax.learners.shapes import check_image_shape
from cfsl_jax.models.conv4 import Conv4

Params = dict  # {"embed": Conv4 variables}
EmbedFn = Callable[[dict, jax.Array], jax.Array]  # (Conv4 variables, x [n,H,W,C]) -> [n, D]


def per_image_apply(module: nn.Module) -> EmbedFn:
    """``apply(variables, x [n, H, W, C]) -> [n, D]``, each image normalised on its own."""

    def apply(variables, x):
        return jax.vmap(lambda image: module.apply(variables, image[None])[0])(x)

    return apply


def conv4_backbone(image_shape: tuple[int, ...], filters: int = 64, activation: str = "relu"
                   ) -> tuple[Callable[[jax.Array, jax.Array], Params], EmbedFn]:
    """``(init_params(key, example_x) -> {"embed": ...}, embed_apply)`` of a Conv-4."""
    module = Conv4(filters=filters, activation=activation)

    def init_params(key: jax.Array, example_x: jax.Array) -> Params:
        check_image_shape(example_x, image_shape)
        # One jitted program: eager init would compile each of its ops separately.
        example = jnp.zeros((1, *image_shape), jnp.float32)
        return {"embed": jax.jit(module.init)(key, example)}

    return init_params, per_image_apply(module)


def feature_dim(embed_apply: EmbedFn, embed_params, image_shape: tuple[int, ...]) -> int:
    """D, from shapes only (no FLOPs)."""
    out = jax.eval_shape(embed_apply, embed_params,
                         jax.ShapeDtypeStruct((1, *image_shape), jnp.float32))
    return int(out.shape[-1])
