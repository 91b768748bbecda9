"""Train (or pretrain) a learner on CFSL tasks, then test it: results.json, results.csv, a table.

    python -m launch.train --learner=protonets --dataset=synthetic --task=B3 --workdir=/tmp/pn
    python -m launch.train --learner=maml_low --dataset=omniglot \\
        --manual_dir=../shared/data/omniglot --task=C3 --epochs=20 --workdir=/tmp/maml

Re-running with the same --workdir resumes an interrupted run where it stopped
(Ctrl-C, SIGTERM, SIGUSR1 or SIGUSR2 checkpoints the step reached first and exits
with 128 + the signal's number), and prints the stored results of a
finished one (--retest tests it again). Spec flags (--nss, --cci, ...) override
the fields of --task. Every split the run samples tasks from is checked against
the spec, and the first step's memory against the device's, before training.
"""

from __future__ import annotations

import dataclasses

from absl import flags

from cfsl_jax.runtime import files, parallel
from cfsl_jax.training import as_published, budgets, packing, runs, train
from cfsl_jax.data import DATASETS
from cfsl_jax.learners import COMPUTE_DTYPES, LEARNERS, options_class
from cfsl_jax.training.config import PRETRAIN_DATA, TrainConfig
from cfsl_jax.protocol.spec import DRAWS, LABEL_OFFSETS, TARGET_MODES

from . import cli
from .flag_types import define_list
from .checks import absolute, check_data_flags, check_output_dir
from .options import (define_backend_flags, define_data_flags, define_deprecated_flag,
                      flag_names, learner_options_from_flag, list_options, parse_options)

_DEFAULTS = TrainConfig()

flags.DEFINE_enum("learner", _DEFAULTS.learner, LEARNERS, "Learner to train.")
flags.DEFINE_enum("dataset", _DEFAULTS.dataset, DATASETS, "Dataset.")
flags.DEFINE_string("task", _DEFAULTS.task, "Paper cell (B3, D8, ...), type (A-D) or type+NSS "
                    "(B7); any case.")
flags.DEFINE_string("workdir", None, "Run directory (checkpoints, results; a local path or "
                    "gs://BUCKET/PATH); required.")
flags.DEFINE_integer("nss", None, "Override: support sets per task.")
flags.DEFINE_integer("nc", None, "Override: classes per support set.")
flags.DEFINE_integer("ks", None, "Override: shots per class in a support set.")
flags.DEFINE_integer("kt", None, "Override: target samples per class.")
flags.DEFINE_integer("cci", None, "Override: class change interval.")
flags.DEFINE_bool("overwrite", None, "Override: labels restart at 0 in every class group.")
flags.DEFINE_enum("target_mode", None, TARGET_MODES, "Override: target sampling mode.")
flags.DEFINE_enum("label_offset", None, LABEL_OFFSETS, "Override: labels without overwrite "
                  "offset per class group (the spec) or per support set (the authors' paper-era "
                  "code; needs --target_mode=per_support_set where CCI > 1). docs/fidelity.md.")
flags.DEFINE_enum("draws", None, DRAWS, "Override: samples distinct in a task (the spec), "
                  "per_group (one draw reused by a group's support sets: the Apr-2020 code) or "
                  "independent (every support set draws its own, groups their own classes: the "
                  "Feb-2020 code; needs --target_mode=per_support_set). docs/fidelity.md.")
flags.DEFINE_enum("as_published", "none", as_published.NAMES, "Preset of one paper-era "
                  "version of the authors' code: feb2020 (commit 39025a3: Table 1's A/B/C cells) "
                  "or apr2020 (5b814ac: its D cells); a bundle of --draws, --target_mode, "
                  "--label_offset and learner options (docs/fidelity.md). Explicit flags and "
                  "options win over it.")
flags.DEFINE_enum("budget", "default", tuple(budgets.BUDGETS), "Schedule preset: default "
                  "(10 x 100 x 8), quick (3 x 20 x 4, 100 val tasks), paper (250 epochs x 500 "
                  "steps x 1 task, 600 val/test tasks, top-5 ensemble, task pretraining). "
                  "Explicit --epochs, --iters_per_epoch, ... win over it.")
flags.DEFINE_enum("pretrain_data", _DEFAULTS.pretrain_data, PRETRAIN_DATA, "Pretrain+Tune / "
                  "EWC-Pretrain pretraining: tasks (images of sampled training tasks, the run's "
                  "epochs, validation and ensemble; the authors') or uniform (--pretrain_steps "
                  "batches of uniformly drawn images).")
flags.DEFINE_integer("seed", _DEFAULTS.seed, "Seed of every random choice of training "
                     "(initialisation, training tasks).")
define_list("seeds", [], "Seeds. launch.train: train them as one pack (README, \"Packing "
            "runs\"), run S into WORKDIR/seedS, not with --seed; launch.sweep: the grid's "
            "seeds (default 0,1,2).")
flags.DEFINE_integer("steps_per_dispatch", 1, "Meta-steps per host call in a pack (it divides "
                     "--iters_per_epoch, --log_every and --checkpoint_every).", lower_bound=1)
flags.DEFINE_string("eval_seed", str(_DEFAULTS.eval_seed), "Seed of the validation and test "
                    "tasks: the same tasks for every --seed and learner, as the authors' code "
                    "(a non-negative integer), or 'seed': the run's --seed (each training seed "
                    "its own tasks; the previous behaviour).")
flags.DEFINE_enum("compute_dtype", _DEFAULTS.compute_dtype, tuple(COMPUTE_DTYPES),
                  "Compute and carried-state dtype (params and optimiser state stay float32).")
flags.DEFINE_integer("num_devices", 0, "Devices to shard the task batch over (0: all).")
flags.DEFINE_bool("multihost", False, "Call jax.distributed.initialize() first (TPU pod "
                  "slices, multi-node GPU: run the same command on every host).")
flags.DEFINE_integer("epochs", _DEFAULTS.epochs, "Meta-training epochs.")
flags.DEFINE_integer("iters_per_epoch", _DEFAULTS.iters_per_epoch, "Meta-steps per epoch.")
flags.DEFINE_integer("meta_batch", _DEFAULTS.meta_batch, "Tasks per meta-step.")
flags.DEFINE_float("learning_rate", _DEFAULTS.learning_rate, "Outer (Adam) learning rate.")
flags.DEFINE_integer("val_tasks", _DEFAULTS.val_tasks, "Validation tasks after each epoch.")
flags.DEFINE_integer("test_tasks", _DEFAULTS.test_tasks, "Test tasks.")
define_deprecated_flag("eval_tasks")
flags.DEFINE_integer("eval_batch", _DEFAULTS.eval_batch,
                     "Tasks per device per evaluation program.")
flags.DEFINE_integer("keep_best", _DEFAULTS.keep_best, "Best epochs kept and ensembled.")
flags.DEFINE_integer("checkpoint_every", _DEFAULTS.checkpoint_every,
                     "Steps between resume checkpoints within an epoch (0: epoch ends only).")
flags.DEFINE_integer("pretrain_steps", _DEFAULTS.pretrain_steps, "Pretraining steps.")
flags.DEFINE_integer("log_every", _DEFAULTS.log_every, "Meta-steps between progress lines "
                     "(a line is printed at least every 10 s anyway).")
flags.DEFINE_bool("tensorboard", _DEFAULTS.tensorboard, "Also write the run's metrics (its "
                  "metrics.jsonl) as TensorBoard event files to WORKDIR/tensorboard (needs the "
                  "[tracking] extra: tensorboardX).")
flags.DEFINE_string("wandb_project", _DEFAULTS.wandb_project, "Also log the run's metrics to "
                    "this Weights & Biases project (needs wandb installed).")
flags.DEFINE_bool("retest", False, "Test a finished run again (otherwise its stored results "
                  "are printed); the recorded wall time stays the training run's.")
flags.DEFINE_multi_string("learner_option", [], "Learner option NAME=VALUE (repeatable), "
                          "e.g. --learner_option=inner_steps=3; --list_options lists them.")
flags.DEFINE_bool("list_options", False, "Print the options of --learner (type, default, help) "
                  "and exit.")
define_data_flags()
define_backend_flags()

FLAGS = flags.FLAGS
_SPEC_FLAGS = ("nss", "nc", "ks", "kt", "cci", "overwrite", "target_mode", "label_offset",
               "draws")
# Flags a --budget sets -> their TrainConfig fields (an explicit flag wins over the budget).
_BUDGET_FLAGS = {"epochs": "epochs", "iters_per_epoch": "iters_per_epoch",
                 "meta_batch": "meta_batch", "val_tasks": "val_tasks", "test_tasks": "test_tasks",
                 "keep_best": "keep_best", "pretrain_data": "pretrain_data"}


def config_from_flags() -> TrainConfig:
    """The TrainConfig of the flags, checked; a mistake is a UserError in flag words."""
    try:
        config = _config_from_flags()
        config.check()
    except ValueError as error:
        raise cli.UserError(flag_names(str(error))) from None
    return config


def _config_from_flags(learner_options: dict | None = None,
                       per_learner: bool = True) -> TrainConfig:
    """The flags' config under --budget and --as_published; ``learner_options`` in place of
    --learner_option's (``per_learner=False``: without the preset's learner options, which a
    sweep adds per learner)."""
    explicit = [field for flag, field in _BUDGET_FLAGS.items() if FLAGS[flag].present]
    if learner_options is None:
        learner_options = learner_options_from_flag(FLAGS.learner, FLAGS.learner_option)
    config = budgets.apply(_plain_config_from_flags(learner_options), FLAGS.budget, keep=explicit)
    return as_published.apply(config, FLAGS.as_published, per_learner=per_learner)


def _plain_config_from_flags(learner_options: dict) -> TrainConfig:
    return TrainConfig(
        learner=FLAGS.learner, dataset=FLAGS.dataset, task=FLAGS.task.strip().upper(),
        learner_options=learner_options,
        dataset_options=parse_options(FLAGS.dataset_option, "dataset_option"),
        spec_overrides={k: FLAGS[k].value for k in _SPEC_FLAGS if FLAGS[k].value is not None},
        seed=FLAGS.seed, eval_seed=parse_eval_seed(FLAGS.eval_seed),
        compute_dtype=FLAGS.compute_dtype, epochs=FLAGS.epochs,
        iters_per_epoch=FLAGS.iters_per_epoch,
        meta_batch=FLAGS.meta_batch, learning_rate=FLAGS.learning_rate,
        val_tasks=FLAGS.val_tasks, test_tasks=FLAGS.test_tasks, eval_batch=FLAGS.eval_batch,
        keep_best=FLAGS.keep_best, checkpoint_every=FLAGS.checkpoint_every,
        pretrain_steps=FLAGS.pretrain_steps, pretrain_data=FLAGS.pretrain_data,
        log_every=FLAGS.log_every, data_dir=absolute(FLAGS.data_dir),
        manual_dir=absolute(FLAGS.manual_dir), download=FLAGS.download,
        tensorboard=FLAGS.tensorboard, wandb_project=FLAGS.wandb_project)


def listed_options() -> bool:
    """With --list_options: print the options of --learner and return True."""
    if FLAGS.list_options:
        print(list_options(f"options of --learner={FLAGS.learner} (--learner_option=NAME=VALUE)",
                           options_class(FLAGS.learner)))
    return FLAGS.list_options


def require_workdir() -> None:
    if not FLAGS.workdir:
        raise cli.UserError("--workdir is required")


def parse_eval_seed(text: str) -> int | None:
    """--eval_seed: a non-negative integer, or 'seed' (None: the run's --seed)."""
    text = text.strip()
    if text == "seed":
        return None
    if not text.isdigit():
        raise cli.UserError(f"--eval_seed={text}: give a non-negative integer or 'seed'")
    return int(text)


def mesh_from_flags():
    """The device mesh of --num_devices (after --multihost's distributed initialisation)."""
    parallel.initialize(FLAGS.multihost)
    with cli.user_input():
        return parallel.make_mesh(FLAGS.num_devices)


def check() -> TrainConfig:
    """The run's config, its paths and its workdir checked (nothing is created)."""
    require_workdir()
    check_data_flags()
    check_output_dir("workdir", FLAGS.workdir)
    config = config_from_flags()
    if FLAGS.seeds:
        packing.check_steps_per_dispatch(config, FLAGS.steps_per_dispatch)
    for seed, workdir in pack_runs():
        runs.check_workdir_config(workdir, dataclasses.replace(config, seed=seed), create=False)
    return config


def pack_runs() -> list[tuple[int, str]]:
    """(seed, workdir) of each run: --seed in --workdir, or each of --seeds in WORKDIR/seedS."""
    if not FLAGS.seeds:
        return [(FLAGS.seed, FLAGS.workdir)]
    given = ",".join(FLAGS.seeds)
    if FLAGS["seed"].present:
        raise cli.UserError(f"--seeds={given} and --seed={FLAGS.seed}: give one of them")
    try:
        seeds = packing.check_seeds([int(seed) for seed in FLAGS.seeds])
    except cli.UserError:
        raise
    except ValueError:
        raise cli.UserError(f"--seeds={given}: seeds are integers, e.g. --seeds=0,1,2") from None
    return [(seed, files.join(FLAGS.workdir, f"seed{seed}")) for seed in seeds]


def main(argv) -> None:
    del argv  # cli.run refuses extra arguments
    if listed_options():
        return
    config = check()
    mesh = mesh_from_flags()
    with cli.flags_recorded(FLAGS.workdir):
        if FLAGS.seeds:
            seeds, workdirs = zip(*pack_runs())
            packing.train_pack(config, seeds, workdirs, FLAGS.steps_per_dispatch)
            return
        train.train_and_evaluate(config, FLAGS.workdir, mesh=mesh, retest=FLAGS.retest)


def run() -> None:
    cli.run(main, check=check)


if __name__ == "__main__":
    run()
