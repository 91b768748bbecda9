"""Shape helpers shared by the learner factories (the contract is ``cfsl_jax.protocol.learner``)."""

from __future__ import annotations

import jax

from cfsl_jax.protocol.learner import Params


def check_image_shape(example_x: jax.Array, image_shape: tuple[int, ...]) -> None:
    """Refuse inputs whose per-image shape differs from the one the learner was built for."""
    if tuple(example_x.shape[1:]) != tuple(image_shape):
        raise ValueError(f"learner was built for images of shape {tuple(image_shape)}, "
                         f"got example_x of shape {tuple(example_x.shape)} ([n, H, W, C])")


def embedding_dim(module, params: Params, image_shape: tuple[int, ...]) -> int:
    """Feature size of ``module.apply(params, x)`` for one image of ``image_shape`` (no FLOPs)."""
    out = jax.eval_shape(module.apply, params,
                         jax.ShapeDtypeStruct((1, *image_shape), jax.numpy.float32))
    return int(out.shape[-1])
