"""MAML++ low/high-end and SCA: meta-gradients, LSLR, per-step BN, ATM, data flow, NSS scaling."""

import re

import flax.linen as nn
from flax import traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from cfsl_jax import data
from cfsl_jax.protocol import episode, metrics
from cfsl_jax.runtime.errors import UserError
from cfsl_jax.learners import get_learner
from cfsl_jax.learners.inner_loop import msl_weights
from cfsl_jax.learners.sca import Critic
from cfsl_jax.protocol.episode import meta_step_macs
from cfsl_jax.models.conv4 import BatchStatNorm
from cfsl_jax.models.conv import im2col_conv
from cfsl_jax.models.densenet import SEDenseNet
from cfsl_jax.models.norm import PerStepBatchNorm
from cfsl_jax.protocol.sampler import sample_task, sample_tasks
from cfsl_jax.protocol.spec import TaskSpec
from cfsl_jax.training.train import TrainConfig, per_task_meta_step_macs
from conftest import compile_unoptimised

IMAGE = (28, 28, 1)
SMALL = (16, 16, 1)
TINY_SPEC = TaskSpec(nss=2, nc=2, ks=1, kt=1, cci=1, overwrite=False, target_mode="per_class")
TINY_LOW = dict(image_shape=SMALL, filters=3, num_blocks=2, inner_steps=2)
TINY_HIGH = dict(image_shape=SMALL, filters=4, embed_filters=4, growth=4, inner_steps=2)


def random_task(spec, image_shape, seed=0, dtype=jnp.float32):
    """Random images with the labels of a real task of ``spec``."""
    keys = jax.random.split(jax.random.key(seed), 2)
    support_x = jax.random.uniform(keys[0], (spec.nss, spec.support_size, *image_shape), dtype)
    group = jnp.arange(spec.nss)[:, None] // spec.cci
    position = jnp.tile(jnp.repeat(jnp.arange(spec.nc), spec.ks), (spec.nss, 1))
    support_y = (position if spec.overwrite else group * spec.nc + position).astype(jnp.int32)
    target_x = jax.random.uniform(keys[1], (spec.target_size, *image_shape), dtype)
    target_y = (jnp.arange(spec.target_size) % spec.num_outputs).astype(jnp.int32)
    return support_x, support_y, target_x, target_y


def init(learner, image_shape, seed=0):
    """The learner's initial parameters, drawn by one jitted program (the same values as op by
    op, without compiling each op)."""
    return jax.jit(learner.init_params, static_argnums=2)(
        jax.random.key(seed), jnp.zeros((1, *image_shape)), learner.spec)


def meta_grad_fn(learner, progress=0.5):
    """A jitted (params, task) -> (meta-loss, meta-gradient) of one task."""
    return jax.jit(jax.value_and_grad(
        lambda p, task: episode.meta_loss(learner, p, *task, jax.random.key(0), progress)[0]))


# ---- meta-gradients ----------------------------------------------------------------------


def test_second_order_meta_gradient_matches_finite_differences_and_first_order_does_not():
    with jax.enable_x64(True):
        learner = get_learner("maml_low", TINY_SPEC, inner_lr=0.1, multi_step_loss=False,
                              first_order_epochs=1, **TINY_LOW)
        first_order = learner.recipe.for_epoch(0)
        assert learner.recipe.for_epoch(1) is learner and first_order is learner.recipe.for_epoch(0)
        params = jax.tree.map(lambda p: p.astype(jnp.float64), init(learner, SMALL))
        task = random_task(TINY_SPEC, SMALL, dtype=jnp.float64)
        direction = jax.tree.map(
            lambda p: jax.random.normal(jax.random.key(p.size), p.shape, jnp.float64), params)
        second_order = meta_grad_fn(learner)
        eps = 1e-5
        shifted = [jax.tree.map(lambda p, d, s=s: p + s * eps * d, params, direction)
                   for s in (1, -1)]
        numeric = float(second_order(shifted[0], task)[0] - second_order(shifted[1], task)[0])
        numeric /= 2 * eps
        dot = lambda g: float(sum(jnp.vdot(a, b) for a, b in zip(  # noqa: E731
            jax.tree.leaves(g), jax.tree.leaves(direction))))
        second = dot(second_order(params, task)[1])
        first = dot(meta_grad_fn(first_order)(params, task)[1])
    assert second == pytest.approx(numeric, rel=1e-6)
    assert abs(first - numeric) > 1e-3 * abs(numeric)  # first-order drops the Hessian terms


# ---- LSLR and per-step batch norm ---------------------------------------------------------


def test_lslr_rates_get_per_step_gradients_and_change_under_training():
    learner = get_learner("maml_low", TINY_SPEC, **TINY_LOW)
    params = init(learner, SMALL)
    task = random_task(TINY_SPEC, SMALL)
    steps = TINY_SPEC.nss * 2
    for rates in jax.tree.leaves(params["lslr"]):
        np.testing.assert_array_equal(rates, np.full(steps, 0.01, np.float32))
    meta_grad = meta_grad_fn(learner)
    _, grads = meta_grad(params, task)
    assert sorted(grads["lslr"]) == ["Conv_0", "Conv_1", "Dense_0"]  # convs: kernels only
    for rate_grad in jax.tree.leaves(grads["lslr"]):
        assert rate_grad.shape == (steps,) and np.all(np.abs(rate_grad) > 1e-6)
    for table in jax.tree.leaves(grads["net"]["PerStepBatchNorm_0"]):  # one row per step, all used
        # + 1: the target forward after the NSS*S support steps has its own row
        assert table.shape == (steps + 1, 3) and np.all(np.abs(table).sum(axis=1) > 1e-6)
    optimizer = optax.adam(1e-3)
    opt_state = optimizer.init(params)
    new = params
    for _ in range(3):
        _, grads = meta_grad(new, task)
        updates, opt_state = optimizer.update(grads, opt_state, new)
        new = optax.apply_updates(new, updates)
    for old_rates, new_rates in zip(jax.tree.leaves(params["lslr"]),
                                    jax.tree.leaves(new["lslr"])):
        assert np.all(np.abs(new_rates - old_rates) > 1e-3)  # ~ 3 Adam steps of 1e-3


def test_per_step_batch_norm_uses_the_row_of_its_step():
    x = jax.random.normal(jax.random.key(0), (6, 3, 3, 2)) * 3 + 1
    norm = PerStepBatchNorm(num_steps=4)
    params = norm.init(jax.random.key(1), x, 0)
    scale = jnp.arange(1.0, 9.0).reshape(4, 2)
    params = {"params": {"step_scale": scale, "step_bias": -scale}}
    standard = (x - x.mean((0, 1, 2))) / jnp.sqrt(x.var((0, 1, 2)) + 1e-5)
    for step in range(4):
        expected = standard * scale[step] - scale[step]
        np.testing.assert_allclose(norm.apply(params, x, step), expected, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(norm.apply(params, x, jnp.int32(step)), expected,
                                   rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(norm.apply(params, x, jnp.int32(9)), norm.apply(params, x, 3))


def test_im2col_convolution_equals_xla_convolution():
    x = jax.random.normal(jax.random.key(0), (2, 7, 6, 3))
    for k in (1, 3):
        kernel = jax.random.normal(jax.random.key(k), (k, k, 3, 5))
        expected = jax.lax.conv_general_dilated(x, kernel, (1, 1), "SAME",
                                                dimension_numbers=("NHWC", "HWIO", "NHWC"))
        np.testing.assert_allclose(im2col_conv(x, kernel), expected, rtol=1e-5, atol=1e-5)


def test_multi_step_loss_weights_anneal_to_the_final_loss():
    final, each = msl_weights(0.0, 4, 0.1)
    assert float(final) == pytest.approx(0.25) and float(each) == pytest.approx(0.25)
    final, each = msl_weights(0.05, 4, 0.1)
    assert float(final + 3 * each) == pytest.approx(1.0) and 0.25 < float(final) < 1
    final, each = msl_weights(0.5, 4, 0.1)
    assert float(final) == 1.0 and float(each) == 0.0


# ---- ATM ------------------------------------------------------------------------------------


def _bytes(*counts):
    return 4 * sum(counts)


@pytest.mark.parametrize("name,options", [("maml_low", {}), ("maml_high", {}), ("sca", {}),
                                          ("maml_high", dict(se_mlp=True, shrink_transitions=True))])
def test_atm_is_the_bytes_of_the_adapted_weights_and_step_counter(name, options):
    spec = TaskSpec.preset("B3")  # 15 outputs
    learner = get_learner(name, spec, **options)
    params = jax.eval_shape(lambda k: learner.init_params(k, jnp.zeros((1, *IMAGE)), spec),
                            jax.random.key(0))
    if name == "maml_low":  # 4 convs of 48 filters + linear 48 -> 15 (28 -> 14 -> 7 -> 3 -> 1)
        weights = _bytes(9 * 1 * 48, 3 * 9 * 48 * 48, 48 * 15 + 15)  # convs: no bias (BN)
    elif not options:  # SE(320: Linear 320->320), conv 3x3 320->48, SE(48: 48->48), 48 -> 15
        weights = _bytes(320 * 320 + 320, 9 * 320 * 48, 48 * 48 + 48, 48 * 15 + 15)
        assert weights + 4 == 976192
    else:  # the previous head: SE(64: 64->16->64), conv 64->48, SE(48: 48->12->48), 48 -> 15
        weights = _bytes(64 * 16 + 16 + 16 * 64 + 64, 9 * 64 * 48,
                         48 * 12 + 12 + 12 * 48 + 48, 48 * 15 + 15)
        assert weights + 4 == 126896
    support = spec.nss * spec.support_size * 28 * 28 * 4
    assert metrics.atm(learner, params, IMAGE) == pytest.approx((weights + 4) / support)


def test_se_densenet_keeps_all_channels_and_gates_with_one_linear_layer():
    x = jnp.zeros((2, *IMAGE))
    params = jax.eval_shape(SEDenseNet().init, jax.random.key(0), x)["params"]
    shapes = {k: v.shape for k, v in traverse_util.flatten_dict(params, sep="/").items()}
    # stem 64; stage 1: 64 + 2 x 64 = 192 kept by its transition; stage 2: 192 + 128 = 320
    se = sorted(k for k in shapes if k.startswith("SqueezeExcite"))
    assert [shapes[k] for k in se] == [(64,), (64, 64), (128,), (128, 128), (192,), (192, 192),
                                       (256,), (256, 256)]
    transitions = [shapes[f"Conv_{i}/kernel"] for i in (5, 10)]
    assert transitions == [(1, 1, 192, 192), (1, 1, 320, 320)]
    assert jax.eval_shape(SEDenseNet().apply, {"params": params}, x).shape == (2, 5, 5, 320)
    old = SEDenseNet(se_mlp=True, shrink_transitions=True)
    old_params = jax.eval_shape(old.init, jax.random.key(0), x)
    assert jax.eval_shape(old.apply, old_params, x).shape == (2, 5, 5, 64)


def test_the_target_forward_uses_its_own_batch_norm_row():
    for own_row in (True, False):
        learner = get_learner("maml_low", TINY_SPEC, target_bn_row=own_row, **TINY_LOW)
        params = init(learner, SMALL)
        support_x, support_y, target_x, _ = random_task(TINY_SPEC, SMALL)
        state = episode.adapt_all(learner, params, support_x, support_y, jax.random.key(0))
        steps = TINY_SPEC.nss * 2
        assert int(state.step) == steps
        table = params["net"]["PerStepBatchNorm_1"]["step_bias"]
        assert table.shape[0] == steps + own_row
        before = learner.predict(params, state, target_x)

        def shifted(row):
            bias = table.at[row].add(1.0)
            net = {**params["net"], "PerStepBatchNorm_1": {
                **params["net"]["PerStepBatchNorm_1"], "step_bias": bias}}
            return learner.predict({**params, "net": net}, state, target_x)

        target_row = steps if own_row else steps - 1
        assert not np.allclose(shifted(target_row), before)
        if own_row:  # the last support step's row no longer reaches the target forward
            np.testing.assert_allclose(shifted(steps - 1), before)


def test_restart_each_support_set_leaves_only_the_last_set_in_the_prediction():
    spec = TaskSpec(nss=3, nc=2, ks=1, kt=1, cci=1, overwrite=True, target_mode="per_class")
    learner = get_learner("maml_low", spec, restart_each_support_set=True, **TINY_LOW)
    params = init(learner, SMALL)
    support_x, support_y, target_x, target_y = random_task(spec, SMALL)
    logits = episode.run_task(learner, params, support_x, support_y, target_x, jax.random.key(0))
    fresh = learner.init(params, jax.random.key(0), spec)  # the meta-weights; the counter
    alone = learner.adapt(params, fresh._replace(step=fresh.step + 4), support_x[2],
                          support_y[2])  # still advances: the last set's steps are 4 and 5
    np.testing.assert_allclose(logits, learner.predict(params, alone, target_x), rtol=1e-5,
                               atol=1e-5)
    carried = get_learner("maml_low", spec, **TINY_LOW)
    assert not np.allclose(episode.run_task(carried, params, support_x, support_y, target_x,
                                            jax.random.key(0)), logits, atol=1e-4)
    # Multi-step loss is off by default: the meta-loss is the final target loss alone.
    loss, final = episode.meta_loss(carried, params, support_x, support_y, target_x, target_y,
                                    jax.random.key(0), 0.0)
    assert float(loss) == pytest.approx(float(metrics.cross_entropy(final, target_y)), rel=1e-6)


def test_adapted_layers_are_xavier_and_the_embedding_pytorch_default():
    learner = get_learner("sca", TINY_SPEC, **TINY_HIGH)
    params = init(learner, SMALL)
    kernel = np.asarray(params["net"]["Conv_0"]["kernel"])  # 3x3, 20 -> 4 channels
    limit = np.sqrt(6 / (9 * 20 + 9 * 4))
    assert np.abs(kernel).max() <= limit and np.abs(kernel).max() > 0.9 * limit
    assert not np.any(np.asarray(params["net"]["Dense_0"]["bias"]))
    stem = np.asarray(params["embed"]["Conv_0"]["kernel"])  # 3x3, 1 -> 4: U(+-1/3)
    assert np.abs(stem).max() <= 1 / 3 and np.abs(stem).max() > 0.8 / 3
    se_bias = np.asarray(params["embed"]["SqueezeExcite_0"]["Dense_0"]["bias"])
    assert np.any(se_bias) and np.abs(se_bias).max() <= 1 / 2  # fan_in 4
    assert sorted(params["critic"]) == ["Dense_0", "Dense_1", "Dense_2"]
    assert all(list(layer) == ["kernel"] for layer in params["critic"].values())  # no biases


# ---- data flow: maml_high's embedding --------------------------------------------------------


def test_maml_high_embeds_each_support_set_and_the_target_set_on_its_own():
    spec = TaskSpec(nss=3, nc=2, ks=2, kt=1, cci=1, overwrite=False, target_mode="per_class")
    learner = get_learner("maml_high", spec, **TINY_HIGH)
    params = init(learner, SMALL)
    support_x, support_y, target_x, _ = random_task(spec, SMALL)
    calls, norm_batches = [], []

    def interceptor(next_fun, args, kwargs, context):
        out = next_fun(*args, **kwargs)
        if context.method_name != "__call__":
            return out
        if isinstance(context.module, SEDenseNet):
            jax.debug.callback(lambda x, y: calls.append((np.asarray(x), np.asarray(y))),
                               args[0], out)
        if isinstance(context.module, BatchStatNorm):
            norm_batches.append(args[0].shape[0])
        return out

    with nn.intercept_methods(interceptor):
        jax.block_until_ready(jax.jit(lambda p: episode.run_task(
            learner, p, support_x, support_y, target_x, jax.random.key(0)))(params))
    jax.effects_barrier()
    sets = [np.asarray(x) for x in support_x] + [np.asarray(target_x)]
    assert len(calls) == len(sets)  # once per support set, once for the target set
    embed = jax.jit(lambda x: SEDenseNet(4, 4).apply({"params": params["embed"]}, x))
    for inputs, features in calls:
        matches = [i for i, s in enumerate(sets) if s.shape == inputs.shape
                   and np.array_equal(s, inputs)]
        assert len(matches) == 1
        sets.pop(matches[0])
        alone = embed(inputs)  # its own batch statistics
        np.testing.assert_allclose(features, alone, rtol=1e-5, atol=1e-5)
    assert not sets
    assert set(norm_batches) == {spec.support_size, spec.target_size}


# ---- NSS scaling: program size and memory ----------------------------------------------------


def test_meta_training_program_does_not_grow_with_nss_and_runs_at_nss_30():
    programs = {}
    for nss in (3, 30):
        spec = TaskSpec(nss=nss, nc=5, ks=1, kt=1, cci=nss, overwrite=True,
                        target_mode="per_class")
        learner = get_learner("maml_low", spec, **TINY_LOW)
        params = init(learner, SMALL)
        task = random_task(spec, SMALL)
        step = jax.jit(jax.value_and_grad(
            lambda p, t, l=learner: episode.meta_loss(l, p, *t, jax.random.key(0), 0.0)[0]))
        lowered = step.lower(params, task)
        ops = len(re.findall(r"^\s*(%\S+ = )?\"?[a-z_]+\.[a-z_.]+", lowered.as_text(), re.M))
        programs[nss] = (ops, lowered, params, task)
    assert programs[30][0] == programs[3][0]  # the same program, whatever NSS
    memory = {}
    for nss, (_, lowered, params, task) in programs.items():
        compiled = lowered.compile()
        memory[nss] = compiled.memory_analysis().temp_size_in_bytes
        if nss == 30:
            loss, grads = compiled(params, task)
            assert np.isfinite(float(loss))
            assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))
    assert memory[30] < 1.5 * memory[3] + 2**20, memory  # remat: only fast weights per set


# ---- SCA -------------------------------------------------------------------------------------


def test_sca_predicts_after_a_critic_step_and_meta_learns_the_critic():
    learner = get_learner("sca", TINY_SPEC, **TINY_HIGH)
    params = init(learner, SMALL)
    task = random_task(TINY_SPEC, SMALL)
    step = jax.jit(jax.value_and_grad(  # at progress 1 the weights are (0, 1): post-critic only
        lambda p: episode.meta_loss(learner, p, *task, jax.random.key(0), 1.0), has_aux=True))
    (loss, post), grads = step(params)
    predict = jax.jit(lambda p: episode.run_task(learner, p, *task[:3], jax.random.key(0)))
    np.testing.assert_allclose(post, predict(params), rtol=1e-5, atol=1e-5)
    assert float(loss) == pytest.approx(float(metrics.cross_entropy(post, task[3])), rel=1e-5)
    assert all(np.any(g != 0) for g in jax.tree.leaves(grads["critic"]))
    # A critic whose output layer is zero has a constant loss: the critic step does nothing.
    silent = {**params, "critic": {**params["critic"], "Dense_2": jax.tree.map(
        jnp.zeros_like, params["critic"]["Dense_2"])}}
    (_, pre), _ = step(silent)
    assert post.shape == pre.shape == (TINY_SPEC.target_size, TINY_SPEC.num_outputs)
    assert not np.allclose(post, pre, atol=1e-6)


def test_the_original_critic_sums_leaky_relu_scores_of_logit_features():
    logits = jnp.array([[1.0, -2.0], [0.5, 0.0]])
    # [logits, |logits|, logits^2, sign(logits)] per target sample
    features = np.array([[1, -2, 1, 2, 1, 4, 1, -1], [0.5, 0, 0.5, 0, 0.25, 0, 1, 0]])
    critic = Critic()
    params = critic.init(jax.random.key(0), logits)["params"]
    w1, w2, w3 = (np.asarray(params[f"Dense_{i}"]["kernel"]) for i in range(3))
    assert w1.shape == (8, 16) and w2.shape == (16, 16) and w3.shape == (16, 1)
    leaky = lambda v: np.where(v > 0, v, 0.01 * v)  # noqa: E731
    expected = np.sum(leaky(leaky(features @ w1) @ w2) @ w3)  # summed over the samples
    assert float(critic.apply({"params": params}, logits)) == pytest.approx(expected, rel=1e-5)
    smooth = Critic(32, "smooth")
    smooth_params = smooth.init(jax.random.key(0), logits)["params"]
    assert smooth_params["Dense_0"]["kernel"].shape == (8, 32) and "bias" in smooth_params[
        "Dense_0"]
    with pytest.raises(UserError, match=r"learner 'sca': option critic='soft' must be one of "
                                        r"\('original', 'smooth'\)"):
        get_learner("sca", TINY_SPEC, critic="soft")


# ---- MACs, options ---------------------------------------------------------------------------


def test_macs_of_adaptation_prediction_and_one_meta_training_step():
    learner = get_learner("maml_low", TINY_SPEC, unroll=True, **TINY_LOW)
    params = init(learner, SMALL)
    macs = metrics.learner_macs(learner, params, SMALL)
    one = metrics.learner_macs(get_learner("maml_low", TINY_SPEC, unroll=True,
                                           **{**TINY_LOW, "inner_steps": 1}), params, SMALL)
    # adaptation's cost grows with its SGD steps (2 here); prediction's does not
    assert macs["macs_adapt"] == pytest.approx(2 * one["macs_adapt"], rel=0.05)
    assert macs["macs_predict"] == one["macs_predict"] > 0
    step = meta_step_macs(learner, params, SMALL)
    assert step > 2 * (TINY_SPEC.nss * macs["macs_adapt"] + macs["macs_predict"])


def test_a_rolled_inner_loop_counts_the_macs_of_the_unrolled_one():
    """XLA counts a loop's body once: with ``unroll_inner=False`` the S=2 inner steps are a
    scan, and the MACs (adaptation, per task, a meta-training step) are still every step's."""
    unrolled = get_learner("maml_low", TINY_SPEC, **TINY_LOW)
    rolled = get_learner("maml_low", TINY_SPEC, unroll_inner=False, **TINY_LOW)
    params = init(unrolled, SMALL)
    assert unrolled.recipe.counted is None and rolled.recipe.counted is not None
    counts = {learner: metrics.learner_macs(learner.evaluated, params, SMALL)
              for learner in (unrolled, rolled)}
    assert counts[rolled] == counts[unrolled]
    in_bf16 = [metrics.learner_macs(get_learner("maml_low", TINY_SPEC, compute_dtype="bfloat16",
                                                unroll_inner=ui, **TINY_LOW), params, SMALL)
               for ui in (True, False)]  # the twin casts as the learner does
    assert in_bf16[0] == in_bf16[1] != counts[unrolled]
    assert counts[rolled]["macs_adapt"] > 1.5 * metrics.xla_macs(  # the scan counted alone
        rolled.adapt, params, rolled.init(params, jax.random.key(0), TINY_SPEC),
        jnp.zeros((TINY_SPEC.support_size, *SMALL)), jnp.zeros(TINY_SPEC.support_size, int))
    steps = {ui: per_task_meta_step_macs(
        TrainConfig(learner="maml_low", task="B3", spec_overrides=dict(
            nss=2, nc=2, ks=1, kt=1, cci=1, overwrite=False), learner_options={
            **{k: v for k, v in TINY_LOW.items() if k != "image_shape"}, "unroll_inner": ui}),
        None, params, SMALL) for ui in (True, False)}
    assert steps[True] == steps[False] > 0


def test_a_meta_step_counts_every_support_set_after_the_training_learner_was_built():
    """``per_task_meta_step_macs`` rebuilds the learner with ``unroll=True`` (a loop's body is
    counted once). A run builds its training learner (``unroll=1``) first, and True == 1 with
    equal hashes: the rebuilt learner must not be that one from the learners' cache (it was,
    and a meta-step counted one support set of NSS: a forward of NSS support sets cost more)."""
    options = {k: v for k, v in TINY_LOW.items() if k != "image_shape"}
    training = get_learner("maml_low", TINY_SPEC, unroll=1, **TINY_LOW)
    assert get_learner("maml_low", TINY_SPEC, unroll=True, **TINY_LOW) is not training
    params = init(training, SMALL)
    config = TrainConfig(learner="maml_low", task="B3", spec_overrides=dict(
        nss=2, nc=2, ks=1, kt=1, cci=1, overwrite=False), learner_options={**options, "unroll": 1})
    per_task = metrics.learner_macs(training, params, SMALL)["macs_per_task"]
    step = per_task_meta_step_macs(config, training, params, SMALL)
    assert step > 2 * per_task  # the value is about one task's forward; its gradient more


def test_a_meta_step_counts_its_task_as_arguments_not_folded_constants():
    """XLA folds what it can of a program's constants: a meta-step counted with its task's
    arrays closed over counted ProtoNets 11 % under the training step it stands for."""
    learner = get_learner("protonets", TINY_SPEC, image_shape=SMALL, filters=4)
    params = init(learner, SMALL)
    spec = TINY_SPEC
    task = (jnp.zeros((spec.nss, spec.support_size, *SMALL)), jnp.zeros((spec.nss,
            spec.support_size), jnp.int32), jnp.zeros((spec.target_size, *SMALL)),
            jnp.zeros((spec.target_size,), jnp.int32))

    def step(params, *task):
        return jax.value_and_grad(lambda p: episode.meta_loss(
            learner, p, *task, jax.random.key(0), 0.0, unroll=True)[0])(params)

    assert meta_step_macs(learner, params, SMALL) == metrics.xla_macs(step, params, *task) > 0


@pytest.mark.parametrize("name,option,value", [
    ("maml_low", "inner_steps", 0), ("maml_low", "inner_lr", -0.1), ("maml_low", "lslr", 1),
    ("maml_low", "remat", "some"), ("maml_low", "msl_fraction", 0.0),
    ("maml_low", "first_order_epochs", -1), ("maml_low", "filters", 0), ("maml_low", "conv", "fft"),
    ("maml_low", "unroll", 0), ("maml_high", "growth", 0), ("sca", "critic_hidden", 0)])
def test_bad_options_are_refused_naming_the_value(name, option, value):
    with pytest.raises(UserError, match=re.escape(f"learner {name!r}: option {option}={value!r} "
                                                  f"must be ")):
        get_learner(name, TINY_SPEC, **{option: value})


# ---- learning on real data -------------------------------------------------------------------


def test_maml_low_meta_training_improves_c3_accuracy_on_omniglot(omniglot_dir, data_dir):
    spec = TaskSpec.preset("C3")
    learner = get_learner("maml_low", spec, filters=16, inner_steps=2, inner_lr=0.1,
                          multi_step_loss=False)
    train, val = (data.load_split("omniglot", split, data_dir=data_dir, manual_dir=omniglot_dir,
                                  resize="lanczos") for split in ("train", "val"))
    # The initial parameters and the spec's check at the suite's -O0 (init_params compiled in
    # 2 s instead of 35 s at the default level, values within 6e-8); training and validation,
    # whose run time dominates, at XLA's default level.
    params = init(learner, IMAGE)
    eval_keys = jax.random.split(jax.random.key(123), 32)
    sample_tasks(eval_keys, val.class_table, val.class_sizes, spec)  # validates the spec
    compile_unoptimised(False)  # restored after the test
    optimizer = optax.adam(1e-2)
    opt_state = optimizer.init(params)

    def task_arrays(split, key):
        task = sample_task(key, split.class_table, split.class_sizes, spec)
        return (data.gather_normalised(split, task.support_idx), task.support_labels,
                data.gather_normalised(split, task.target_idx), task.target_labels)

    @jax.jit
    def train_step(params, opt_state, key):
        def task_grad(key):
            task = task_arrays(train, key)
            return jax.grad(lambda p: episode.meta_loss(learner, p, *task, key, 0.5)[0])(params)
        grads = jax.lax.map(task_grad, jax.random.split(key, 4))
        updates, opt_state = optimizer.update(jax.tree.map(lambda g: g.mean(0), grads),
                                              opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    @jax.jit
    def val_accuracy(params):
        def one(key):
            support_x, support_y, target_x, target_y = task_arrays(val, key)
            logits = episode.run_task(learner, params, support_x, support_y, target_x, key)
            return metrics.accuracy(logits, target_y)
        return jax.lax.map(one, eval_keys).mean()

    before = float(val_accuracy(params))
    for step in range(60):
        params, opt_state = train_step(params, opt_state, jax.random.fold_in(jax.random.key(7),
                                                                             step))
    after = float(val_accuracy(params))
    print(f"C3 validation accuracy {before:.3f} -> {after:.3f}")
    # C3 reuses the 5 labels across 3 class groups; on the LANCZOS images 60 steps of 4 tasks
    # took 0.297 -> 0.400 (with parameter seeds 1 and 2 and their own training keys: +0.095,
    # +0.125); on the default nearest-neighbour images 0.276 -> 0.350, closer to the bar. With 32
    # filters, 3 inner steps and 30 steps the gain was +0.02..+0.09 depending on the seed and
    # on the CPU's rounding (meta-training amplifies it), too close to the bar.
    assert after > before + 0.05, (before, after)


def test_sca_loss_weights_follow_the_authors_per_epoch_schedule_when_asked():
    """``critic_weight_epochs=T``: w_pre = 0.5 - 0.5 (epoch + 1) / T, fixed within an epoch
    (``5b814ac:few_shot_learning_system.py`` ``importance_vector``), at the progress the
    training loop passes (step / total in float32); 0, the default: (1 -/+ progress) / 2."""
    from cfsl_jax.learners.sca import critic_loss_weights

    epochs, iters = 250, 500  # the paper's schedule; every step of it
    steps = np.arange(epochs * iters)
    progress = np.asarray(steps / (epochs * iters), np.float32)  # as training.loop passes it
    weights = jax.jit(critic_loss_weights, static_argnums=1)  # one program per shape, T
    w_pre, w_post = weights(progress, epochs)
    authors = 0.5 - 0.5 * (steps // iters + 1) / epochs
    np.testing.assert_allclose(w_pre, authors, atol=1e-6)
    np.testing.assert_allclose(w_post, 1.0 - authors, atol=1e-6)
    for epoch, step, pre in [(0, 0, 0.5 - 0.5 / 250), (0, 499, 0.5 - 0.5 / 250),
                             (1, 0, 0.5 - 1.0 / 250), (124, 250, 0.25), (249, 0, 0.0),
                             (249, 499, 0.0)]:
        at = np.float32((epoch * iters + step) / (epochs * iters))
        assert float(weights(at, epochs)[0]) == pytest.approx(pre, abs=1e-6)
    for epochs, iters in [(3, 7), (10, 100), (50, 17)]:  # other schedules, every step
        steps = np.arange(epochs * iters)
        got = weights(np.asarray(steps / (epochs * iters), np.float32), epochs)[0]
        np.testing.assert_allclose(got, 0.5 - 0.5 * (steps // iters + 1) / epochs, atol=1e-6)
    per_step = critic_loss_weights(jnp.float32(0.3))  # the default: annealed every step
    assert [float(w) for w in per_step] == pytest.approx([0.35, 0.65])
    # the learner uses them: at progress 0.3 of T = 4 epochs (epoch 1) its meta-loss is the
    # per-step learner's at progress (1 + 1) / 4
    task = random_task(TINY_SPEC, SMALL)

    def losses(learner, *progresses):  # one program per learner, progress traced as in training
        params = init(learner, SMALL)
        meta_loss = jax.jit(lambda p, progress: episode.meta_loss(
            learner, p, *task, jax.random.key(0), progress)[0])
        return [float(meta_loss(params, jnp.float32(progress))) for progress in progresses]

    epochs4, = losses(get_learner("sca", TINY_SPEC, critic_weight_epochs=4, **TINY_HIGH), 0.3)
    at_half, at_03 = losses(get_learner("sca", TINY_SPEC, **TINY_HIGH), 0.5, 0.3)
    assert epochs4 == pytest.approx(at_half, rel=1e-5)
    assert epochs4 != pytest.approx(at_03, rel=1e-5)


def test_the_authors_critic_weight_schedule_must_span_the_runs_epochs():
    """critic_weight_epochs=T holds the weights for each of T epochs: T other than the run's
    --epochs would be neither the authors' schedule nor the per-step one; refused in one line."""
    with pytest.raises(UserError, match=r"critic_weight_epochs=3: .* --epochs \(10\)"):
        TrainConfig(learner="sca", learner_options={"critic_weight_epochs": 3}, epochs=10).check()
    TrainConfig(learner="sca", learner_options={"critic_weight_epochs": 10}, epochs=10).check()
