"""Weight initialisation as the authors' PyTorch code does it, applied to Flax parameter trees.

    params = reinitialize(module.init(key, x), jax.random.fold_in(key, 1), "xavier")

The authors' code (docs/fidelity.md, "Weight init") initialises every layer that adapts
in an inner loop (``MetaConv2dLayer``, ``MetaLinearLayer``: the Conv-4 of
MAML++ low-end and of the fine-tuning baselines, the MAML++ high-end / SCA
head and its squeeze-excite layers) with ``nn.init.xavier_uniform_`` and zero
biases. Its ordinary ``torch.nn`` layers (the SE-DenseNet embedding, the SCA
critic, the ProtoNets Conv-4) keep PyTorch's default: kernel and bias uniform in
+-1/sqrt(fan_in). Flax's own default (LeCun-normal kernels, zero biases) is
``"lecun"``: the parameters are left as ``module.init`` made them.

A "layer" here is any module dict holding a ``kernel`` leaf (``nn.Dense``,
``models.conv.Conv``); its sibling ``bias`` is that layer's bias. Norm
parameters (``scale``/``bias`` without a ``kernel``, per-step tables) are
never touched: ones and zeros, as PyTorch's batch norm. Fans follow PyTorch:
fan_in = inputs x receptive field, fan_out = outputs x receptive field.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import traverse_util

WEIGHT_INITS: tuple[str, ...] = ("xavier", "torch", "lecun")  # the schemes, module doc


def _fans(shape: tuple[int, ...]) -> tuple[int, int]:
    receptive = math.prod(shape[:-2]) if len(shape) > 2 else 1
    return shape[-2] * receptive, shape[-1] * receptive


def reinitialize(params: Any, key: jax.Array, scheme: str) -> Any:
    """``params`` with every layer's kernel (and bias) redrawn by ``scheme`` (see module doc).

    "xavier": kernel U(+-sqrt(6 / (fan_in + fan_out))), bias 0. "torch": kernel
    and bias U(+-1 / sqrt(fan_in)). "lecun": ``params`` unchanged. Deterministic
    in ``key``; shapes and dtypes are kept.
    """
    if scheme not in WEIGHT_INITS:
        raise ValueError(f"weight init scheme must be one of {WEIGHT_INITS}, got {scheme!r}")
    if scheme == "lecun":
        return params
    flat = traverse_util.flatten_dict(params)
    layers = sorted({path[:-1] for path in flat if path[-1] == "kernel"})
    for layer, layer_key in zip(layers, jax.random.split(key, max(len(layers), 1))):
        kernel = flat[layer + ("kernel",)]
        fan_in, fan_out = _fans(kernel.shape)
        kernel_key, bias_key = jax.random.split(layer_key)
        if scheme == "xavier":
            limit = math.sqrt(6.0 / (fan_in + fan_out))
        else:
            limit = 1.0 / math.sqrt(fan_in)
        flat[layer + ("kernel",)] = jax.random.uniform(
            kernel_key, kernel.shape, kernel.dtype, -limit, limit)
        if layer + ("bias",) in flat:
            bias = flat[layer + ("bias",)]
            flat[layer + ("bias",)] = (jnp.zeros_like(bias) if scheme == "xavier" else
                                       jax.random.uniform(bias_key, bias.shape, bias.dtype,
                                                          -limit, limit))
    return traverse_util.unflatten_dict(flat)
