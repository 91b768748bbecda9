"""Batch-norm pieces: per-step tables (MAML++ "BNWB") and running averages.

Running averages (``BatchStatNorm(mode="train"|"eval")``, the authors'
``nn.BatchNorm2d`` with ``track_running_stats=True``): in "train" mode a layer
normalises with its batch's statistics and sows the batch's (mean, unbiased
variance) as ``intermediates/moments``; ``collect_moments`` gathers them into a
tree shaped like the "batch_stats" collection, and ``absorb`` folds a sequence
of them into the running averages as PyTorch does, one forward pass after the
other (``r <- (1 - momentum) r + momentum m``, momentum 0.1). "eval" mode
normalises with the running averages.

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

from typing import Any

import flax.linen as nn
from flax import traverse_util
import jax
import jax.numpy as jnp

META_ONLY_PREFIX = "step_"  # parameter names that an inner loop must not adapt
NORM_MODES: tuple[str, ...] = ("batch", "train", "eval")
MOMENTUM = 0.1  # PyTorch BatchNorm2d's default


def running_moments(module: nn.Module, x: jax.Array, axes: tuple[int, ...], dtype
                    ) -> tuple[jax.Array, jax.Array]:
    """(mean, biased variance) to normalise ``x`` with, for ``module.mode`` "train" or "eval".

    Declares ``batch_stats/mean`` (zeros) and ``batch_stats/var`` (ones); "train" sows the
    batch's (mean, unbiased variance) as ``intermediates/moments``; "eval" returns the
    running averages.
    """
    if module.mode not in NORM_MODES[1:]:
        raise ValueError(f"norm mode must be one of {NORM_MODES}, got {module.mode!r}")
    features = x.shape[-1]
    shape = (1,) * (x.ndim - 1) + (features,)
    running_mean = module.variable("batch_stats", "mean", jnp.zeros, (features,), jnp.float32)
    running_var = module.variable("batch_stats", "var", jnp.ones, (features,), jnp.float32)
    if module.mode == "eval":
        return (running_mean.value.reshape(shape).astype(dtype),
                running_var.value.reshape(shape).astype(dtype))
    mean = jnp.mean(x, axis=axes, keepdims=True, dtype=dtype)
    var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
    count = x.size // features
    unbiased = var * (count / max(count - 1, 1))
    module.sow("intermediates", "moments",
               (jax.lax.stop_gradient(mean.reshape(features)).astype(jnp.float32),
                jax.lax.stop_gradient(unbiased.reshape(features)).astype(jnp.float32)))
    return mean, var


def collect_moments(intermediates: Any) -> dict:
    """The sown moments of one forward pass as a tree shaped like "batch_stats"."""
    flat = traverse_util.flatten_dict(intermediates)
    out = {}
    for path, value in flat.items():
        if path[-1] == "moments":
            (mean, var), = value
            out[path[:-1] + ("mean",)] = mean
            out[path[:-1] + ("var",)] = var
    return traverse_util.unflatten_dict(out)


def absorb(running: Any, moments: Any, momentum: float = MOMENTUM) -> Any:
    """``running`` after folding in ``moments`` (leaves [K, C], in order) one at a time."""

    def fold(r, m):
        decay = (1.0 - momentum) ** jnp.arange(m.shape[0] - 1, -1, -1, dtype=jnp.float32)
        return (1.0 - momentum) ** m.shape[0] * r + momentum * jnp.tensordot(decay, m, axes=1)

    return jax.tree.map(fold, running, moments)


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
