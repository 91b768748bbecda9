"""A run's config: every field that defines a run, its default, and how an old config.json reads.

    from cfsl_jax.training.config import TrainConfig
    config = TrainConfig(learner="protonets", task="B3", epochs=3)

``TrainConfig`` holds each field's default (the named schedules that replace some of them are
``cfsl_jax.training.budgets``). ``from_json`` reads a saved ``config.json``: a field the file
lacks takes its ``LEGACY_DEFAULTS`` value where the default changed since such files were
written, else today's default; every reader of a workdir (resuming, comparing, reporting)
goes through it. ``to_json`` writes the dataset's preprocessing option
(``cfsl_jax.datasets.preprocessing``) even when it was left at its default, so a
``config.json`` without it was saved before the option existed and reads back with the
value such runs used (LANCZOS Omniglot, SlimageNet64 in [0, 1]).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from cfsl_jax.datasets.preprocessing import with_preprocessing
from cfsl_jax.runtime.errors import UserError
from cfsl_jax.learners import COMPUTE_DTYPES
from cfsl_jax.protocol.spec import TaskSpec

PRETRAIN_DATA: tuple[str, ...] = ("tasks", "uniform")  # TrainConfig.pretrain_data


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a run (written to workdir/config.json)."""

    learner: str = "protonets"
    learner_options: dict = dataclasses.field(default_factory=dict)
    dataset: str = "synthetic"
    dataset_options: dict = dataclasses.field(default_factory=dict)
    task: str = "B3"  # a paper cell, a type or type+NSS (TaskSpec.parse)
    spec_overrides: dict = dataclasses.field(default_factory=dict)  # TaskSpec fields to replace
    seed: int = 0
    # the validation/test tasks' seed; None: ``seed`` (each training seed its own tasks)
    eval_seed: int | None = 0
    compute_dtype: str = "float32"  # learners.COMPUTE_DTYPES; params/optimiser stay float32
    epochs: int = 10
    iters_per_epoch: int = 100
    meta_batch: int = 8
    learning_rate: float = 1e-3
    weight_decay: float = 1e-5
    val_tasks: int = 600
    test_tasks: int = 600
    eval_batch: int = 50
    keep_best: int = 5
    checkpoint_every: int = 0  # steps between mid-epoch resume checkpoints (0: epoch ends)
    log_every: int = 50
    pretrain_steps: int = 2000
    pretrain_batch: int = 64
    pretrain_data: str = "tasks"  # PRETRAIN_DATA: "tasks" (the authors') or "uniform"
    data_dir: str | None = None
    manual_dir: str | None = None
    download: bool = False  # fetch a dataset's archives when they are not in manual_dir
    tensorboard: bool = False  # also write the metrics as TensorBoard event files (tracking)
    wandb_project: str | None = None  # also log the metrics to this Weights & Biases project

    @property
    def task_seed(self) -> int:
        """The seed of the validation and test tasks: ``eval_seed``, or ``seed`` if None."""
        return self.seed if self.eval_seed is None else self.eval_seed

    @property
    def spec(self) -> TaskSpec:
        base = TaskSpec.parse(self.task)
        return dataclasses.replace(base, **self.spec_overrides) if self.spec_overrides else base

    def check(self) -> None:
        for name in ("epochs", "iters_per_epoch", "meta_batch", "val_tasks", "test_tasks",
                     "eval_batch", "keep_best", "log_every", "pretrain_steps", "pretrain_batch"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise UserError(f"TrainConfig.{name} must be a positive integer, got {value!r}")
        if self.eval_seed is not None and (isinstance(self.eval_seed, bool)
                                           or not isinstance(self.eval_seed, int)
                                           or self.eval_seed < 0):
            raise UserError(f"TrainConfig.eval_seed must be a non-negative integer or None, "
                            f"got {self.eval_seed!r}")
        if self.checkpoint_every < 0:
            raise UserError(f"TrainConfig.checkpoint_every must be >= 0, "
                            f"got {self.checkpoint_every}")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise UserError(f"TrainConfig.compute_dtype={self.compute_dtype!r}; valid: "
                            f"{tuple(COMPUTE_DTYPES)}")
        if not self.learning_rate > 0:
            raise UserError(f"TrainConfig.learning_rate must be > 0, got {self.learning_rate}")
        if self.pretrain_data not in PRETRAIN_DATA:
            raise UserError(f"TrainConfig.pretrain_data={self.pretrain_data!r}; valid: "
                            f"{PRETRAIN_DATA}")
        self.spec  # noqa: B018  (validates the task)

    def to_json(self) -> dict[str, Any]:
        """The fields, with the dataset's preprocessing option written out (module doc)."""
        out = dataclasses.asdict(self)
        out["dataset_options"] = with_preprocessing(self.dataset, self.dataset_options)
        return out


# What ``from_json`` reads for a field a config.json was saved without, where the default has
# changed since (runs saved before pretrain_data existed pretrained on uniform images; before
# eval_seed existed, the evaluation tasks followed the training seed).
LEGACY_DEFAULTS: dict[str, Any] = {"pretrain_data": "uniform", "eval_seed": None}
# Learner options whose default changed when eval_seed was added: a config.json saved without
# eval_seed ran these learners with batch-statistics batch norm.
LEGACY_LEARNER_OPTIONS: dict[str, dict[str, Any]] = {
    name: {"bn_stats": "batch"} for name in ("protonets", "maml_high", "sca")}


def with_legacy_defaults(saved: dict[str, Any]) -> dict[str, Any]:
    """A saved config.json's fields, with what runs saved before a default changed used."""
    out = {**LEGACY_DEFAULTS, **saved}
    out["dataset_options"] = with_preprocessing(saved.get("dataset", TrainConfig.dataset),
                                                saved.get("dataset_options", {}), legacy=True)
    if "eval_seed" not in saved:
        legacy = LEGACY_LEARNER_OPTIONS.get(saved.get("learner", TrainConfig.learner), {})
        out["learner_options"] = {**legacy, **saved.get("learner_options", {})}
    return out


def from_json(saved: dict[str, Any]) -> TrainConfig:
    """The config of a saved ``config.json`` (unknown fields ignored; missing ones: module doc)."""
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    return TrainConfig(**{k: v for k, v in with_legacy_defaults(saved).items() if k in known})
