"""Train (or pretrain) a learner on CFSL tasks, then test it: results.json, results.csv, a table.

    python -m launch.train --learner=protonets --dataset=synthetic --task=B3 --workdir=/tmp/pn
    python -m launch.train --learner=maml_low --dataset=omniglot \
        --manual_dir=../shared/data/omniglot --task=C3 --epochs=20 --workdir=/tmp/maml

Re-running with the same --workdir resumes an interrupted run where it stopped.
Spec flags (--nss, --cci, ...) override the fields of --task.
"""

from __future__ import annotations

from absl import app, flags

from cfsl_jax import train
from cfsl_jax.data import DATASETS
from cfsl_jax import parallel
from cfsl_jax.learners import COMPUTE_DTYPES, LEARNERS
from cfsl_jax.spec import TARGET_MODES

from .options import define_data_flags, parse_options, quiet_third_party_logs

_DEFAULTS = train.TrainConfig()

flags.DEFINE_enum("learner", _DEFAULTS.learner, LEARNERS, "Learner to train.")
flags.DEFINE_enum("dataset", _DEFAULTS.dataset, DATASETS, "Dataset.")
flags.DEFINE_string("task", _DEFAULTS.task, "Paper cell (B3, D8, ...), type (A-D) or type+NSS.")
flags.DEFINE_string("workdir", None, "Run directory (checkpoints, results).", required=True)
flags.DEFINE_integer("nss", None, "Override: support sets per task.")
flags.DEFINE_integer("nc", None, "Override: classes per support set.")
flags.DEFINE_integer("ks", None, "Override: shots per class in a support set.")
flags.DEFINE_integer("kt", None, "Override: target samples per class.")
flags.DEFINE_integer("cci", None, "Override: class change interval.")
flags.DEFINE_bool("overwrite", None, "Override: labels restart at 0 in every class group.")
flags.DEFINE_enum("target_mode", None, TARGET_MODES, "Override: target sampling mode.")
flags.DEFINE_integer("seed", _DEFAULTS.seed, "Seed of every random choice.")
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
flags.DEFINE_integer("eval_tasks", _DEFAULTS.test_tasks, "Test tasks.")
flags.DEFINE_integer("eval_batch", _DEFAULTS.eval_batch,
                     "Tasks per device per evaluation program.")
flags.DEFINE_integer("keep_best", _DEFAULTS.keep_best, "Best epochs kept and ensembled.")
flags.DEFINE_integer("checkpoint_every", _DEFAULTS.checkpoint_every,
                     "Steps between resume checkpoints within an epoch (0: epoch ends only).")
flags.DEFINE_integer("pretrain_steps", _DEFAULTS.pretrain_steps, "Pretraining steps.")
flags.DEFINE_integer("log_every", _DEFAULTS.log_every, "Meta-steps between progress lines.")
flags.DEFINE_multi_string("learner_option", [], "Learner option NAME=VALUE (repeatable), "
                          "e.g. --learner_option=inner_steps=3.")
define_data_flags()

FLAGS = flags.FLAGS
_SPEC_FLAGS = ("nss", "nc", "ks", "kt", "cci", "overwrite", "target_mode")


def config_from_flags() -> train.TrainConfig:
    return train.TrainConfig(
        learner=FLAGS.learner, dataset=FLAGS.dataset, task=FLAGS.task,
        learner_options=parse_options(FLAGS.learner_option, "learner_option"),
        dataset_options=parse_options(FLAGS.dataset_option, "dataset_option"),
        spec_overrides={k: FLAGS[k].value for k in _SPEC_FLAGS if FLAGS[k].value is not None},
        seed=FLAGS.seed, compute_dtype=FLAGS.compute_dtype, epochs=FLAGS.epochs, iters_per_epoch=FLAGS.iters_per_epoch,
        meta_batch=FLAGS.meta_batch, learning_rate=FLAGS.learning_rate,
        val_tasks=FLAGS.val_tasks, test_tasks=FLAGS.eval_tasks, eval_batch=FLAGS.eval_batch,
        keep_best=FLAGS.keep_best, checkpoint_every=FLAGS.checkpoint_every,
        pretrain_steps=FLAGS.pretrain_steps, log_every=FLAGS.log_every, data_dir=FLAGS.data_dir,
        manual_dir=FLAGS.manual_dir)


def mesh_from_flags():
    """The device mesh of --num_devices (after --multihost's distributed initialisation)."""
    parallel.initialize(FLAGS.multihost)
    return parallel.make_mesh(FLAGS.num_devices)


def main(argv) -> None:
    quiet_third_party_logs()
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    try:
        config = config_from_flags()
        config.check()
        mesh = mesh_from_flags()
    except ValueError as error:
        raise app.UsageError(str(error)) from error
    train.train_and_evaluate(config, FLAGS.workdir, mesh=mesh)


def run() -> None:
    app.run(main)


if __name__ == "__main__":
    run()
