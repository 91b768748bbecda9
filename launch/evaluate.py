"""Test a run from its workdir, or a learner that needs no training on a fresh init.

    python -m launch.evaluate --workdir=/tmp/pn                  # a finished run
    python -m launch.evaluate --workdir=/tmp/it --learner=init_tune --task=B10

With a new workdir, the train flags (--learner, --dataset, --task, ...) say
what to evaluate; only learners with training="none" or "pretrain" qualify
(a pretrain learner is pretrained first). Writes results.json and
results.csv into the workdir and prints the table.
"""

from __future__ import annotations

import os

from absl import app, flags

from cfsl_jax import train
from cfsl_jax.learners import get_learner

from . import train as train_cli  # noqa: F401  (defines the shared flags)
from .options import quiet_third_party_logs

FLAGS = flags.FLAGS


def main(argv) -> None:
    quiet_third_party_logs()
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    workdir = FLAGS.workdir
    try:
        mesh = train_cli.mesh_from_flags()
    except ValueError as error:
        raise app.UsageError(str(error)) from error
    if os.path.exists(os.path.join(workdir, "config.json")):
        train.evaluate_run(workdir, num_tasks=None, mesh=mesh)
        return
    config = train_cli.config_from_flags()
    try:
        config.check()
        learner = get_learner(config.learner, config.spec, **config.learner_options)
    except ValueError as error:
        raise app.UsageError(str(error)) from error
    if learner.training == "meta":
        raise app.UsageError(f"learner {config.learner!r} is meta-trained: run "
                             f"`python -m launch.train` first, or give a finished --workdir")
    train.train_and_evaluate(config, workdir, mesh=mesh)


def run() -> None:
    app.run(main)


if __name__ == "__main__":
    run()
