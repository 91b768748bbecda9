"""Mixed precision for any learner: float32 meta-parameters, compute and carried state in bf16.

    learner = with_compute_dtype(get_learner("protonets", spec), "bfloat16")

The wrapped learner casts the meta-parameters and the input images to the
compute dtype on entry to ``init`` / ``adapt`` / ``predict`` / ``meta_loss``
(the cast is differentiable: meta-gradients, the optimiser state and the
stored parameters stay float32), carries the floating leaves of its
adaptation state in the compute dtype (integer leaves -- counts, indices --
are left alone), and returns float32 logits and losses. ATM therefore
reflects the dtype actually carried: a state of float weights halves in bf16,
while the support inputs it is measured against are the float32 images the
data pipeline delivers.

Accumulating states lose precision in bf16 (8 mantissa bits): ProtoNets'
per-label sums over many support sets, for example. That is the trade the
flag makes; compare with float32 before relying on it for long tasks.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from cfsl_jax.learners.base import Learner

COMPUTE_DTYPES: dict[str, Any] = {"float32": jnp.float32, "bfloat16": jnp.bfloat16,
                                  "float16": jnp.float16}


def cast_floating(tree: Any, dtype) -> Any:
    """Cast the floating-point leaves of ``tree`` to ``dtype``; other leaves unchanged."""
    return jax.tree.map(
        lambda x: x.astype(dtype) if jnp.issubdtype(jnp.result_type(x), jnp.floating) else x,
        tree)


def with_compute_dtype(learner: Learner, compute_dtype: str) -> Learner:
    """``learner`` computing in ``compute_dtype`` (one of ``COMPUTE_DTYPES``)."""
    if compute_dtype not in COMPUTE_DTYPES:
        raise ValueError(f"compute_dtype={compute_dtype!r}; valid: {tuple(COMPUTE_DTYPES)}")
    dtype = COMPUTE_DTYPES[compute_dtype]
    if dtype == jnp.float32:
        return learner

    def low(tree):
        return cast_floating(tree, dtype)

    def full(tree):
        return cast_floating(tree, jnp.float32)

    def init(params, key, spec):
        return low(learner.init(low(params), key, spec))

    def adapt(params, state, support_x, support_y):
        return low(learner.adapt(low(params), state, low(support_x), support_y))

    def predict(params, state, target_x):
        return full(learner.predict(low(params), state, low(target_x)))

    meta_loss = None
    if learner.meta_loss is not None:
        def meta_loss(params, support_x, support_y, target_x, target_y, key, progress):
            return full(learner.meta_loss(low(params), low(support_x), support_y, low(target_x),
                                          target_y, key, progress))

    for_epoch = None
    if learner.for_epoch is not None:
        wrapped: dict[int, Learner] = {}  # one wrapper per distinct learner: train.py caches by id

        def for_epoch(epoch):
            inner = learner.for_epoch(epoch)
            if id(inner) not in wrapped:
                wrapped[id(inner)] = with_compute_dtype(inner, compute_dtype)
            return wrapped[id(inner)]

    embed_apply = None
    if learner.embed_apply is not None:
        def embed_apply(params, x):
            return full(learner.embed_apply(low(params), low(x)))

    running_bn = None
    if learner.running_bn is not None:
        def moments(params, support_x, target_x):
            return full(learner.running_bn.moments(low(params), low(support_x), low(target_x)))
        running_bn = learner.running_bn._replace(moments=moments)

    evaluation = (None if learner.evaluation is None
                  else with_compute_dtype(learner.evaluation, compute_dtype))
    return learner._replace(init=init, adapt=adapt, predict=predict, meta_loss=meta_loss,
                            for_epoch=for_epoch, embed_apply=embed_apply,
                            evaluation=evaluation, running_bn=running_bn)
