"""--as_published presets: named bundles of individual options (cfsl_jax/training/as_published.py)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cfsl_jax.training import as_published
from cfsl_jax import data
from cfsl_jax.protocol import episode
from cfsl_jax.learners import get_learner
from cfsl_jax.models.conv4 import Conv4
from cfsl_jax.training import runs
from cfsl_jax.training.runs import TrainConfig
from cfsl_jax.protocol.sampler import sample_task
from conftest import init_params


def test_presets_are_bundles_of_options_and_explicit_options_win():
    feb = as_published.apply(TrainConfig(learner="maml_low", task="B3"), "feb2020")
    assert feb.spec.draws == "independent" and feb.spec.label_offset == "per_support_set"
    assert feb.learner_options == {"restart_each_support_set": True}
    apr = as_published.apply(TrainConfig(learner="protonets", task="D4"), "apr2020")
    assert apr.spec.draws == "per_group" and apr.spec.num_outputs == 20
    assert apr.learner_options == {"last_sample_prototype": True, "distance": "dot",
                                   "bn_stats": "running", "activation": "leaky_relu",
                                   "block_order": "conv_act_norm", "conv_bias": False}
    mine = TrainConfig(learner="protonets", task="B3", spec_overrides={"draws": "distinct"},
                       learner_options={"distance": "squared_euclidean"})
    kept = as_published.apply(mine, "feb2020")
    assert kept.spec.draws == "distinct" and kept.learner_options["distance"] == (
        "squared_euclidean")
    assert as_published.apply(mine, "none") == mine
    assert as_published.apply(TrainConfig(learner="ewc_init"), "feb2020").learner_options == {}
    for preset in ("feb2020", "apr2020"):  # the authors' per-step BN rows: 39025a3 and 5b814ac
        assert as_published.apply(TrainConfig(learner="pretrain_tune"), preset).learner_options == {
            "restart_each_support_set": True, "per_step_bn_rows": True}
    with pytest.raises(ValueError, match="as_published='mar2020'; valid"):
        as_published.apply(mine, "mar2020")


def test_a_config_names_the_preset_whose_settings_it_carries():
    for learner in ("protonets", "maml_low", "ewc_init", "pretrain_tune"):
        base = TrainConfig(learner=learner, task="B3")
        assert as_published.preset_of(base) == "none"
        for name in ("feb2020", "apr2020"):  # they differ in their draws alone
            config = as_published.apply(base, name)
            assert as_published.preset_of(config) == name
            # read back from config.json, with every learner option resolved
            assert as_published.preset_of(runs.from_json(config.to_json())) == name
    feb = as_published.apply(TrainConfig(learner="protonets", task="B3", seed=3,
                                         learner_options={"filters": 32}), "feb2020")
    assert as_published.preset_of(feb) == "feb2020"  # another option beside it
    replaced = as_published.apply(TrainConfig(learner="protonets", task="B3", learner_options={
        "distance": "squared_euclidean"}), "feb2020")
    assert as_published.preset_of(replaced) == "none"  # one of its values replaced
    assert as_published.preset_of(TrainConfig(learner="maml_low", spec_overrides={
        "draws": "independent"})) == "none"  # part of a preset is not the preset


def test_feb2020_protonets_logits_are_dot_products_with_the_last_sample_prototype(
        omniglot_train):
    config = as_published.apply(
        TrainConfig(learner="protonets", task="B3", learner_options={"filters": 8}), "feb2020")
    spec = config.spec
    learner = get_learner("protonets", spec, **config.learner_options).evaluated
    params = init_params(learner, jax.random.key(0), jnp.zeros((1, 28, 28, 1)), spec)
    split = omniglot_train
    task = sample_task(jax.random.key(2), split.class_table, split.class_sizes, spec)
    support_x = data.gather_normalised(split, task.support_idx)
    target_x = data.gather_normalised(split, task.target_idx)
    logits = episode.run_task(learner, params, support_x, task.support_labels, target_x,
                              jax.random.key(0))
    # running averages, as at test; the authors' block: conv (no bias), LeakyReLU, batch norm
    embed = Conv4(filters=8, norm="eval", activation="leaky_relu", block_order="conv_act_norm",
                  use_bias=False)
    prototypes = np.zeros((spec.num_outputs, 8 * 1 * 1))
    for n in range(spec.nss):  # each label's last support sample
        features = np.asarray(embed.apply(params, support_x[n]))
        for row, label in enumerate(np.asarray(task.support_labels[n])):
            prototypes[label] = features[row]
    expected = np.asarray(embed.apply(params, target_x)) @ (prototypes / (spec.nss * spec.ks)).T
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-5)
    # and the target set is KT per class per support set, as the paper-era code
    assert logits.shape == (spec.nss * spec.nc * spec.kt, spec.num_outputs)
    assert dataclasses.replace(spec, draws="distinct").target_mode == "per_support_set"


def test_the_authors_protonets_block_is_conv_leaky_relu_batch_norm():
    """``block_order=conv_act_norm``: each block is BN(LeakyReLU(conv(x))), then the pool, so
    the embedding is signed (the authors' ConvReLUBatchNorm); the default is ReLU after BN."""
    x = jax.random.uniform(jax.random.key(0), (6, 28, 28, 1))
    authors = Conv4(filters=4, num_blocks=1, activation="leaky_relu", block_order="conv_act_norm")
    default = Conv4(filters=4, num_blocks=1)
    params = authors.init(jax.random.key(1), x)
    assert jax.tree.structure(params) == jax.tree.structure(default.init(jax.random.key(1), x))
    kernel = params["params"]["Conv_0"]["kernel"]
    conv = jax.lax.conv_general_dilated(x, kernel, (1, 1), "SAME",
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))
    act = jax.nn.leaky_relu(conv, 0.01)
    normed = (act - act.mean((0, 1, 2))) / jnp.sqrt(act.var((0, 1, 2)) + 1e-5)
    pooled = normed.reshape(6, 14, 2, 14, 2, 4).max((2, 4)).reshape(6, -1)
    np.testing.assert_allclose(authors.apply(params, x), pooled, rtol=1e-4, atol=1e-4)
    assert float(jnp.min(authors.apply(params, x))) < 0 <= float(jnp.min(default.apply(params, x)))


def test_protonets_conv_bias_option_removes_the_bias_and_the_presets_set_it_off():
    """``conv_bias=False``: the authors' ``ConvReLUBatchNorm(..., bias=False)``; under
    ``conv_act_norm`` a bias would act before the LeakyReLU, so the presets drop it."""
    spec = TrainConfig(learner="protonets", task="B3").spec

    def conv_leaves(**options):
        learner = get_learner("protonets", spec, filters=4, **options)
        params = jax.eval_shape(lambda key, x: learner.init_params(key, x, spec),
                                jax.random.key(0), jnp.zeros((1, 28, 28, 1)))
        return {name: set(leaves) for name, leaves in params["params"].items()
                if name.startswith("Conv_")}

    assert conv_leaves() == {f"Conv_{i}": {"kernel", "bias"} for i in range(4)}  # default
    assert conv_leaves(conv_bias=False) == {f"Conv_{i}": {"kernel"} for i in range(4)}
    for preset in ("feb2020", "apr2020"):
        config = as_published.apply(TrainConfig(learner="protonets", task="B3"), preset)
        assert config.learner_options["conv_bias"] is False
        assert conv_leaves(**config.learner_options) == {
            f"Conv_{i}": {"kernel"} for i in range(4)}
        kept = as_published.apply(TrainConfig(learner="protonets", task="B3", learner_options={
            "conv_bias": True}), preset)  # given explicitly, it wins (and is not the preset)
        assert kept.learner_options["conv_bias"] is True
        assert as_published.preset_of(kept) == "none"
