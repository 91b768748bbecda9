"""models.conv: the GEMM-gradient convolution equals XLA's, to first and second order."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cfsl_jax.models.conv import Conv, conv2d


def xla_conv(x, kernel):
    return jax.lax.conv_general_dilated(x, kernel, (1, 1), "SAME",
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))


@pytest.mark.parametrize("kernel_shape", [(3, 3, 1, 8), (3, 3, 5, 7), (1, 1, 6, 4), (5, 3, 2, 3)])
def test_gradients_match_xla(kernel_shape):
    x = jax.random.normal(jax.random.key(0), (2, 9, 8, kernel_shape[2]))
    kernel = jax.random.normal(jax.random.key(1), kernel_shape)

    def loss(conv):
        return lambda x, k: jnp.sin(conv(x, k)).sum()

    ours = jax.grad(loss(conv2d), (0, 1))(x, kernel)
    theirs = jax.grad(loss(xla_conv), (0, 1))(x, kernel)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)

    # Second order (MAML differentiates through inner gradient steps).
    def meta(conv):
        return lambda k: jnp.sum(jax.grad(loss(conv), 1)(x, k) ** 2)

    np.testing.assert_allclose(jax.grad(meta(conv2d))(kernel), jax.grad(meta(xla_conv))(kernel),
                               rtol=1e-3, atol=1e-2)


def test_module_matches_flax_conv():
    x = jax.random.normal(jax.random.key(0), (3, 7, 7, 4))
    ours = Conv(6)
    params = ours.init(jax.random.key(1), x)
    flax_conv = __import__("flax.linen", fromlist=["Conv"]).Conv(6, (3, 3), padding="SAME")
    assert jax.tree.map(jnp.shape, params) == jax.tree.map(
        jnp.shape, flax_conv.init(jax.random.key(1), x))
    np.testing.assert_allclose(ours.apply(params, x), flax_conv.apply(params, x), rtol=1e-5,
                               atol=1e-5)
    with pytest.raises(ValueError, match="odd kernel sizes"):
        Conv(6, 2).init(jax.random.key(0), x)
