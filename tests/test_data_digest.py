"""The test data pinned in results.json (``test_data_sha256``): the task fingerprint covers the
split's counts and the tasks' indices, not its class names or images, so another dataset (or
class order) with the same counts has the same fingerprint; launch.verify must not say MATCH
on it. Records written before the digest (docs/reference) verify as before.
"""

import dataclasses

import os

import numpy as np
import jax.numpy as jnp
import pytest

from cfsl_jax.experiments import verify
from cfsl_jax.runtime.errors import UserError
from cfsl_jax.training import results, runs, train
from cfsl_jax.training.evaluate import data_digest, evaluate, task_fingerprint
from test_integrity import CONFIG, copied, finished  # noqa: F401 (finished: a fixture)


def reordered(split):
    """``split`` with its classes in reverse order (names and images), the same counts and
    class table: the same task indices, other data."""
    images, table = np.asarray(split.images), np.asarray(split.class_table)
    moved = images.copy()
    for c in range(len(table)):
        moved[table[c]] = images[table[len(table) - 1 - c]]
    info = dataclasses.replace(split.info, class_names=split.info.class_names[::-1])
    return split.replace(images=jnp.asarray(moved), info=info)


def test_another_class_order_has_the_fingerprint_but_not_the_digest_and_verify_says_so(
        tmp_path, monkeypatch):
    learner, splits = runs.build(CONFIG)
    other = reordered(splits["test"])
    spec = learner.spec
    assert task_fingerprint(other, spec, 7, 0) == task_fingerprint(splits["test"], spec, 7, 0)
    assert data_digest(other) != data_digest(splits["test"])
    renamed = splits["test"].replace(info=dataclasses.replace(
        splits["test"].info, class_names=tuple(f"x{n}" for n in splits["test"].info.class_names)))
    assert data_digest(renamed) != data_digest(splits["test"])
    # a run's record (its untrained params: verify --nometrics compares no test numbers)
    workdir = str(tmp_path / "w")
    runs.check_workdir_config(workdir, CONFIG)
    params = runs.init_params(learner, splits["train"], CONFIG.seed)
    report = evaluate(learner, params, splits["test"], num_tasks=CONFIG.test_tasks,
                      seed=CONFIG.task_seed, batch_size=CONFIG.eval_batch, cost_metrics=False)
    recorded = results.record(CONFIG, learner, splits, report, workdir, wall_seconds=1.0,
                              best_epochs=[])
    assert recorded["test_data_sha256"] == data_digest(splits["test"])
    assert verify.verify(workdir, metrics=False, costs=False) == []
    real = runs.load_splits
    monkeypatch.setattr(runs, "load_splits", lambda config: {
        **real(config), "test": reordered(real(config)["test"])})
    differences = verify.verify(workdir, metrics=False, costs=False)
    assert len(differences) == 1 and differences[0].startswith("test data: recorded SHA-256 "), \
        differences
    # a record from before the digest: checked as before (fingerprint and counts)
    monkeypatch.setattr(runs, "load_splits", real)
    stored = results.read_json(f"{workdir}/results.json")
    del stored["test_data_sha256"]
    results.write_json(f"{workdir}/results.json", stored)
    assert verify.verify(workdir, metrics=False, costs=False) == []


def test_a_retest_on_changed_test_data_is_refused_and_keeps_the_record(
        tmp_path, monkeypatch, finished):  # noqa: F811
    """launch.evaluate --retest of a finished run whose test data changed since (same counts,
    so the same task fingerprint) must not test it on the new data and overwrite results.json
    (numbers and test_data_sha256) as if nothing changed."""
    workdir = copied(finished, tmp_path)
    path = os.path.join(workdir, "results.json")
    before = results.read_json(path)
    real = runs.load_splits
    monkeypatch.setattr(runs, "load_splits", lambda config: {
        **real(config), "test": reordered(real(config)["test"])})
    with pytest.raises(UserError, match="tested on other test data"):
        train.train_and_evaluate(CONFIG, workdir, retest=True)
    assert results.read_json(path) == before


def test_a_resume_on_changed_data_is_refused(tmp_path, monkeypatch):
    """A run stopped part way and resumed on other data (a re-prepared dataset, another
    --data_dir: same counts, so the same task fingerprint) must be refused, not trained on to
    the end on a mix of the two and recorded as the new data's run."""
    workdir = str(tmp_path / "w")
    with pytest.raises(BaseException, match="stopped after step 4"):
        train.train_and_evaluate(CONFIG, workdir, stop_after_steps=4)
    real = runs.load_splits
    monkeypatch.setattr(runs, "load_splits", lambda config: {
        **real(config), "train": reordered(real(config)["train"])})
    with pytest.raises(UserError, match="trained on other data.*the train split"):
        train.train_and_evaluate(CONFIG, workdir)
    assert not os.path.exists(os.path.join(workdir, "results.json"))
    monkeypatch.setattr(runs, "load_splits", real)  # the data it was trained on: resumes
    assert train.train_and_evaluate(CONFIG, workdir)["test_data_sha256"] == data_digest(
        real(CONFIG)["test"])
