"""Batch norm on running averages (``bn_stats="running"``), and evaluation tasks from
``eval_seed``: per-sample test predictions on real images, PyTorch's running-average rule, the
training step folding in every forward pass, and old workdirs read with their old defaults."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from cfsl_jax import data
from cfsl_jax.protocol import episode
from cfsl_jax.training import runs, train
from cfsl_jax.training.evaluate import task_fingerprint
from cfsl_jax.learners import get_learner
from cfsl_jax.learners.protonets import ProtoNetsOptions
from cfsl_jax.models.norm import absorb
from cfsl_jax.protocol.sampler import sample_task
from cfsl_jax.protocol.spec import TaskSpec
from conftest import init_params

SPEC = TaskSpec(nss=2, nc=3, ks=2, kt=2, cci=1, overwrite=False)
TINY = train.TrainConfig(
    learner="protonets", learner_options={"filters": 8}, dataset="synthetic",
    dataset_options={"num_classes": 60, "samples_per_class": 8}, task="B2",
    spec_overrides={"nc": 3, "kt": 2}, epochs=1, iters_per_epoch=2, meta_batch=2,
    val_tasks=4, test_tasks=4, eval_batch=4, keep_best=1, log_every=2)


def real_task(split: data.Split, spec: TaskSpec, seed: int = 0):
    task = sample_task(jax.random.key(seed), split.class_table, split.class_sizes, spec)
    return (data.gather_normalised(split, task.support_idx), task.support_labels,
            data.gather_normalised(split, task.target_idx))


@pytest.mark.parametrize("bn_stats", ["running", "batch"])
def test_a_target_prediction_depends_on_the_other_targets_only_with_batch_statistics(
        omniglot_train, bn_stats):
    learner = get_learner("protonets", SPEC, filters=8, bn_stats=bn_stats).evaluated
    params = init_params(learner, jax.random.key(0), jnp.zeros((1, 28, 28, 1)), SPEC)
    support_x, support_y, target_x = real_task(omniglot_train, SPEC)
    key = jax.random.key(0)
    together = episode.run_task(learner, params, support_x, support_y, target_x, key)
    alone = episode.run_task(learner, params, support_x, support_y, target_x[:1], key)
    difference = float(jnp.abs(together[0] - alone[0]).max())
    if bn_stats == "running":
        assert difference < 1e-4 * float(jnp.abs(together[0]).max())
    else:  # normalised with the whole target set's statistics: transductive
        assert difference > 1e-2 * float(jnp.abs(together[0]).max())


def test_absorb_is_pytorchs_running_average_one_forward_pass_after_another():
    running = {"mean": jnp.array([0.0, 1.0]), "var": jnp.array([1.0, 2.0])}
    moments = {"mean": jnp.array([[1.0, 3.0], [2.0, -1.0], [0.5, 0.0]]),
               "var": jnp.array([[4.0, 1.0], [2.0, 2.0], [1.0, 3.0]])}
    expected = {k: np.array(v) for k, v in running.items()}
    for i in range(3):  # torch: running = (1 - momentum) * running + momentum * batch
        for k in expected:
            expected[k] = 0.9 * expected[k] + 0.1 * np.array(moments[k][i])
    out = absorb(running, moments)
    for k in expected:
        np.testing.assert_allclose(out[k], expected[k], rtol=1e-6)
    np.testing.assert_allclose(expected["mean"], [0.311, 0.882], atol=1e-6)


def test_moments_are_each_sets_mean_and_unbiased_variance(omniglot_train):
    learner = get_learner("protonets", SPEC, filters=8)
    params = init_params(learner, jax.random.key(1), jnp.zeros((1, 28, 28, 1)), SPEC)
    support_x, _, target_x = real_task(omniglot_train, SPEC, seed=1)
    moments = learner.recipe.running_bn.moments(params, support_x, target_x)["BatchStatNorm_0"]
    assert moments["mean"].shape == (SPEC.nss + 1, 8)
    kernel = params["params"]["Conv_0"]["kernel"]
    for i, x in enumerate([*support_x, target_x]):  # the first conv, then its batch moments
        conv = jax.lax.conv_general_dilated(x, kernel, (1, 1), "SAME",
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"))
        conv = np.asarray(conv + params["params"]["Conv_0"].get("bias", 0.0)).reshape(-1, 8)
        np.testing.assert_allclose(moments["mean"][i], conv.mean(0), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(moments["var"][i], conv.var(0, ddof=1), rtol=1e-3, atol=1e-6)


def test_a_training_step_folds_each_tasks_forward_passes_in_task_order():
    learner, splits = train.build(TINY)
    batch, _ = train.build(train.TrainConfig(**{**TINY.to_json(),
                                                "learner_options": {"filters": 8,
                                                                    "bn_stats": "batch"}}))
    params = train.init_params(learner, splits["train"], 0)
    # Plain SGD: Adam would turn the float-noise gradients of the conv biases before each
    # BatchStatNorm (true gradient 0) into full +-lr steps whose sign depends on rounding.
    optimizer = optax.sgd(0.1)
    key = jax.random.key(5)
    new, _, _ = train.make_train_step(learner, optimizer, 2)(
        params, optimizer.init(params), splits["train"], key, jnp.float32(0))
    split, moments = splits["train"], []
    for task_key in jax.random.split(key, 2):
        task = sample_task(task_key, split.class_table, split.class_sizes, learner.spec)
        moments.append(learner.recipe.running_bn.moments(
            params, data.gather_normalised(split, task.support_idx),
            data.gather_normalised(split, task.target_idx)))
    expected = absorb(params["batch_stats"],
                      jax.tree.map(lambda *m: jnp.concatenate(m), *moments))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                 new["batch_stats"], expected)
    assert float(jnp.abs(new["batch_stats"]["BatchStatNorm_0"]["mean"]).max()) > 1e-3
    # the meta-gradient is that of batch statistics: the weights move as with bn_stats=batch
    plain = {"params": params["params"]}
    moved, _, _ = train.make_train_step(batch, optimizer, 2)(
        plain, optimizer.init(plain), splits["train"], key, jnp.float32(0))
    # (two programs: their convolutions accumulate in a CPU-dependent order; 1.6e-6 seen)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5),
                 new["params"], moved["params"])


def test_evaluation_tasks_follow_eval_seed_not_the_training_seed():
    learner, splits = train.build(TINY)
    configs = [train.TrainConfig(**{**TINY.to_json(), "seed": seed}) for seed in (0, 3)]
    assert configs[0].task_seed == configs[1].task_seed == 0
    prints = {task_fingerprint(splits["test"], learner.spec, 8, c.task_seed) for c in configs}
    assert len(prints) == 1
    legacy = [train.TrainConfig(**{**c.to_json(), "eval_seed": None}) for c in configs]
    assert [c.task_seed for c in legacy] == [0, 3]
    assert len({task_fingerprint(splits["test"], learner.spec, 8, c.task_seed)
                for c in legacy}) == 2


def test_a_workdir_saved_before_eval_seed_keeps_its_tasks_and_batch_statistics(tmp_path):
    saved = {k: v for k, v in TINY.to_json().items() if k != "eval_seed"}
    saved.update(seed=3, learner_options=TINY.learner_options)  # only the options given
    (tmp_path / "config.json").write_text(json.dumps(saved))
    config = runs.load_config(str(tmp_path))
    assert config.task_seed == 3 and config.eval_seed is None
    assert config.learner_options == {**dataclasses.asdict(ProtoNetsOptions()), "filters": 8,
                                      "bn_stats": "batch", "conv": "gemm_grad",
                                      "tasks_on_cpu": "vmap"}
    assert runs.build(config)[0].recipe.running_bn is None
    today = train.TrainConfig(**{**TINY.to_json(), "seed": 3})
    assert runs.config_differences(saved, today) == ["eval_seed", "learner_options"]


def test_eval_seed_flag_takes_an_integer_or_seed_and_refuses_anything_else():
    from launch_inprocess import command_module

    from cfsl_jax.runtime.errors import UserError

    with command_module("train") as train_cli:  # its flags defined, and removed afterwards
        parse_eval_seed = train_cli.parse_eval_seed
        assert parse_eval_seed("0") == 0 and parse_eval_seed(" 17 ") == 17
        assert parse_eval_seed("seed") is None
        for bad in ("-1", "x", "1.5", ""):
            with pytest.raises(UserError, match=r"--eval_seed=.*: give a non-negative integer "
                                                r"or 'seed'"):
                parse_eval_seed(bad)
