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

from cfsl_jax.learners import COMPUTE_DTYPE_NAMES
from cfsl_jax.protocol.learner import STATE_FUNCTIONS, Learner, map_functions

COMPUTE_DTYPES: dict[str, Any] = {name: getattr(jnp, name) for name in COMPUTE_DTYPE_NAMES}


def cast_floating(tree: Any, dtype) -> Any:
    """Cast the floating-point array leaves of ``tree`` to ``dtype``; other leaves (integer
    arrays, PRNG keys, a ``TaskSpec``) unchanged."""
    return jax.tree.map(
        lambda x: x.astype(dtype) if jnp.issubdtype(getattr(x, "dtype", jnp.int32),
                                                    jnp.floating) else x, tree)


def with_compute_dtype(learner: Learner, compute_dtype: str) -> Learner:
    """``learner`` computing in ``compute_dtype`` (one of ``COMPUTE_DTYPES``): every function
    it computes with (``map_functions``) takes its floating inputs in that dtype and returns
    the carried state in it, and logits, losses, features and moments in float32."""
    if compute_dtype not in COMPUTE_DTYPES:
        raise ValueError(f"compute_dtype={compute_dtype!r}; valid: {tuple(COMPUTE_DTYPES)}")
    dtype = COMPUTE_DTYPES[compute_dtype]
    if dtype == jnp.float32:
        return learner

    def wrap(name, fn):
        out_dtype = dtype if name in STATE_FUNCTIONS else jnp.float32

        kept = 1 if name == "meta_loss" else 0  # its last argument, progress, is no input

        def cast(*args):
            args = cast_floating(args[:len(args) - kept], dtype) + args[len(args) - kept:]
            return cast_floating(fn(*args), out_dtype)
        return cast

    return map_functions(learner, wrap)
