"""The one empirical Fisher (models.fisher): closed form on a linear softmax model, batch
statistics on a batch-normalised net, and the per-sample path on a per-image normalised net."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cfsl_jax.fluid.backbone import per_image_apply
from cfsl_jax.models.conv4 import Conv4, LinearHead
from cfsl_jax.models.fisher import empirical_fisher, log_likelihood_grads


def linear(weights, x):
    return x @ weights["w"] + weights["b"]


@pytest.mark.parametrize("independent", [False, True])
def test_the_fisher_of_a_linear_softmax_model_at_zero_weights_by_hand(independent):
    # W = 0, b = 0: p = (1/2, 1/2); d log p_y / dW = x outer (onehot_y - p), d/db = onehot_y - p.
    # sample 0: x (1, 2), y 0 -> [[.5, -.5], [1, -1]];  sample 1: x (3, 0), y 1 -> [[-1.5, 1.5], 0]
    weights = {"w": jnp.zeros((2, 2)), "b": jnp.zeros(2)}
    x, y = jnp.array([[1.0, 2.0], [3.0, 0.0]]), jnp.array([0, 1])
    fisher = empirical_fisher(linear, weights, x, y, independent=independent)
    np.testing.assert_allclose(fisher["w"], [[(0.25 + 2.25) / 2] * 2, [(1 + 0) / 2] * 2])
    np.testing.assert_allclose(fisher["b"], [0.25, 0.25])


@pytest.mark.parametrize("independent", [False, True])
def test_the_fisher_of_a_linear_softmax_model_is_the_closed_form_mean_of_squares(independent):
    rng = np.random.default_rng(0)
    w, b = rng.normal(size=(4, 3)), rng.normal(size=3)
    x, y = rng.normal(size=(6, 4)), np.array([0, 1, 2, 2, 1, 0])
    logits = x @ w + b
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    residual = np.eye(3)[y] - p  # d log p_y / d logits, per sample
    want_w = np.mean(np.einsum("nd,nk->ndk", x, residual) ** 2, axis=0)
    want_b = np.mean(residual**2, axis=0)
    weights = {"w": jnp.asarray(w, jnp.float32), "b": jnp.asarray(b, jnp.float32)}
    fisher = empirical_fisher(linear, weights, jnp.asarray(x, jnp.float32), jnp.asarray(y),
                              independent=independent)
    np.testing.assert_allclose(fisher["w"], want_w, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(fisher["b"], want_b, rtol=1e-5, atol=1e-7)
    assert want_w.min() > 1e-6  # every entry is informative


def small_net(apply_embed):
    embed, head = Conv4(filters=4, num_blocks=2), LinearHead(5)

    def net(weights, x):
        return head.apply(weights["head"], apply_embed(embed)(weights["embed"], x))

    def init(key, x):
        embed_key, head_key = jax.random.split(key)
        weights = {"embed": embed.init(embed_key, x[:1])}
        weights["head"] = head.init(head_key, apply_embed(embed)(weights["embed"], x))
        return weights

    return net, init


def images(n, dtype=jnp.float32):
    return jax.random.uniform(jax.random.key(1), (n, 12, 12, 1), dtype)


def leaves(tree):
    return {jax.tree_util.keystr(path): leaf
            for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def test_batch_statistics_enter_each_sample_log_likelihood():
    # A batch-normalised net: sample i's log-likelihood is row i of the net on the whole batch.
    net, init = small_net(lambda module: module.apply)
    x, y = images(3), jnp.array([0, 4, 2])

    @jax.jit
    def computed(key):
        weights = init(key, x)
        grads = [jax.grad(lambda w: jax.nn.log_softmax(net(w, x))[i, y[i]])(weights)
                 for i in range(3)]
        return (weights, empirical_fisher(net, weights, x, y),
                empirical_fisher(net, weights, x, y, independent=True), grads)

    weights, fisher, alone, grads = computed(jax.random.key(3))
    expected = jax.tree.map(lambda *g: sum(gi**2 for gi in g) / 3, *grads)
    for got, want in zip(jax.tree.leaves(fisher), jax.tree.leaves(expected)):
        np.testing.assert_allclose(got, want, rtol=5e-3, atol=1e-9)
    # Batches of one normalise with other statistics: another Fisher (the head's differs).
    head, head_alone = (f["['head']['params']['Dense_0']['kernel']"] for f in (leaves(fisher),
                                                                             leaves(alone)))
    assert float(jnp.max(jnp.abs(head - head_alone))) > 0.1 * float(jnp.max(head))


def test_the_per_sample_path_equals_a_loop_and_the_batch_path_on_a_per_image_net():
    # FLUID's backbone normalises each image alone: the three computations agree (float64).
    net, init = small_net(per_image_apply)
    with jax.enable_x64(True):
        x, y = images(4, jnp.float64), jnp.array([0, 4, 2, 2])
        weights = jax.tree.map(lambda w: w.astype(jnp.float64), init(jax.random.key(3), x))
        per_sample = jax.jit(lambda w: empirical_fisher(net, w, x, y, independent=True))(weights)
        batch = jax.jit(lambda w: empirical_fisher(net, w, x, y))(weights)
        one = jax.jit(jax.grad(lambda w, xi, yi: jax.nn.log_softmax(net(w, xi[None])[0])[yi]))
        loop = jax.tree.map(lambda *g: sum(gi**2 for gi in g) / 4,
                            *[one(weights, x[i], y[i]) for i in range(4)])
        for name, got in leaves(per_sample).items():
            assert got.dtype == jnp.float64
            np.testing.assert_allclose(got, leaves(loop)[name], rtol=1e-6, atol=1e-20)
            np.testing.assert_allclose(got, leaves(batch)[name], rtol=1e-6, atol=1e-20)
        # A conv bias before the normalisation has an exactly zero gradient: its Fisher is
        # rounding (float32: ~1e-13, where two programs differ by any factor), the rest is not.
        got = leaves(per_sample)
        assert float(got["['embed']['params']['Conv_0']['bias']"].max()) < 1e-25
        assert float(got["['embed']['params']['Conv_0']['kernel']"].max()) > 1e-3


def test_per_sample_gradients_have_one_row_per_sample():
    weights = {"w": jnp.ones((4, 3)), "b": jnp.zeros(3)}
    grads = log_likelihood_grads(linear, weights, jnp.ones((6, 4)), jnp.zeros(6, jnp.int32))
    assert grads["w"].shape == (6, 4, 3) and grads["b"].shape == (6, 3)
    with pytest.raises(AssertionError):
        log_likelihood_grads(linear, weights, jnp.ones((6, 4)), jnp.zeros(5, jnp.int32))
