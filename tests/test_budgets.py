"""--budget: the paper's schedule in one word (cfsl_jax/training/budgets.py)."""

from __future__ import annotations

import dataclasses

import pytest

from cfsl_jax.training import budgets
from cfsl_jax.runtime.errors import UserError
from cfsl_jax.training.train import TrainConfig


def test_paper_budget_is_the_papers_schedule():
    config = budgets.apply(TrainConfig(learner="maml_low", task="C3", seed=2), "paper")
    assert (config.epochs, config.iters_per_epoch, config.meta_batch) == (250, 500, 1)
    assert (config.val_tasks, config.test_tasks, config.keep_best) == (600, 600, 5)
    assert config.pretrain_data == "tasks"
    assert (config.learner, config.task, config.seed) == ("maml_low", "C3", 2)  # untouched
    assert config.epochs * config.iters_per_epoch * config.meta_batch == 125_000
    assert budgets.name_of(config) == "paper"
    config.check()


def test_explicit_choices_win_over_the_budget():
    config = dataclasses.replace(TrainConfig(), epochs=7, pretrain_data="uniform")
    kept = budgets.apply(config, "paper", keep=("epochs", "pretrain_data"))
    assert (kept.epochs, kept.pretrain_data, kept.iters_per_epoch) == (7, "uniform", 500)
    assert budgets.name_of(kept) is None


def test_default_budget_is_trainconfigs_defaults_and_quick_the_readme_command():
    custom = dataclasses.replace(TrainConfig(), epochs=99, meta_batch=3)
    assert budgets.apply(custom, "default") == TrainConfig()
    assert budgets.name_of(TrainConfig()) == "default"
    quick = budgets.apply(TrainConfig(), "quick")
    assert (quick.epochs, quick.iters_per_epoch, quick.meta_batch, quick.val_tasks) == (3, 20, 4,
                                                                                       100)


def test_unknown_budget_is_refused_with_the_valid_names():
    with pytest.raises(UserError, match=r"--budget=fast: unknown budget; valid: default, "
                                        r"quick, paper"):
        budgets.apply(TrainConfig(), "fast")


def test_launch_flag_sets_the_budget_and_explicit_flags_win():
    """launch.train --budget=paper --epochs=3 (also what launch.sweep uses per run)."""
    import json
    import os
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = ("import json; from absl import flags; import launch.train as t; "
            "flags.FLAGS(['train', '--workdir=unused', '--budget=paper', '--epochs=3', "
            "'--learner=pretrain_tune']); print(json.dumps(t.config_from_flags().to_json()))")
    out = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True,
                         env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr
    config = json.loads(out.stdout.strip().splitlines()[-1])
    assert (config["epochs"], config["iters_per_epoch"], config["meta_batch"]) == (3, 500, 1)
    assert (config["val_tasks"], config["test_tasks"], config["pretrain_data"]) == (600, 600,
                                                                                   "tasks")
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    for preset in budgets.BUDGETS.values():
        assert set(preset) <= fields
