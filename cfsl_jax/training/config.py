"""A run's config: every field that defines a run, its default, and how an old config.json reads.

    from cfsl_jax.training.config import TrainConfig
    config = TrainConfig(learner="protonets", task="B3", epochs=3)

``TrainConfig`` holds each field's default (the named schedules that replace some of them are
``cfsl_jax.training.budgets``). ``from_json`` reads a saved ``config.json``: a field the file
lacks takes its ``LEGACY_DEFAULTS`` value where the default changed since such files were
written, else today's default; every reader of a workdir (resuming, comparing, reporting)
goes through it. ``to_json`` writes what a default would otherwise leave implicit: every
option of the learner's options class with its value, given or default (``resolved``), and the
dataset's preprocessing option (``cfsl_jax.datasets.preprocessing``), so a changed default
never changes what an existing workdir computes. A ``config.json`` saved before that holds
only the learner options given on its command line: an option it lacks reads back as the
value such runs used (``LEGACY_LEARNER_OPTIONS``: ProtoNets' ``conv`` was ``gemm_grad``), else
today's default; one without the preprocessing option reads back as LANCZOS Omniglot and
SlimageNet64 in [0, 1]. A dataset option given at its default (``class_split=ordered``) is
dropped (``dataset_options.normalised_options``, in ``TrainConfig`` itself): such a run, or a
config.json that recorded one, is the run without it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from cfsl_jax.dataset_options import DATASETS, check_synthetic, normalised_options
from cfsl_jax.datasets.preprocessing import with_preprocessing
from cfsl_jax.learners import COMPUTE_DTYPE_NAMES, LEARNERS, options_class
from cfsl_jax.runtime.errors import UserError
from cfsl_jax.runtime.options import check_limits, option
from cfsl_jax.protocol.spec import TaskSpec

PRETRAIN_DATA: tuple[str, ...] = ("tasks", "uniform")  # TrainConfig.pretrain_data


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a run (written to workdir/config.json).

    Each field carries its help, choices and limits (``runtime.options.option``): ``check``
    enforces them, and the commands make a flag of each field from them
    (``cfsl_jax.launch.config_flags``; ``flag`` names a flag spelled otherwise, None: none).
    """

    learner: str = option("protonets", "Learner to train.", choices=LEARNERS)
    learner_options: dict = option(
        help="Learner option NAME=VALUE (repeatable), e.g. --learner_option=inner_steps=3; "
        "--list_options lists them.", flag="learner_option", factory=dict)
    dataset: str = option("synthetic", "Dataset.", choices=DATASETS)
    dataset_options: dict = option(
        help="Dataset option NAME=VALUE (repeatable), e.g. --dataset_option=num_classes=200 for "
        "synthetic, resize=lanczos or class_split=authors for omniglot, normalisation=unit for "
        "slimagenet64.", flag="dataset_option", factory=dict)
    task: str = option("B3", "Paper cell (B3, D8, ...), type (A-D) or type+NSS (B7); any case.")
    # TaskSpec fields to replace (their flags: TaskSpec's fields, --nss, --nc, ...)
    spec_overrides: dict = option(help="TaskSpec fields to replace.", flag=None, factory=dict)
    seed: int = option(0, "Seed of every random choice of training (initialisation, training "
                       "tasks).", minimum=0)
    eval_seed: int | None = option(
        0, "Seed of the validation and test tasks: the same tasks for every --seed and learner, "
        "as the authors' code (a non-negative integer), or 'seed': the run's --seed (each "
        "training seed its own tasks).", minimum=0)
    compute_dtype: str = option("float32", "Compute and carried-state dtype (params and "
                                "optimiser state stay float32).", choices=COMPUTE_DTYPE_NAMES)
    epochs: int = option(10, "Meta-training epochs.", minimum=1)
    iters_per_epoch: int = option(100, "Meta-steps per epoch.", minimum=1)
    meta_batch: int = option(8, "Tasks per meta-step.", minimum=1)
    learning_rate: float = option(1e-3, "Outer (Adam) learning rate.", above=0)
    weight_decay: float = option(1e-5, "Weight decay of the outer (Adam) and pretraining "
                                 "optimisers: L2 added to the gradient, as PyTorch's.", minimum=0)
    val_tasks: int = option(600, "Validation tasks after each epoch.", minimum=1)
    test_tasks: int = option(600, "Test tasks.", minimum=1)
    eval_batch: int = option(50, "Tasks per device per evaluation program.", minimum=1)
    keep_best: int = option(5, "Best epochs kept and ensembled.", minimum=1)
    checkpoint_every: int = option(0, "Steps between resume checkpoints within an epoch (0: "
                                   "epoch ends only).", minimum=0)
    log_every: int = option(50, "Meta-steps between progress lines (a line is printed at least "
                            "every 10 s anyway).", minimum=1)
    pretrain_steps: int = option(2000, "Pretraining steps.", minimum=1)
    pretrain_batch: int = option(64, "Images per pretraining step (--pretrain_data=uniform).",
                                 minimum=1)
    pretrain_data: str = option(
        "tasks", "Pretrain+Tune / EWC-Pretrain pretraining: tasks (images of sampled training "
        "tasks, the run's epochs, validation and ensemble; the authors') or uniform "
        "(--pretrain_steps batches of uniformly drawn images).", choices=PRETRAIN_DATA)
    data_dir: str | None = option(None, "Where prepared TFDS datasets live (default: "
                                   "$CFSL_DATA_DIR, else ~/tensorflow_datasets).")
    manual_dir: str | None = option(None, "Folder with the official archives (Omniglot: "
                                    "images_background.zip and images_evaluation.zip, or the "
                                    "two *_small zips).")
    download: bool = option(False, "Download a dataset's archives when they are not in "
                            "--manual_dir (Omniglot only; otherwise a missing archive is an "
                            "error).")
    tensorboard: bool = option(
        False, "Also write the run's metrics (its metrics.jsonl) as TensorBoard event files to "
        "WORKDIR/tensorboard (needs the [tracking] extra: tensorboardX).")
    wandb_project: str | None = option(None, "Also log the run's metrics to this Weights & "
                                       "Biases project (needs wandb installed).")

    def __post_init__(self):
        # an option given at its default is the option unset (normalised_options): a run
        # of --dataset_option=class_split=ordered is one with the default run, and a saved
        # config.json holding such an option reads back (from_json) as one without it
        if isinstance(self.dataset_options, dict):
            object.__setattr__(self, "dataset_options",
                               normalised_options(self.dataset, self.dataset_options))

    @property
    def task_seed(self) -> int:
        """The seed of the validation and test tasks: ``eval_seed``, or ``seed`` if None."""
        return self.seed if self.eval_seed is None else self.eval_seed

    @property
    def spec(self) -> TaskSpec:
        base = TaskSpec.parse(self.task)
        return dataclasses.replace(base, **self.spec_overrides) if self.spec_overrides else base

    def check(self) -> None:
        """UserError for the first field outside its choices or limits, or a task that does not
        parse; fields named by ``naming.name`` (``TrainConfig.epochs``, or the command's flag)."""
        check_limits(self)
        if self.dataset == "synthetic" and isinstance(self.dataset_options, dict):
            check_synthetic(self.dataset_options)  # its sizes, before anything is generated
        self.spec  # noqa: B018  (validates the task)
        held = (self.learner_options or {}).get("critic_weight_epochs", 0)
        if self.learner == "sca" and held not in (0, self.epochs):  # SCA's loss weights
            raise UserError(f"--learner_option=critic_weight_epochs={held}: the authors' "
                            f"per-epoch schedule needs the run's --epochs ({self.epochs}), or 0 "
                            f"for the per-step one")

    def to_json(self) -> dict[str, Any]:
        """The fields, with every learner option and the dataset's preprocessing option
        written out (module doc)."""
        out = dataclasses.asdict(self)
        out["learner_options"] = resolved(self.learner, self.learner_options)
        out["dataset_options"] = with_preprocessing(self.dataset, self.dataset_options)
        return out


def resolved(learner: str, options: dict[str, Any]) -> dict[str, Any]:
    """Every option of ``learner``'s options class: ``options`` over the class's defaults (an
    unknown learner's ``options`` unchanged: ``check`` refuses it)."""
    if learner not in LEARNERS:
        return dict(options)
    return {**dataclasses.asdict(options_class(learner)()), **options}


# What ``from_json`` reads for a field a config.json was saved without, where the default has
# changed since (runs saved before pretrain_data existed pretrained on uniform images; before
# eval_seed existed, the evaluation tasks followed the training seed).
LEGACY_DEFAULTS: dict[str, Any] = {"pretrain_data": "uniform", "eval_seed": None}
# What ``from_json`` reads for a learner option a config.json was saved without (one saved before
# config.json recorded every option, or before the option existed), where the default has changed
# since: learner -> option -> (value, ``since``). ``since`` is a field that every config.json saved
# after the change holds (the file then lacks the option because it ran today's default), or None
# (every file that lacks the option ran ``value``). ProtoNets ran gemm_grad convolutions until its
# default became auto, and ran a CPU batch of tasks as one vmap until tasks_on_cpu was added
# (2026-11-28); protonets, maml_high and sca ran batch-statistics batch norm until eval_seed was
# added.
# Learner options that change how a run is computed, not what: the same numbers up to float
# rounding (the convolutions' kernels, how a device lays out a batch of tasks, what is
# rematerialised or unrolled). Runs that differ only in these are one experiment (the seeds of
# one cell in a report).
COMPUTATION_OPTIONS = ("conv", "tasks_on_cpu", "remat", "unroll", "unroll_inner")
LEGACY_LEARNER_OPTIONS: dict[str, dict[str, tuple[Any, str | None]]] = {
    "protonets": {"bn_stats": ("batch", "eval_seed"), "conv": ("gemm_grad", None),
                  "tasks_on_cpu": ("vmap", None)},
    "maml_high": {"bn_stats": ("batch", "eval_seed")},
    "sca": {"bn_stats": ("batch", "eval_seed")},
}


def legacy_learner_options(saved: dict[str, Any]) -> dict[str, Any]:
    """The learner options of a saved config.json: its own, with each one it lacks that ran
    another value than today's default (``LEGACY_LEARNER_OPTIONS``) at that value."""
    learner = saved.get("learner", TrainConfig.learner)
    options = saved.get("learner_options", {})
    changed = LEGACY_LEARNER_OPTIONS.get(learner, {})
    legacy = {name: value for name, (value, since) in changed.items()
              if name not in options and (since is None or since not in saved)}
    return {**legacy, **options}


def with_legacy_defaults(saved: dict[str, Any]) -> dict[str, Any]:
    """A saved config.json's fields, with what runs saved before a default changed used, and
    every learner option (``resolved``)."""
    out = {**LEGACY_DEFAULTS, **saved}
    out["dataset_options"] = with_preprocessing(saved.get("dataset", TrainConfig.dataset),
                                                saved.get("dataset_options", {}), legacy=True)
    out["learner_options"] = resolved(out.get("learner", TrainConfig.learner),
                                      legacy_learner_options(saved))
    return out


def from_json(saved: dict[str, Any]) -> TrainConfig:
    """The config of a saved ``config.json`` (unknown fields ignored; missing ones: module doc)."""
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    return TrainConfig(**{k: v for k, v in with_legacy_defaults(saved).items() if k in known})
