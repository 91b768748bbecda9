"""2-D SAME, stride-1 convolutions that stay fast inside XLA:CPU loops.

Why: ``run_task`` walks support sets with ``lax.scan``, so the backward pass of
meta-training computes convolution kernel gradients inside a while loop. On
XLA:CPU that gradient (a convolution with batch and feature dimensions
swapped) falls off the fast path inside loops and runs 30-100x slower than
the same op outside one (docs/results.md, "Implementation choices"). Here the
kernel gradient is computed as ``patches(x)^T @ dy``, with the patches built
from shifted slices (no compute), which is a plain GEMM everywhere. The
forward pass and the input gradient are XLA's own convolutions, which are
fast in loops. The rule is an ordinary JAX function, so it differentiates
again (second-order MAML).

``conv2d(x, kernel)``: x [N, H, W, Cin] (NHWC), kernel [KH, KW, Cin, Cout]
(HWIO), stride 1, SAME padding, odd kernel sizes.

``im2col_conv`` goes one step further: the forward pass itself is one GEMM
over the KH*KW shifted copies of the input, so every derivative of every
order is matmuls and pads. Second-order MAML++ on CPU runs fastest this way.

``Conv(features, kernel_size, impl, use_bias)`` picks one with ``impl``:
"gemm_grad" (``conv2d``), "im2col", "xla" (``lax.conv_general_dilated``,
cuDNN on GPU), or "auto": ``AUTO_IMPLS`` of the platform the program is
lowered for (``backend.lowering_platform()``, read at trace time). im2col on
CPU (above) and on GPU/TPU: vmapping per-task weights turns XLA convolutions
into grouped convolutions, which cuDNN runs with generic kernels, while
im2col's batched GEMMs batch well (docs/results.md, "Implementation choices").
All implementations compute the same convolution (tests/test_conv.py).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from cfsl_jax.runtime import backend

_DIMENSIONS = ("NHWC", "HWIO", "NHWC")


def _conv(x: jax.Array, kernel: jax.Array) -> jax.Array:
    return jax.lax.conv_general_dilated(x, kernel, (1, 1), "SAME", dimension_numbers=_DIMENSIONS)


def _patches(x: jax.Array, kh: int, kw: int) -> jax.Array:
    """[N, H, W, KH*KW*Cin] SAME-padded patches, ordered (kh, kw, cin) like a HWIO kernel."""
    _, h, w, _ = x.shape
    padded = jnp.pad(x, ((0, 0), (kh // 2, kh // 2), (kw // 2, kw // 2), (0, 0)))
    shifted = [padded[:, i:i + h, j:j + w, :] for i in range(kh) for j in range(kw)]
    return jnp.concatenate(shifted, axis=-1)


@jax.custom_vjp
def conv2d(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """SAME, stride-1 NHWC convolution with a GEMM kernel gradient (see the module docstring)."""
    return _conv(x, kernel)


def _conv2d_fwd(x, kernel):
    return _conv(x, kernel), (x, kernel)


def _conv2d_bwd(residuals, dy):
    x, kernel = residuals
    kh, kw, cin, cout = kernel.shape
    _, input_vjp = jax.vjp(lambda x: _conv(x, kernel), x)
    (dx,) = input_vjp(dy)
    patches = _patches(x, kh, kw).reshape(-1, kh * kw * cin)
    dkernel = (patches.T @ dy.reshape(-1, cout)).reshape(kh, kw, cin, cout)
    return dx, dkernel.astype(kernel.dtype)


conv2d.defvjp(_conv2d_fwd, _conv2d_bwd)


def im2col_conv(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """SAME, stride-1 convolution of x [N, H, W, Cin] with kernel [KH, KW, Cin, Cout] as a GEMM."""
    kh, kw, cin, cout = kernel.shape
    n, h, w, _ = x.shape
    if kh == kw == 1:
        return x @ kernel.reshape(cin, cout)
    columns = _patches(x, kh, kw).reshape(n * h * w, kh * kw * cin)
    return (columns @ kernel.reshape(kh * kw * cin, cout)).reshape(n, h, w, cout)


CONV_IMPLS: tuple[str, ...] = ("auto", "gemm_grad", "im2col", "xla")
_CONV_FNS = {"gemm_grad": conv2d, "im2col": im2col_conv, "xla": _conv}
# "auto" by the platform a program is lowered for (any other platform: AUTO_DEFAULT)
AUTO_IMPLS: dict[str, str] = {"cpu": "im2col", "gpu": "im2col", "cuda": "im2col",
                              "rocm": "im2col", "tpu": "im2col"}
AUTO_DEFAULT = "im2col"
# MACs are counted with XLA's convolution whatever ``impl`` computes (``backend.counting``): the
# taps the convolution defines, SAME padding's left out (im2col's GEMM multiplies the padding
# zeros too, gemm_grad's kernel gradient as well), so a count does not depend on the option
COUNTED_IMPL = "xla"


def resolve_conv_impl(impl: str, platform: str | None = None) -> str:
    """The implementation ``impl`` names; "auto": ``AUTO_IMPLS[platform]``; while MACs are
    counted, ``COUNTED_IMPL`` whatever ``impl``.

    ``platform`` defaults to ``backend.lowering_platform()`` (the default backend's,
    or "cpu" while MACs are counted), never a device the program does not run on.
    """
    if impl not in CONV_IMPLS:
        raise ValueError(f"conv impl must be one of {CONV_IMPLS}, got {impl!r}")
    if backend.counting():
        return COUNTED_IMPL
    if impl == "auto":
        return AUTO_IMPLS.get(platform or backend.lowering_platform(), AUTO_DEFAULT)
    return impl


class Conv(nn.Module):
    """A SAME, stride-1 convolution with ``nn.Conv``'s parameter names and initialisers."""

    features: int
    kernel_size: int | tuple[int, int] = 3
    impl: str = "gemm_grad"
    use_bias: bool = True
    dtype: jnp.dtype | None = None  # compute dtype; None: the input's

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        dtype = self.dtype or x.dtype
        size = ((self.kernel_size,) * 2 if isinstance(self.kernel_size, int)
                else tuple(self.kernel_size))
        if any(k % 2 == 0 for k in size):
            raise ValueError(f"Conv needs odd kernel sizes for SAME padding, got {size}")
        kernel = self.param("kernel", nn.initializers.lecun_normal(),
                            (*size, x.shape[-1], self.features), jnp.float32)
        conv = _CONV_FNS[resolve_conv_impl(self.impl)]
        y = conv(x.astype(dtype), kernel.astype(dtype))
        if self.use_bias:
            bias = self.param("bias", nn.initializers.zeros, (self.features,), jnp.float32)
            y = y + bias.astype(dtype)
        return y
