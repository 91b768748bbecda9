"""Fine-tuning baselines and pretraining: ATM, MACs, learning, EWC's Fisher and anchors."""

import logging
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from cfsl_jax import data
from cfsl_jax.protocol import episode, metrics
from cfsl_jax.datasets.synthetic import generate
from cfsl_jax.runtime.errors import UserError
from cfsl_jax.learners import get_learner
from cfsl_jax.learners.finetune import (EwcOptions, EwcState, FinetuneOptions, TuneState,
                                        ewc_init, ewc_pretrain, init_tune, merge, pretrain_tune,
                                        split_norm)
from cfsl_jax.models import init as weight_init
from cfsl_jax.models.conv4 import Conv4, LinearHead
from cfsl_jax.models.fisher import empirical_fisher
from cfsl_jax.training.pretrain import entry_pool, init_state, pretrain, train_step
from cfsl_jax.protocol.spec import TaskSpec
from conftest import init_params, traces_counted

IMAGE = (28, 28, 1)
B3 = TaskSpec.preset("B3")  # NSS=3, NC=5, KS=1, KT=5, 15 outputs
FINETUNERS = ("init_tune", "pretrain_tune", "ewc_init", "ewc_pretrain")


@pytest.fixture(scope="module")
def glyphs():
    """Synthetic glyphs: float images [20 classes, 10 samples, 28, 28, 1] in [0, 1]."""
    images, _ = generate(20, 10, 28, 0)
    return jnp.asarray(images, jnp.float32).reshape(20, 10, *IMAGE) / 255.0


def support_set(glyphs, classes, sample, labels):
    """One sample of each class in ``classes``, labelled ``labels``."""
    return glyphs[jnp.asarray(classes), sample], jnp.asarray(labels, jnp.int32)


def network(num_outputs, params):
    """The fine-tuners' default network of adapted weights, built here from the architecture:
    the norm layers' scale/bias stay at ``params``."""
    embed = Conv4(filters=48, activation="leaky_relu", conv_impl="auto")
    head = LinearHead(num_outputs)
    kept = split_norm(params)[1]

    def apply(weights, x):
        weights = merge(weights, kept)
        return head.apply(weights["head"], embed.apply(weights["embed"], x))
    return apply


def adapted(params):
    """The leaves of ``params`` that fine-tuning adapts (all but the norm layers')."""
    return split_norm(params)[0]


@jax.jit
def _weighted_sq_distance(a, b, fisher):
    return sum(jnp.sum(f * (u - v) ** 2) for u, v, f in zip(
        jax.tree.leaves(a), jax.tree.leaves(b), jax.tree.leaves(fisher)))


def sq_distance(a, b, fisher=None):
    """sum (a - b)**2 over every weight, or sum F * (a - b)**2 when ``fisher`` is given."""
    fisher = fisher if fisher is not None else jax.tree.map(jnp.ones_like, a)
    return float(_weighted_sq_distance(a, b, fisher))


@pytest.fixture(scope="module")
def tuned():
    """init_tune on B3: the learner, its params, and its jitted adapt and predict."""
    learner = init_tune(B3)
    params = init_params(learner, jax.random.key(1), jnp.zeros((1, *IMAGE)), B3)
    return learner, params, jax.jit(learner.adapt), jax.jit(learner.predict)


@pytest.fixture(scope="module")
def two_sets(glyphs):
    """Two B3 support sets: classes 0-4 labelled 0-4, then classes 5-9 labelled 5-9."""
    return (support_set(glyphs, [0, 1, 2, 3, 4], 0, [0, 1, 2, 3, 4]),
            support_set(glyphs, [5, 6, 7, 8, 9], 0, [5, 6, 7, 8, 9]))


# ---- ATM and MACs -------------------------------------------------------------------------

def test_atm_is_the_adapted_weight_bytes_and_ewc_carries_three_copies(tuned):
    learner, params, _, _ = tuned
    # Conv-4, 48 filters, 1 input channel: 3x3 kernels + biases, then scale + bias per norm.
    conv = (3 * 3 * 1 * 48 + 48) + 3 * (3 * 3 * 48 * 48 + 48)  # 480 + 3 * 20784 = 62832
    norm = 4 * (48 + 48)  # 384: not adapted by default, so not carried
    head = 48 * 15 + 15  # 28 -> 14 -> 7 -> 3 -> 1 pixels: 48 features; B3 has 15 outputs
    assert metrics.tree_bytes(params) == (conv + norm + head) * 4 == 255804
    weight_bytes = (conv + head) * 4  # 63567 float32 = 254268 bytes
    support_bytes = 3 * 5 * 1 * 28 * 28 * 1 * 4  # NSS*NC*KS images, float32 = 47040
    assert metrics.support_bytes(B3, IMAGE) == support_bytes
    assert metrics.atm(learner, params, IMAGE) == pytest.approx(254268 / 47040, rel=1e-12)
    # weights + Fisher + anchors
    assert metrics.atm(ewc_init(B3), params, IMAGE) == pytest.approx(3 * 254268 / 47040)
    # adapt_norm=True (the previous behaviour): the norm layers adapt and are carried too.
    moving = init_tune(B3, FinetuneOptions(adapt_norm=True))
    assert metrics.atm(moving, params, IMAGE) == pytest.approx(
        255804 / 47040, rel=1e-12)


def test_macs_are_linear_in_nss_and_adapt_is_a_few_forward_backward_passes():
    steps = 2

    def macs(nss):  # type A: outputs and target size do not depend on NSS
        spec = TaskSpec(nss=nss, nc=5, ks=1, kt=5, cci=nss, overwrite=True,
                        target_mode="per_class")
        learner = init_tune(spec, FinetuneOptions(inner_steps=steps))
        params = init_params(learner, jax.random.key(0), jnp.zeros((1, *IMAGE)), spec)
        return learner, params, metrics.learner_macs(learner, params, IMAGE)

    learner, params, three = macs(3)
    _, _, six = macs(6)
    assert six["macs_adapt"] == three["macs_adapt"]
    assert six["macs_per_task"] - three["macs_per_task"] == 3 * three["macs_adapt"]
    forward = metrics.xla_macs(learner.predict, params, TuneState(adapted(params)),
                               jnp.zeros((5, *IMAGE)))
    # Each step is a forward and a backward pass (~2 forwards); a rolled loop would count 1 step.
    assert 2 * steps * forward < three["macs_adapt"] < 4 * steps * forward


# ---- fine-tuning ----------------------------------------------------------------------------

def test_adapt_fits_the_support_set(tuned, two_sets):
    learner, params, adapt, predict = tuned
    (x, y), _ = two_sets
    state = learner.init(params, jax.random.key(2), B3)
    adapted = adapt(params, state, x, y)
    before = metrics.cross_entropy(predict(params, state, x), y)
    after = metrics.cross_entropy(predict(params, adapted, x), y)
    assert float(before) > 2.0  # about chance over 15 outputs: ln 15 = 2.7
    assert float(after) < 0.25 * float(before)
    assert float(metrics.accuracy(predict(params, adapted, x), y)) == 1.0
    # init_tune's init is the params; adapt moves them (all but the norm layers').
    assert sq_distance(state.weights, split_norm(params)[0]) == 0.0
    assert sq_distance(adapted.weights, split_norm(params)[0]) > 0.0
    assert not split_norm(adapted.weights)[1]  # no norm leaf is carried


@pytest.fixture(scope="module")
def huge_ewc(tuned, two_sets):
    """ewc_init with lambda = 1e7 on the two sets: the states before, after one and after two
    sets, and each set's Fisher at the weights fine-tuned on it (by ``models.fisher``)."""
    _, params, _, _ = tuned
    learner = ewc_init(B3, EwcOptions(ewc_lambda=1e7))
    (x1, y1), (x2, y2) = two_sets
    net = network(B3.num_outputs, params)

    @jax.jit
    def two_sets_seen(params):
        state0 = learner.init(params, jax.random.key(5), B3)
        state1 = learner.adapt(params, state0, x1, y1)
        state2 = learner.adapt(params, state1, x2, y2)
        return (state0, state1, state2, empirical_fisher(net, state1.weights, x1, y1),
                empirical_fisher(net, state2.weights, x2, y2))

    return two_sets_seen(params)


def test_ewc_accumulates_the_fisher_and_anchors_on_the_latest_weights(tuned, two_sets, huge_ewc):
    _, params, adapt, _ = tuned
    (x1, y1), _ = two_sets
    state0, state1, state2, fisher1, fisher2 = huge_ewc
    assert isinstance(state2, EwcState)
    assert all(float(jnp.abs(f).max()) == 0 for f in jax.tree.leaves(state0.fisher))
    # atol: conv biases feed a batch-statistics norm, which cancels their gradient, so their
    # Fisher is rounding noise (~1e-12) that differs between two programs; the rest is 1e-7..1e-2.
    for got, want in zip(jax.tree.leaves(state1.fisher), jax.tree.leaves(fisher1)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-10)
    for got, one, two in zip(jax.tree.leaves(state2.fisher), jax.tree.leaves(fisher1),
                             jax.tree.leaves(fisher2)):
        np.testing.assert_allclose(got, one + two, rtol=1e-4, atol=1e-10)
    assert float(jnp.max(fisher2["head"]["params"]["Dense_0"]["kernel"])) > 0
    assert sq_distance(state1.anchors, state1.weights) == 0.0
    assert sq_distance(state2.anchors, state2.weights) == 0.0
    # With no Fisher yet, the first set is plain fine-tuning, whatever lambda is.
    plain = adapt(params, TuneState(adapted(params)), x1, y1)
    assert sq_distance(plain.weights, state1.weights) < 1e-10


def test_a_huge_ewc_lambda_keeps_the_weights_at_the_anchors(tuned, two_sets, huge_ewc):
    _, params, adapt, predict = tuned
    (x1, y1), (x2, y2) = two_sets
    _, ewc1, ewc2, _, _ = huge_ewc
    tune1 = adapt(params, TuneState(adapted(params)), x1, y1)
    tune2 = adapt(params, tune1, x2, y2)
    assert sq_distance(ewc1.anchors, tune1.weights) < 1e-10  # same start for the second set
    # EWC pins what the Fisher of set 1 deems important; weights it ignores still move.
    fisher = ewc1.fisher
    assert (sq_distance(ewc2.weights, ewc1.anchors, fisher)
            < 1e-2 * sq_distance(tune2.weights, tune1.weights, fisher))
    assert sq_distance(ewc2.weights, ewc1.anchors) < 0.25 * sq_distance(tune2.weights,
                                                                        tune1.weights)
    # ... so the second set is barely learned, unlike without EWC.
    def support_loss(weights):
        return float(metrics.cross_entropy(predict(params, TuneState(weights), x2), y2))

    assert support_loss(ewc2.weights) > 4 * support_loss(tune2.weights)


def test_norm_layers_stay_at_params_unless_adapt_norm(tuned, two_sets):
    learner, params, _, predict = tuned
    (x, y), _ = two_sets
    norm = split_norm(params)[1]["embed"]["params"]
    assert sorted(norm) == [f"BatchStatNorm_{i}" for i in range(4)]
    # Changing a norm layer in params changes the prediction: it is read from params, not state.
    state = learner.adapt(params, learner.init(params, jax.random.key(2), B3), x, y)
    shifted = jax.tree.map(lambda p: p, params)
    shifted["embed"]["params"]["BatchStatNorm_3"]["bias"] = norm["BatchStatNorm_3"]["bias"] + 1.0
    assert not np.allclose(predict(params, state, x), predict(shifted, state, x))
    # adapt_norm=True: the norm layers adapt and are carried.
    moving = init_tune(B3, FinetuneOptions(adapt_norm=True))
    after = moving.adapt(params, moving.init(params, jax.random.key(2), B3), x, y)
    assert sq_distance(split_norm(after.weights)[1], split_norm(params)[1]) > 0.0


@pytest.mark.parametrize("name", ["init_tune", "pretrain_tune"])
def test_restart_each_support_set_leaves_only_the_last_set_in_the_prediction(name, glyphs):
    learner = get_learner(name, B3, inner_steps=2, restart_each_support_set=True)
    params = init_params(learner, jax.random.key(18), jnp.zeros((1, *IMAGE)), B3)
    support_x = glyphs[:15, 0].reshape(3, 5, *IMAGE)
    support_y = jnp.arange(15, dtype=jnp.int32).reshape(3, 5)
    target_x = glyphs[:15, 1].reshape(-1, *IMAGE)
    key = jax.random.key(19)
    logits = jax.jit(episode.run_task, static_argnums=0)(learner, params, support_x, support_y,
                                                         target_x, key)
    alone = learner.adapt(params, learner.init(params, key, B3), support_x[2], support_y[2])
    np.testing.assert_allclose(logits, learner.predict(params, alone, target_x), rtol=1e-5,
                               atol=1e-5)
    carried = get_learner(name, B3, inner_steps=2)  # the default carries the weights
    np.testing.assert_allclose(learner.predict(params, alone, target_x), carried.predict(
        params, carried.adapt(params, carried.init(params, key, B3), support_x[2],
                              support_y[2]), target_x), rtol=1e-5, atol=1e-5)
    carried_logits = episode.run_task(carried, params, support_x, support_y, target_x, key)
    assert not np.allclose(carried_logits, logits, atol=1e-3)


def test_params_are_xavier_uniform_with_zero_biases_by_default(tuned):
    _, params, _, _ = tuned
    flat = traverse_util.flatten_dict(params, sep="/")
    for path, (fan_in, fan_out) in {"embed/params/Conv_0/kernel": (9, 9 * 48),
                                    "embed/params/Conv_3/kernel": (9 * 48, 9 * 48),
                                    "head/params/Dense_0/kernel": (48, 15)}.items():
        limit = np.sqrt(6.0 / (fan_in + fan_out))
        values = np.asarray(flat[path])
        assert np.abs(values).max() <= limit and np.abs(values).max() > 0.95 * limit, path
        assert np.std(values) == pytest.approx(limit / np.sqrt(3), rel=0.1), path
    for path, values in flat.items():
        if path.endswith("bias") and "BatchStatNorm" not in path:
            assert not np.any(np.asarray(values)), path
        if path.endswith("scale"):
            np.testing.assert_array_equal(values, 1.0)
    lecun = init_params(init_tune(B3, FinetuneOptions(weight_init="lecun")),
                        jax.random.key(1), jnp.zeros((1, *IMAGE)), B3)
    assert float(jnp.abs(lecun["head"]["params"]["Dense_0"]["kernel"]).max()) > np.sqrt(6 / 63)


def test_weight_init_schemes_have_pytorchs_bounds():
    params = {"conv": {"kernel": jnp.zeros((3, 3, 48, 32)), "bias": jnp.ones(32)},
              "norm": {"scale": jnp.ones(32), "bias": jnp.ones(32)}}
    key = jax.random.key(0)
    xavier = weight_init.reinitialize(params, key, "xavier")
    torch = weight_init.reinitialize(params, key, "torch")
    assert float(jnp.abs(xavier["conv"]["kernel"]).max()) <= np.sqrt(6 / (432 + 288))
    assert float(jnp.abs(xavier["conv"]["kernel"]).max()) > 0.99 * np.sqrt(6 / (432 + 288))
    assert not np.any(np.asarray(xavier["conv"]["bias"]))
    for leaf in ("kernel", "bias"):  # both U(+-1/sqrt(fan_in)), fan_in = 3*3*48 = 432
        values = np.abs(np.asarray(torch["conv"][leaf]))
        assert values.max() <= 1 / np.sqrt(432) and values.max() > 0.8 / np.sqrt(432)
    for scheme in (xavier, torch):  # norm layers (no kernel) are left alone
        np.testing.assert_array_equal(scheme["norm"]["bias"], 1.0)
    assert weight_init.reinitialize(params, key, "lecun") is params
    with pytest.raises(ValueError, match="'he'"):
        weight_init.reinitialize(params, key, "he")


# ---- pretraining ----------------------------------------------------------------------------

def test_pretrain_tune_init_pairs_the_pretrained_embed_with_the_params_head():
    learner = pretrain_tune(B3)
    params = init_params(learner, jax.random.key(8), jnp.zeros((1, *IMAGE)), B3)
    assert learner.recipe.training == "pretrain" and learner.recipe.per_task_weights
    for key in (9, 10):  # every task starts from the same head: the authors' linear_0
        weights = learner.init(params, jax.random.key(key), B3).weights
        assert sq_distance(weights, adapted(params)) == 0.0


def test_pretrain_tune_fresh_head_option_draws_a_head_per_task():
    learner = pretrain_tune(B3, FinetuneOptions(fresh_head=True))
    params = init_params(learner, jax.random.key(8), jnp.zeros((1, *IMAGE)), B3)
    a = learner.init(params, jax.random.key(9), B3).weights
    b = learner.init(params, jax.random.key(10), B3).weights
    again = learner.init(params, jax.random.key(9), B3).weights
    assert sq_distance(a["embed"], adapted(params)["embed"]) == 0.0
    assert a["head"]["params"]["Dense_0"]["kernel"].shape == (48, B3.num_outputs)
    assert sq_distance(a["head"], b["head"]) > 0.0
    assert sq_distance(a["head"], params["head"]) > 0.0
    assert sq_distance(a["head"], again["head"]) == 0.0


# ---- the authors' per-step batch-norm rows (per_step_bn_rows) --------------------------------

def with_norm(params, values):
    """``params`` with every norm layer's scale and bias replaced by ``values(leaf, index)``."""
    flat = traverse_util.flatten_dict(params)
    return traverse_util.unflatten_dict({
        path: values(leaf, i) if "BatchStatNorm" in str(path) else leaf
        for i, (path, leaf) in enumerate(flat.items())})


@pytest.fixture(scope="module")
def pretrained():
    """pretrain_tune's params with a norm scale/bias far from the init, as pretraining leaves
    them, and the same params with the initial scale 1 / bias 0 (the authors' untrained rows)."""
    params = init_params(pretrain_tune(B3), jax.random.key(30), jnp.zeros((1, *IMAGE)), B3)
    moved = with_norm(params, lambda leaf, i: leaf + 0.5 * jax.random.uniform(
        jax.random.key(31 + i), leaf.shape, minval=-1.0, maxval=1.0))
    initial = with_norm(params, lambda leaf, i: leaf)  # init_params: scale 1, bias 0
    for path, leaf in traverse_util.flatten_dict(initial).items():
        if "BatchStatNorm" in str(path):
            np.testing.assert_array_equal(leaf, 1.0 if path[-1] == "scale" else 0.0)
    return moved, initial


def sgd_steps(networks, weights, x, y, learning_rate=0.01):
    """One plain SGD step on ``x, y`` per network in ``networks``, written out."""
    for apply in networks:
        grads = jax.grad(lambda w: metrics.cross_entropy(apply(w, x), y))(weights)
        weights = jax.tree.map(lambda w, g: w - learning_rate * g, weights, grads)
    return weights


@pytest.mark.parametrize("restart", [False, True])
def test_per_step_bn_rows_use_the_trained_affine_only_at_a_tasks_first_step(
        pretrained, two_sets, glyphs, restart):
    # 39025a3: row 0 of each per-step BN table is the only one pretraining trains; support
    # step k of a task (counted across its support sets) reads row k, the target row NSS*S.
    params, initial = pretrained
    (x1, y1), (x2, y2) = two_sets
    trained_net, untrained_net = network(15, params), network(15, initial)
    learner = pretrain_tune(B3, FinetuneOptions(inner_steps=2, per_step_bn_rows=True,
                                                restart_each_support_set=restart))
    state1 = learner.adapt(params, learner.init(params, jax.random.key(2), B3), x1, y1)
    expected1 = sgd_steps([trained_net, untrained_net], adapted(params), x1, y1)
    assert sq_distance(state1.weights, expected1) < 1e-6 and int(state1.step) == 2
    state2 = learner.adapt(params, state1, x2, y2)
    start = adapted(params) if restart else state1.weights
    expected2 = sgd_steps([untrained_net, untrained_net], start, x2, y2)
    assert sq_distance(state2.weights, expected2) < 1e-6 and int(state2.step) == 4
    # (rounding apart: a step with the other affine moves the weights by far more)
    assert sq_distance(expected1, sgd_steps([untrained_net] * 2, adapted(params), x1, y1)) > 1e-4
    assert sq_distance(expected2, sgd_steps([trained_net, untrained_net], start, x2, y2)) > 1e-4
    target = glyphs[:10, 1]
    np.testing.assert_allclose(learner.predict(params, state2, target),
                               untrained_net(state2.weights, target), rtol=1e-5, atol=1e-5)
    # Off (the default): every step and the prediction use params' (the trained) affine.
    default = pretrain_tune(B3, FinetuneOptions(inner_steps=2, restart_each_support_set=restart))
    off = default.adapt(params, default.init(params, jax.random.key(2), B3), x1, y1)
    assert off.step is None
    assert sq_distance(off.weights, sgd_steps([trained_net] * 2, adapted(params), x1, y1)) < 1e-6
    np.testing.assert_allclose(default.predict(params, off, target),
                               trained_net(off.weights, target), rtol=1e-5, atol=1e-5)
    assert not np.allclose(default.predict(params, off, target),
                           learner.predict(params, state1, target), atol=1e-2)


def test_per_step_bn_rows_under_restart_equal_a_model_with_the_initial_affine(pretrained,
                                                                              glyphs):
    # As published (restart + per-step rows), only the last support set reaches the target and
    # none of its steps reads row 0: the prediction is the default learner's on params whose
    # pretrained scale/bias are put back to their init.
    params, initial = pretrained
    support_x = glyphs[:15, 0].reshape(3, 5, *IMAGE)
    support_y = jnp.arange(15, dtype=jnp.int32).reshape(3, 5)
    target_x = glyphs[:15, 1].reshape(-1, *IMAGE)
    key = jax.random.key(19)
    published = get_learner("pretrain_tune", B3, inner_steps=2, restart_each_support_set=True,
                            per_step_bn_rows=True)
    default = get_learner("pretrain_tune", B3, inner_steps=2, restart_each_support_set=True)
    logits = episode.run_task(published, params, support_x, support_y, target_x, key)
    np.testing.assert_allclose(logits, episode.run_task(default, initial, support_x, support_y,
                                                        target_x, key), rtol=1e-5, atol=1e-5)
    assert not np.allclose(logits, episode.run_task(default, params, support_x, support_y,
                                                    target_x, key), atol=1e-2)


def test_per_step_bn_rows_counts_steps_for_ewc_and_leaves_init_learners_alone(pretrained,
                                                                            two_sets):
    params, initial = pretrained
    (x1, y1), _ = two_sets
    # EWC-Pretrain: the Fisher is the prediction's, with the initial affine; 4 more ATM bytes.
    learner = ewc_pretrain(B3, EwcOptions(inner_steps=2, per_step_bn_rows=True))
    state = learner.adapt(params, learner.init(params, jax.random.key(2), B3), x1, y1)
    fisher = empirical_fisher(network(15, initial), state.weights, x1, y1)
    assert sq_distance(state.fisher, fisher) < 1e-16 and int(state.step) == 2
    plain = ewc_pretrain(B3, EwcOptions(inner_steps=2))
    assert metrics.atm(learner, params, IMAGE) * metrics.support_bytes(B3, IMAGE) == (
        metrics.atm(plain, params, IMAGE) * metrics.support_bytes(B3, IMAGE) + 4)
    # Init+Tune's norm layers are never trained (nor are the authors'): no counter, no change.
    rows = init_tune(B3, FinetuneOptions(inner_steps=2, per_step_bn_rows=True))
    assert rows.init(params, jax.random.key(2), B3).step is None
    default = init_tune(B3, FinetuneOptions(inner_steps=2))
    assert sq_distance(rows.adapt(params, rows.init(params, None, B3), x1, y1).weights,
                       default.adapt(params, default.init(params, None, B3), x1, y1).weights) == 0


@pytest.fixture(scope="module")
def small_split():
    """The train classes of a 20-class synthetic set: 15 classes x 10 samples."""
    return data.load_split("synthetic", "train", num_classes=20, samples_per_class=10)


@pytest.fixture(scope="module")
def pretrainer():
    learner = pretrain_tune(B3)
    return learner, init_params(learner, jax.random.key(11), jnp.zeros((1, *IMAGE)), B3)


PRETRAIN = dict(batch_size=32, learning_rate=1e-3, weight_decay=1e-5)


def test_pretrain_train_step_reduces_the_loss_and_compiles_once(small_split, pretrainer):
    learner, params = pretrainer
    num_classes = small_split.class_table.shape[0]
    assert num_classes == 15
    state = init_state(learner, params, num_classes, IMAGE, jax.random.key(12),
                       PRETRAIN["learning_rate"], PRETRAIN["weight_decay"])
    pool = entry_pool(small_split.class_table)
    assert pool.image_idx.shape == (150,) and int(pool.labels[-1]) == 14
    losses, keys = [], [jax.random.fold_in(jax.random.key(13), i) for i in range(30)]
    with traces_counted() as traced:
        for i, key in enumerate(keys):
            state, loss, _ = train_step(state, small_split, pool, key, learner=learner,
                                        num_classes=num_classes, **PRETRAIN)
            losses.append(float(loss))
            if i == 0:
                first = traced[0]  # the step's program, and the ops around it, once
    assert traced[0] == first  # 29 more steps trace nothing
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:10])


def test_pretrain_trains_only_the_embed_deterministically(small_split, pretrainer, caplog):
    learner, params = pretrainer
    with caplog.at_level(logging.INFO):
        trained = pretrain(learner, params, small_split, jax.random.key(15), steps=30,
                           log_every=15, **PRETRAIN)
    again = pretrain(learner, params, small_split, jax.random.key(15), steps=30, log_every=30,
                     **PRETRAIN)
    assert sq_distance(trained["head"], params["head"]) == 0.0
    assert sq_distance(trained["embed"], params["embed"]) > 0.0
    assert sq_distance(trained["embed"], again["embed"]) == 0.0
    logged = [float(m) for m in re.findall(r"step \d+/30: loss ([\d.]+)", caplog.text)]
    assert len(logged) == 2 and logged[1] < 0.5 * logged[0]


def test_pretrain_refuses_bad_values(small_split, pretrainer):
    learner, params = pretrainer
    with pytest.raises(ValueError, match="steps must be an integer >= 1, got 0"):
        pretrain(learner, params, small_split, jax.random.key(0), steps=0)
    with pytest.raises(ValueError, match="learning_rate must be a finite number > 0, got 0"):
        pretrain(learner, params, small_split, jax.random.key(0), learning_rate=0)
    with pytest.raises(ValueError, match="no embed_apply"):
        pretrain(get_learner("protonets", B3), params, small_split, jax.random.key(0))


# ---- options and the episode ------------------------------------------------------------------

@pytest.mark.parametrize("options, message", [
    (dict(inner_steps=0), "learner 'ewc_init': option inner_steps=0 must be an integer >= 1"),
    (dict(learning_rate=-0.1), "option learning_rate=-0.1 must be a number > 0"),
    (dict(ewc_lambda=float("nan")), "option ewc_lambda=nan must be a finite number"),
    (dict(filters=2.5), "option filters=2.5 must be an integer"),
    (dict(activation="gelu"), r"option activation='gelu' must be one of \('relu', 'leaky_relu'\)"),
    (dict(conv="cudnn"), "option conv='cudnn' must be one of "),
    (dict(weight_init="original"), r"weight_init='original' must be one of \('xavier', 'torch', "
                                   r"'lecun'\)"),
    (dict(inner_step=2), "learner 'ewc_init': no option inner_step; valid: activation, "),
    (dict(per_step_bn_rows="yes"), r"option per_step_bn_rows='yes' must be a bool \(true or "),
    (dict(per_step_bn_rows=True, adapt_norm=True), r"per_step_bn_rows=True needs adapt_norm=False "
                                                   r"\(the authors' per-step rows are never"),
])
def test_bad_options_are_refused(options, message):
    with pytest.raises(UserError, match=message):
        get_learner("ewc_init", B3, **options)


def test_every_conv_impl_adapts_and_predicts_the_same(tuned, two_sets, glyphs):
    # "auto" (im2col on every platform: batched GEMMs for per-task weights on GPU/TPU),
    # "gemm_grad" and XLA's own convolution compute one function: the same adapted weights
    # and the same logits. Compared in float64: in float32, ten SGD steps through max-pool
    # ties and leaky-ReLU kinks amplify the implementations' different rounding (~1e-7) to
    # ~0.3 in some logits, while in float64 all three agree to ~1e-13 on CPU and ~2e-8 on an
    # H100 (cuDNN's float64 convolutions sum in another order; the steps amplify it).
    (x1, y1), (x2, y2) = two_sets
    results = {}
    with jax.enable_x64(True):
        params = jax.tree.map(lambda p: p.astype(jnp.float64), tuned[1])
        x1, x2, target = (x.astype(jnp.float64) for x in (x1, x2, glyphs[:10, 1]))
        for conv in ("auto", "gemm_grad", "xla"):
            other = init_tune(B3, FinetuneOptions(conv=conv))

            @jax.jit
            def run(params):
                state = other.init(params, jax.random.key(2), B3)
                state = other.adapt(params, other.adapt(params, state, x1, y1), x2, y2)
                return state.weights, other.predict(params, state, target)

            results[conv] = run(params)
    weights, logits = results["auto"]
    assert logits.dtype == jnp.float64
    for conv in ("gemm_grad", "xla"):
        np.testing.assert_allclose(logits, results[conv][1], rtol=1e-7, atol=1e-7)
        for a, b in zip(jax.tree.leaves(weights), jax.tree.leaves(results[conv][0])):
            np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-9)
    assert float(jnp.std(logits)) > 0.01  # not a degenerate comparison


def test_ewc_lambda_is_not_an_option_of_plain_fine_tuning():
    with pytest.raises(UserError, match="learner 'init_tune': no option ewc_lambda"):
        get_learner("init_tune", B3, ewc_lambda=1.0)


def test_run_task_gives_finite_logits_for_every_finetuner(glyphs):
    learners = [get_learner(name, B3, inner_steps=1) for name in FINETUNERS]  # shapes, not skill
    params = [init_params(learner, jax.random.key(16), jnp.zeros((1, *IMAGE)), B3)
              for learner in learners]
    support_x = glyphs[:15, 0].reshape(3, 5, *IMAGE)
    support_y = jnp.arange(15, dtype=jnp.int32).reshape(3, 5)
    target_x = glyphs[:15, 1:6].reshape(-1, *IMAGE)  # per_class: 3 groups x 5 classes x KT=5

    @jax.jit  # one program for all four: XLA compiles their shared parts once
    def run_all(params, key):
        return [episode.run_task(learner, p, support_x, support_y, target_x, key)
                for learner, p in zip(learners, params)]

    for name, logits in zip(FINETUNERS, run_all(params, jax.random.key(17))):
        assert logits.shape == (B3.target_size, B3.num_outputs) == (75, 15), name
        assert bool(jnp.all(jnp.isfinite(logits))), name
