"""Pretraining on the images of sampled training tasks (pretrain_data="tasks", the authors' way):
labels, schedule, validation-based selection, resume."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cfsl_jax import data
from cfsl_jax.protocol import sampler
from cfsl_jax.training import checkpoints, pretrain
from cfsl_jax.learners import get_learner
from cfsl_jax.protocol.spec import TaskSpec
from cfsl_jax.training.config import TrainConfig
from cfsl_jax.training.loop import Interrupted
from cfsl_jax.runtime import parallel

from conftest import FAKE_DEVICES, cpu_mesh, init_params, traces_counted

SPEC = TaskSpec(nss=2, nc=2, ks=1, kt=1, cci=1, overwrite=False, target_mode="per_class")
IMAGE = (16, 16, 1)


@pytest.fixture(scope="module")
def splits():
    """40 synthetic classes of 16x16: 30 train, 5 val, 5 test."""
    return {name: data.load_split("synthetic", name, num_classes=40, samples_per_class=6,
                                  image_size=16) for name in data.SPLITS}


@pytest.fixture(scope="module")
def learner_and_params():
    learner = get_learner("pretrain_tune", SPEC, image_shape=IMAGE, filters=8, inner_steps=1)
    return learner, init_params(learner, jax.random.key(0), jnp.zeros((1, *IMAGE)), SPEC)


def test_task_images_are_the_tasks_images_labelled_with_their_class(splits):
    split = splits["train"]
    classes = pretrain.image_classes(split.class_table)
    assert classes.shape == (split.images.shape[0],)
    key = jax.random.key(5)
    idx, labels = jax.jit(pretrain.task_images, static_argnums=(3, 4))(key, split, classes,
                                                                         SPEC, 3)
    tasks = jax.vmap(sampler.sample_task, in_axes=(0, None, None, None))(
        jax.random.split(key, 3), split.class_table, split.class_sizes, SPEC)
    per_task = SPEC.nss * SPEC.support_size + SPEC.target_size  # 4 support + 4 target images
    assert idx.shape == labels.shape == (3 * per_task,)
    expected = np.concatenate([np.asarray(tasks.support_idx).reshape(3, -1),
                               np.asarray(tasks.target_idx)], axis=1).ravel()
    np.testing.assert_array_equal(idx, expected)
    table = np.asarray(split.class_table)
    for i, label in zip(np.asarray(idx), np.asarray(labels)):
        assert i in table[label]  # the label is the image's class-table row
    # Each task's images come from its own classes only.
    for t in range(3):
        assert set(np.asarray(labels[t * per_task:(t + 1) * per_task])) == set(
            np.asarray(tasks.classes[t]).ravel())


def test_task_pretraining_on_8_devices_matches_one_and_compiles_once(splits,
                                                                     learner_and_params):
    """The step's images laid along the mesh: the same steps as on one device (float summation
    order aside), the work split, one compile. (pretrain_on_tasks runs over every device by
    default, so the resume test below and test_stops' pretraining stops run on 8 devices.)"""
    spec = TaskSpec(nss=1, nc=3, ks=1, kt=1, cci=1, overwrite=False, target_mode="per_class")
    learner = get_learner("pretrain_tune", spec, image_shape=IMAGE, filters=8, inner_steps=1)
    params = learner_and_params[1]  # the backbone does not depend on the spec
    split = splits["train"]
    classes = pretrain.image_classes(split.class_table)
    num_classes = int(split.class_table.shape[0])
    probe = data.gather_normalised(split, jnp.arange(12))
    runs = []
    for n in (1, FAKE_DEVICES):
        mesh = cpu_mesh(n)
        state = parallel.replicate(pretrain.init_state(
            learner, params, num_classes, IMAGE, jax.random.key(1), 1e-3, 1e-5), mesh)
        placed, placed_classes = parallel.place_split(split, mesh), parallel.replicate(classes, mesh)
        # 3 tasks of 6 images: 18 images, an uneven split over 8 devices
        hyper = dict(learner=learner, num_classes=num_classes, tasks=3, learning_rate=1e-3,
                     weight_decay=1e-5, mesh=mesh)
        flops = pretrain.task_step.lower(state, placed, placed_classes, jax.random.key(10),
                                         **hyper).compile().cost_analysis()["flops"]
        losses = []
        for step in range(3):
            with traces_counted() as traced:
                state, loss, _ = pretrain.task_step(state, placed, placed_classes,
                                                    jax.random.key(10 + step), **hyper)
            assert traced == [0]  # the program compiled above, reused by every step
            losses.append(float(loss))
        runs.append((flops, losses, jax.device_get(state.params)))
    (flops_1, losses_1, params_1), (flops_8, losses_8, params_8) = runs
    embed = jax.jit(learner.recipe.embed_apply)
    features_1, features_8 = (np.asarray(embed(p["embed"], probe)) for p in (params_1, params_8))
    assert flops_8 < 0.75 * flops_1  # per device: the batch's convolutions are split
    assert losses_1[2] < losses_1[0] - 0.1  # the steps do learn
    np.testing.assert_allclose(losses_8, losses_1, rtol=1e-5)
    np.testing.assert_allclose(features_8, features_1, rtol=1e-4, atol=1e-5)
    # Every parameter agrees to float rounding except the convolutions' biases: the norm
    # layer after each cancels them (true gradient 0), and Adam turns their float-noise
    # gradients into +-learning-rate steps of either sign; the features above show they
    # change nothing.
    for path, a, b in zip(*zip(*jax.tree_util.tree_leaves_with_path(params_1)),
                          jax.tree.leaves(params_8)):
        name = jax.tree_util.keystr(path)
        if not ("Conv" in name and "bias" in name):
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7, err_msg=name)


def _config(**changes) -> TrainConfig:
    """The schedule fields of a run (its learner and data are built by the fixtures)."""
    fields = dict(learner="pretrain_tune", seed=0, learning_rate=1e-3, weight_decay=1e-5,
                  meta_batch=2, epochs=3, iters_per_epoch=2, log_every=2, val_tasks=4,
                  eval_batch=4, keep_best=2, checkpoint_every=0)
    return TrainConfig(**{**fields, **changes})


def test_pretrain_on_tasks_selects_epochs_and_resumes_exactly(splits, learner_and_params,
                                                               tmp_path):
    learner, params = learner_and_params
    config = _config()
    full = checkpoints.Checkpoints(str(tmp_path / "full"), config.keep_best)
    ensemble = pretrain.pretrain_on_tasks(config, learner, params, splits, str(tmp_path / "full"),
                                          full)
    history = json.loads((tmp_path / "full" / "val_history.json").read_text())
    assert [h["epoch"] for h in history] == [0, 1, 2]  # validated after every epoch
    best = full.best_epochs()
    assert len(best) == 2 and history[best[0]]["val_acc"] == max(h["val_acc"] for h in history)
    full.close()
    # The ensemble: keep_best members along a leading axis; the backbone trained, the
    # learner's own head untouched (the temporary head over 30 classes is thrown away).
    leaves = jax.tree.leaves(ensemble["head"])
    assert all(leaf.shape[0] == 2 for leaf in jax.tree.leaves(ensemble))
    for member, original in zip(leaves, jax.tree.leaves(params["head"])):
        np.testing.assert_array_equal(member[0], original)
    moved = [float(jnp.abs(m[0] - o).max()) for m, o in
             zip(jax.tree.leaves(ensemble["embed"]), jax.tree.leaves(params["embed"]))]
    assert max(moved) > 0

    # Killed after 3 steps (mid-epoch 1, last checkpoint at step 2), then resumed: same result.
    resumed_dir = str(tmp_path / "resumed")
    ckpt = checkpoints.Checkpoints(resumed_dir, config.keep_best)
    with pytest.raises(Interrupted):
        pretrain.pretrain_on_tasks(config, learner, params, splits, resumed_dir, ckpt,
                                   stop_after_steps=3)
    again = pretrain.pretrain_on_tasks(config, learner, params, splits, resumed_dir, ckpt)
    ckpt.close()
    for a, b in zip(jax.tree.leaves(ensemble), jax.tree.leaves(again)):
        np.testing.assert_array_equal(a, b)


def test_pretrain_on_tasks_refuses_a_spec_the_train_split_cannot_supply(splits,
                                                                         learner_and_params,
                                                                         tmp_path):
    wide = TaskSpec(nss=20, nc=2, ks=1, kt=1, cci=1, overwrite=False, target_mode="per_class")
    learner = get_learner("pretrain_tune", wide, image_shape=IMAGE, filters=8)
    ckpt = checkpoints.Checkpoints(str(tmp_path), 1)
    with pytest.raises(ValueError, match="needs .* 40 distinct classes, but the split has 30"):
        pretrain.pretrain_on_tasks(_config(), learner, learner_and_params[1], splits,
                                   str(tmp_path), ckpt)
    ckpt.close()


def test_train_and_evaluate_pretrains_on_tasks_and_tests_the_best_epochs(tmp_path):
    """TrainConfig(pretrain_data="tasks"), the default: a Pretrain+Tune run validates each
    epoch and tests the ensemble of its best epochs."""
    from cfsl_jax.training import train

    config = TrainConfig(
        learner="pretrain_tune", learner_options={"filters": 8, "inner_steps": 1},
        dataset="synthetic", dataset_options={"num_classes": 40, "samples_per_class": 6,
                                              "image_size": 16},
        task="B2", spec_overrides={"nc": 2, "kt": 1}, epochs=2, iters_per_epoch=2,
        meta_batch=2, val_tasks=4, test_tasks=4, eval_batch=4, keep_best=1, log_every=2)
    assert config.pretrain_data == "tasks"
    out = train.train_and_evaluate(config, str(tmp_path))
    history = json.loads((tmp_path / "val_history.json").read_text())
    assert [h["epoch"] for h in history] == [0, 1]
    assert len(out["best_epochs"]) == 1  # keep_best=1: the ensemble of the best epoch
    assert history[out["best_epochs"][0]]["val_acc"] == max(h["val_acc"] for h in history)
    # 4 tasks of 4 target samples (2 groups x 2 classes x KT=1): a whole number of 16ths
    acc = out["test"]["acc_mean"]
    assert out["test"]["num_tasks"] == 4 and abs(acc * 16 - round(acc * 16)) < 1e-6
