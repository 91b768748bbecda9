"""The MAML++ high-end networks: an SE-DenseNet embedding and an adaptable head.

As the authors' code (``SqueezeExciteDenseNet`` and
``VGGActivationNormNetworkWithAttention``; docs/fidelity.md), with the configs'
``num_filters`` 64, ``num_blocks_per_stage`` 2, ``num_stages`` 2,
``output_spatial_dimensionality`` 5):

``SEDenseNet`` (meta-learned only, never adapted): a 3x3 stem conv
(``filters`` = 64), then ``num_stages`` stages of ``blocks_per_stage`` dense
blocks [squeeze-excite gate on the block input -> 1x1 conv (``growth``) ->
3x3 conv (``growth``), each conv with ``BatchStatNorm`` + LeakyReLU; the
gated input and the new ``growth`` channels are concatenated]; after each
stage a 2x2 average pool and a 1x1 transition conv (+ norm + LeakyReLU) that
keeps all its channels (reduction 1.0: 64 -> 192 -> 320 channels with the
defaults); finally an adaptive average pool to ``output_size`` x
``output_size`` (PyTorch's bins: output cell i covers input rows
floor(i*H/o) .. ceil((i+1)*H/o)-1, so a 28x28 input, 7x7 after two stages, is
pooled to 5x5 with overlapping 3x3/2x2 bins; an input smaller than the
output repeats cells). Normalisation follows ``norm`` (``models.conv4``):
"batch" uses the statistics of the batch it is given, so a support set or the
target set is embedded on its own; "train" also keeps running averages;
"eval" normalises with them.

``SqueezeExcite`` (the authors'): x * sigmoid(Linear_CxC(global mean of x)),
one linear layer with a bias. ``se_mlp=True`` selects a 2-layer MLP gate
instead (hidden max(C // 4, 4), ReLU) whose gate only feeds the block's convs
(the concatenation carries the ungated input); with
``shrink_transitions=True`` the transitions go back to ``filters`` channels
(64 -> 64 -> 64): together the two options give a smaller embedding.

``AdaptableHead`` (adapted in the inner loop): [SE -> 3x3 conv (``filters``
= 48) + ``PerStepBatchNorm`` + LeakyReLU -> 2x2 max-pool -> SE -> global
average pool -> linear]. Its call takes the inner-step index for the
per-step norm. Its convolution has no bias: the batch norm after it cancels a
bias exactly, so the authors' (adapted) conv bias never moves.

Convolutions are ``models.conv.Conv`` with ``impl`` from the learner
(default "auto", see ``models.conv``), without bias. ``max_pool`` is a
reshape + argmax one-hot (twice differentiable with elementwise ops only; odd
edges are dropped, as VALID pooling does).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from cfsl_jax.models.conv import Conv
from cfsl_jax.models.conv4 import BatchStatNorm
from cfsl_jax.models.norm import PerStepBatchNorm

def max_pool(x: jax.Array, size: int = 2) -> jax.Array:
    """Non-overlapping size x size max-pool of [n, H, W, C] (VALID: odd edges dropped).

    The maximum is picked with a one-hot of each window's argmax, so the gradient goes to
    the window's first maximum, as PyTorch's ``MaxPool2d``. ``jnp.max``'s own gradient
    divides by the number of window elements equal to the maximum: compiled at -O0
    (``jax_disable_most_optimizations``) on XLA:CPU, that gave NaN gradients for the MAML++
    network after one meta-update, while the same program at full optimisation and run op
    by op was finite. The one-hot has no division.
    """
    n, h, w, c = x.shape
    ho, wo = h // size, w // size
    windows = (x[:, :ho * size, :wo * size].reshape(n, ho, size, wo, size, c)
               .transpose(0, 1, 3, 5, 2, 4).reshape(n, ho, wo, c, size * size))
    first = jax.nn.one_hot(jnp.argmax(windows, axis=-1), size * size, dtype=x.dtype)
    return jnp.sum(windows * first, axis=-1)


def avg_pool(x: jax.Array, size: int = 2) -> jax.Array:
    """Non-overlapping size x size average pool of [n, H, W, C] (VALID)."""
    n, h, w, c = x.shape
    ho, wo = h // size, w // size
    x = x[:, :ho * size, :wo * size]
    return x.reshape(n, ho, size, wo, size, c).mean(axis=(2, 4))


def _adaptive_matrix(size: int, out: int) -> np.ndarray:
    """[out, size] averaging weights of PyTorch-style adaptive pooling bins."""
    matrix = np.zeros((out, size), np.float32)
    for i in range(out):
        start, end = (i * size) // out, -(-((i + 1) * size) // out)
        matrix[i, start:end] = 1.0 / (end - start)
    return matrix


def adaptive_avg_pool(x: jax.Array, out: int) -> jax.Array:
    """Average-pool [n, H, W, C] to [n, out, out, C] with adaptive bins."""
    _, h, w, _ = x.shape
    rows = jnp.asarray(_adaptive_matrix(h, out), x.dtype)
    cols = jnp.asarray(_adaptive_matrix(w, out), x.dtype)
    return jnp.einsum("nhwc,ih,jw->nijc", x, rows, cols)


class SqueezeExcite(nn.Module):
    """Channel gate x * sigmoid(f(global average of x)): f = Linear CxC, or with ``mlp`` a
    2-layer MLP of hidden max(C // reduction, 4) with ReLU."""

    mlp: bool = False
    reduction: int = 4

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        channels = x.shape[-1]
        squeezed = jnp.mean(x, axis=(1, 2))
        if self.mlp:
            squeezed = nn.relu(nn.Dense(max(channels // self.reduction, 4))(squeezed))
        gate = nn.sigmoid(nn.Dense(channels)(squeezed))
        return x * gate[:, None, None, :]


class SEDenseNet(nn.Module):
    """SE-DenseNet embedding: [n, H, W, C] -> [n, output_size, output_size, channels]
    (channels = filters + num_stages * blocks_per_stage * growth; ``filters`` if shrunk)."""

    filters: int = 64
    growth: int = 64
    num_stages: int = 2
    blocks_per_stage: int = 2
    output_size: int = 5
    conv_impl: str = "auto"
    se_mlp: bool = False  # a 2-layer MLP gate, feeding the convs only
    shrink_transitions: bool = False  # transitions back to ``filters`` channels
    norm: str = "batch"  # BatchStatNorm's mode (models.norm.NORM_MODES)

    def _conv_norm_act(self, x: jax.Array, features: int, kernel_size: int) -> jax.Array:
        x = Conv(features, kernel_size, self.conv_impl, use_bias=False)(x)
        return nn.leaky_relu(BatchStatNorm(mode=self.norm)(x))

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = self._conv_norm_act(x, self.filters, 3)
        for _ in range(self.num_stages):
            for _ in range(self.blocks_per_stage):
                gated = SqueezeExcite(self.se_mlp)(x)
                y = self._conv_norm_act(gated, self.growth, 1)
                y = self._conv_norm_act(y, self.growth, 3)
                x = jnp.concatenate([x if self.se_mlp else gated, y], axis=-1)
            x = avg_pool(x)
            keep = self.filters if self.shrink_transitions else x.shape[-1]
            x = self._conv_norm_act(x, keep, 1)
        return adaptive_avg_pool(x, self.output_size)


class AdaptableHead(nn.Module):
    """The MAML++ high-end head: [n, h, w, C] features, inner step -> logits [n, num_outputs]."""

    num_outputs: int
    filters: int = 48
    num_steps: int = 1
    conv_impl: str = "auto"
    se_mlp: bool = False  # a 2-layer squeeze-excite MLP

    @nn.compact
    def __call__(self, x: jax.Array, step: jax.Array | int = 0) -> jax.Array:
        x = SqueezeExcite(self.se_mlp)(x)
        x = Conv(self.filters, 3, self.conv_impl, use_bias=False)(x)
        x = nn.leaky_relu(PerStepBatchNorm(self.num_steps)(x, step))
        x = max_pool(x)
        x = SqueezeExcite(self.se_mlp)(x)
        return nn.Dense(self.num_outputs)(jnp.mean(x, axis=(1, 2)))
