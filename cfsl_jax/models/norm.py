"""Per-step batch normalisation (MAML++ "BNWB"): one scale/bias per inner step.

``PerStepBatchNorm(num_steps)(x, step)`` normalises ``x`` with the statistics
of the batch it is given (no running averages, so no statistics cross
support sets or reach the target set) and applies ``scale[step]`` and
``bias[step]``. ``step`` may be a traced int32 scalar (it is dynamic inside a
``lax.scan`` over support sets); it is clamped to ``[0, num_steps - 1]``.
The parameters are named ``step_scale`` / ``step_bias``: leaves whose name
starts with ``step_`` are meta-learned only and never adapted in an inner
loop (``inner_loop.is_adaptable``).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

META_ONLY_PREFIX = "step_"  # parameter names that an inner loop must not adapt


class PerStepBatchNorm(nn.Module):
    """Batch-statistics normalisation with a learned scale/bias per inner step."""

    num_steps: int = 1
    epsilon: float = 1e-5

    @nn.compact
    def __call__(self, x: jax.Array, step: jax.Array | int = 0) -> jax.Array:
        features = x.shape[-1]
        scale = self.param(f"{META_ONLY_PREFIX}scale", nn.initializers.ones,
                           (self.num_steps, features), jnp.float32)
        bias = self.param(f"{META_ONLY_PREFIX}bias", nn.initializers.zeros,
                          (self.num_steps, features), jnp.float32)
        if isinstance(step, int):  # a static index: a static slice
            index = min(max(step, 0), self.num_steps - 1)
        else:
            index = jnp.clip(jnp.asarray(step, jnp.int32), 0, self.num_steps - 1)
        axes = tuple(range(x.ndim - 1))
        stats = jnp.promote_types(x.dtype, jnp.float32)  # bf16 inputs: float32 statistics
        mean = jnp.mean(x, axis=axes, keepdims=True, dtype=stats)
        var = jnp.maximum(jnp.mean(jnp.square(x.astype(stats)), axis=axes, keepdims=True)
                          - jnp.square(mean), 0)
        normed = ((x - mean) * jax.lax.rsqrt(var + self.epsilon)).astype(x.dtype)
        return normed * scale[index].astype(x.dtype) + bias[index].astype(x.dtype)
