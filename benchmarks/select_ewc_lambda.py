"""EWC-Init's lambda selected on the VALIDATION split (never on test tasks).

    python -m benchmarks.select_ewc_lambda --dataset=omniglot/full \
        --dataset_option=class_split=authors --manual_dir=FOLDER --tasks=B3,B5 --val_tasks=200

EWC-Init has no meta-training (its parameters are a fixed function of the
seed), so selecting lambda is evaluation only: for every cell and every lambda
of ``--lambdas`` (0 is Init+Tune's fine-tuning with no penalty), the mean
accuracy on ``--val_tasks`` validation tasks (the same tasks for every lambda:
``--eval_seed``); the selected lambda maximises the mean over the cells. One
JSON line per (cell, lambda), then the selection (``benchmarks.selection``).
EWC-Pretrain would need a pretraining run per lambda and is left out.
"""

from __future__ import annotations

from absl import app, flags

from benchmarks.selection import Selection, grid

flags.DEFINE_string("dataset", "omniglot/full", "Dataset.")
flags.DEFINE_multi_string("dataset_option", [], "Dataset option NAME=VALUE.")
flags.DEFINE_string("manual_dir", None, "Folder with the official archives.")
flags.DEFINE_string("data_dir", None, "Where prepared datasets live.")
flags.DEFINE_list("tasks", ["B3", "B5"], "Cells.")
flags.DEFINE_list("lambdas", ["0", "1e2", "1e3", "1e4", "1e5"], "Lambdas tried.")
flags.DEFINE_integer("val_tasks", 200, "Validation tasks per (cell, lambda).")
flags.DEFINE_integer("eval_seed", 0, "Seed of the validation tasks.")
flags.DEFINE_integer("seed", 0, "Seed of the initialisation.")
FLAGS = flags.FLAGS


def main(argv) -> None:
    del argv
    from cfsl_jax.training import runs
    from cfsl_jax.training.evaluate import evaluate
    from launch.options import parse_options

    dataset_options = parse_options(FLAGS.dataset_option, "dataset_option")
    selection = Selection("ewc_lambda")
    for task in FLAGS.tasks:
        for lam in grid(FLAGS.lambdas):
            config = runs.TrainConfig(learner="ewc_init", learner_options={"ewc_lambda": lam},
                                      dataset=FLAGS.dataset, dataset_options=dataset_options,
                                      task=task, seed=FLAGS.seed, eval_seed=FLAGS.eval_seed,
                                      manual_dir=FLAGS.manual_dir, data_dir=FLAGS.data_dir)
            learner, splits = runs.build(config)
            params = runs.init_params(learner, splits["train"], config.seed)
            report = evaluate(learner, params, splits["val"], num_tasks=FLAGS.val_tasks,
                              seed=config.task_seed, purpose="val", cost_metrics=False)
            selection.record(lam, report["acc_mean"], task=task,
                             val_acc_ci95=report["acc_ci95"],
                             task_fingerprint=report["task_fingerprint"])
    selection.select()

if __name__ == "__main__":
    app.run(main)
