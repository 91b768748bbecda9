"""EWC's lambda selected on the VALIDATION split (never on test tasks): EWC-Init, or a finished
EWC-Pretrain run.

    python -m benchmarks.select_ewc_lambda --dataset=omniglot/full \
        --dataset_option=class_split=authors --manual_dir=FOLDER --tasks=B3,B5 --val_tasks=200

EWC-Init has no meta-training (its parameters are a fixed function of the
seed), so selecting lambda is evaluation only: for every cell and every lambda
of ``--lambdas`` (0 is Init+Tune's fine-tuning with no penalty), the mean
accuracy on ``--val_tasks`` validation tasks (the same tasks for every lambda:
``--eval_seed``); the selected lambda maximises the mean over the cells. One
JSON line per (cell, lambda), then the selection (``benchmarks.selection``).

EWC-Pretrain: lambda only weighs the penalty of the per-task fine-tuning, not the
pretraining (the same for every lambda), so ``--workdir`` of a finished EWC-Pretrain run
selects its lambda on that run's pretrained weights (its selected epoch), its cell, data and
validation tasks (``--manual_dir``/``--data_dir``, where given, replace the folders it recorded):

    python -m benchmarks.select_ewc_lambda --workdir=SWEEP/omniglot-full/ewc_pretrain/D4/seed0 \
        --val_tasks=200

Lambda also picks which pretraining epoch the run keeps (by validation accuracy); selecting
on one run's kept weights leaves that choice fixed.
"""

from __future__ import annotations

from absl import flags

from benchmarks.selection import Selection, grid
from launch import cli

flags.DEFINE_string("dataset", "omniglot/full", "Dataset.")
flags.DEFINE_multi_string("dataset_option", [], "Dataset option NAME=VALUE.")
flags.DEFINE_string("manual_dir", None, "Folder with the official archives.")
flags.DEFINE_string("data_dir", None, "Where prepared datasets live.")
flags.DEFINE_list("tasks", ["B3", "B5"], "Cells.")
flags.DEFINE_list("lambdas", ["0", "1e2", "1e3", "1e4", "1e5"], "Lambdas tried.")
flags.DEFINE_integer("val_tasks", 200, "Validation tasks per (cell, lambda).")
flags.DEFINE_integer("eval_seed", 0, "Seed of the validation tasks.")
flags.DEFINE_integer("seed", 0, "Seed of the initialisation.")
flags.DEFINE_string("workdir", None, "A finished EWC-Pretrain run: select on its pretrained "
                    "weights, cell and data (the data flags above are then its own).")
FLAGS = flags.FLAGS


def candidates(lam: float):
    """(config, learner, splits, params) of each cell at ``lam``: ``--workdir``'s run with
    its weights, or EWC-Init at ``--seed`` on the flags' data."""
    import dataclasses

    from cfsl_jax.runtime.errors import UserError
    from cfsl_jax.training import runs
    from launch.options import parse_options

    if FLAGS.workdir:
        saved = runs.load_config(FLAGS.workdir)
        if "ewc_lambda" not in saved.learner_options:
            raise UserError(f"--workdir={FLAGS.workdir} holds a {saved.learner} run: give an "
                            f"ewc_pretrain or ewc_init run (an EWC learner)")
        folders = {k: v for k, v in (("manual_dir", FLAGS.manual_dir),
                                     ("data_dir", FLAGS.data_dir)) if v}
        saved = dataclasses.replace(saved, **folders)
        config = dataclasses.replace(saved, learner_options={**saved.learner_options,
                                                             "ewc_lambda": lam})
        learner, splits = runs.build(config)
        yield config, learner, splits, runs.restore_params(saved, learner, splits,
                                                           FLAGS.workdir)
        return
    dataset_options = parse_options(FLAGS.dataset_option, "dataset_option")
    for task in FLAGS.tasks:
        config = runs.TrainConfig(learner="ewc_init", learner_options={"ewc_lambda": lam},
                                  dataset=FLAGS.dataset, dataset_options=dataset_options,
                                  task=task, seed=FLAGS.seed, eval_seed=FLAGS.eval_seed,
                                  manual_dir=FLAGS.manual_dir, data_dir=FLAGS.data_dir)
        learner, splits = runs.build(config)
        yield config, learner, splits, runs.init_params(learner, splits["train"], config.seed)


def main(argv) -> None:
    del argv
    from cfsl_jax.training.evaluate import evaluate

    selection = Selection("ewc_lambda")
    for lam in grid(FLAGS.lambdas):
        for config, learner, splits, params in candidates(lam):
            report = evaluate(learner, params, splits["val"], num_tasks=FLAGS.val_tasks,
                              seed=config.task_seed, purpose="val", cost_metrics=False)
            selection.record(lam, report["acc_mean"], task=config.task, learner=config.learner,
                             val_acc_ci95=report["acc_ci95"],
                             task_fingerprint=report["task_fingerprint"])
    selection.select()


if __name__ == "__main__":
    cli.run(main)
