"""models.conv: every implementation equals XLA's convolution (to first and second order);
"auto" follows the platform a program is lowered for."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cfsl_jax.runtime import backend
from cfsl_jax.models.conv import (AUTO_IMPLS, _CONV_FNS, Conv, conv2d, im2col_conv,
                                  resolve_conv_impl)


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


IMPLS = ("gemm_grad", "im2col", "xla", "auto")


@pytest.mark.parametrize("impl", IMPLS)
def test_every_impl_computes_the_same_convolution_and_gradients(impl):
    x = jax.random.normal(jax.random.key(0), (2, 6, 5, 3))
    kernel = jax.random.normal(jax.random.key(1), (3, 3, 3, 4))
    conv = _CONV_FNS[resolve_conv_impl(impl)]
    np.testing.assert_allclose(conv(x, kernel), xla_conv(x, kernel), rtol=1e-5, atol=1e-5)
    ours = jax.grad(lambda x, k: jnp.sin(conv(x, k)).sum(), (0, 1))(x, kernel)
    theirs = jax.grad(lambda x, k: jnp.sin(xla_conv(x, k)).sum(), (0, 1))(x, kernel)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_im2col_with_per_task_kernels_under_vmap_equals_grouped_xla_convolutions():
    # What a batch of per-task-weight tasks does: a kernel per task, vmapped.
    x = jax.random.normal(jax.random.key(0), (4, 2, 5, 5, 3))  # [tasks, N, H, W, C]
    kernels = jax.random.normal(jax.random.key(1), (4, 3, 3, 3, 2))
    np.testing.assert_allclose(jax.vmap(im2col_conv)(x, kernels), jax.vmap(xla_conv)(x, kernels),
                               rtol=1e-5, atol=1e-5)


def test_auto_resolves_by_the_platform_a_program_is_lowered_for(monkeypatch):
    monkeypatch.setitem(AUTO_IMPLS, "tpu", "xla")  # make the platforms' choices differ
    assert resolve_conv_impl("auto", "cpu") == AUTO_IMPLS["cpu"] == "im2col"
    assert resolve_conv_impl("auto", "gpu") == "im2col"
    assert resolve_conv_impl("auto", "some_new_platform") == "im2col"
    with backend.lowering_for("tpu"):
        assert resolve_conv_impl("auto") == "xla"
    with backend.lowering_for("cpu"):
        monkeypatch.setattr(jax, "default_backend", lambda: "tpu")  # not consulted
        assert resolve_conv_impl("auto") == "im2col"
    assert resolve_conv_impl("gemm_grad", "tpu") == "gemm_grad"  # names mean what they say
    with pytest.raises(ValueError, match=r"conv impl must be one of .* got 'fft'"):
        resolve_conv_impl("fft")
