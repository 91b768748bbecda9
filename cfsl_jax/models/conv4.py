"""The Conv-4 family of the paper: 4 x [3x3 conv, norm, ReLU/LeakyReLU, 2x2 max-pool].

``block_order``: "conv_norm_act" (the default: Snell et al.'s Conv-4, and the
order of every learner's backbone) or "conv_act_norm" (the activation before the
norm, as the authors' ProtoNets ``ConvReLUBatchNorm``: conv, LeakyReLU, batch
norm, then the pool, so the embedding is signed; ``BLOCK_ORDERS``).

64 filters for ProtoNets, 48 for the fine-tuning / MAML++ low-end family. The
embedding is flattened; a ``LinearHead`` sized by the task spec sits on top
where a learner needs one. Normalisation (``BatchStatNorm``) follows ``norm``
(``models.norm.NORM_MODES``): "batch" (default) uses the statistics of the
batch it is given, with no running averages: a support set or the target set
is normalised on its own, so no statistics cross sets; "train" does the same
and also keeps running averages (the "batch_stats" collection, updated by the
caller from the sown moments, ``models.norm``); "eval" normalises with the
running averages, so each image is embedded on its own. Convolutions
are ``models.conv.Conv`` with implementation ``conv_impl``: "gemm_grad" (the
default: a GEMM kernel gradient that stays fast inside the ``lax.scan`` over
support sets on CPU) or any of ``models.conv.CONV_IMPLS`` ("auto": im2col,
whose batched GEMMs batch well where per-task weights are vmapped on GPU/TPU).
"""

from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from cfsl_jax.models.conv import Conv
from cfsl_jax.models.norm import running_moments

BLOCK_ORDERS: tuple[str, ...] = ("conv_norm_act", "conv_act_norm")

ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "relu": nn.relu,
    "leaky_relu": nn.leaky_relu,
}


class BatchStatNorm(nn.Module):
    """Batch normalisation with a learned scale/bias; statistics as ``mode``.

    "batch": the current batch's statistics, no variables besides scale/bias.
    "train": the same, plus running averages ``batch_stats/{mean,var}`` (PyTorch's
    initial 0 and 1) and the batch's moments sown as ``intermediates/moments``
    (mean, unbiased variance: what PyTorch's ``BatchNorm2d`` folds into its running
    averages). "eval": normalises with the running averages.
    """

    epsilon: float = 1e-5
    mode: str = "batch"  # models.norm.NORM_MODES

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        features = x.shape[-1]
        axes = tuple(range(x.ndim - 1))
        stats = jnp.promote_types(x.dtype, jnp.float32)  # bf16 inputs: float32 statistics
        scale = self.param("scale", nn.initializers.ones, (features,), jnp.float32)
        bias = self.param("bias", nn.initializers.zeros, (features,), jnp.float32)
        if self.mode == "batch":
            mean = jnp.mean(x, axis=axes, keepdims=True, dtype=stats)
            var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
        else:
            mean, var = running_moments(self, x, axes, stats)
        normed = ((x - mean) * jax.lax.rsqrt(var + self.epsilon)).astype(x.dtype)
        return normed * scale.astype(x.dtype) + bias.astype(x.dtype)


class Conv4(nn.Module):
    """Conv-4 embedding: [n, H, W, C] -> [n, filters * h * w]."""

    filters: int = 64
    activation: str = "relu"
    num_blocks: int = 4
    dtype: jnp.dtype | None = None  # compute dtype; None: the input's
    conv_impl: str = "gemm_grad"  # models.conv.CONV_IMPLS
    norm: str = "batch"  # BatchStatNorm's mode (models.norm.NORM_MODES)
    block_order: str = "conv_norm_act"  # BLOCK_ORDERS
    use_bias: bool = True  # the convolutions' bias (False: the authors' ProtoNets)

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        act = ACTIVATIONS[self.activation]
        if self.block_order not in BLOCK_ORDERS:
            raise ValueError(f"block_order={self.block_order!r}; valid: {BLOCK_ORDERS}")
        x = x.astype(self.dtype or x.dtype)
        for _ in range(self.num_blocks):
            x = Conv(self.filters, 3, self.conv_impl, use_bias=self.use_bias, dtype=self.dtype)(x)
            if self.block_order == "conv_act_norm":
                x = BatchStatNorm(mode=self.norm)(act(x))
            else:
                x = act(BatchStatNorm(mode=self.norm)(x))
            x = nn.max_pool(x, (2, 2), strides=(2, 2), padding="VALID")
        return x.reshape(x.shape[0], -1)


class LinearHead(nn.Module):
    """A linear classifier head: [n, d] -> [n, num_outputs]."""

    num_outputs: int
    dtype: jnp.dtype | None = None  # compute dtype; None: from the input and the weights

    @nn.compact
    def __call__(self, features: jax.Array) -> jax.Array:
        return nn.Dense(self.num_outputs, dtype=self.dtype)(features)
