"""Test a run from its workdir, or a learner that needs no training on a fresh init.

    python -m launch.evaluate --workdir=/tmp/pn                  # re-test a finished run
    python -m launch.evaluate --workdir=/tmp/it --learner=init_tune --task=B10

With a workdir that holds a run, it is tested again from its checkpoints (the
recorded wall time stays the training run's). With a new workdir, the train
flags (--learner, --dataset, --task, ...) say what to evaluate; only learners
with training="none" or "pretrain" qualify (a pretrain learner is pretrained
first). Writes results.json and results.csv into the workdir and prints the
table; progress lines show tasks done and the ETA.
"""

from __future__ import annotations

import os

from absl import flags

from cfsl_jax import train
from cfsl_jax.learners import get_learner

from . import cli
from . import train as train_cli  # noqa: F401  (defines the shared flags)

FLAGS = flags.FLAGS


def main(argv) -> None:
    del argv
    if train_cli.listed_options():
        return
    train_cli.require_workdir()
    workdir = FLAGS.workdir
    mesh = train_cli.mesh_from_flags()
    if os.path.exists(os.path.join(workdir, "config.json")):
        train.evaluate_run(workdir, num_tasks=None, mesh=mesh)
        return
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise cli.UserError(f"--workdir={workdir} is a file, not a folder")
    if not FLAGS["learner"].present and not os.path.exists(workdir):
        raise cli.UserError(f"--workdir={workdir} does not exist (give a finished run's folder, "
                            f"or --learner to evaluate a learner that needs no training)")
    if not FLAGS["learner"].present:
        raise cli.UserError(f"--workdir={workdir} holds no run (no config.json); to evaluate a "
                            f"learner that needs no training there, give --learner (and "
                            f"--task, --dataset)")
    config = train_cli.config_from_flags()
    with cli.user_input():
        learner = get_learner(config.learner, config.spec, **config.learner_options)
    if learner.training == "meta":
        raise cli.UserError(f"--learner={config.learner} is meta-trained: run launch.train "
                            f"first, or give the --workdir of a finished run")
    train.train_and_evaluate(config, workdir, mesh=mesh, retest=FLAGS.retest)


def run() -> None:
    cli.run(main)


if __name__ == "__main__":
    run()
